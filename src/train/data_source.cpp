#include "train/data_source.h"

#include <cmath>

#include "core/error.h"
#include "data/file_kind.h"
#include "models/decoder.h"
#include "models/mlp.h"

namespace dpt {

namespace {

// Maps and checks the shards of --data (and --val-data) and splits the
// windows into training and held-out ones.
void load_token_shards(const TrainOptions& o, const std::string& path, TokenFormat format, const Model& model,
                       Datasets& sets) {
  const int64_t vocab = dynamic_cast<const Decoder&>(model).config().vocab;
  const int64_t T = model.positions();
  sets.tokens = std::make_unique<TokenShards>(path, format, vocab);
  const int64_t all = ShardWindows::total(*sets.tokens, T);
  if (all == 0)
    throw InputError(fmt::format("{}: {} tokens in {} shards, and no shard holds one window of {} tokens", path,
                                 sets.tokens->total_tokens(), sets.tokens->count(), T + 1));
  if (!o.val_data.empty()) {
    sets.val_tokens = std::make_unique<TokenShards>(o.val_data, format, vocab);
    sets.train_windows = all;
    sets.val_windows = ShardWindows::total(*sets.val_tokens, T);
    if (sets.val_windows == 0)
      throw InputError(fmt::format("{}: no shard holds one window of {} tokens", o.val_data, T + 1));
    return;
  }
  sets.val_windows = static_cast<int64_t>(std::floor(static_cast<double>(all) * o.val_fraction));
  sets.train_windows = all - sets.val_windows;
  sets.val_first = sets.train_windows;
  if (sets.train_windows == 0)
    throw InputError(fmt::format("{}: no training window is left after holding out {} of {}", path,
                                 sets.val_windows, all));
  if (o.val_fraction > 0.0 && sets.val_windows == 0)
    throw InputError(fmt::format("{}: {} windows of {} tokens, too few to hold out --val-fraction {} of them", path,
                                 all, T + 1, o.val_fraction));
}

}  // namespace

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
    const std::string path = o.data.empty() ? kFortunesDir : o.data;
    const TokenFormat given = parse_token_format(o.data_format);
    const TokenFormat format = resolve_format(path, given, data_format_flags());
    // Held-out text is checked as --data's is: a shard there is no text either.
    if (format == TokenFormat::Bytes && given == TokenFormat::Auto && !o.val_data.empty())
      check_text_files(text_input_files(o.val_data), data_format_flags());
    const size_t window = static_cast<size_t>(model.positions() + 1);
    if (format != TokenFormat::Bytes) {
      load_token_shards(o, path, format, model, *sets);
    } else if (o.val_data.empty()) {
      sets->corpus = ByteCorpus::load(path, o.val_fraction, window);
    } else {
      sets->corpus = ByteCorpus::load(path, 0.0, window);
      sets->val_corpus = ByteCorpus::load(o.val_data, 0.0, window);
    }
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
  } else if (sets_->tokens) {
    const int64_t T = model.positions();
    train_windows_ = std::make_unique<ShardWindows>(*sets_->tokens, T, 0, sets_->train_windows);
    if (sets_->val_windows > 0)
      val_windows_ = std::make_unique<ShardWindows>(*sets_->held_out(), T, sets_->val_first, sets_->val_windows);
    shard_sampler_ = std::make_unique<ShardSampler>(*train_windows_, micro * world * o.grad_accum, o.seed, rank,
                                                    world);
  } else {
    const ByteCorpus& c = *sets_->corpus;
    windows_ = std::make_unique<WindowSampler>(c.train(), c.train_size(), model.positions(), o.seed, rank, world);
  }
}

bool DataSource::evaluable() const {
  if (synthetic_) return false;
  if (sets_->tokens) return val_windows_ != nullptr;
  if (sets_->val_corpus) return true;
  return !sets_->corpus || sets_->corpus->val_size() > 0;
}

void DataSource::next(Batch& b) {
  if (synthetic_) {
    b = synthetic_batch_;  // same sizes every step: copying reuses b's storage
  } else if (epochs_) {
    epochs_->next(b);
  } else if (shard_sampler_) {
    shard_sampler_->next(b, micro_);
  } else {
    windows_->next(b, micro_);
  }
}

void DataSource::skip_steps(int64_t steps, int64_t global_batch, int64_t grad_accum) {
  if (epochs_) epochs_->skip(steps * grad_accum);
  if (windows_) windows_->skip(steps * global_batch);
  if (shard_sampler_) shard_sampler_->skip_steps(steps);
}

nlohmann::json DataSource::position() const {
  if (epochs_) return {{"epoch", epochs_->epoch()}, {"position_in_share", epochs_->position()}};
  if (shard_sampler_) return {{"epoch", shard_sampler_->state().epoch}, {"windows", shard_sampler_->state().position}};
  return nlohmann::json::object();
}

int64_t DataSource::steps(const TrainOptions& o) const {
  if (o.steps > 0) return o.steps;
  if (epochs_) return o.epochs * epochs_->steps_per_epoch() / o.grad_accum;
  return o.model == "mlp" ? 702 : 200;
}

EvalResult DataSource::evaluate(Model& model, int64_t batch, int64_t max_windows, int rank, int world,
                                const ForwardFn* forward) const {
  if (sets_->test_images) return evaluate_images(model, *sets_->test_images, 1000, rank, world);
  if (val_windows_) return evaluate_windows(model, *val_windows_, batch, max_windows, rank, world, forward);
  if (const auto& v = sets_->val_corpus)
    return evaluate_text(model, v->train(), v->train_size(), batch, max_windows, rank, world, forward);
  const ByteCorpus& c = *sets_->corpus;
  return evaluate_text(model, c.val(), c.val_size(), batch, max_windows, rank, world, forward);
}

}  // namespace dpt
