// Optimizers over a flat span of parameters.
//
// An optimizer owns the state for one contiguous range [begin, begin + n) of
// a model's flat parameter buffer: the whole model today, one rank's shard
// under ZeRO. It learns which elements get weight decay from the Layout
// (slots cut to the range), so a shard is simply a shorter span. Its update
// is elementwise and runs over chunks of the span that its state tier
// brings into RAM (all of it at once in RAM, a few MiB at a time from a
// file: `--offload optimizer`); every element gets the same arithmetic
// either way, so offloaded training is bitwise the same.
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "optim/state_tier.h"
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

// What an update leaves in the gradients it read: them (Kept), or zeros
// (Zeroed: the update clears each gradient as it reads it, so the next
// step's backward can accumulate into them with no memset of its own).
enum class GradsAfter { Kept, Zeroed };

class Optimizer : private ChunkKernel {
 public:
  // Covers elements [begin, begin + n) of buffers laid out by `layout`. Its
  // state (`tensors` tensors of n floats, zero at first) lives in `tier`,
  // shared with other optimizers of the rank, or with nullptr in RAM of
  // its own (optim/state_tier.h).
  // With `masters`, the span's fp32 master weights are one more tensor of
  // the state, after the optimizer's own (`--offload params`: they live in
  // the tier, not in RAM); then prepare() takes no params and each update
  // writes its bf16 copy to `publish` (docs/memory.md, "Offload"). Without
  // masters, `publish` is optional: given, the update writes it the same way.
  Optimizer(OptimizerConfig config, const Layout& layout, size_t begin, size_t n, size_t tensors,
            StateTier* tier, bool masters = false);
  ~Optimizer() override = default;

  // One update of params[begin, begin + n) from grads over the same range
  // (both pointers are to the start of the span, not of the buffer). With
  // `publish` (the span's bf16 compute copy in a bf16 run), the update
  // writes the copy as it writes the parameters: no conversion pass after.
  void step(float* params, float* grads, float lr, GradsAfter after = GradsAfter::Kept, bf16* publish = nullptr);
  // The same for several optimizers as one pass of their shared tier
  // (step_prepared): each is prepared with its span's pointers first.
  void prepare(float* params, float* grads, float lr, bf16* publish = nullptr, GradsAfter after = GradsAfter::Kept);
  // The master weights' tensor (optimizers made with masters).
  size_t master_tensor() const { return tensors_ - 1; }
  StateTier::Job job() { return {region_, this}; }
  StateTier& tier() { return *tier_; }

  // Bytes of optimizer state (momentum, Adam moments), wherever the tier
  // keeps them.
  size_t state_bytes() const { return tensors_ * n_ * sizeof(float); }
  const OptimizerConfig& config() const { return config_; }
  int64_t steps() const { return steps_; }

  // The state as checkpoints store it: PyTorch's names ("momentum_buffer";
  // "exp_avg", "exp_avg_sq"), each n elements over the optimizer's span.
  virtual std::vector<std::string> state_names() const = 0;
  // Elements [at, at + n) of state tensor i, out of and into the tier.
  void read_state(size_t i, size_t at, size_t n, float* out) { tier_->read(region_, i, at, n, out); }
  void write_state(size_t i, size_t at, size_t n, const float* in) { tier_->write(region_, i, at, n, in); }
  // State tensor i when it is in RAM, else nullptr (offloaded).
  float* ram_state(size_t i) { return tier_->data(region_, i); }
  size_t numel() const { return n_; }
  // Restores the step count (AdamW's bias correction and SGD's first step
  // depend on it) when a run resumes.
  void set_steps(int64_t steps) { steps_ = steps; }

 protected:
  struct Segment {
    size_t offset, n;  // relative to the span
    bool decay;
  };
  // Before a step's chunks: the step count and the step's scalars.
  virtual void begin_update() = 0;
  // Calls f(i0, i1, seg) for each part [i0, i1) of chunk [lo, lo + k) that
  // lies in one segment (span offsets).
  template <typename F>
  void for_segments(size_t lo, size_t k, F f) const {
    for (const Segment& seg : segments_) {
      const size_t a = std::max(seg.offset, lo), b = std::min(seg.offset + seg.n, lo + k);
      if (a < b) f(a, b, seg);
    }
  }

  OptimizerConfig config_;
  std::vector<Segment> segments_;  // the span cut by slots
  size_t n_, tensors_;
  int64_t steps_ = 0;
  // The step being applied (prepare).
  // Elements [a, b) of the span: parameters at a (state: the tensors at lo),
  // from RAM or the master tensor; after the update, their bf16 copy.
  float* params_at(size_t a, size_t lo, float* const* state) const {
    return masters_ ? state[tensors_ - 1] + (a - lo) : params_ + a;
  }
  // Where element a of the span's bf16 copy goes (nullptr: no copy).
  bf16* copy_at(size_t a) const { return publish_ ? publish_ + a : nullptr; }
  float* params_ = nullptr;
  float* grads_ = nullptr;
  bool consume_ = false;  // GradsAfter::Zeroed
  bf16* publish_ = nullptr;
  float lr_ = 0.0f;
  bool masters_ = false;

 private:
  std::unique_ptr<StateTier> own_tier_;  // when none is given
  StateTier* tier_;
  int region_;
};

// Steps every optimizer, each prepared with its span, as one pass of the
// tier they share (a file tier then reads the next span's state while it
// updates the last one's).
void step_prepared(const std::vector<std::unique_ptr<Optimizer>>& optimizers);

// SGD with momentum, as PyTorch's torch.optim.SGD (dampening 0, no Nesterov):
//   g = grad + wd * p ; buf = momentum * buf + g ; p -= lr * buf
class Sgd : public Optimizer {
 public:
  Sgd(OptimizerConfig config, const Layout& layout, size_t begin, size_t n, StateTier* tier = nullptr,
      bool masters = false);
  std::vector<std::string> state_names() const override;

 private:
  void begin_update() override;
  void update(size_t lo, size_t k, float* const* state) override;
  bool first_ = false;
};

// AdamW, as torch.optim.AdamW: p -= lr * wd * p (decayed slots only), then
// the bias-corrected Adam update. State: m and v, 8 bytes per parameter.
class AdamW : public Optimizer {
 public:
  AdamW(OptimizerConfig config, const Layout& layout, size_t begin, size_t n, StateTier* tier = nullptr,
        bool masters = false);
  std::vector<std::string> state_names() const override { return {"exp_avg", "exp_avg_sq"}; }

 private:
  void begin_update() override;
  void update(size_t lo, size_t k, float* const* state) override;
  float step_size_ = 0.0f, rc2_ = 0.0f;
};

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& config, const Layout& layout,
                                          size_t begin, size_t n, StateTier* tier = nullptr, bool masters = false);

// The factor that brings a gradient of norm `norm` to at most max_norm
// (PyTorch's clip_grad_norm_: max_norm / (norm + 1e-6), capped at 1).
float clip_factor(double norm, float max_norm);

}  // namespace dpt
