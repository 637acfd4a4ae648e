// Linear layer (PyTorch nn.Linear): out = inp @ weight^T + bias.
//   inp    [N, C]   N rows (B*T for a sequence model)
//   weight [OC, C]  PyTorch's [out, in] layout
//   bias   [OC]     or nullptr
//   out    [N, OC]
// GEMMs go through nn/gemm.h (OpenBLAS or oneDNN).
//
// T is the GEMM operands' type: float, or bf16 in a mixed-precision run
// (inputs, weights and output gradients as bf16 compute copies; outputs,
// gradients and biases fp32, the products accumulated in fp32).
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace dpt {

template <typename T>
void linear_forward(float* out, const T* inp, const T* weight, const float* bias, int64_t N, int64_t C,
                    int64_t OC);

// The three parts of backward, for callers that report gradients as they
// become final (the MLP does the weight in row blocks):
// dinp = dout @ weight (written)
template <typename T>
void linear_backward_input(float* dinp, const T* dout, const T* weight, int64_t N, int64_t C, int64_t OC);
// dweight[o0:o1, :] += dout[:, o0:o1]^T @ inp   (rows o0..o1-1 of the weight;
// accumulated, for gradient accumulation). The last bits of a row may depend
// on the blocks (OpenBLAS's AVX2 kernels round a block's edge rows their own
// way, and oneDNN picks its kernel by shape), so a caller that wants
// reproducible runs always uses the same blocks.
template <typename T>
void linear_backward_weight(float* dweight, const T* dout, const T* inp, int64_t N, int64_t C, int64_t OC,
                            int64_t o0, int64_t o1);
// dbias += sum_n dout   (accumulated)
// (fp32 always: a bf16 run sums its bias gradients from the fp32 output
// gradient, docs/precision.md says why.)
void linear_backward_bias(float* dbias, const float* dout, int64_t N, int64_t OC);
// A bf16 backward's two reads of its fp32 output gradient in one pass:
// dout16 = dout rounded to bf16 (convert's rounding), and dbias += the sums
// linear_backward_bias makes, bit for bit (each column over the rows in
// order, from zero, then added). Without it, the GEMMs' operand would be a
// conversion pass of its own over the same N x OC gradient.
void linear_backward_bias_bf16(float* dbias, bf16* dout16, const float* dout, int64_t N, int64_t OC);

// All of it: dinp (skipped when nullptr: the first layer of a model needs no
// input gradient, nor a split backward's W), dweight (all rows; skipped
// when nullptr: a split backward's B), dbias (skipped when nullptr) from
// dout_bias: dout itself in fp32; a bf16 run passes the fp32 gradient that
// dout was converted from.
template <typename T>
void linear_backward(float* dinp, float* dweight, float* dbias, const T* dout, const T* inp, const T* weight,
                     int64_t N, int64_t C, int64_t OC, const float* dout_bias = nullptr);

}  // namespace dpt
