// Linear layer (PyTorch nn.Linear): out = inp @ weight^T + bias.
//   inp    [N, C]   N rows (B*T for a sequence model)
//   weight [OC, C]  PyTorch's [out, in] layout
//   bias   [OC]     or nullptr
//   out    [N, OC]
// GEMMs go to OpenBLAS; every call is one sgemm.
#pragma once

#include <cstdint>

namespace dpt {

void linear_forward(float* out, const float* inp, const float* weight, const float* bias, int64_t N,
                    int64_t C, int64_t OC);

// dinp  = dout @ weight       (written, skipped when dinp is nullptr: the
//                              first layer of a model needs no input grad)
// dweight += dout^T @ inp     (accumulated, for gradient accumulation)
// dbias   += sum_n dout       (accumulated; skipped when dbias is nullptr)
void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int64_t N, int64_t C, int64_t OC);

}  // namespace dpt
