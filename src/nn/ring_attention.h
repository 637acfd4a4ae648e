// Causal attention over sequences split across the N ranks of a context-
// parallel group (ring attention; Liu et al. 2023, with the zig-zag chunk
// placement of Megatron-LM's and torchtitan's context parallelism;
// docs/context_parallel.md). Each sequence of T tokens is cut into 2N chunks
// of T / 2N; rank r holds chunks r and 2N - 1 - r (its Tl = T / N local
// rows: chunk r's first, then chunk 2N - 1 - r's), so every rank has the
// same causal work. Its queries meet every rank's keys and values as those
// travel round the ring, one rank's block per step, the next block's
// transfer running while the current one is computed (nn/flash_attention.h's
// block kernel, the partial results merged by their log-sum-exps).
//
// Backward passes the blocks round once more, with the gradient of each
// block's keys and values following one step behind it, each rank adding
// its part, until it reaches the block's owner again.
//
// Layouts as the fused attention's (nn/flash_attention.h) over the local
// rows: qkv [B, Tl, (NH + 2 NKV) hd], out [B, Tl, NH hd], lse [B, NH, Tl].
#pragma once

#include <cstddef>
#include <cstdint>

#include "nn/flash_attention.h"

namespace dpt {

// What ring attention asks of its CP group. start() begins sending n floats
// at `send` to the next rank (rank + 1 mod size) and receiving n floats from
// the previous one into `recv`; neither buffer may be touched until wait(),
// which ends every exchange started. Exchanges complete in the order they
// start.
class ContextRing {
 public:
  virtual ~ContextRing() = default;
  virtual int size() const = 0;
  virtual int rank() const = 0;
  virtual void start(const float* send, float* recv, size_t n) = 0;
  virtual void wait() = 0;
};

// The position in its sequence of local row `row` (of Tl) on rank `rank` of
// `size`.
inline int64_t context_position(int64_t row, int64_t Tl, int rank, int size) {
  const int64_t half = Tl / 2;
  return row < half ? rank * half + row : (2 * size - 1 - rank) * half + (row - half);
}

struct RingShape {
  int64_t B, Tl, NH, NKV, hd;
  FlashProducts products = FlashProducts::F32;  // a bf16 run's: FlashProducts::BF16
  // Floats of one block on the ring: every local row's keys and values.
  size_t block() const { return static_cast<size_t>(B * Tl * 2 * NKV * hd); }
  // Floats of the scratch forward and backward use: two blocks forward
  // (the one computed, the one arriving); five backward (those two, the
  // gradient being summed, the one leaving and the one arriving).
  size_t scratch() const { return 5 * block(); }
};

void ring_attention_forward(float* out, float* lse, const float* qkv, const RingShape& s, ContextRing& ring,
                            float* scratch);

// dqkv written whole (every local row's q, k and v gradients).
void ring_attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                             const RingShape& s, ContextRing& ring, float* scratch);

}  // namespace dpt
