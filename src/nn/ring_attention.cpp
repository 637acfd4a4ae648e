#include "nn/ring_attention.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "nn/flash_attention.h"

namespace dpt {

namespace {

// The keys and values of every local row, [B, Tl, 2 NKV hd]: the block a
// rank puts on the ring.
void pack_kv(float* kv, const float* qkv, const RingShape& s) {
  const int64_t ld = (s.NH + 2 * s.NKV) * s.hd, w = 2 * s.NKV * s.hd, rows = s.B * s.Tl;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) std::memcpy(kv + r * w, qkv + r * ld + s.NH * s.hd, sizeof(float) * w);
}

// The block pair of local chunk qi (0: chunk `rank`, 1: chunk 2N - 1 -
// rank) and chunk ki of rank src's block (kv); false where the query chunk
// comes before the key chunk (no query sees a key).
bool pair(const RingShape& s, int rank, int src, int size, int qi, int ki, const float* qkv, const float* kv,
          FlashBlock& blk) {
  const int64_t q_chunk = qi == 0 ? rank : 2 * size - 1 - rank;
  const int64_t k_chunk = ki == 0 ? src : 2 * size - 1 - src;
  if (q_chunk < k_chunk) return false;
  const int64_t half = s.Tl / 2, ld = (s.NH + 2 * s.NKV) * s.hd, w = 2 * s.NKV * s.hd;
  blk = FlashBlock{.B = s.B,
                   .NH = s.NH,
                   .NKV = s.NKV,
                   .hd = s.hd,
                   .Tq = half,
                   .Tk = half,
                   .delta = (q_chunk - k_chunk) * half,
                   .q = qkv + qi * half * ld,
                   .q_ld = ld,
                   .q_batch = s.Tl * ld,
                   .k = kv + ki * half * w,
                   .v = kv + ki * half * w + s.NKV * s.hd,
                   .kv_ld = w,
                   .kv_batch = s.Tl * w,
                   .out_ld = s.NH * s.hd,
                   .out_batch = s.Tl * s.NH * s.hd,
                   .lse_T = s.Tl,
                   .products = s.products};
  return true;
}

}  // namespace

void ring_attention_forward(float* out, float* lse, const float* qkv, const RingShape& s, ContextRing& ring,
                            float* scratch) {
  const int N = ring.size(), r = ring.rank();
  const size_t n = s.block();
  const int64_t half = s.Tl / 2, ldo = s.NH * s.hd;
  float *cur = scratch, *next = scratch + n;
  pack_kv(cur, qkv, s);
  std::fill(lse, lse + s.B * s.NH * s.Tl, -std::numeric_limits<float>::infinity());
  for (int t = 0; t < N; ++t) {
    const int src = (r - t + N) % N;  // whose keys and values `cur` holds
    if (t + 1 < N) ring.start(cur, next, n);
    for (int qi = 0; qi < 2; ++qi)
      for (int ki = 0; ki < 2; ++ki) {
        FlashBlock blk;
        if (pair(s, r, src, N, qi, ki, qkv, cur, blk)) flash_block_forward(blk, out + qi * half * ldo, lse + qi * half);
      }
    if (t + 1 < N) {
      ring.wait();
      std::swap(cur, next);
    }
  }
}

void ring_attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                             const RingShape& s, ContextRing& ring, float* scratch) {
  const int N = ring.size(), r = ring.rank();
  const size_t n = s.block();
  const int64_t half = s.Tl / 2, ld = (s.NH + 2 * s.NKV) * s.hd, ldo = s.NH * s.hd, w = 2 * s.NKV * s.hd;
  const int64_t rows = s.B * s.Tl;
  float *kv = scratch, *kv_next = kv + n, *acc = kv_next + n, *acc_prev = acc + n, *acc_in = acc_prev + n;
  pack_kv(kv, qkv, s);
  for (int64_t i = 0; i < rows; ++i) std::fill(dqkv + i * ld, dqkv + i * ld + s.NH * s.hd, 0.0f);
  for (int t = 0; t < N; ++t) {
    const int src = (r - t + N) % N;
    // The next block's keys and values, and the gradient the previous rank
    // summed for this step's block, travel while this rank computes its part.
    if (t + 1 < N) ring.start(kv, kv_next, n);
    if (t > 0) ring.start(acc_prev, acc_in, n);
    std::fill(acc, acc + n, 0.0f);
    for (int qi = 0; qi < 2; ++qi)
      for (int ki = 0; ki < 2; ++ki) {
        FlashBlock blk;
        if (!pair(s, r, src, N, qi, ki, qkv, kv, blk)) continue;
        float* dk = acc + ki * half * w;
        flash_block_backward(blk, out + qi * half * ldo, dout + qi * half * ldo, lse + qi * half,
                             dqkv + qi * half * ld, dk, dk + s.NKV * s.hd);
      }
    ring.wait();
    if (t > 0)
      for (size_t i = 0; i < n; ++i) acc[i] += acc_in[i];
    std::swap(kv, kv_next);
    std::swap(acc, acc_prev);
  }
  // acc_prev is the whole gradient of the next rank's block; this rank's
  // comes from the previous one.
  ring.start(acc_prev, acc_in, n);
  ring.wait();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < rows; ++i) std::memcpy(dqkv + i * ld + s.NH * s.hd, acc_in + i * w, sizeof(float) * w);
}

}  // namespace dpt
