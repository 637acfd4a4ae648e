// GELU's and SwiGLU's bf16 paths written for CPUs with AVX-512 and its BF16
// instructions (AMD Zen 4 on, Intel Cooper Lake and Sapphire Rapids on),
// picked at run time by nn/activations.cpp and nn/swiglu.cpp. Both
// functions are a sigmoid: GELU's tanh form is x sigmoid(2u), u = sqrt(2/pi)
// (x + 0.044715 x^3), and SiLU is g sigmoid(g). Each sigmoid is 1 / (1 + 2^y)
// with 2^y from vreduceps (y's fraction f) and vscalefps (times 2^floor(y))
// around a degree-4 polynomial for 2^f on [0, 1) (within 3.5e-6), and the
// reciprocal from vrcp14ps (within 6.1e-5): about 16 vector operations per
// 16 elements against the portable path's 30-odd and a division, and the
// bf16 rounding is one vcvtneps2bf16 (round to nearest even as to_bf16,
// which takes six; it reads a denormal input as zero, which to_bf16 rounds
// to a denormal bf16). On W-GPT's 2M elements on one core GELU's bf16
// forward runs in under half the portable path's time (docs/performance.md,
// "GELU and SiLU in AVX-512 BF16").
//
// What it costs in accuracy: GELU's output moves by one bf16 rounding step
// from the correctly rounded value on 0.15% of the outputs above 0.05 in
// magnitude and 0.27% of the smaller ones (the portable path: 0.001% and
// 22%, its 1 + tanh cancelling far below zero), and the fp32 gradient the backward sums into the bias is within
// 2e-4 of the exact one, relative (tests/test_activations_bf16.cpp;
// docs/precision.md).
//
// Each function handles its whole range (its tail with masked loads and
// stores), so the bits of an element do not depend on where a thread's range
// starts. The caller parallelises.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace dpt::avx512_activations {

// Whether the bf16 paths take these kernels: this build is for x86-64 with
// GCC, this CPU has AVX-512 F, BW, VL, DQ and BF16, and they are not turned
// off.
bool enabled();
// Tests and benchmarks of the portable path turn these kernels off (and
// back on).
void set_off(bool off);

// out[i] = gelu(inp[i]) rounded to bf16.
void gelu_forward(bf16* out, const float* inp, int64_t n);
// d = dy * gelu'(x) for n elements: dx16 = d in bf16, dx = d (when dx is not
// null), acc += d (the bias gradient's running column sums). dx may alias dy
// or x.
void gelu_backward(float* dx, bf16* dx16, float* acc, const float* dy, const float* x, int64_t n);

// y = silu(g) * u rounded to bf16, over one row's I channels.
void swiglu_forward(bf16* y, const float* g, const float* u, int64_t I);
// One row's gradients: dg = dy u silu'(g), du = dy silu(g), in bf16 (dg16,
// du16), and in fp32 where dg and du are not null (they may alias g and u).
void swiglu_backward(float* dg, float* du, bf16* dg16, bf16* du16, const float* dy, const float* g, const float* u,
                     int64_t I);

}  // namespace dpt::avx512_activations
