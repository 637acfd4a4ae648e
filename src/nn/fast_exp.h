// e^x for the elementwise kernels, inline so the loops that call it stay one
// vector body without -ffast-math (a call to glibc's expf is scalar there,
// and a call to its vector expf spills every register each iteration).
// The method: x = n ln2 + r, |r| <= ln2 / 2 (ln2 in two parts, so r is
// exact to fp32), e^r from its Taylor series to r^7 (truncation below 2e-8
// relative), times 2^n built in the exponent bits.
// x is clamped to [-80, 80], where 2^n stays a normal float: e^-80 stands
// for anything smaller (it is 1.8e-35: zero beside the 1 of a softmax's
// maximum or of a sigmoid's 1 + e^-x).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace dpt {

// e^x for |x| <= 80 (no clamp: GELU's caller bounds its argument itself).
inline float exp_small(float x) {
  const float n = std::nearbyint(x * 1.44269504088896341f);
  float r = std::fma(n, -0.693145751953125f, x);
  r = std::fma(n, -1.428606765330187045e-06f, r);
  float p = 1.0f / 5040.0f;
  p = std::fma(p, r, 1.0f / 720.0f);
  p = std::fma(p, r, 1.0f / 120.0f);
  p = std::fma(p, r, 1.0f / 24.0f);
  p = std::fma(p, r, 1.0f / 6.0f);
  p = std::fma(p, r, 0.5f);
  p = std::fma(p, r, 1.0f);
  p = std::fma(p, r, 1.0f);
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

inline float fast_exp(float x) { return exp_small(x > 80.0f ? 80.0f : (x < -80.0f ? -80.0f : x)); }

// 1 / (1 + e^-x).
inline float fast_sigmoid(float x) { return 1.0f / (1.0f + fast_exp(-x)); }

}  // namespace dpt
