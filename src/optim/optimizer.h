// Optimizers over a flat span of parameters.
//
// An optimizer owns the state for one contiguous range [begin, begin + n) of
// a model's flat parameter buffer: the whole model today, one rank's shard
// under ZeRO. It learns which elements get weight decay from the Layout
// (slots cut to the range), so a shard is simply a shorter span.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "tensor/flat_buffer.h"
#include "tensor/layout.h"

namespace dpt {

struct OptimizerConfig {
  std::string name = "sgd";   // "sgd" or "adamw"
  float momentum = 0.9f;      // sgd
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;  // adamw
  float weight_decay = 0.0f;  // sgd: L2 added to the gradient; adamw: decoupled
};

// Floats of state per parameter: 2 for AdamW (m, v), 1 for SGD with
// momentum, 0 for plain SGD. The optimizers size their state by it, and so
// do the memory estimates (parallel/rank_bytes.h).
size_t state_floats(const OptimizerConfig& config);

class Optimizer {
 public:
  // Covers elements [begin, begin + n) of buffers laid out by `layout`.
  Optimizer(OptimizerConfig config, const Layout& layout, size_t begin, size_t n);
  virtual ~Optimizer() = default;

  // One update of params[begin, begin + n) from grads over the same range
  // (both pointers are to the start of the span, not of the buffer).
  virtual void step(float* params, const float* grads, float lr) = 0;
  // Bytes of optimizer state held (momentum, Adam moments).
  size_t state_bytes() const { return state_.bytes(); }
  const OptimizerConfig& config() const { return config_; }
  int64_t steps() const { return steps_; }

  // The state as checkpoints store it: PyTorch's names ("momentum_buffer";
  // "exp_avg", "exp_avg_sq"), each n elements over the optimizer's span.
  virtual std::vector<std::string> state_names() const = 0;
  float* state(size_t i) { return state_.f32() + i * n_; }
  // Restores the step count (AdamW's bias correction and SGD's first step
  // depend on it) when a run resumes.
  void set_steps(int64_t steps) { steps_ = steps; }

 protected:
  struct Segment {
    size_t offset, n;  // relative to the span
    bool decay;
  };
  OptimizerConfig config_;
  std::vector<Segment> segments_;  // the span cut by slots
  size_t n_;
  FlatBuffer state_;
  int64_t steps_ = 0;
};

// SGD with momentum, as PyTorch's torch.optim.SGD (dampening 0, no Nesterov):
//   g = grad + wd * p ; buf = momentum * buf + g ; p -= lr * buf
class Sgd : public Optimizer {
 public:
  Sgd(OptimizerConfig config, const Layout& layout, size_t begin, size_t n);
  void step(float* params, const float* grads, float lr) override;
  std::vector<std::string> state_names() const override;
};

// AdamW, as torch.optim.AdamW: p -= lr * wd * p (decayed slots only), then
// the bias-corrected Adam update. State: m and v, 8 bytes per parameter.
class AdamW : public Optimizer {
 public:
  AdamW(OptimizerConfig config, const Layout& layout, size_t begin, size_t n);
  void step(float* params, const float* grads, float lr) override;
  std::vector<std::string> state_names() const override { return {"exp_avg", "exp_avg_sq"}; }
};

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& config, const Layout& layout,
                                          size_t begin, size_t n);

// Sum of squares of n gradients (in double, for a stable global norm). Under
// sharding each rank sums its shard and the sums are all-reduced.
double sum_of_squares(const float* grads, size_t n);
// The factor that brings a gradient of norm `norm` to at most max_norm
// (PyTorch's clip_grad_norm_: max_norm / (norm + 1e-6), capped at 1).
float clip_factor(double norm, float max_norm);
void scale(float* x, size_t n, float factor);

}  // namespace dpt
