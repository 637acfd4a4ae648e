#include "nn/update.h"

#include <algorithm>
#include <cmath>

#include "core/cpu_level.h"

namespace dpt {

DPT_CPU_CLONES double sum_of_squares(const float* grads, size_t n) {
  // fp32 partial sums over blocks of 1024 (vectorised), added up in double:
  // as exact as an all-double sum for any realistic n, several times faster.
  constexpr size_t kBlock = 1024;
  const size_t blocks = (n + kBlock - 1) / kBlock;
  double s = 0.0;
#pragma omp parallel for reduction(+ : s) schedule(static)
  for (size_t b = 0; b < blocks; ++b) {
    const float* g = grads + b * kBlock;
    const size_t m = std::min(kBlock, n - b * kBlock);
    float part = 0.0f;
#pragma omp simd reduction(+ : part)
    for (size_t i = 0; i < m; ++i) part += g[i] * g[i];
    s += static_cast<double>(part);
  }
  return s;
}

DPT_CPU_CLONES void scale(float* x, size_t n, float factor) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) x[i] *= factor;
}

// With p16 and without: two copies of each loop, no test of p16 inside, so
// both stay single vector loops (in the function itself, not a helper, so
// that its OpenMP body is compiled in both CPU-level copies). The
// arithmetic is the same in both.
DPT_CPU_CLONES void sgd_update(float* p, float* g, float* buf, size_t n, float lr, float momentum, float decay,
                               bool first, bool consume, bf16* p16) {
  if (!p16) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; ++i) {
      float gi = g[i] + decay * p[i];
      if (consume) g[i] = 0.0f;
      if (buf) {
        buf[i] = first ? gi : momentum * buf[i] + gi;
        gi = buf[i];
      }
      p[i] -= lr * gi;
    }
    return;
  }
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) {
    float gi = g[i] + decay * p[i];
    if (consume) g[i] = 0.0f;
    if (buf) {
      buf[i] = first ? gi : momentum * buf[i] + gi;
      gi = buf[i];
    }
    const float pi = p[i] - lr * gi;
    p[i] = pi;
    p16[i] = to_bf16(pi);
  }
}

DPT_CPU_CLONES void adamw_update(float* p, float* g, float* m, float* v, size_t n, float b1, float b2, float eps,
                                 float keep, float step_size, float rc2, bool consume, bf16* p16) {
  if (!p16) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; ++i) {
      const float gi = g[i];
      if (consume) g[i] = 0.0f;
      m[i] = b1 * m[i] + (1.0f - b1) * gi;
      v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
      p[i] = p[i] * keep - step_size * m[i] / (std::sqrt(v[i]) * rc2 + eps);
    }
    return;
  }
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) {
    const float gi = g[i];
    if (consume) g[i] = 0.0f;
    m[i] = b1 * m[i] + (1.0f - b1) * gi;
    v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
    const float pi = p[i] * keep - step_size * m[i] / (std::sqrt(v[i]) * rc2 + eps);
    p[i] = pi;
    p16[i] = to_bf16(pi);
  }
}

}  // namespace dpt
