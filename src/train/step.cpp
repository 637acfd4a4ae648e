#include "train/step.h"

#include <cmath>
#include <ctime>

#include <fmt/format.h>

#include "core/error.h"
#include "core/fault.h"
#include "nn/gemm.h"
#include "optim/optimizer.h"

namespace dpt {

namespace {

double since_ms(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// CPU time of the whole process (every thread), in ms.
double process_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
}

}  // namespace

StepOutcome train_step(StepContext& c, int64_t step, bool log_step, Timeline* tl) {
  const TrainOptions& o = c.o;
  const int rank = c.pg.rank();
  StepOutcome out;
  StepBreakdown& t = out.t;
  auto t0 = Clock::now();
  const double cpu0 = process_cpu_ms(), gemm0 = gemm_seconds();
  c.strategy.begin_step();
  out.loss = c.executor.run(step, t, tl);
  auto tw = Clock::now();
  fault_point("reduce", step + 1, rank);
  t.comm_wait_ms += c.strategy.finish_backward() * 1000.0;  // after a pipeline's waits for its neighbours
  t.gather_ms = c.strategy.take_gather_wait() * 1000.0;
  auto to = Clock::now();
  if (c.left_reduction == Clock::time_point{}) c.left_reduction = t0;  // the first step
  t.busy_ms = std::chrono::duration<double, std::milli>(tw - c.left_reduction).count();
  c.left_reduction = to;
  if (tl && c.pg.size() > 1) tl->add(Timeline::CommWait, step, tw, to);  // one process waits for nothing
  // The global gradient norm is needed to clip, and logged; it costs a pass
  // over the gradients (and a collective where they are sharded), so it is
  // skipped on other steps. Every rank takes the same branch.
  c.pg.set_phase("optimizer");  // the norm's collective, zero1/2's all-gathers
  fault_point("optimizer", step + 1, rank);
  if (o.clip > 0.0f || log_step) out.grad_norm = std::sqrt(c.executor.grad_norm_squared());
  if (o.clip > 0.0f) c.strategy.scale_grads(clip_factor(out.grad_norm, o.clip));
  out.lr = o.schedule.at(step);
  c.strategy.step(out.lr);
  c.executor.after_step();
  t.optimizer_ms = since_ms(to);
  c.pg.set_phase("other");  // evaluation, the logged loss, replica checks
  if (tl) {
    tl->add(Timeline::Optimizer, step, to, Clock::now());
    c.strategy.trace(*tl, step);
  }
  t.step_ms = since_ms(t0);
  t.cpu_ms = process_cpu_ms() - cpu0;
  t.gemm_ms = (gemm_seconds() - gemm0) * 1e3;
  if (!std::isfinite(out.loss))
    throw InputError(fmt::format("training diverged: loss is {} at step {}", out.loss, step));
  return out;
}

std::optional<Timeline> make_timeline(const TrainOptions& o, int64_t steps, const Executor& executor,
                                      const Strategy& strategy) {
  std::optional<Timeline> timeline;
  if (!o.trace_out.empty())
    timeline.emplace(static_cast<size_t>(std::min(o.trace_steps, steps)) *
                     (executor.trace_spans() + 2 + strategy.trace_spans()));
  return timeline;
}

}  // namespace dpt
