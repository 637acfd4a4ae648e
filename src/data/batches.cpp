#include "data/batches.h"

#include "core/error.h"
#include "models/decoder.h"
#include "models/mlp.h"

namespace dpt {

void fill_image_batch(const ImageSet& set, const int64_t* indices, int64_t B, Batch& batch) {
  const int64_t D = static_cast<int64_t>(set.rows) * set.cols;
  batch.B = B;
  batch.T = 1;
  batch.features.resize(static_cast<size_t>(B * D));
  batch.targets.resize(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    const uint8_t* px = set.pixels.data() + indices[b] * D;
    float* f = batch.features.data() + b * D;
    for (int64_t i = 0; i < D; ++i) f[i] = static_cast<float>(px[i]) * (1.0f / 255.0f);
    batch.targets[static_cast<size_t>(b)] = set.labels[static_cast<size_t>(indices[b])];
  }
}

ImageEpochs::ImageEpochs(const ImageSet& set, int64_t batch, uint64_t seed, int rank, int world,
                         DistributedSampler::Tail tail)
    : set_(set), batch_(batch), sampler_(set.count, rank, world, seed, tail) {
  const int64_t share = static_cast<int64_t>(sampler_.indices().size());
  if (batch <= 0 || batch > share)
    throw InputError(fmt::format("batch size {} per rank must be between 1 and the {} images of a rank's share",
                                 batch, share));
}

int64_t ImageEpochs::steps_per_epoch() const {
  return static_cast<int64_t>(sampler_.indices().size()) / batch_;
}

void ImageEpochs::next(Batch& out) {
  if (pos_ + batch_ > static_cast<int64_t>(sampler_.indices().size())) {
    sampler_.set_epoch(sampler_.epoch() + 1);
    pos_ = 0;
  }
  fill_image_batch(set_, sampler_.indices().data() + pos_, batch_, out);
  pos_ += batch_;
}

void ImageEpochs::skip(int64_t batches) {
  for (int64_t i = 0; i < batches; ++i) {
    if (pos_ + batch_ > static_cast<int64_t>(sampler_.indices().size())) {
      sampler_.set_epoch(sampler_.epoch() + 1);
      pos_ = 0;
    }
    pos_ += batch_;
  }
}

WindowSampler::WindowSampler(const uint8_t* data, size_t n, int64_t T, uint64_t seed, int rank, int world)
    : data_(data), n_(n), T_(T), rng_(seed), rank_(rank), world_(world) {
  if (n < static_cast<size_t>(T + 1))
    throw InputError(fmt::format("text of {} bytes is shorter than one window of {}", n, T + 1));
}

void WindowSampler::next(Batch& out, int64_t B) {
  out.B = B;
  out.T = T_;
  out.tokens.resize(static_cast<size_t>(B * T_));
  out.targets.resize(static_cast<size_t>(B * T_));
  const uint64_t starts = n_ - static_cast<size_t>(T_);  // window [s, s + T] inclusive
  for (int64_t g = 0; g < world_ * B; ++g) {
    const uint64_t start = rng_.below(starts);  // drawn on every rank, kept by one
    if (g / B != rank_) continue;
    const int64_t b = g % B;
    const uint8_t* w = data_ + start;
    for (int64_t t = 0; t < T_; ++t) {
      out.tokens[static_cast<size_t>(b * T_ + t)] = w[t];
      out.targets[static_cast<size_t>(b * T_ + t)] = w[t + 1];
    }
  }
}

void WindowSampler::skip(int64_t windows) {
  const uint64_t starts = n_ - static_cast<size_t>(T_);
  for (int64_t g = 0; g < windows; ++g) (void)rng_.below(starts);
}

int64_t fill_sequential_windows(const uint8_t* data, size_t n, int64_t T, int64_t first, int64_t B,
                                Batch& batch) {
  const int64_t total = static_cast<int64_t>(n) / (T + 1);
  const int64_t count = std::max<int64_t>(0, std::min(B, total - first));
  batch.B = count;
  batch.T = T;
  batch.tokens.resize(static_cast<size_t>(count * T));
  batch.targets.resize(static_cast<size_t>(count * T));
  for (int64_t b = 0; b < count; ++b) {
    const uint8_t* w = data + (first + b) * (T + 1);
    for (int64_t t = 0; t < T; ++t) {
      batch.tokens[static_cast<size_t>(b * T + t)] = w[t];
      batch.targets[static_cast<size_t>(b * T + t)] = w[t + 1];
    }
  }
  return count;
}

void fill_synthetic(const Model& model, int64_t B, uint64_t seed, Batch& batch) {
  Rng rng(seed);
  batch.B = B;
  if (const auto* mlp = dynamic_cast<const Mlp*>(&model)) {
    const auto& s = mlp->config().sizes;
    batch.T = 1;
    batch.features.resize(static_cast<size_t>(B * s.front()));
    for (float& f : batch.features) f = rng.uniform();
    batch.targets.resize(static_cast<size_t>(B));
    for (int32_t& t : batch.targets) t = static_cast<int32_t>(rng.below(static_cast<uint64_t>(s.back())));
    return;
  }
  const auto& g = dynamic_cast<const Decoder&>(model).config();
  batch.T = g.context;
  batch.tokens.resize(static_cast<size_t>(B * g.context));
  batch.targets.resize(static_cast<size_t>(B * g.context));
  for (int32_t& t : batch.tokens) t = static_cast<int32_t>(rng.below(static_cast<uint64_t>(g.vocab)));
  for (int32_t& t : batch.targets) t = static_cast<int32_t>(rng.below(static_cast<uint64_t>(g.vocab)));
}

}  // namespace dpt
