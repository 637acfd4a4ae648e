// One optimizer step of the training loop, timed by phase, and the times of
// a run's steps kept for the steady-state medians.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <vector>

#include "comm/process_group.h"
#include "core/stats.h"
#include "core/timeline.h"
#include "parallel/strategy.h"
#include "train/executor.h"
#include "train/lockstep.h"
#include "train/train.h"

namespace dpt {

using Clock = std::chrono::steady_clock;

// What one optimizer step needs, and what it gives.
struct StepContext {
  const TrainOptions& o;
  comm::ProcessGroup& pg;
  Strategy& strategy;
  Executor& executor;
  Clock::time_point left_reduction{};  // when the last step's reduction ended (StepBreakdown::busy_ms)
};
struct StepOutcome {
  double loss = 0.0, grad_norm = 0.0;
  float lr = 0.0f;
  StepBreakdown t;
};

// One optimizer step: grad_accum micro-steps of forward and backward, the
// wait for the reductions, clipping, the update. Timed by phase; traced
// into tl when given.
StepOutcome train_step(StepContext& c, int64_t step, bool log_step, Timeline* tl);

// The timeline of a run with --trace-out: it records only the last
// trace_steps steps (per step data, forward and backward per micro-batch,
// the wait, the optimizer and the strategy's collectives).
std::optional<Timeline> make_timeline(const TrainOptions& o, int64_t steps, const Executor& executor,
                                      const Strategy& strategy);

// Per-step phase times of this rank, kept for the steady-state medians.
// Reserved up front so steps allocate nothing (capped: a run of millions
// of steps grows them rarely, by doubling, rather than reserving GBs).
class StepTimes {
 public:
  explicit StepTimes(int64_t steps) {
    for (auto* v : all()) v->reserve(static_cast<size_t>(std::min<int64_t>(steps, 1 << 16)));
  }
  void add(const StepBreakdown& t) {
    const double values[] = {t.data_ms,      t.forward_ms, t.backward_ms, t.gather_ms, t.comm_wait_ms,
                             t.optimizer_ms, t.step_ms,    t.cpu_ms,      t.busy_ms,     t.gemm_ms};
    size_t i = 0;
    for (auto* v : all()) v->push_back(values[i++]);
  }
  StepBreakdown medians() const {  // see core/stats.h
    return {steady_median(data_), steady_median(fwd_), steady_median(bwd_),  steady_median(gather_),
            steady_median(wait_), steady_median(opt_), steady_median(step_), steady_median(cpu_),
            steady_median(busy_), steady_median(gemm_)};
  }
  size_t size() const { return step_.size(); }
  // The last steady steps (at most kLockstepSteps) as the lock-step split
  // needs them (train/lockstep.h): busy times, comm waits, and the work in
  // the busy times (less the waits at gathers: who was slower).
  struct Lockstep {
    std::vector<double> busy, waits, work;
  };
  Lockstep lockstep_steps() const {
    const size_t n = size(), from = std::max(warmup_steps(n), n - std::min(n, kLockstepSteps));
    const auto at = [from](const std::vector<double>& v) { return v.begin() + static_cast<long>(from); };
    Lockstep l{{at(busy_), busy_.end()}, {at(wait_), wait_.end()}, {}};
    for (size_t s = from; s < n; ++s) l.work.push_back(busy_[s] - gather_[s]);
    return l;
  }

 private:
  std::array<std::vector<double>*, 10> all() {
    return {&data_, &fwd_, &bwd_, &gather_, &wait_, &opt_, &step_, &cpu_, &busy_, &gemm_};
  }
  std::vector<double> data_, fwd_, bwd_, gather_, wait_, opt_, step_, cpu_, busy_, gemm_;
};

}  // namespace dpt
