// Token and position embeddings (GPT-2's wte and wpe).
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace dpt {

// out[n, :] = table[ids[n], :]   (written)
//   ids [N] in [0, V), table [V, C], out [N, C]
// The table is fp32, or the bf16 compute copy of a mixed-precision run
// (widened into the fp32 residual stream).
template <typename T>
void embedding_forward(float* out, const int32_t* ids, const T* table, int64_t N, int64_t C);
// dtable[ids[n], :] += dout[n, :]
void embedding_backward(float* dtable, const float* dout, const int32_t* ids, int64_t N, int64_t C);

// Learned position embedding, added to a [B, T, C] activation:
// out[b, t, :] += pos[t, :]   (pos [T_max, C], T <= T_max)
template <typename P>
void position_embedding_forward(float* out, const P* pos, int64_t B, int64_t T, int64_t C);
// dpos[t, :] += sum_b dout[b, t, :]
void position_embedding_backward(float* dpos, const float* dout, int64_t B, int64_t T, int64_t C);

}  // namespace dpt
