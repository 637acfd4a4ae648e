#include "nn/swiglu.h"

#include "core/cpu_level.h"
#include "nn/activations_avx512.h"
#include "nn/fast_exp.h"
#include "nn/fast_tanh.h"

#include <type_traits>

namespace dpt {

template <typename T>
DPT_CPU_CLONES void swiglu_forward(T* out, const float* gu, int64_t N, int64_t I) {
  const bool avx512 = std::is_same_v<T, bf16> && avx512_activations::enabled();
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* g = gu + n * 2 * I;
    const float* u = g + I;
    T* y = out + n * I;
    // A bf16 output takes the sigmoid from nn/activations_avx512.h where
    // the CPU has AVX-512 BF16, else from rational_tanh (nn/fast_tanh.h:
    // within 6e-7, below a bf16 rounding step); fp32 keeps its bits.
    if constexpr (std::is_same_v<T, bf16>) {
      if (avx512) {
        avx512_activations::swiglu_forward(y, g, u, I);
        continue;
      }
#pragma omp simd
      for (int64_t i = 0; i < I; ++i) y[i] = to_bf16(g[i] * rational_sigmoid(g[i]) * u[i]);
    } else {
#pragma omp simd
      for (int64_t i = 0; i < I; ++i) y[i] = g[i] * fast_sigmoid(g[i]) * u[i];
    }
  }
}

template void swiglu_forward(float*, const float*, int64_t, int64_t);
template void swiglu_forward(bf16*, const float*, int64_t, int64_t);

DPT_CPU_CLONES void swiglu_backward(float* dgu, bf16* dgu16, const float* dout, const float* gu, int64_t N,
                                    int64_t I) {
  const bool avx512 = dgu16 && avx512_activations::enabled();
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* g = gu + n * 2 * I;
    const float* u = g + I;
    const float* dy = dout + n * I;
    if (!dgu16) {
      float* dg = dgu + n * 2 * I;
      float* du = dg + I;
#pragma omp simd
      for (int64_t i = 0; i < I; ++i) {
        // Both read before either is written: in place over gu is safe.
        const float s = fast_sigmoid(g[i]);
        const float a = dy[i] * u[i] * (s * (1.0f + g[i] * (1.0f - s))), b = dy[i] * (g[i] * s);
        dg[i] = a;
        du[i] = b;
      }
      continue;
    }
    // The bf16 path (nn/activations_avx512.h's sigmoid, or
    // rational_sigmoid): both halves rounded as they are made, the fp32
    // gradient written only where the caller wants it.
    bf16* dg16 = dgu16 + n * 2 * I;
    bf16* du16 = dg16 + I;
    if (avx512) {
      float* dg = dgu ? dgu + n * 2 * I : nullptr;
      avx512_activations::swiglu_backward(dg, dg ? dg + I : nullptr, dg16, du16, dy, g, u, I);
      continue;
    }
    if (dgu) {
      float* dg = dgu + n * 2 * I;
      float* du = dg + I;
#pragma omp simd
      for (int64_t i = 0; i < I; ++i) {
        const float s = rational_sigmoid(g[i]);
        const float a = dy[i] * u[i] * (s * (1.0f + g[i] * (1.0f - s))), b = dy[i] * (g[i] * s);
        dg[i] = a;
        du[i] = b;
        dg16[i] = to_bf16(a);
        du16[i] = to_bf16(b);
      }
    } else {
#pragma omp simd
      for (int64_t i = 0; i < I; ++i) {
        const float s = rational_sigmoid(g[i]);
        dg16[i] = to_bf16(dy[i] * u[i] * (s * (1.0f + g[i] * (1.0f - s))));
        du16[i] = to_bf16(dy[i] * (g[i] * s));
      }
    }
  }
}

}  // namespace dpt
