// tanh for the portable bf16 paths of the elementwise kernels (GELU, SiLU:
// where the CPU has no AVX-512 BF16, nn/activations_avx512.h's kernels run
// instead), inline so their loops stay one vector body: a rational function x P(x^2) / Q(x^2)
// (Eigen's float tanh: degree 13 over degree 6) on |x| < 7.9053, exactly
// +-1 beyond (tanh is 1 - 2.7e-7 there). At most 1.2e-6 from tanh in
// absolute terms (measured on a grid of 1e-4 over [-10, 10]); a bf16 ulp
// near 1 is 3.9e-3, so what a bf16 kernel writes moves by at most one
// rounding step, on the few values that sit that close to a rounding
// boundary. It costs one division and nine FMAs against exp_small's range
// reduction, eight-term polynomial, exponent build and division
// (fast_exp.h): a GELU forward writing bf16 runs in 0.60 ms instead of 0.85
// over W-GPT's 2M elements on one AVX-512 core.
//
// The fp32 kernels keep exp_small's tanh: their results are held bit for
// bit by tests/fixtures/gpt_bitwise.
#pragma once

#include <algorithm>
#include <cmath>

namespace dpt {

inline float rational_tanh(float x0) {
  constexpr float kClamp = 7.90531110763549805f;
  const float x = std::min(std::max(x0, -kClamp), kClamp);
  const float x2 = x * x;
  float p = -2.76076847742355e-16f;
  p = std::fma(p, x2, 2.00018790482477e-13f);
  p = std::fma(p, x2, -8.60467152213735e-11f);
  p = std::fma(p, x2, 5.12229709037114e-08f);
  p = std::fma(p, x2, 1.48572235717979e-05f);
  p = std::fma(p, x2, 6.37261928875436e-04f);
  p = std::fma(p, x2, 4.89352455891786e-03f);
  float q = 1.19825839466702e-06f;
  q = std::fma(q, x2, 1.18534705686654e-04f);
  q = std::fma(q, x2, 2.26843463243900e-03f);
  q = std::fma(q, x2, 4.89352518554385e-03f);
  // Exactly +-1 from the clamp on (the rational gives 1 - 2.4e-7 there):
  // GELU's gradient multiplies 1 - tanh^2 by about x^3, and must be zero,
  // not x^3 times a rounding residue, far out in the tails.
  return std::fabs(x0) >= kClamp ? std::copysign(1.0f, x0) : x * p / q;
}

// 1 / (1 + e^-x) = (1 + tanh(x / 2)) / 2: at most 6e-7 from the sigmoid.
inline float rational_sigmoid(float x) { return std::fma(0.5f, rational_tanh(0.5f * x), 0.5f); }

}  // namespace dpt
