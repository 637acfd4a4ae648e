// Evaluation passes (forward only) over held-out data, split across ranks.
//
// Each rank evaluates a contiguous share of the samples (chunk_range of
// them) and the shares' sums are combined, so every sample is counted exactly
// once and a distributed evaluation equals a single-process one.
#pragma once

#include <cstdint>
#include <functional>

#include "comm/process_group.h"
#include "data/fashion_mnist.h"
#include "data/shard_sampler.h"
#include "models/model.h"

namespace dpt {

struct EvalResult {
  double loss_sum = 0.0;  // cross-entropy summed over targets
  int64_t correct = 0;    // targets that are the argmax
  int64_t count = 0;      // targets evaluated
  double loss() const { return count ? loss_sum / static_cast<double>(count) : 0.0; }
  double accuracy() const { return count ? static_cast<double>(correct) / static_cast<double>(count) : 0.0; }
};

// What evaluates one batch when it is not the model's own forward: a
// pipeline's (train/pipeline_executor.h), whose last stage returns the
// statistics and the others zeros, so combine() over every rank still
// counts each target once.
using ForwardFn = std::function<ForwardStats(const Batch&)>;

// Images [chunk(rank)] of the set, in order, `batch` at a time.
EvalResult evaluate_images(Model& model, const ImageSet& set, int64_t batch, int rank = 0, int world = 1);

// Consecutive non-overlapping windows of T+1 bytes from the start of
// [data, data + n), the last partial window dropped; at most max_windows of
// them when max_windows > 0; this rank takes its chunk of those windows.
EvalResult evaluate_text(Model& model, const uint8_t* data, size_t n, int64_t batch, int64_t max_windows,
                         int rank = 0, int world = 1, const ForwardFn* forward = nullptr);

// The windows of a token-shard range in order, each exactly once (at most
// max_windows of them when max_windows > 0); this rank takes its chunk.
EvalResult evaluate_windows(Model& model, const ShardWindows& windows, int64_t batch, int64_t max_windows,
                            int rank = 0, int world = 1, const ForwardFn* forward = nullptr);

// Sums the ranks' results in rank order (exact: the sums travel as doubles).
EvalResult combine(const EvalResult& mine, comm::ProcessGroup& pg);

}  // namespace dpt
