#include "nn/swiglu.h"

#include "core/cpu_level.h"
#include "nn/fast_exp.h"

namespace dpt {

template <typename T>
DPT_CPU_CLONES void swiglu_forward(T* out, const float* gu, int64_t N, int64_t I) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* g = gu + n * 2 * I;
    const float* u = g + I;
    T* y = out + n * I;
#pragma omp simd
    for (int64_t i = 0; i < I; ++i) y[i] = from_f32<T>(g[i] * fast_sigmoid(g[i]) * u[i]);
  }
}

template void swiglu_forward(float*, const float*, int64_t, int64_t);
template void swiglu_forward(bf16*, const float*, int64_t, int64_t);

DPT_CPU_CLONES void swiglu_backward(float* dgu, bf16* dgu16, const float* dout, const float* gu, int64_t N,
                                    int64_t I) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* g = gu + n * 2 * I;
    const float* u = g + I;
    const float* dy = dout + n * I;
    float* dg = dgu + n * 2 * I;
    float* du = dg + I;
#pragma omp simd
    for (int64_t i = 0; i < I; ++i) {
      const float s = fast_sigmoid(g[i]);
      dg[i] = dy[i] * u[i] * (s * (1.0f + g[i] * (1.0f - s)));
      du[i] = dy[i] * (g[i] * s);
    }
    if (dgu16) {
      bf16* d16 = dgu16 + n * 2 * I;
#pragma omp simd
      for (int64_t i = 0; i < 2 * I; ++i) d16[i] = to_bf16(dg[i]);
    }
  }
}

}  // namespace dpt
