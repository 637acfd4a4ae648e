// RMSNorm over the last dimension (Llama's LlamaRMSNorm, Qwen2's Qwen2RMSNorm):
//   out = x * rsqrt(mean(x^2) + eps) * weight, computed in fp32.
//   inp [N, C], weight [C] -> out [N, C]
//   rstd [N]: saved for backward (rstd = 1 / sqrt(mean(x^2) + eps))
// No bias and no mean subtraction: that is what sets it apart from LayerNorm.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace dpt {

// out is float, or bf16 when the RMSNorm feeds a bf16 GEMM (as LayerNorm's).
template <typename T>
void rmsnorm_forward(T* out, float* rstd, const float* inp, const float* weight, int64_t N, int64_t C,
                     float eps);

// dinp    += gradient w.r.t. inp. Accumulated, not written: an RMSNorm's
//            input is the residual stream (layernorm_backward's convention).
// dweight += sum_n dout * xhat, xhat = x * rstd. The rows' partial sums are
//            added to each other in thread order, their total to dweight in
//            one addition (as layernorm_backward): reproducible for a given
//            thread count.
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int64_t N, int64_t C);

}  // namespace dpt
