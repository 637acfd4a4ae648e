// LayerNorm over the last dimension (PyTorch nn.LayerNorm, eps 1e-5).
//   inp [N, C], weight [C], bias [C] -> out [N, C]
//   mean [N], rstd [N]: saved for backward (rstd = 1 / sqrt(var + eps))
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace dpt {

constexpr float kLayerNormEps = 1e-5f;

// out is float, or bf16 when the LayerNorm feeds a bf16 GEMM (written
// directly, no fp32 copy: backward needs only inp, mean and rstd).
template <typename T>
void layernorm_forward(T* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                       int64_t N, int64_t C);

// dinp    += gradient w.r.t. inp. Accumulated, not written: a LayerNorm's
//            input is always the residual stream, whose gradient already
//            holds the skip connection's share (see nn/residual.h).
// dweight += sum_n dout * xhat;  dbias += sum_n dout, each sum added to the
//            gradient in one addition (so into zeros, then added, is bitwise
//            the same: models/decoder_split.cpp relies on it)
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int64_t N, int64_t C);

}  // namespace dpt
