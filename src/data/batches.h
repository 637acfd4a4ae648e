// Turning datasets into training batches: seeded and reproducible.
#pragma once

#include <cstdint>
#include <vector>

#include "core/rng.h"
#include "data/distributed_sampler.h"
#include "data/fashion_mnist.h"
#include "models/model.h"

namespace dpt {

// Copies images indices[0..B) into batch.features (scaled to [0, 1]) and
// their labels into batch.targets.
void fill_image_batch(const ImageSet& set, const int64_t* indices, int64_t B, Batch& batch);

// Epochs over an image set, `batch` images at a time from this rank's share
// (see DistributedSampler; a single process is rank 0 of 1). When fewer than
// `batch` images are left in the share, the epoch ends (the tail is dropped,
// as PyTorch's DataLoader with drop_last=True), so every step sees a full batch.
class ImageEpochs {
 public:
  ImageEpochs(const ImageSet& set, int64_t batch, uint64_t seed, int rank = 0, int world = 1,
              DistributedSampler::Tail tail = DistributedSampler::Tail::Drop);
  void next(Batch& out);  // moves to the next epoch when this one runs out
  // Moves past `batches` batches without copying them (a resumed run).
  void skip(int64_t batches);
  int64_t epoch() const { return sampler_.epoch(); }
  int64_t position() const { return pos_; }  // images of this epoch's share taken
  int64_t steps_per_epoch() const;

 private:
  const ImageSet& set_;
  int64_t batch_;
  DistributedSampler sampler_;
  int64_t pos_ = 0;
};

// Random windows of T+1 bytes from [data, data + n): inputs are the first
// T bytes, targets the last T (the next byte at every position).
//
// Across ranks, every rank draws the offsets of the whole global batch
// (world x B) from the same generator and keeps its own slice, so rank r of
// N sees exactly the windows a single process with batch N x B sees at
// positions [rB, (r+1)B).
class WindowSampler {
 public:
  WindowSampler(const uint8_t* data, size_t n, int64_t T, uint64_t seed, int rank = 0, int world = 1);
  void next(Batch& out, int64_t B);
  // Moves past `windows` windows of the global stream (every rank's), as
  // next() would: a resumed run continues the same stream whatever its
  // world size, since a step always draws the global batch.
  void skip(int64_t windows);

 private:
  const uint8_t* data_;
  size_t n_;
  int64_t T_;
  Rng rng_;
  int rank_, world_;
};

// Fills batch with consecutive, non-overlapping windows of T+1 bytes
// starting at window `first` (window w covers bytes [w(T+1), (w+1)(T+1))).
// Returns how many windows were filled (fewer than B at the end).
int64_t fill_sequential_windows(const uint8_t* data, size_t n, int64_t T, int64_t first, int64_t B,
                                Batch& batch);

// Random batches of the right shape for benchmarks that must not measure
// data loading.
void fill_synthetic(const Model& model, int64_t B, uint64_t seed, Batch& batch);

}  // namespace dpt
