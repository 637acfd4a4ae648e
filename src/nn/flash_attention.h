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

#include "core/dtype.h"

namespace dpt {

inline constexpr int64_t kFlashTile = 64;

// What the tile products read. F32: fp32 throughout (an fp32 run). BF16 (a
// --precision bf16 run, as PyTorch autocast's SDPA): the products read bf16
// copies of their inputs, rounded once as the tiles are packed, and
// accumulate in fp32 (AVX-512 BF16's vdpbf16ps where the CPU has it, else
// fp32 FMAs on the same bf16 values); the softmax, lse, the online
// rescaling, D = rowsum(dO O) and every output stay fp32. Two things keep
// the key biases' gradient (exactly zero in exact arithmetic) at fp32
// rounding rather than bf16 noise (docs/precision.md): the forward's P V
// reads the probabilities in fp32 (V in bf16), so D matches the backward's
// rowsum(P dP); and the bf16 rounding of dS, which breaks rowsum(dS) = 0, is
// summed per query row and taken back out of dK spread over the keys the
// row sees, so the keys' gradients sum as if dS had not been rounded.
enum class FlashProducts { F32, BF16 };

// out16 (a bf16 run's operand for the output projection; null: none):
// out's bf16 copy, each query tile's rows converted as soon as the kernel
// has written them (still in cache), not in a pass of its own.
void flash_attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t NH,
                             int64_t NKV, int64_t hd, FlashProducts products = FlashProducts::F32,
                             bf16* out16 = nullptr);

// dqkv written (as gqa_attention_backward's). Each (batch, key/value head)
// pair is one thread's work, its group's query heads in order: the bits do
// not depend on the thread count.
void flash_attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                              int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t hd,
                              FlashProducts products = FlashProducts::F32);

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
  FlashProducts products = FlashProducts::F32;
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
// Tests only: FlashProducts::BF16 through fp32 FMAs on the bf16 values (what
// runs on a CPU without AVX-512 BF16) even where vdpbf16ps would run.
void set_flash_attention_no_dpbf16_for_testing(bool on);
// Whether FlashProducts::BF16 runs on AVX-512 BF16's vdpbf16ps here (the
// CPU has it, this build holds the code, the bf16 GEMM setting does not
// widen the products (nn/gemm.h, bf16_dot_products_pay), no test switched
// it off).
bool flash_attention_dpbf16();

}  // namespace dpt
