// Where a rank's training batches come from: its share of Fashion-MNIST, its
// slice of each global batch of corpus windows, or synthetic batches; plus
// the held-out data for evaluation.
#pragma once

#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "data/batches.h"
#include "data/byte_corpus.h"
#include "data/fashion_mnist.h"
#include "data/shard_sampler.h"
#include "data/token_shards.h"
#include "train/evaluate.h"
#include "train/train.h"

namespace dpt {

// The data of a run, read from disk once and shared by every DataSource
// (DP's replicas all read the same sets). Empty for synthetic runs.
struct Datasets {
  std::optional<ImageSet> train_images, test_images;  // mlp
  std::optional<ByteCorpus> corpus, val_corpus;       // gpt on text (val_corpus: --val-data)
  // gpt on token shards (data/token_shards.h): windows [0, train_windows) of
  // `tokens` train; the held-out windows are [val_first, val_first +
  // val_windows) of val_tokens (--val-data) or, without it, of `tokens`.
  std::unique_ptr<TokenShards> tokens, val_tokens;
  int64_t train_windows = 0, val_first = 0, val_windows = 0;
  const TokenShards* held_out() const { return val_tokens ? val_tokens.get() : tokens.get(); }
};
std::shared_ptr<const Datasets> load_datasets(const TrainOptions& o, const Model& model);

class DataSource {
 public:
  // micro: samples per micro-batch on this rank.
  DataSource(const TrainOptions& o, const Model& model, std::shared_ptr<const Datasets> sets, int64_t micro,
             int rank, int world);
  void next(Batch& b);
  // Moves to where the data stands after `steps` optimizer steps of
  // `global_batch` samples in `grad_accum` micro-batches each (a resumed
  // run). The global batch of a step is the same at any world size, so a
  // run resumed on other ranks sees the same samples.
  void skip_steps(int64_t steps, int64_t global_batch, int64_t grad_accum);
  // Where the data stands, for a checkpoint's manifest (token shards: the
  // ShardSampler's epoch and windows handed out).
  nlohmann::json position() const;
  // The run's optimizer steps: --steps, else o.epochs epochs (mlp on real
  // data; W-MLP's 3 epochs, 702 steps, when synthetic), else 200 (gpt).
  int64_t steps(const TrainOptions& o) const;
  // False for synthetic runs and for a corpus with no held-out part
  // (--val-fraction 0): there is nothing to evaluate on.
  bool evaluable() const;
  // This rank's share of the held-out data; combine() across ranks.
  // forward: what evaluates a batch instead of model.forward (a pipeline's).
  EvalResult evaluate(Model& model, int64_t batch, int64_t max_windows, int rank, int world,
                      const ForwardFn* forward = nullptr) const;

 private:
  bool synthetic_ = false;
  int64_t micro_;
  std::shared_ptr<const Datasets> sets_;
  std::unique_ptr<ImageEpochs> epochs_;
  std::unique_ptr<WindowSampler> windows_;
  // Token shards: this source's views of the windows (each holds a small
  // scratch buffer, so DP's replica threads each have their own).
  std::unique_ptr<ShardWindows> train_windows_, val_windows_;
  std::unique_ptr<ShardSampler> shard_sampler_;
  Batch synthetic_batch_;
};

}  // namespace dpt
