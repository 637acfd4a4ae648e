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

// One block pair of ring attention (context parallelism, docs/context_parallel.md):
// Tq query rows against Tk key/value rows of other layouts, where query row
// r sees key row c exactly when r + delta >= c (delta = the first query's
// position minus the first key's: 0 on a chunk's own diagonal, >= Tk where
// every key is earlier). Strides in floats: query head h of row r of
// sequence b at q[b q_batch + r q_ld + h hd]; key/value head g of row c at
// k[b kv_batch + c kv_ld + g hd] (v likewise); out and dout [b out_batch +
// r out_ld + h hd]; lse [(b NH + h) lse_T + r].
struct FlashBlock {
  int64_t B, NH, NKV, hd;
  int64_t Tq, Tk, delta;
  const float* q;
  int64_t q_ld, q_batch;
  const float* k;
  const float* v;
  int64_t kv_ld, kv_batch;
  int64_t out_ld, out_batch, lse_T;
};

// Merges the block's attention into (out, lse): on entry they hold the
// softmax-weighted output and log-sum-exp of the keys seen so far (lse
// -infinity for a row that has seen none: its out is not read), on exit
// those of the union. A row that sees no key of the block is left as it was.
void flash_block_forward(const FlashBlock& blk, float* out, float* lse);

// The block's part of the gradients, given the final out and lse (of every
// block) and dout: added into dq (q's layout: q_ld, q_batch) and into dk and
// dv (k's layout). Each (sequence, key/value head) pair is one thread's work:
// the bits do not depend on the thread count.
void flash_block_backward(const FlashBlock& blk, const float* out, const float* dout, const float* lse, float* dq,
                          float* dk, float* dv);

// Tests only: the 8-float-vector products (what runs without AVX-512) even
// where the 16-float ones would, so an AVX-512 host checks both.
void set_flash_attention_narrow_for_testing(bool on);

}  // namespace dpt
