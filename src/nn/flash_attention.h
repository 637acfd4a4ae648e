// Causal attention without the T x T matrix (FlashAttention's tiling with an
// online softmax; Dao et al. 2022, and FlashAttention-2's backward), for
// long contexts (issue 35). The same layouts as grouped-query attention
// (nn/gqa_attention.h: qkv rows of NH query heads, then NKV key heads, then
// NKV value heads, hd channels each; out [B, T, NH hd]; query head h reads
// key/value head h / (NH / NKV)), and the same results within rounding; what
// it keeps for backward is lse [B, NH, T], the log of each row's softmax
// sum (with its maximum), not the probabilities: O(B NH T) floats where the
// unfused layer keeps B NH T^2.
//
// Queries and keys go in tiles of kFlashTile rows; each tile pair is a few
// register-blocked products on packed copies of the tiles, and the keys a
// block of queries cannot see (above the diagonal) are never computed.
// Backward recomputes each tile's probabilities from lse.
#pragma once

#include <cstdint>

namespace dpt {

inline constexpr int64_t kFlashTile = 64;

void flash_attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t NH,
                             int64_t NKV, int64_t hd);

// dqkv written (as gqa_attention_backward's). Each (batch, key/value head)
// pair is one thread's work, its group's query heads in order: the bits do
// not depend on the thread count.
void flash_attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                              int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t hd);

// Tests only: the 8-float-vector products (what runs without AVX-512) even
// where the 16-float ones would, so an AVX-512 host checks both.
void set_flash_attention_narrow_for_testing(bool on);

}  // namespace dpt
