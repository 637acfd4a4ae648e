#include "nn/rope.h"

#include <cmath>

#include "core/cpu_level.h"

namespace dpt {

namespace {

constexpr double kTwoPi = 6.283185307179586;

// transformers' _compute_llama3_parameters on one frequency, in its fp32
// order of operations (the Python floats meet fp32 tensors).
float llama3_scaled(float f, const RopeLlama3Scaling& s) {
  const float old = static_cast<float>(s.original_max_position_embeddings);
  const float low_wavelen = old / s.low_freq_factor, high_wavelen = old / s.high_freq_factor;
  const float wavelen = static_cast<float>(kTwoPi) / f;
  if (wavelen < high_wavelen) return f;
  if (wavelen > low_wavelen) return f / s.factor;
  const float smooth = (old / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  return (1.0f - smooth) * f / s.factor + smooth * f;
}

}  // namespace

void rope_inv_freq(float* inv_freq, int64_t hd, float theta, const RopeLlama3Scaling* llama3) {
  for (int64_t i = 0; i < hd / 2; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(hd);
    const float f = 1.0f / static_cast<float>(std::pow(static_cast<double>(theta), static_cast<double>(e)));
    inv_freq[i] = llama3 ? llama3_scaled(f, *llama3) : f;
  }
}

void rope_cache(float* cos, float* sin, const float* inv_freq, int64_t T, int64_t hd) {
  const int64_t half = hd / 2;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const double a = static_cast<double>(static_cast<float>(t) * inv_freq[i]);
      cos[t * half + i] = static_cast<float>(std::cos(a));
      sin[t * half + i] = static_cast<float>(std::sin(a));
    }
}

namespace {

// Rotates the H heads of one row by the angle times `sign` (+1 forward, -1
// backward: the transpose of a rotation is the rotation back). Inlined into
// the cloned kernels below, so it is vectorised for each copy.
inline void rotate_row(float* y, const float* x, const float* c, const float* s, float sign, int64_t H,
                       int64_t hd) {
  const int64_t half = hd / 2;
  for (int64_t h = 0; h < H; ++h, x += hd, y += hd) {
#pragma omp simd
    for (int64_t i = 0; i < half; ++i) {
      const float x1 = x[i], x2 = x[i + half], sn = sign * s[i];
      y[i] = x1 * c[i] - x2 * sn;
      y[i + half] = x2 * c[i] + x1 * sn;
    }
  }
}

}  // namespace

DPT_CPU_CLONES void rope_forward(float* out, const float* inp, const float* cos, const float* sin, int64_t B,
                                 int64_t T, int64_t H, int64_t hd, int64_t ld) {
  const int64_t half = hd / 2;
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < B * T; ++row)
    rotate_row(out + row * ld, inp + row * ld, cos + (row % T) * half, sin + (row % T) * half, 1.0f, H, hd);
}

DPT_CPU_CLONES void rope_backward(float* dinp, const float* dout, const float* cos, const float* sin, int64_t B,
                                  int64_t T, int64_t H, int64_t hd, int64_t ld) {
  const int64_t half = hd / 2;
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < B * T; ++row)
    rotate_row(dinp + row * ld, dout + row * ld, cos + (row % T) * half, sin + (row % T) * half, -1.0f, H, hd);
}

DPT_CPU_CLONES void rope_backward_bf16(float* dinp, bf16* dinp16, const float* dout, const float* cos, const float* sin,
                                       int64_t B, int64_t T, int64_t H, int64_t hd, int64_t ld) {
  const int64_t half = hd / 2, rotated = H * hd;
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < B * T; ++row) {
    float* y = dinp + row * ld;
    const float* x = dout + row * ld;
    bf16* y16 = dinp16 + row * ld;
    rotate_row(y, x, cos + (row % T) * half, sin + (row % T) * half, -1.0f, H, hd);
#pragma omp simd
    for (int64_t c = 0; c < rotated; ++c) y16[c] = to_bf16(y[c]);
#pragma omp simd
    for (int64_t c = rotated; c < ld; ++c) y16[c] = to_bf16(x[c]);
  }
}

}  // namespace dpt
