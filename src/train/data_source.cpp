#include "train/data_source.h"

#include "core/error.h"
#include "models/mlp.h"

namespace dpt {

std::shared_ptr<const Datasets> load_datasets(const TrainOptions& o, const Model& model) {
  auto sets = std::make_shared<Datasets>();
  if (o.synthetic) return sets;
  if (model.kind() == "mlp") {
    const std::string dir = o.data.empty() ? kFashionMnistDir : o.data;
    sets->train_images = load_fashion_mnist(dir, "train");
    sets->test_images = load_fashion_mnist(dir, "test");
    const int64_t pixels = static_cast<int64_t>(sets->train_images->rows) * sets->train_images->cols;
    const int64_t inputs = dynamic_cast<const Mlp&>(model).config().sizes.front();
    if (inputs != pixels)
      throw InputError(fmt::format("the MLP takes {} inputs but the images have {} pixels", inputs, pixels));
  } else {
    sets->corpus = ByteCorpus::load(o.data.empty() ? kFortunesDir : o.data, o.val_fraction,
                                    static_cast<size_t>(model.positions() + 1));
  }
  return sets;
}

DataSource::DataSource(const TrainOptions& o, const Model& model, std::shared_ptr<const Datasets> sets,
                       int64_t micro, int rank, int world)
    : synthetic_(o.synthetic), micro_(micro), sets_(std::move(sets)) {
  if (o.synthetic) {
    // Each rank its own random batch; the same every step.
    fill_synthetic(model, micro, o.seed + static_cast<uint64_t>(rank), synthetic_batch_);
  } else if (sets_->train_images) {
    epochs_ = std::make_unique<ImageEpochs>(*sets_->train_images, micro, o.seed, rank, world,
                                            DistributedSampler::parse_tail(o.sampler_tail));
  } else {
    const ByteCorpus& c = *sets_->corpus;
    windows_ = std::make_unique<WindowSampler>(c.train(), c.train_size(), model.positions(), o.seed, rank, world);
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

void DataSource::skip_steps(int64_t steps, int64_t global_batch, int64_t grad_accum) {
  if (epochs_) epochs_->skip(steps * grad_accum);
  if (windows_) windows_->skip(steps * global_batch);
}

nlohmann::json DataSource::position() const {
  if (epochs_) return {{"epoch", epochs_->epoch()}, {"position_in_share", epochs_->position()}};
  return nlohmann::json::object();
}

int64_t DataSource::steps(const TrainOptions& o) const {
  if (o.steps > 0) return o.steps;
  if (epochs_) return o.epochs * epochs_->steps_per_epoch() / o.grad_accum;
  return o.model == "mlp" ? 702 : 200;
}

EvalResult DataSource::evaluate(Model& model, int64_t batch, int64_t max_windows, int rank, int world) const {
  if (sets_->test_images) return evaluate_images(model, *sets_->test_images, 1000, rank, world);
  const ByteCorpus& c = *sets_->corpus;
  return evaluate_text(model, c.val(), c.val_size(), batch, max_windows, rank, world);
}

}  // namespace dpt
