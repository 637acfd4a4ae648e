// Elementwise activations over n elements.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace dpt {

// ReLU: out = max(0, inp). out may alias inp.
void relu_forward(float* out, const float* inp, int64_t n);
// dinp = dout * (out > 0), written. Uses the forward output (not the input)
// so the forward may run in place. dinp may alias dout.
void relu_backward(float* dinp, const float* dout, const float* out, int64_t n);

// GELU, tanh form (GPT-2; PyTorch gelu(approximate='tanh')):
// out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
// out is float, or bf16 when it feeds a bf16 GEMM. The bf16 output is
// computed as x sigmoid(2u) by nn/activations_avx512.h's kernel where the
// CPU has AVX-512 BF16, else with tanh from a rational approximation
// (nn/fast_tanh.h); either is within a bf16 rounding step of GELU. The
// fp32 output keeps its bits.
template <typename T>
void gelu_forward(T* out, const float* inp, int64_t n);
// dinp = dout * gelu'(inp), written. dinp may alias dout or inp.
void gelu_backward(float* dinp, const float* dout, const float* inp, int64_t n);
// The same over N rows of OC, with what follows it in a GPT MLP's backward
// done in the same pass over memory: dbias += the column sums of dinp (the
// c_fc bias gradient, summed in linear_backward's order, so the same sums)
// when dbias is given, and dinp16 = dinp rounded to bf16 (the c_fc GEMMs'
// operand in a bf16 run) when dinp16 is given. dout and inp are read once
// instead of three times. dinp may alias dout or inp. With dinp16 given, the
// gradient is the bf16 path's (as the forward above; within 2e-4), and dinp
// may be null: a bf16 run's GEMMs read only the bf16 copy and the bias
// gradient is summed here, so the fp32 gradient need not be written.
void gelu_backward(float* dinp, bf16* dinp16, float* dbias, const float* dout, const float* inp, int64_t N,
                   int64_t OC);

}  // namespace dpt
