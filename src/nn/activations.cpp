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

// dout * gelu'(x).
inline float gelu_grad(float dout, float x) {
  float u = kGeluScale * (x + kGeluCubic * x * x * x);
  float t = fast_tanh(u);
  float sech2 = 1.0f - t * t;
  float du = kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
  return dout * (0.5f * (1.0f + t) + 0.5f * x * sech2 * du);
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
  for (int64_t i = 0; i < n; ++i) dinp[i] = gelu_grad(dout[i], inp[i]);
}

DPT_CPU_CLONES void gelu_backward(float* dinp, bf16* dinp16, float* dbias, const float* dout, const float* inp,
                                  int64_t N, int64_t OC) {
  // Threads split the columns in blocks of 64 and each sums its columns over
  // all rows in row order, as linear_backward_bias does, so the bias
  // gradient does not depend on the thread count. A block's rows (2048 x
  // 64 floats in W-GPT, read and written) stay in L2.
#pragma omp parallel for schedule(static)
  for (int64_t o0 = 0; o0 < OC; o0 += 64) {
    const int64_t o1 = o0 + 64 < OC ? o0 + 64 : OC;
    float acc[64] = {0};
    for (int64_t n = 0; n < N; ++n) {
      const float* dy = dout + n * OC;
      const float* x = inp + n * OC;
      float* dx = dinp + n * OC;
      if (dinp16) {
        bf16* dx16 = dinp16 + n * OC;
#pragma omp simd
        for (int64_t o = o0; o < o1; ++o) {
          const float d = gelu_grad(dy[o], x[o]);
          dx[o] = d;
          dx16[o] = to_bf16(d);
          acc[o - o0] += d;
        }
      } else {
#pragma omp simd
        for (int64_t o = o0; o < o1; ++o) {
          const float d = gelu_grad(dy[o], x[o]);
          dx[o] = d;
          acc[o - o0] += d;
        }
      }
    }
    if (dbias)
      for (int64_t o = o0; o < o1; ++o) dbias[o] += acc[o - o0];
  }
}

template void gelu_forward(float*, const float*, int64_t);
template void gelu_forward(bf16*, const float*, int64_t);

}  // namespace dpt
