// Local and DDP: every rank holds the whole model (parallel/replicated.cpp).
#pragma once

#include <memory>
#include <string>

#include "parallel/host_update.h"
#include "parallel/reducer.h"
#include "parallel/strategy.h"

namespace dpt {

class LocalStrategy : public Strategy {
 public:
  // Initialises the model's own buffers from init (seed + seed_offset), or
  // loads them.
  LocalStrategy(const StrategyOptions& options, Model& model, comm::ProcessGroup& pg, const StrategyInit& init,
                uint64_t seed_offset = 0);
  const std::string& name() const override { return options_.strategy.name(); }
  std::string describe() const override;
  float loss_scale() const override { return 1.0f; }
  void begin_step() override;
  void begin_micro_step(bool) override {}
  double finish_backward() override { return 0.0; }
  double grad_norm_squared() override;
  void scale_grads(float factor) override;
  void step(float lr) override;
  void gather_unit(int unit, float* out) override;
  std::vector<StateSpan> state_spans() override;
  void restored(int64_t optimizer_steps) override;
  MemoryBytes bytes() const override;
  nlohmann::json offload_detail() const override;

 protected:
  StrategyOptions options_;
  Model& model_;
  comm::ProcessGroup& pg_;
  std::unique_ptr<StateTier> tier_;  // the optimizer's state: RAM or a file (before opt_: outlives it)
  std::unique_ptr<Optimizer> opt_;
  // A GPU model's update on the host (--offload optimizer); else none.
  std::unique_ptr<HostUpdate> host_;
  bool grads_zero_ = false;  // the last step left the gradients zero (begin_step)
};

class DdpStrategy : public LocalStrategy {
 public:
  DdpStrategy(const StrategyOptions& options, Model& model, comm::ProcessGroup& pg, const StrategyInit& init);
  std::string describe() const override;
  nlohmann::json detail() const override;
  float loss_scale() const override;
  void begin_micro_step(bool last) override;
  double finish_backward() override;
  void verify(int64_t step) override;
  std::vector<StateSpan> state_spans() override;
  void restored(int64_t optimizer_steps) override;
  void trace(Timeline& tl, int64_t step) const override;
  size_t trace_spans() const override;
  MemoryBytes bytes() const override;

 private:
  std::unique_ptr<Reducer> reducer_;
};

// The catalog's records (parallel/catalog.h).
StrategyRecord local_record();
StrategyRecord ddp_record();

}  // namespace dpt
