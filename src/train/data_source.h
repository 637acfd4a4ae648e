// Where a rank's training batches come from: its share of Fashion-MNIST, its
// slice of each global batch of corpus windows, or synthetic batches; plus
// the held-out data for evaluation.
#pragma once

#include <memory>
#include <optional>

#include "data/batches.h"
#include "data/byte_corpus.h"
#include "data/fashion_mnist.h"
#include "train/evaluate.h"
#include "train/train.h"

namespace dpt {

class DataSource {
 public:
  // micro: samples per micro-batch on this rank.
  DataSource(const TrainOptions& o, const Model& model, int64_t micro, int rank, int world);
  void next(Batch& b);
  // Steps of `o.epochs` epochs (mlp on real data), else 0.
  int64_t steps_for_epochs(int64_t epochs, int64_t grad_accum) const;
  bool evaluable() const { return !synthetic_; }
  // This rank's share of the held-out data; combine() across ranks.
  EvalResult evaluate(Model& model, int64_t batch, int64_t max_windows, int rank, int world) const;

 private:
  bool synthetic_ = false;
  int64_t micro_;
  std::optional<ImageSet> train_images_, test_images_;
  std::optional<ByteCorpus> corpus_;
  std::unique_ptr<ImageEpochs> epochs_;
  std::unique_ptr<WindowSampler> windows_;
  Batch synthetic_batch_;
};

}  // namespace dpt
