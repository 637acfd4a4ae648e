#include "train/data_source.h"

#include "core/error.h"
#include "models/mlp.h"

namespace dpt {

DataSource::DataSource(const TrainOptions& o, const Model& model, int64_t micro, int rank, int world)
    : synthetic_(o.synthetic), micro_(micro) {
  if (o.synthetic) {
    // Each rank its own random batch; the same every step.
    fill_synthetic(model, micro, o.seed + static_cast<uint64_t>(rank), synthetic_batch_);
  } else if (model.kind() == "mlp") {
    std::string dir = o.data.empty() ? kFashionMnistDir : o.data;
    train_images_ = load_fashion_mnist(dir, "train");
    test_images_ = load_fashion_mnist(dir, "test");
    const int64_t pixels = static_cast<int64_t>(train_images_->rows) * train_images_->cols;
    const int64_t inputs = dynamic_cast<const Mlp&>(model).config().sizes.front();
    if (inputs != pixels)
      throw InputError(fmt::format("the MLP takes {} inputs but the images have {} pixels", inputs, pixels));
    epochs_ = std::make_unique<ImageEpochs>(*train_images_, micro, o.seed, rank, world,
                                            DistributedSampler::parse_tail(o.sampler_tail));
  } else {
    std::string path = o.data.empty() ? kFortunesDir : o.data;
    const int64_t T = model.positions();
    corpus_ = ByteCorpus::load(path, o.val_fraction, static_cast<size_t>(T + 1));
    windows_ = std::make_unique<WindowSampler>(corpus_->train(), corpus_->train_size(), T, o.seed, rank, world);
  }
}

void DataSource::next(Batch& b) {
  if (synthetic_) {
    b = synthetic_batch_;  // same sizes every step: copying reuses b's storage
  } else if (epochs_) {
    epochs_->next(b);
  } else {
    windows_->next(b, micro_);
  }
}

int64_t DataSource::steps_for_epochs(int64_t epochs, int64_t grad_accum) const {
  return epochs_ ? epochs * epochs_->steps_per_epoch() / grad_accum : 0;
}

EvalResult DataSource::evaluate(Model& model, int64_t batch, int64_t max_windows, int rank, int world) const {
  if (test_images_) return evaluate_images(model, *test_images_, 1000, rank, world);
  return evaluate_text(model, corpus_->val(), corpus_->val_size(), batch, max_windows, rank, world);
}

}  // namespace dpt
