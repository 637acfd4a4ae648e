#include "optim/optimizer.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace dpt {

Optimizer::Optimizer(OptimizerConfig config, const Layout& layout, size_t begin, size_t n)
    : config_(std::move(config)), n_(n) {
  DPT_CHECK(begin + n <= layout.numel(), "optimizer span past the layout");
  for (const Slot& s : layout.slots()) {
    size_t lo = std::max(begin, s.offset), hi = std::min(begin + n, s.offset + s.numel);
    if (lo < hi) segments_.push_back({lo - begin, hi - lo, s.decay});
  }
}

size_t state_floats(const OptimizerConfig& config) {
  if (config.name == "adamw") return 2;
  return config.momentum != 0.0f ? 1 : 0;
}

Sgd::Sgd(OptimizerConfig config, const Layout& layout, size_t begin, size_t n)
    : Optimizer(std::move(config), layout, begin, n) {
  if (const size_t k = state_floats(config_)) state_ = FlatBuffer(k * n);
}

std::vector<std::string> Sgd::state_names() const {
  if (config_.momentum == 0.0f) return {};  // plain SGD keeps nothing
  return {"momentum_buffer"};
}

void Sgd::step(float* params, const float* grads, float lr) {
  const float mu = config_.momentum, wd = config_.weight_decay;
  float* buf = state_.f32();
  // PyTorch initialises the momentum buffer with the first gradient.
  const bool first = steps_ == 0;
  for (const Segment& seg : segments_) {
    float* p = params + seg.offset;
    const float* g = grads + seg.offset;
    float* b = buf ? buf + seg.offset : nullptr;
    const float d = seg.decay ? wd : 0.0f;
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < seg.n; ++i) {
      float gi = g[i] + d * p[i];
      if (b) {
        b[i] = first ? gi : mu * b[i] + gi;
        gi = b[i];
      }
      p[i] -= lr * gi;
    }
  }
  ++steps_;
}

AdamW::AdamW(OptimizerConfig config, const Layout& layout, size_t begin, size_t n)
    : Optimizer(std::move(config), layout, begin, n) {
  state_ = FlatBuffer(state_floats(config_) * n);  // m then v
}

void AdamW::step(float* params, const float* grads, float lr) {
  ++steps_;
  const float b1 = config_.beta1, b2 = config_.beta2, eps = config_.eps;
  const float c1 = 1.0f - std::pow(b1, static_cast<float>(steps_));
  const float c2 = 1.0f - std::pow(b2, static_cast<float>(steps_));
  // PyTorch's arithmetic order: p -= (lr / c1) * m / (sqrt(v) / sqrt(c2) + eps).
  const float step_size = lr / c1, rc2 = 1.0f / std::sqrt(c2);
  float* m = state_.f32();
  float* v = m + n_;
  for (const Segment& seg : segments_) {
    float* p = params + seg.offset;
    const float* g = grads + seg.offset;
    float* ms = m + seg.offset;
    float* vs = v + seg.offset;
    const float keep = 1.0f - lr * (seg.decay ? config_.weight_decay : 0.0f);
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < seg.n; ++i) {
      ms[i] = b1 * ms[i] + (1.0f - b1) * g[i];
      vs[i] = b2 * vs[i] + (1.0f - b2) * g[i] * g[i];
      p[i] = p[i] * keep - step_size * ms[i] / (std::sqrt(vs[i]) * rc2 + eps);
    }
  }
}

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& config, const Layout& layout,
                                          size_t begin, size_t n) {
  if (config.name == "sgd") return std::make_unique<Sgd>(config, layout, begin, n);
  if (config.name == "adamw") return std::make_unique<AdamW>(config, layout, begin, n);
  throw InputError(fmt::format("unknown optimizer '{}' (expected sgd or adamw)", config.name));
}

double sum_of_squares(const float* grads, size_t n) {
  // fp32 partial sums over blocks of 1024 (vectorised), added up in double:
  // as exact as an all-double sum for any realistic n, several times faster.
  constexpr size_t kBlock = 1024;
  const size_t blocks = (n + kBlock - 1) / kBlock;
  double s = 0.0;
#pragma omp parallel for reduction(+ : s) schedule(static)
  for (size_t b = 0; b < blocks; ++b) {
    const float* g = grads + b * kBlock;
    const size_t m = std::min(kBlock, n - b * kBlock);
    float part = 0.0f;
#pragma omp simd reduction(+ : part)
    for (size_t i = 0; i < m; ++i) part += g[i] * g[i];
    s += static_cast<double>(part);
  }
  return s;
}

float clip_factor(double norm, float max_norm) {
  double f = static_cast<double>(max_norm) / (norm + 1e-6);
  return f < 1.0 ? static_cast<float>(f) : 1.0f;
}

void scale(float* x, size_t n, float factor) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) x[i] *= factor;
}

}  // namespace dpt
