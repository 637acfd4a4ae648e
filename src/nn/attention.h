// Multi-head causal self-attention (the core, between c_attn and c_proj).
//   qkv [B, T, 3C]: q, k, v stacked along the last dimension, each split
//                   into NH heads of hs = C / NH channels
//   out [B, T, C]:  heads concatenated
//   att [B, NH, T, T]: softmax(q k^T / sqrt(hs)) with the causal mask,
//                   saved for backward (entries above the diagonal are 0)
// Every (batch, head) pair is two small GEMMs; threads split the pairs.
#pragma once

#include <cstdint>

namespace dpt {

void attention_forward(float* out, float* att, const float* qkv, int64_t B, int64_t T, int64_t C,
                       int64_t NH);

// dqkv = gradient w.r.t. qkv, written.
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att,
                        int64_t B, int64_t T, int64_t C, int64_t NH);

}  // namespace dpt
