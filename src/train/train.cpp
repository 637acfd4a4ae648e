// The training loop behind `dpt train`, in the order it runs: set up, loop
// over steps, report. Each part lives in a file of its own: the checks
// (run_checks.h), this rank's model, strategy, data and executor
// (rank_setup.h), one step (step.h), checkpoints (resume.h) and what the run
// shows and writes (run_report.h).
#include "train/train.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>

#include "io/atomic_file.h"
#include "models/weights.h"
#include "parallel/catalog.h"
#include "train/gemm_rate.h"
#include "train/metrics_file.h"
#include "train/naive_dp.h"
#include "train/progress.h"
#include "train/rank_setup.h"
#include "train/resume.h"
#include "train/run_checks.h"
#include "train/run_report.h"
#include "train/sample.h"
#include "train/step.h"
#include "train/stop_signal.h"
#include "train/trace_file.h"

namespace dpt {

namespace {

// What a run writes as it goes: the progress line, --metrics-out, and the
// timeline of its last steps (--trace-out). With checkpoints on, a signal
// stops the run after its step (with a checkpoint); without, it ends the
// process as it always has.
struct RunOutputs {
  RunOutputs(const TrainOptions& o, comm::ProcessGroup& pg, const RankSetup& run)
      : progress(run.steps, o.quiet || pg.rank() != 0, o.model == "mlp" ? "samples/s" : "tokens/s"),
        timeline(make_timeline(o, run.steps, *run.executor, *run.strategy)),
        trace_steps(o.trace_steps) {
    if (pg.rank() == 0 && !o.metrics_out.empty())
      metrics = std::make_unique<MetricsFile>(o.metrics_out, run.resumed ? run.start : -1);
    // Created now: an unwritable --trace-out fails before training, not after it.
    if (pg.rank() == 0 && timeline) trace_file = std::make_unique<AtomicFile>(o.trace_out);
    if (!o.checkpoint_dir.empty()) signals.emplace();
  }
  // The timeline when `step` is one of the last trace_steps of `steps`.
  Timeline* timeline_at(int64_t step, int64_t steps) {
    return timeline && step >= steps - trace_steps ? &*timeline : nullptr;
  }
  std::unique_ptr<MetricsFile> metrics;
  Progress progress;
  std::optional<Timeline> timeline;
  int64_t trace_steps;
  std::unique_ptr<AtomicFile> trace_file;
  std::optional<StopSignals> signals;
};

// The evaluation of the model now, over the ranks: a replica's TP ranks
// evaluate the same windows together (their equal copies in the combined
// sums leave the mean as it is). Nothing without held-out data.
std::optional<EvalResult> evaluate(const TrainOptions& o, RankSetup& run, comm::ProcessGroup& pg) {
  if (!run.data->evaluable()) return std::nullopt;
  return combine(run.data->evaluate(*run.model, run.micro, o.eval_windows, run.mesh.dp_rank, run.mesh.dp,
                                    run.executor->eval_forward()),
                 pg);
}

// After step `done` with checkpoints on: a checkpoint when due; true when a
// signal stopped the run here (r then says where).
bool stopped_after(const TrainOptions& o, RankSetup& run, comm::ProcessGroup& pg, int64_t done, RunOutputs& out,
                   TrainResult& r) {
  const std::optional<std::string> stop =
      checkpoint_or_stop(o, *run.model, *run.strategy, *run.data, pg, done, run.steps, r);
  if (!stop) return false;
  out.progress.finish();
  if (!o.quiet && pg.rank() == 0)
    std::printf("stopped by signal %d after step %lld; checkpoint %s\n", r.stopped_by, static_cast<long long>(done),
                stop->c_str());
  r.steps = done;
  return true;
}

// The GEMM peak's first sample, after the first step (core/gemm_peak.h):
// for up to 1% of the run still to come as the first step's time foretells
// it (at most 0.25 s), and none where that is under 2.5 s (a test's short
// run measures only at the end, as before). None on a GPU: its operands
// (768 MiB) would raise the device memory peak the run reports.
double sample_gemm_peak(Device d, DType precision, double first_step_ms, int64_t steps_left) {
  const double rest_s = 1e-3 * first_step_ms * static_cast<double>(steps_left);
  if (d != Device::CPU || rest_s < 2.5) return 0.0;
  return measure_device_gemm_gflops(d, precision, std::min(0.25, 0.01 * rest_s));
}

}  // namespace

SaveOptions save_options(const TrainOptions& o) {
  return SaveOptions{parse_weight_format(o.save_format), o.save_shard_bytes, o.save_dtype};
}

TrainResult run_training(TrainOptions o, comm::ProcessGroup& pg) {
  const Mesh mesh = checked_mesh(o, pg);
  if (o.strategy->in_threads()) return run_dp_training(o);
  // Read now: a bad baseline must fail before training, not after it.
  const double baseline = o.baseline.empty() ? 0.0 : read_baseline_throughput(o.baseline);
  TrainResult r;
  RankSetup run = set_up_rank(o, pg, mesh, r);
  const bool quiet = o.quiet || pg.rank() != 0, mlp = o.model == "mlp";
  RunOutputs out(o, pg, run);
  if (!quiet) print_header(o, *run.model, *run.strategy, mesh, run.micro, run.steps, run.data->evaluable(), r.topology);

  // Every rank reads the tokenizer and prompt; rank 0 makes its model at the first sample.
  std::optional<TrainingSamples> samples;
  if (o.sample_every > 0) samples.emplace(o, dynamic_cast<const Decoder&>(*run.model).config());
  StepTimes times(run.steps - run.start);
  const double per_step = static_cast<double>(o.batch * (mlp ? 1 : run.model->positions()));
  StepContext context{o, pg, *run.strategy, *run.executor};
  const LedgerMark mark(pg);
  run.strategy->take_gather_wait();
  const auto run_start = Clock::now();
  for (int64_t step = run.start; step < run.steps; ++step) {
    const bool log_step = (step + 1) % o.log_every == 0 || step + 1 == run.steps;
    const StepOutcome s = train_step(context, step, log_step, out.timeline_at(step, run.steps));
    times.add(s.t);
    if (o.verify_every > 0 && pg.size() > 1 && (step + 1) % o.verify_every == 0) run.strategy->verify(step + 1);
    std::optional<EvalResult> ev;
    if (o.eval_every > 0 && (step + 1) % o.eval_every == 0 && step + 1 < run.steps) ev = evaluate(o, run, pg);
    if (samples && (step + 1) % o.sample_every == 0) {
      const std::string text = samples->sample(*run.executor, pg, step + 1);
      run.strategy->take_gather_wait();  // the sample's gathers are no step's wait
      if (pg.rank() == 0) out.progress.line(fmt::format("sample after step {}: {}", step + 1, text));
    }
    double loss = s.loss;
    if (log_step || ev)
      loss = log_step_out(run.groups->dp(), out.progress, out.metrics.get(), mlp,
                          {step + 1, s.loss, s.lr, s.grad_norm, s.t, ev}, per_step * 1000.0 / s.t.step_ms);
    if (step == run.start) {
      r.first_loss = loss;
      r.early_gemm_gflops = sample_gemm_peak(o.device, o.precision, s.t.step_ms, run.steps - run.start - 1);
    }
    r.final_loss = loss;
    if (out.signals && stopped_after(o, run, pg, step + 1, out, r)) return r;
  }
  out.progress.finish();
  if (out.timeline) write_trace(*out.timeline, out.trace_file.get(), pg);
  const double total_s = std::chrono::duration<double>(Clock::now() - run_start).count();
  r.steps = run.steps;
  count_comm(pg, mark, o, run.planned_comm, run.start, run.steps, r);
  if (run.ring && run.steps > run.start) r.ring_wait_ms = run.ring->waited_ms() / static_cast<double>(run.steps - run.start);

  // The weights are written before anything else can fail (evaluation, the
  // summary), so a finished run is never lost.
  if (!o.save.empty()) {
    run.executor->save(o.save, save_options(o));
    if (pg.rank() == 0) save_hf_config(*run.model, o.save, parse_weight_format(o.save_format));
  }
  out.metrics.reset();
  if (auto ev = evaluate(o, run, pg)) {
    r.eval_loss = ev->loss();
    r.eval_accuracy = ev->accuracy();
  }
  r.breakdown = times.medians();
  r.step_cpu_ms_median = r.breakdown.cpu_ms;
  r.step_gemm_ms_median = r.breakdown.gemm_ms;
  report_run(o, pg, *run.model, *run.strategy, *run.executor, run.data->evaluable(), times, baseline, total_s, quiet,
             r);
  return r;
}

TrainResult run_training(TrainOptions o) {
  auto pg = comm::ProcessGroup::create();
  return run_training(std::move(o), *pg);
}

}  // namespace dpt
