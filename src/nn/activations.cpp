#include "nn/activations.h"

#include <cmath>

#include "core/cpu_level.h"

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

// tanh through exp keeps the loop vectorisable: this file is compiled with
// -ffast-math (see CMakeLists.txt) so glibc's vector expf is used, and glibc
// has no vector tanhf. |u| is clamped at 10, where tanh is +-1 in fp32, so
// exp never overflows.
inline float fast_tanh(float u) {
  u = u > 10.0f ? 10.0f : (u < -10.0f ? -10.0f : u);
  return 1.0f - 2.0f / (std::exp(2.0f * u) + 1.0f);
}
}  // namespace

template <typename T>
DPT_CPU_CLONES void gelu_forward(T* out, const float* inp, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    float x = inp[i];
    float u = kGeluScale * (x + kGeluCubic * x * x * x);
    out[i] = from_f32<T>(0.5f * x * (1.0f + fast_tanh(u)));
  }
}

DPT_CPU_CLONES void gelu_backward(float* dinp, const float* dout, const float* inp, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    float x = inp[i];
    float u = kGeluScale * (x + kGeluCubic * x * x * x);
    float t = fast_tanh(u);
    float sech2 = 1.0f - t * t;
    float du = kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
    dinp[i] = dout[i] * (0.5f * (1.0f + t) + 0.5f * x * sech2 * du);
  }
}

template void gelu_forward(float*, const float*, int64_t);
template void gelu_forward(bf16*, const float*, int64_t);

}  // namespace dpt
