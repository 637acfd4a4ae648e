#include "data/distributed_sampler.h"

#include "core/error.h"
#include "core/rng.h"

namespace dpt {

DistributedSampler::Tail DistributedSampler::parse_tail(const std::string& s) {
  if (s == "drop") return Tail::Drop;
  if (s == "pad") return Tail::Pad;
  throw InputError(fmt::format("unknown sampler tail '{}' (expected drop or pad)", s));
}

DistributedSampler::DistributedSampler(int64_t dataset_size, int rank, int world, uint64_t seed, Tail tail)
    : size_(dataset_size), rank_(rank), world_(world), seed_(seed), tail_(tail) {
  if (world < 1 || rank < 0 || rank >= world) throw InputError(fmt::format("rank {} of world {}", rank, world));
  if (dataset_size < world)
    throw InputError(fmt::format("{} samples cannot be shared among {} ranks", dataset_size, world));
  perm_.resize(static_cast<size_t>(size_));
  set_epoch(0);
}

void DistributedSampler::set_epoch(int64_t epoch) {
  if (epoch == epoch_) return;
  epoch_ = epoch;
  // Fisher-Yates from a generator seeded by (seed, epoch) alone, so every
  // rank draws the same permutation without talking to the others.
  for (int64_t i = 0; i < size_; ++i) perm_[static_cast<size_t>(i)] = i;
  Rng rng(seed_ * 1000003ULL + static_cast<uint64_t>(epoch));
  for (size_t i = perm_.size(); i > 1; --i) std::swap(perm_[i - 1], perm_[rng.below(i)]);
  const int64_t total = tail_ == Tail::Drop ? size_ / world_ * world_ : (size_ + world_ - 1) / world_ * world_;
  share_.clear();
  for (int64_t p = rank_; p < total; p += world_) share_.push_back(perm_[static_cast<size_t>(p % size_)]);
}

}  // namespace dpt
