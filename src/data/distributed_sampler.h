// Which samples each rank sees, epoch by epoch (PyTorch's
// torch.utils.data.DistributedSampler): every epoch, a permutation of the
// dataset drawn from (seed, epoch), the same on every rank; cut to a
// multiple of the world size (Tail::Drop drops the last samples of the
// permutation, Tail::Pad repeats its first ones); rank r takes positions
// r, r + N, r + 2N, ... So the shares are disjoint (with Drop), cover the
// dataset, and the samples of step t across all ranks are exactly the
// samples a single process with an N-times larger batch takes at step t.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dpt {

class DistributedSampler {
 public:
  enum class Tail { Drop, Pad };
  static Tail parse_tail(const std::string& s);  // "drop" | "pad"; InputError otherwise

  DistributedSampler(int64_t dataset_size, int rank, int world, uint64_t seed, Tail tail);
  // Draws epoch `epoch`'s permutation and this rank's share of it.
  void set_epoch(int64_t epoch);
  const std::vector<int64_t>& indices() const { return share_; }
  int64_t epoch() const { return epoch_; }

 private:
  int64_t size_;
  int rank_, world_;
  uint64_t seed_;
  Tail tail_;
  int64_t epoch_ = -1;
  std::vector<int64_t> perm_, share_;
};

}  // namespace dpt
