#include "nn/activations.h"

#include "nn/activations_avx512.h"
#include "nn/fast_exp.h"
#include "nn/fast_tanh.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/cpu_level.h"
#include "core/threads.h"

namespace dpt {

DPT_CPU_CLONES void relu_forward(float* out, const float* inp, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = inp[i] > 0.0f ? inp[i] : 0.0f;
}

DPT_CPU_CLONES void relu_backward(float* dinp, const float* dout, const float* out, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) dinp[i] = out[i] > 0.0f ? dout[i] : 0.0f;
}

namespace {
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

// tanh through exp keeps the loop vectorisable (glibc has no vector
// tanhf). |u| is clamped at 10, where tanh is +-1 in fp32.
inline float fast_tanh(float u) {
  u = u > 10.0f ? 10.0f : (u < -10.0f ? -10.0f : u);
  return 1.0f - 2.0f / (exp_small(2.0f * u) + 1.0f);
}

// dout * gelu'(x).
inline float gelu_grad(float dout, float x) {
  float u = kGeluScale * (x + kGeluCubic * x * x * x);
  float t = fast_tanh(u);
  float sech2 = 1.0f - t * t;
  float du = kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
  return dout * (0.5f * (1.0f + t) + 0.5f * x * sech2 * du);
}

// The same two for the bf16 paths (a bf16 output, or a bf16 copy of the
// gradient for the GEMMs): tanh from rational_tanh (nn/fast_tanh.h), about
// 1.4x faster, within 1.2e-6 of the fp32 path's values.
inline float gelu_bf16path(float x) {
  const float x2 = x * x;
  const float h = 0.5f * x;
  return std::fma(h, rational_tanh(kGeluScale * x * std::fma(kGeluCubic, x2, 1.0f)), h);
}

inline float gelu_grad_bf16path(float dout, float x) {
  const float x2 = x * x;
  const float t = rational_tanh(kGeluScale * x * std::fma(kGeluCubic, x2, 1.0f));
  const float du = kGeluScale * std::fma(3.0f * kGeluCubic, x2, 1.0f);
  const float h = 0.5f * x;
  return dout * std::fma(h * du, std::fma(-t, t, 1.0f), std::fma(0.5f, t, 0.5f));
}
}  // namespace

template <typename T>
DPT_CPU_CLONES void gelu_forward(T* out, const float* inp, int64_t n) {
  if constexpr (std::is_same_v<T, bf16>) {
    if (avx512_activations::enabled()) {
#pragma omp parallel
      {
        const ThreadSpan span = thread_span16(n);
        if (span.begin < span.end)
          avx512_activations::gelu_forward(out + span.begin, inp + span.begin, span.end - span.begin);
      }
      return;
    }
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) out[i] = to_bf16(gelu_bf16path(inp[i]));
  } else {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      float x = inp[i];
      float u = kGeluScale * (x + kGeluCubic * x * x * x);
      out[i] = 0.5f * x * (1.0f + fast_tanh(u));
    }
  }
}

DPT_CPU_CLONES void gelu_backward(float* dinp, const float* dout, const float* inp, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) dinp[i] = gelu_grad(dout[i], inp[i]);
}

DPT_CPU_CLONES void gelu_backward(float* dinp, bf16* dinp16, float* dbias, const float* dout, const float* inp,
                                  int64_t N, int64_t OC) {
  // Each thread takes a contiguous range of columns (whole rows with one
  // thread, so memory is read in order) and sums each of its columns over
  // all rows in row order, from zero, before adding the sum to dbias: the
  // sums linear_backward_bias makes, whatever the thread count.
  const bool avx512 = dinp16 && avx512_activations::enabled();
#pragma omp parallel
  {
    const auto [c0, c1] = thread_span16(OC);  // whole 64-byte lines
    static thread_local std::vector<float> sums;
    sums.assign(static_cast<size_t>(c1 - c0), 0.0f);
    float* acc = sums.data() - c0;
    for (int64_t n = 0; n < N && c0 < c1; ++n) {
      const float* dy = dout + n * OC;
      const float* x = inp + n * OC;
      float* dx = dinp ? dinp + n * OC : nullptr;
      bf16* dx16 = dinp16 ? dinp16 + n * OC : nullptr;
      // One loop body per case, no test inside: the vector loops stay
      // branch-free.
      if (avx512) {
        avx512_activations::gelu_backward(dx ? dx + c0 : nullptr, dx16 + c0, acc + c0, dy + c0, x + c0, c1 - c0);
      } else if (!dx16) {
#pragma omp simd
        for (int64_t c = c0; c < c1; ++c) {
          const float d = gelu_grad(dy[c], x[c]);
          dx[c] = d;
          acc[c] += d;
        }
      } else if (dx) {
#pragma omp simd
        for (int64_t c = c0; c < c1; ++c) {
          const float d = gelu_grad_bf16path(dy[c], x[c]);
          dx[c] = d;
          dx16[c] = to_bf16(d);
          acc[c] += d;
        }
      } else {
#pragma omp simd
        for (int64_t c = c0; c < c1; ++c) {
          const float d = gelu_grad_bf16path(dy[c], x[c]);
          dx16[c] = to_bf16(d);
          acc[c] += d;
        }
      }
    }
    if (dbias)
      for (int64_t c = c0; c < c1; ++c) dbias[c] += acc[c];
  }
}

template void gelu_forward(float*, const float*, int64_t);
template void gelu_forward(bf16*, const float*, int64_t);

}  // namespace dpt
