#include "data/shard_sampler.h"

#include <algorithm>

#include "core/error.h"
#include "core/rng.h"

namespace dpt {

namespace {
// Windows of T+1 tokens at multiples of T in a shard of n tokens.
int64_t windows_in(int64_t n, int64_t T) { return n > T ? (n - 1) / T : 0; }
}  // namespace

int64_t ShardWindows::total(const TokenShards& shards, int64_t T) {
  int64_t w = 0;
  for (size_t s = 0; s < shards.count(); ++s) w += windows_in(shards.tokens(s), T);
  return w;
}

ShardWindows::ShardWindows(const TokenShards& shards, int64_t T, int64_t first, int64_t count)
    : shards_(shards), T_(T), first_(first) {
  starts_.push_back(0);
  for (size_t s = 0; s < shards.count(); ++s) starts_.push_back(starts_.back() + windows_in(shards.tokens(s), T));
  const int64_t all = starts_.back();
  count_ = count > 0 ? count : all - first;
  DPT_CHECK(first >= 0 && count_ >= 0 && first + count_ <= all, "windows [{}, {}) outside the {} of the shards",
            first, first + count_, all);
  scratch_.resize(static_cast<size_t>(T + 1));
}

void ShardWindows::fill(int64_t i, Batch& batch, int64_t b) const {
  DPT_CHECK(i >= 0 && i < count_, "window {} outside 0..{}", i, count_ - 1);
  const int64_t w = first_ + i;
  // The shard whose windows include w: the last start <= w.
  const size_t s = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), w) - starts_.begin()) - 1;
  shards_.read(s, (w - starts_[s]) * T_, T_ + 1, scratch_.data());
  std::copy(scratch_.begin(), scratch_.begin() + T_, batch.tokens.begin() + b * T_);
  std::copy(scratch_.begin() + 1, scratch_.end(), batch.targets.begin() + b * T_);
}

WindowPermutation::WindowPermutation(uint64_t n, uint64_t key) : n_(n), key_(key), half_bits_(1) {
  while (half_bits_ < 32 && (uint64_t{1} << (2 * half_bits_)) < n) ++half_bits_;
}

uint64_t WindowPermutation::round(uint64_t half, int r) const {
  return counter_bits(key_ + static_cast<uint64_t>(r) * 0x9E3779B97F4A7C15ULL, half) &
         ((uint64_t{1} << half_bits_) - 1);
}

uint64_t WindowPermutation::operator()(uint64_t i) const {
  DPT_CHECK(i < n_, "permutation index {} outside 0..{}", i, n_ - 1);
  const uint64_t mask = (uint64_t{1} << half_bits_) - 1;
  uint64_t x = i;
  do {  // cycle-walking: a bijection of the larger domain, applied until it lands in [0, n)
    uint64_t left = x >> half_bits_, right = x & mask;
    for (int r = 0; r < 4; ++r) {
      const uint64_t next = left ^ round(right, r);
      left = right;
      right = next;
    }
    x = (left << half_bits_) | right;
  } while (x >= n_);
  return x;
}

namespace {
uint64_t epoch_key(uint64_t seed, int64_t epoch) {
  return counter_bits(seed ^ 0x5A4D504C45520000ULL, static_cast<uint64_t>(epoch));
}
}  // namespace

ShardSampler::ShardSampler(const ShardWindows& windows, int64_t global_batch, uint64_t seed, int rank, int world)
    : windows_(windows),
      global_(global_batch),
      seed_(seed),
      rank_(rank),
      world_(world),
      perm_(static_cast<uint64_t>(std::max<int64_t>(windows.size(), 1)), epoch_key(seed, 0)) {
  if (global_batch > windows.size())
    throw InputError(fmt::format("the training data has {} windows of {} tokens, fewer than one global batch of {}",
                                 windows.size(), windows.T() + 1, global_batch));
}

void ShardSampler::set_state(SamplerState s) {
  if (s.epoch < 0 || s.position < 0 || s.position > windows_.size() || s.position % global_ != 0)
    throw InputError(fmt::format("sampler position {} of epoch {} does not fit {} windows in global batches of {}",
                                 s.position, s.epoch, windows_.size(), global_));
  state_ = s;
  perm_ = WindowPermutation(static_cast<uint64_t>(windows_.size()), epoch_key(seed_, s.epoch));
}

void ShardSampler::skip_steps(int64_t steps) {
  const int64_t per_epoch = steps_per_epoch();
  set_state({steps / per_epoch, (steps % per_epoch) * global_});
}

void ShardSampler::next(Batch& out, int64_t B) {
  // A step starts on a multiple of the global batch; one that would not fit
  // in this epoch starts the next.
  if (state_.position % global_ == 0 && state_.position + global_ > windows_.size())
    set_state({state_.epoch + 1, 0});
  const int64_t T = windows_.T();
  out.B = B;
  out.T = T;
  out.tokens.resize(static_cast<size_t>(B * T));
  out.targets.resize(static_cast<size_t>(B * T));
  const int64_t mine = state_.position + static_cast<int64_t>(rank_) * B;
  for (int64_t b = 0; b < B; ++b)
    windows_.fill(static_cast<int64_t>(perm_(static_cast<uint64_t>(mine + b))), out, b);
  state_.position += static_cast<int64_t>(world_) * B;
}

}  // namespace dpt
