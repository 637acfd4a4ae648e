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
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/stats.h"
#include "core/memory.h"
#include "io/atomic_file.h"
#include "models/weights.h"
#include "parallel/replicas.h"
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
    nlohmann::json j = {{"model", o.model}, {"strategy", "dp"}, {"world", 1}, {"replicas", R},
                        {"steps", steps}, {"batch", o.batch}, {"first_loss", r.first_loss},
                        {"final_loss", r.final_loss}, {"step_ms_median", r.step_ms_median},
                        {"samples_per_s", r.samples_per_s}, {"gflops", r.gflops},
                        {"compute_ms", steady(t.compute)}, {"gather_ms", steady(t.gather)},
                        {"optimizer_ms", steady(t.opt)}, {"broadcast_ms", steady(t.bcast)},
                        {"peak_rss", r.peak_rss}};
    write_summary(o.summary_out, std::move(j), r, mlp, evaluable);
  }
}

TrainResult run_dp_training(const TrainOptions& o) {
  const int R = o.dp_replicas;
  if (R < 1) throw InputError(fmt::format("--dp-replicas {} must be positive", R));
  const int64_t micro = micro_batch(o, R, "replicas");
  const bool mlp = o.model == "mlp";

  // Replica 0 is built (or loaded) and the others copy its weights; the
  // data is read once and shared.
  std::vector<std::unique_ptr<Model>> replicas;
  replicas.push_back(build_model(o, o.seed));
  Model& master = *replicas[0];
  const size_t n = master.param_count();
  const auto sets = load_datasets(o, master);
  std::vector<std::unique_ptr<DataSource>> data;
  for (int i = 0; i < R; ++i) {
    if (i > 0) {
      replicas.push_back(make_model(master.metadata()));
      replicas.back()->set_checkpoint_activations(o.checkpoint_activations);
      std::memcpy(replicas.back()->params(), master.params(), n * sizeof(float));
    }
    data.push_back(std::make_unique<DataSource>(o, *replicas.back(), sets, micro, i, R));
  }
  const int64_t steps = data[0]->steps(o);
  Schedule schedule = o.schedule;
  schedule.total_steps = steps;
  auto opt = make_optimizer(o.optimizer, master.layout(), 0, n);
  const float loss_scale = 1.0f / static_cast<float>(o.grad_accum * R);
  Progress progress(steps, o.quiet, mlp ? "samples/s" : "tokens/s");
  if (!o.quiet)
    std::printf("dpt train: %s, %zu parameters, %s, dp with %d replica threads, global batch %lld, %lld steps\n",
                o.model.c_str(), n, o.optimizer.name.c_str(), R, static_cast<long long>(o.batch),
                static_cast<long long>(steps));

  TrainResult r;
  DpTimes times;
  auto& [step_ms, compute_ms, gather_ms, opt_ms, bcast_ms] = times;
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
    Model& mine = *replicas[i];
    for (int64_t step = 0; step < steps; ++step) {
#pragma omp master
      t_step = Clock::now();
      auto tc = Clock::now();
      double loss = 0.0;
      try {
        mine.zero_grads();
        for (int64_t k = 0; k < o.grad_accum; ++k) {
          data[i]->next(batches[i]);
          loss += mine.forward(batches[i]).loss;
          mine.backward(loss_scale);
        }
      } catch (const std::exception& e) {
#pragma omp critical
        error = e.what();
      }
      losses[i] = loss / static_cast<double>(o.grad_accum);
      const double c_ms = ms_since(tc);
#pragma omp barrier
#pragma omp master
      {
        compute_ms.push_back(c_ms);
        // Gather: replica 0 adds every other replica's gradients to its own.
        auto tg = Clock::now();
        float* g = master.grads();
        for (int q = 1; q < R; ++q) {
          const float* gq = replicas[static_cast<size_t>(q)]->grads();
#pragma omp simd
          for (size_t e = 0; e < n; ++e) g[e] += gq[e];
        }
        gather_ms.push_back(ms_since(tg));
        auto to = Clock::now();
        if (o.clip > 0.0f) scale(g, n, clip_factor(std::sqrt(sum_of_squares(g, n)), o.clip));
        opt->step(master.params(), g, schedule.at(step));
        opt_ms.push_back(ms_since(to));
        // Broadcast: copy the new weights into every other replica.
        auto tb = Clock::now();
        for (int q = 1; q < R; ++q)
          std::memcpy(replicas[static_cast<size_t>(q)]->params(), master.params(), n * sizeof(float));
        bcast_ms.push_back(ms_since(tb));
        double mean = 0.0;
        for (double l : losses) mean += l / R;
        if (step == 0) r.first_loss = mean;
        r.final_loss = mean;
        const double ms = ms_since(t_step);
        step_ms.push_back(ms);
        if ((step + 1) % o.log_every == 0 || step + 1 == steps) progress.update(step + 1, mean, per_step * 1000.0 / ms);
      }
#pragma omp barrier
      if (!error.empty()) break;
    }
  }
  if (!error.empty()) throw InputError(error);
  progress.finish();
  r.steps = steps;
  r.step_ms_median = steady_median(step_ms);
  r.breakdown = {0.0,
                 0.0,
                 steady_median(compute_ms),
                 steady_median(gather_ms) + steady_median(bcast_ms),
                 steady_median(opt_ms),
                 r.step_ms_median};
  r.samples_per_s = static_cast<double>(o.batch) * 1000.0 / r.step_ms_median;
  if (!mlp) r.tokens_per_s = r.samples_per_s * static_cast<double>(master.positions());
  r.gflops = master.train_flops(o.batch) / (r.step_ms_median * 1e-3) / 1e9;
  // Saved before anything else can fail: evaluation, the summary.
  if (!o.save.empty()) save_weights(master, o.save, parse_weight_format(o.save_format));
  if (data[0]->evaluable()) {
    EvalResult ev = data[0]->evaluate(master, micro, o.eval_windows, 0, 1);
    r.eval_loss = ev.loss();
    r.eval_accuracy = ev.accuracy();
  }
  r.peak_rss = peak_rss_bytes();
  report_dp_run(o, r, R, times, data[0]->evaluable());
  return r;
}

}  // namespace dpt
