#include "optim/optimizer.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "device/kernels.h"

namespace dpt {

Optimizer::Optimizer(OptimizerConfig config, const Layout& layout, size_t begin, size_t n, size_t tensors,
                     StateTier* tier, bool masters)
    : config_(std::move(config)), n_(n), tensors_(tensors + (masters ? 1 : 0)), masters_(masters), tier_(tier) {
  DPT_CHECK(begin + n <= layout.numel(), "optimizer span past the layout");
  for (const Slot& s : layout.slots()) {
    size_t lo = std::max(begin, s.offset), hi = std::min(begin + n, s.offset + s.numel);
    if (lo < hi) segments_.push_back({lo - begin, hi - lo, s.decay});
  }
  if (!tier_) {
    own_tier_ = std::make_unique<RamTier>();
    tier_ = own_tier_.get();
  }
  region_ = tier_->add_region(tensors_, n_);
}

void Optimizer::prepare(float* params, float* grads, float lr, bf16* publish, GradsAfter after) {
  DPT_CHECK(masters_ == (params == nullptr) && (!masters_ || publish != nullptr),
            "an optimizer {} master weights is prepared {} parameters{}", masters_ ? "keeping" : "without",
            params ? "with" : "without", masters_ && !publish ? " and no bf16 copy to write" : "");
  params_ = params;
  publish_ = publish;
  grads_ = grads;
  consume_ = after == GradsAfter::Zeroed;
  lr_ = lr;
  begin_update();
}

size_t state_floats(const OptimizerConfig& config) {
  if (config.name == "adamw") return 2;
  return config.momentum != 0.0f ? 1 : 0;
}

void Optimizer::step(float* params, float* grads, float lr, GradsAfter after, bf16* publish) {
  prepare(params, grads, lr, publish, after);
  const StateTier::Job j = job();
  tier_->stream(&j, 1);
}

void step_prepared(const std::vector<std::unique_ptr<Optimizer>>& optimizers) {
  if (optimizers.empty()) return;
  // Kept between calls: a step allocates nothing.
  static thread_local std::vector<StateTier::Job> jobs;
  jobs.clear();
  StateTier& tier = optimizers.front()->tier();
  for (const auto& o : optimizers) {
    DPT_CHECK(&o->tier() == &tier, "optimizers stepped together share one state tier");
    jobs.push_back(o->job());
  }
  tier.stream(jobs.data(), jobs.size());
}

Sgd::Sgd(OptimizerConfig config, const Layout& layout, size_t begin, size_t n, StateTier* tier, bool masters)
    : Optimizer(config, layout, begin, n, state_floats(config), tier, masters) {}

std::vector<std::string> Sgd::state_names() const {
  if (config_.momentum == 0.0f) return {};  // plain SGD keeps nothing
  return {"momentum_buffer"};
}

void Sgd::begin_update() {
  // PyTorch initialises the momentum buffer with the first gradient.
  first_ = steps_ == 0;
  ++steps_;
}

void Sgd::update(size_t lo, size_t k, float* const* state) {
  const Kernels& kern = kernels(tier().device());
  const bool momentum = state_floats(config_) > 0;
  for_segments(lo, k, [&](size_t a, size_t b, const Segment& seg) {
    float* buf = momentum ? state[0] + (a - lo) : nullptr;
    float* p = params_at(a, lo, state);
    kern.sgd_update(p, grads_ + a, buf, b - a, lr_, config_.momentum, seg.decay ? config_.weight_decay : 0.0f, first_,
                    consume_, copy_at(a));
  });
}

AdamW::AdamW(OptimizerConfig config, const Layout& layout, size_t begin, size_t n, StateTier* tier, bool masters)
    : Optimizer(config, layout, begin, n, state_floats(config), tier, masters) {}  // m and v

void AdamW::begin_update() {
  ++steps_;
  const float b1 = config_.beta1, b2 = config_.beta2;
  const float c1 = 1.0f - std::pow(b1, static_cast<float>(steps_));
  const float c2 = 1.0f - std::pow(b2, static_cast<float>(steps_));
  // PyTorch's arithmetic order: p -= (lr / c1) * m / (sqrt(v) / sqrt(c2) + eps).
  step_size_ = lr_ / c1;
  rc2_ = 1.0f / std::sqrt(c2);
}

void AdamW::update(size_t lo, size_t k, float* const* state) {
  const Kernels& kern = kernels(tier().device());
  for_segments(lo, k, [&](size_t a, size_t b, const Segment& seg) {
    const float keep = 1.0f - lr_ * (seg.decay ? config_.weight_decay : 0.0f);
    float* p = params_at(a, lo, state);
    kern.adamw_update(p, grads_ + a, state[0] + (a - lo), state[1] + (a - lo), b - a, config_.beta1, config_.beta2,
                      config_.eps, keep, step_size_, rc2_, consume_, copy_at(a));
  });
}

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& config, const Layout& layout,
                                          size_t begin, size_t n, StateTier* tier, bool masters) {
  if (config.name == "sgd") return std::make_unique<Sgd>(config, layout, begin, n, tier, masters);
  if (config.name == "adamw") return std::make_unique<AdamW>(config, layout, begin, n, tier, masters);
  throw InputError(fmt::format("unknown optimizer '{}' (expected sgd or adamw)", config.name));
}

float clip_factor(double norm, float max_norm) {
  double f = static_cast<double>(max_norm) / (norm + 1e-6);
  return f < 1.0 ? static_cast<float>(f) : 1.0f;
}

}  // namespace dpt
