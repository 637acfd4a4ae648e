#include "nn/rmsnorm.h"

#include <omp.h>

#include <cmath>
#include <vector>

#include "core/cpu_level.h"

namespace dpt {

template <typename T>
DPT_CPU_CLONES void rmsnorm_forward(T* out, float* rstd, const float* inp, const float* weight, int64_t N,
                                    int64_t C, float eps) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* x = inp + n * C;
    T* y = out + n * C;
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int64_t c = 0; c < C; ++c) ss += x[c] * x[c];
    const float s = 1.0f / std::sqrt(ss / static_cast<float>(C) + eps);
    // Hugging Face's order: weight * (x * rstd).
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) y[c] = from_f32<T>(weight[c] * (x[c] * s));
    rstd[n] = s;
  }
}

template void rmsnorm_forward(float*, float*, const float*, const float*, int64_t, int64_t, float);
template void rmsnorm_forward(bf16*, float*, const float*, const float*, int64_t, int64_t, float);

DPT_CPU_CLONES void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                                     const float* weight, const float* rstd, int64_t N, int64_t C) {
  // As layernorm_backward: each thread sums its rows' dweight privately, the
  // partial sums are added to each other in thread order; the scratch is the
  // calling thread's, kept between calls.
  const int nt = omp_get_max_threads();
  static thread_local std::vector<float> partial;
  partial.assign(static_cast<size_t>(nt) * C, 0.0f);
  float* base = partial.data();
#pragma omp parallel num_threads(nt)
  {
    float* dw = base + static_cast<size_t>(omp_get_thread_num()) * C;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const float* x = inp + n * C;
      const float* dy = dout + n * C;
      float* dx = dinp + n * C;
      const float s = rstd[n];
      // y = w * xhat, xhat = x s, s = (mean(x^2) + eps)^-1/2:
      // dx = s * (dxhat - xhat * mean(dxhat * xhat)), dxhat = dy * w.
      float sum_dxhat_xhat = 0.0f;
#pragma omp simd reduction(+ : sum_dxhat_xhat)
      for (int64_t c = 0; c < C; ++c) {
        const float xhat = x[c] * s;
        sum_dxhat_xhat += dy[c] * weight[c] * xhat;
        dw[c] += dy[c] * xhat;
      }
      const float b = sum_dxhat_xhat / static_cast<float>(C);
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) dx[c] += s * (dy[c] * weight[c] - x[c] * s * b);
    }
  }
  // Their total added to dweight in one addition (as layernorm_backward).
  for (int t = 1; t < nt; ++t) {
    const float* dw = base + static_cast<size_t>(t) * C;
    for (int64_t c = 0; c < C; ++c) base[c] += dw[c];
  }
  for (int64_t c = 0; c < C; ++c) dweight[c] += base[c];
}

}  // namespace dpt
