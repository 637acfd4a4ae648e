#include "nn/layernorm.h"

#include <omp.h>

#include <cmath>
#include <vector>

#include "core/cpu_level.h"

namespace dpt {

template <typename T>
DPT_CPU_CLONES void layernorm_forward(T* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                       int64_t N, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* x = inp + n * C;
    T* y = out + n * C;
    // The row sums are SIMD reductions (lanes summed at the end): a serial
    // float sum is one dependent add per element, several times slower.
    float m = 0.0f;
#pragma omp simd reduction(+ : m)
    for (int64_t c = 0; c < C; ++c) m += x[c];
    m /= static_cast<float>(C);
    float v = 0.0f;
#pragma omp simd reduction(+ : v)
    for (int64_t c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m);
    v /= static_cast<float>(C);
    float s = 1.0f / std::sqrt(v + kLayerNormEps);
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) y[c] = from_f32<T>((x[c] - m) * s * weight[c] + bias[c]);
    mean[n] = m;
    rstd[n] = s;
  }
}

template void layernorm_forward(float*, float*, float*, const float*, const float*, const float*, int64_t,
                                int64_t);
template void layernorm_forward(bf16*, float*, float*, const float*, const float*, const float*, int64_t,
                                int64_t);

DPT_CPU_CLONES void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int64_t N, int64_t C) {
  // Each thread sums its rows' dweight/dbias privately, then the partial
  // sums are added in thread order, so the result does not depend on timing.
  // The scratch is kept between calls so a training step allocates nothing;
  // it belongs to the calling thread (replicas on other threads have their
  // own), and the team reaches it through `base`.
  int nt = omp_get_max_threads();
  static thread_local std::vector<float> partial;
  partial.assign(static_cast<size_t>(nt) * 2 * C, 0.0f);
  float* base = partial.data();
#pragma omp parallel num_threads(nt)
  {
    float* dw = base + static_cast<size_t>(omp_get_thread_num()) * 2 * C;
    float* db = dw + C;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const float* x = inp + n * C;
      const float* dy = dout + n * C;
      float* dx = dinp + n * C;
      float m = mean[n], s = rstd[n];
      // dxhat = dy * w; dx = s * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))
      float sum_dxhat = 0.0f, sum_dxhat_xhat = 0.0f;
#pragma omp simd reduction(+ : sum_dxhat, sum_dxhat_xhat)
      for (int64_t c = 0; c < C; ++c) {
        float xhat = (x[c] - m) * s;
        float dxhat = dy[c] * weight[c];
        sum_dxhat += dxhat;
        sum_dxhat_xhat += dxhat * xhat;
        dw[c] += dy[c] * xhat;
        db[c] += dy[c];
      }
      float a = sum_dxhat / static_cast<float>(C), b = sum_dxhat_xhat / static_cast<float>(C);
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) {
        float xhat = (x[c] - m) * s;
        dx[c] += s * (dy[c] * weight[c] - a - xhat * b);
      }
    }
  }
  // The partial sums added to each other in thread order, then their total
  // to the gradient in one addition: dweight + (0 + total) is then bitwise
  // dweight + total, so a split backward can compute a micro-batch's
  // parameter gradients into zeros and add them in later
  // (models/decoder_split.cpp); the GPU's column sums end the same way.
  for (int t = 1; t < nt; ++t) {
    const float* dw = base + static_cast<size_t>(t) * 2 * C;
    for (int64_t c = 0; c < 2 * C; ++c) base[c] += dw[c];
  }
  for (int64_t c = 0; c < C; ++c) {
    dweight[c] += base[c];
    dbias[c] += base[C + c];
  }
}

}  // namespace dpt
