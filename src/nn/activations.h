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
// out is float, or bf16 when it feeds a bf16 GEMM.
template <typename T>
void gelu_forward(T* out, const float* inp, int64_t n);
// dinp = dout * gelu'(inp), written. dinp may alias dout.
void gelu_backward(float* dinp, const float* dout, const float* inp, int64_t n);

}  // namespace dpt
