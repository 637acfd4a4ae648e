// Naive data parallelism (PyTorch's nn.DataParallel, the scheme DDP
// replaced), kept to be measured against DDP: one process, one thread per
// replica. Every step each replica runs forward and backward on its share of
// the batch; then replica 0 alone gathers every gradient into its own, steps
// the optimizer and copies the new weights back into every replica, while
// the other threads wait. The gather and the copy are serial work on one
// thread that grows with the replica count: the bottleneck DDP removes by
// all-reducing in parallel and stepping every replica itself.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/stats.h"
#include "core/memory.h"
#include "models/weights.h"
#include "nn/update.h"
#include "train/naive_dp.h"
#include "train/rank_setup.h"
#include "train/run_checks.h"
#include "train/run_report.h"
#include "train/sample.h"
#include "train/data_source.h"
#include "train/progress.h"

namespace dpt {

namespace {
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }
}  // namespace

// Per-step times of a DP run, in ms: the step, the replicas' forward and
// backward, and replica 0's gather, optimizer step and broadcast.
struct DpTimes {
  std::vector<double> step, compute, gather, opt, bcast;
};

// The end of a DP run: the printed lines and the summary file.
void report_dp_run(const TrainOptions& o, const TrainResult& r, int R, const DpTimes& t, bool evaluable) {
  const bool mlp = o.model == "mlp";
  const int64_t steps = r.steps;
  auto steady = [](const std::vector<double>& v) { return steady_median(v); };
  if (!o.quiet) {
    std::printf("done: %lld steps, train loss %.4f -> %.4f", static_cast<long long>(steps), r.first_loss, r.final_loss);
    if (evaluable)
      std::printf(mlp ? ", test accuracy %.2f%%" : ", validation loss %.4f",
                  mlp ? 100.0 * r.eval_accuracy : r.eval_loss);
    std::printf("\nthroughput: %.0f %s (median step %.2f ms): replicas' forward+backward %.2f ms, then on "
                "replica 0 alone: gather %.2f ms, optimizer %.2f ms, broadcast %.2f ms\n",
                mlp ? r.samples_per_s : r.tokens_per_s, mlp ? "samples/s" : "tokens/s", r.step_ms_median,
                steady(t.compute), steady(t.gather), steady(t.opt), steady(t.bcast));
  }
  if (!o.summary_out.empty()) {
    nlohmann::json j = {{"model", o.model}, {"strategy", o.strategy.name()}, {"world", 1}, {"replicas", R},
                        {"steps", steps}, {"batch", o.batch}, {"first_loss", r.first_loss},
                        {"final_loss", r.final_loss}, {"step_ms_median", r.step_ms_median},
                        {"samples_per_s", r.samples_per_s}, {"gflops", r.gflops},
                        {"compute_ms", steady(t.compute)}, {"gather_ms", steady(t.gather)},
                        {"optimizer_ms", steady(t.opt)}, {"broadcast_ms", steady(t.bcast)},
                        {"peak_rss", r.peak_rss}};
    write_summary(o.summary_out, std::move(j), r, mlp, evaluable);
  }
}

namespace {

// The replicas and their data: replica 0 is built (or loaded) and the
// others copy its weights; the data is read once and shared.
struct Replicas {
  std::vector<std::unique_ptr<Model>> models;
  std::vector<std::unique_ptr<DataSource>> data;
};
Replicas make_replicas(const TrainOptions& o, int R, int64_t micro) {
  Replicas reps;
  reps.models.push_back(build_model(o, o.seed));
  Model& master = *reps.models[0];
  const auto sets = load_datasets(o, master);
  for (int i = 0; i < R; ++i) {
    if (i > 0) {
      reps.models.push_back(make_model(master.metadata()));
      reps.models.back()->set_checkpoint_activations(o.checkpoint_activations);
      set_attention(o, *reps.models.back());
      std::memcpy(reps.models.back()->params(), master.params(), master.param_count() * sizeof(float));
    }
    reps.data.push_back(std::make_unique<DataSource>(o, *reps.models.back(), sets, micro, i, R));
  }
  return reps;
}

// Replica 0's part of a step, while the other threads wait: every other
// replica's gradients added to its own (the gather), clipping, the
// optimizer, and the new weights copied into every other replica (the
// broadcast). Timed into t.
void master_update(const TrainOptions& o, Replicas& reps, Optimizer& opt, float lr, DpTimes& t) {
  Model& master = *reps.models[0];
  const size_t n = master.param_count();
  auto tg = Clock::now();
  float* g = master.grads();
  for (size_t q = 1; q < reps.models.size(); ++q) {
    const float* gq = reps.models[q]->grads();
#pragma omp simd
    for (size_t e = 0; e < n; ++e) g[e] += gq[e];
  }
  t.gather.push_back(ms_since(tg));
  auto to = Clock::now();
  if (o.clip > 0.0f) scale(g, n, clip_factor(std::sqrt(sum_of_squares(g, n)), o.clip));
  opt.step(master.params(), g, lr);
  t.opt.push_back(ms_since(to));
  auto tb = Clock::now();
  for (size_t q = 1; q < reps.models.size(); ++q) std::memcpy(reps.models[q]->params(), master.params(), n * sizeof(float));
  t.bcast.push_back(ms_since(tb));
}

// One replica's forward and backward over its micro-batches; returns its
// mean loss. An error is kept in `error` (threads cannot throw out of the
// team).
double replica_pass(const TrainOptions& o, Model& mine, DataSource& data, Batch& batch, float loss_scale,
                    std::string& error) {
  double loss = 0.0;
  try {
    mine.zero_grads();
    for (int64_t k = 0; k < o.grad_accum; ++k) {
      data.next(batch);
      loss += mine.forward(batch).loss;
      mine.backward(loss_scale);
    }
  } catch (const std::exception& e) {
#pragma omp critical
    error = e.what();
  }
  return loss / static_cast<double>(o.grad_accum);
}

// The run's figures from its step times, the weights saved and the final
// evaluation.
void finish_dp_run(const TrainOptions& o, Replicas& reps, int64_t micro, const DpTimes& t, TrainResult& r) {
  const Model& master = *reps.models[0];
  r.step_ms_median = steady_median(t.step);
  r.breakdown = {0.0, 0.0, steady_median(t.compute), steady_median(t.gather) + steady_median(t.bcast),
                 steady_median(t.opt), r.step_ms_median};
  r.samples_per_s = static_cast<double>(o.batch) * 1000.0 / r.step_ms_median;
  if (o.model != "mlp") r.tokens_per_s = r.samples_per_s * static_cast<double>(master.positions());
  r.gflops = master.train_flops(o.batch) / (r.step_ms_median * 1e-3) / 1e9;
  // Saved before anything else can fail: evaluation, the summary.
  if (!o.save.empty()) {
    save_weights(master, o.save, save_options(o));
    save_hf_config(master, o.save, parse_weight_format(o.save_format));
  }
  if (reps.data[0]->evaluable()) {
    EvalResult ev = reps.data[0]->evaluate(*reps.models[0], micro, o.eval_windows, 0, 1);
    r.eval_loss = ev.loss();
    r.eval_accuracy = ev.accuracy();
  }
  r.peak_rss = peak_rss_bytes();
}

}  // namespace

TrainResult run_dp_training(const TrainOptions& o) {
  const int R = o.dp_replicas;
  if (R < 1) throw InputError(fmt::format("--dp-replicas {} must be positive", R));
  const int64_t micro = micro_batch(o, R, "replicas");
  const bool mlp = o.model == "mlp";
  Replicas reps = make_replicas(o, R, micro);
  Model& master = *reps.models[0];
  const int64_t steps = reps.data[0]->steps(o);
  check_warmup(o, steps);
  Schedule schedule = o.schedule;
  schedule.total_steps = steps;
  auto opt = make_optimizer(o.optimizer, master.layout(), 0, master.param_count());
  const float loss_scale = 1.0f / static_cast<float>(o.grad_accum * R);
  Progress progress(steps, o.quiet, mlp ? "samples/s" : "tokens/s");
  // The master replica is the whole model: samples generate on it.
  std::optional<TrainingSamples> samples;
  if (o.sample_every > 0) samples.emplace(o, dynamic_cast<const Decoder&>(master).config());
  if (!o.quiet)
    std::printf("dpt train: %s, %zu parameters, %s, dp with %d replica threads, global batch %lld, %lld steps\n",
                o.model.c_str(), master.param_count(), o.optimizer.name.c_str(), R, static_cast<long long>(o.batch),
                static_cast<long long>(steps));

  TrainResult r;
  DpTimes times;
  std::vector<double> losses(static_cast<size_t>(R));
  std::vector<Batch> batches(static_cast<size_t>(R));
  std::string error;
  const double per_step = static_cast<double>(o.batch * (mlp ? 1 : master.positions()));
  Clock::time_point t_step;
  // Replicas are the threads of one OpenMP team: inside it, the engine's own
  // parallel loops and OpenBLAS run single-threaded on each replica's thread.
#pragma omp parallel num_threads(R)
  {
    const size_t i = static_cast<size_t>(omp_get_thread_num());
    for (int64_t step = 0; step < steps; ++step) {
#pragma omp master
      t_step = Clock::now();
      auto tc = Clock::now();
      losses[i] = replica_pass(o, *reps.models[i], *reps.data[i], batches[i], loss_scale, error);
      const double c_ms = ms_since(tc);
#pragma omp barrier
#pragma omp master
      {
        times.compute.push_back(c_ms);
        master_update(o, reps, *opt, schedule.at(step), times);
        double mean = 0.0;
        for (double l : losses) mean += l / R;
        if (step == 0) r.first_loss = mean;
        r.final_loss = mean;
        times.step.push_back(ms_since(t_step));
        if ((step + 1) % o.log_every == 0 || step + 1 == steps)
          progress.update(step + 1, mean, per_step * 1000.0 / times.step.back());
        if (samples && (step + 1) % o.sample_every == 0)
          progress.line(fmt::format("sample after step {}: {}", step + 1,
                                    samples->sample(dynamic_cast<Decoder&>(master), step + 1)));
      }
#pragma omp barrier
      if (!error.empty()) break;
    }
  }
  if (!error.empty()) throw InputError(error);
  progress.finish();
  r.steps = steps;
  finish_dp_run(o, reps, micro, times, r);
  report_dp_run(o, r, R, times, reps.data[0]->evaluable());
  return r;
}

}  // namespace dpt
