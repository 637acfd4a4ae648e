// SwiGLU's elementwise part (Llama's MLP: down(silu(gate(x)) * up(x))):
//   gu  [N, 2I]: each row is gate (I channels) then up (I channels), the
//               output of one fused linear whose weight is gate_proj's rows
//               followed by up_proj's ([2I, C]).
//   out [N, I] = silu(gate) * up, silu(g) = g * sigmoid(g).
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace dpt {

// out is float, or bf16 when it feeds a bf16 GEMM (down_proj); the bf16
// output takes its sigmoid from nn/activations_avx512.h where the CPU has
// AVX-512 BF16, else from rational_tanh (nn/fast_tanh.h).
template <typename T>
void swiglu_forward(T* out, const float* gu, int64_t N, int64_t I);

// dgu [N, 2I] = gradient w.r.t. gu, written, laid out as gu:
//   dgate = dout * up * silu'(gate), silu'(g) = s (1 + g (1 - s)), s = sigmoid(g)
//   dup   = dout * silu(gate)
// dgu16, when given, receives dgu rounded to bf16 in the same pass (the
// fused linear's GEMM operand in a bf16 run); it then takes the sigmoid as
// the bf16 forward does (dgu within 2e-4 of the fp32 path's) and dgu may be
// null (a bf16 run's GEMMs read the copy alone). dgu may be gu: each gate
// and up pair is read before its gradients are written (a split backward
// keeps the gradient over the pre-activation: models/decoder_split.cpp).
void swiglu_backward(float* dgu, bf16* dgu16, const float* dout, const float* gu, int64_t N, int64_t I);

}  // namespace dpt
