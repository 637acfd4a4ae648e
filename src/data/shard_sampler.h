// Windows over token shards and the order they are trained in (docs/data.md).
//
// A window is T + 1 tokens starting at a multiple of T inside one shard (as
// llm.c reads them): shard s of n_s tokens has (n_s - 1) / T windows, and
// windows never cross shards. The windows of all shards are numbered in shard
// order, 0 .. W-1; a ShardWindows is a contiguous range of those numbers (the
// training part, or the held-out one) and knows where each window lies from
// the shards' prefix sums alone: O(shards) memory, never O(windows).
//
// An epoch visits every window of the range once, in a permutation drawn
// from (seed, epoch) that is computed on the fly (see WindowPermutation).
#pragma once

#include <cstdint>
#include <vector>

#include "data/token_shards.h"
#include "models/model.h"

namespace dpt {

class ShardWindows {
 public:
  // Windows [first, first + count) of the shards' numbering; count 0 to the end.
  ShardWindows(const TokenShards& shards, int64_t T, int64_t first = 0, int64_t count = 0);
  // Windows of every shard together.
  static int64_t total(const TokenShards& shards, int64_t T);

  int64_t size() const { return count_; }
  int64_t T() const { return T_; }
  // Writes window i of the range (0 <= i < size()) as row b of the batch:
  // tokens [b*T, (b+1)*T) are its first T tokens, targets the last T.
  void fill(int64_t i, Batch& batch, int64_t b) const;

 private:
  const TokenShards& shards_;
  int64_t T_, first_, count_;
  std::vector<int64_t> starts_;  // first global window of each shard, plus the total
  mutable std::vector<int32_t> scratch_;
};

// A bijection of [0, n), keyed: a 4-round Feistel network over the smallest
// even number of bits that holds n, and cycle-walking (apply again while the
// value is >= n) to stay inside [0, n). The domain is under 4n, so a value
// takes fewer than 4 applications on average. Memory: three integers.
class WindowPermutation {
 public:
  WindowPermutation(uint64_t n, uint64_t key);
  uint64_t operator()(uint64_t i) const;

 private:
  uint64_t round(uint64_t half, int r) const;
  uint64_t n_, key_;
  int half_bits_;
};

// The sampler's position, all it needs to resume exactly: the epoch, and the
// windows of that epoch already handed out across all ranks (a multiple of
// the global batch between steps). A checkpoint records it in its manifest
// (DataSource::position) and a resumed run gets there with skip_steps.
struct SamplerState {
  int64_t epoch = 0;
  int64_t position = 0;
};

// Training batches from a ShardWindows range. Each optimizer step takes the
// next `global_batch` windows of the epoch's permutation; a micro-step takes
// the next world x B of them, and rank r keeps positions [rB, (r+1)B) of
// those. So the windows of every step are the same whatever the world size
// and gradient accumulation (only the global batch matters), the ranks'
// windows are disjoint, and no window repeats within an epoch. When fewer
// than global_batch windows are left, the epoch ends (the tail is dropped,
// as drop_last does) and the next one is drawn from (seed, epoch + 1).
class ShardSampler {
 public:
  ShardSampler(const ShardWindows& windows, int64_t global_batch, uint64_t seed, int rank = 0, int world = 1);
  void next(Batch& out, int64_t B);  // B: this rank's windows per micro-step

  SamplerState state() const { return state_; }
  // Resumes at a state another sampler of the same data, seed and global
  // batch returned (InputError if it does not fit this dataset).
  void set_state(SamplerState s);
  // Where the sampler stands after `steps` optimizer steps from the start
  // (a resumed run): O(1), since every step takes one global batch.
  void skip_steps(int64_t steps);
  int64_t steps_per_epoch() const { return windows_.size() / global_; }

 private:
  const ShardWindows& windows_;
  int64_t global_;
  uint64_t seed_;
  int rank_, world_;
  SamplerState state_;
  WindowPermutation perm_;
};

}  // namespace dpt
