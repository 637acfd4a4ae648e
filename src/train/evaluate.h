// Evaluation passes (forward only) over held-out data.
#pragma once

#include <cstdint>

#include "data/fashion_mnist.h"
#include "models/model.h"

namespace dpt {

struct EvalResult {
  double loss = 0.0;      // mean cross-entropy over every target
  double accuracy = 0.0;  // fraction of targets that are the argmax
  int64_t count = 0;      // targets evaluated
};

// Every image of the set once, in order, `batch` at a time (the last batch
// may be smaller).
EvalResult evaluate_images(Model& model, const ImageSet& set, int64_t batch);

// Consecutive non-overlapping windows of T+1 bytes from the start of
// [data, data + n), the last partial window dropped; at most max_windows of
// them when max_windows > 0.
EvalResult evaluate_text(Model& model, const uint8_t* data, size_t n, int64_t batch,
                         int64_t max_windows);

}  // namespace dpt
