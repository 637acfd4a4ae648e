#include "train/train.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/stats.h"
#include "core/gemm_peak.h"
#include "core/memory.h"
#include "core/threads.h"
#include "io/atomic_file.h"
#include "models/weights.h"
#include "parallel/replicas.h"
#include "train/data_source.h"
#include "train/progress.h"
#include "train/timeline.h"

namespace dpt {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

void apply_defaults(TrainOptions& o) {
  const bool mlp = o.model == "mlp";
  if (o.model != "mlp" && o.model != "gpt")
    throw InputError(fmt::format("unknown model '{}' (expected mlp or gpt)", o.model));
  if (o.batch == 0) o.batch = mlp ? 256 : 16;
  if (o.optimizer.name.empty()) o.optimizer.name = mlp ? "sgd" : "adamw";
  if (o.schedule.lr <= 0.0f) o.schedule.lr = o.optimizer.name == "sgd" ? 0.05f : 3e-4f;
  if (o.optimizer.weight_decay < 0.0f) o.optimizer.weight_decay = o.optimizer.name == "adamw" ? 0.1f : 0.0f;
  if (o.batch < 1) throw InputError(fmt::format("batch size {} must be positive", o.batch));
  if (o.grad_accum < 1) throw InputError(fmt::format("--grad-accum {} must be positive", o.grad_accum));
  if (o.steps < 0) throw InputError(fmt::format("steps {} must not be negative", o.steps));
  if (o.log_every < 1) o.log_every = 1;
}

namespace {


double since_ms(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Every rank's values, gathered as doubles (an all-gather moves bytes).
std::vector<double> gather(comm::ProcessGroup& pg, const std::vector<double>& mine) {
  const size_t k = mine.size();
  std::vector<double> all(k * static_cast<size_t>(pg.size()));
  std::copy(mine.begin(), mine.end(), all.begin() + static_cast<long>(k * static_cast<size_t>(pg.rank())));
  pg.all_gather(all.data(), all.size() * 2, DType::F32);
  return all;
}

// samples_per_s of a 1-rank run's summary.
double read_baseline_throughput(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw IoError(fmt::format("{}: cannot read the baseline summary", path));
  json j;
  try {
    in >> j;
  } catch (const json::exception&) {
    throw IoError(fmt::format("{}: the baseline summary is not JSON", path));
  }
  if (!j.contains("samples_per_s") || !j["samples_per_s"].is_number() || j["samples_per_s"].get<double>() <= 0)
    throw InputError(fmt::format("{}: no positive samples_per_s in the baseline summary", path));
  if (j.value("world", 1) != 1)
    throw InputError(fmt::format("{}: the baseline must be a 1-rank run", path));
  return j["samples_per_s"].get<double>();
}

}  // namespace

void check_outputs(const TrainOptions& o, comm::ProcessGroup& pg) {
  std::string problem;
  if (pg.rank() == 0)
    for (const std::string* path : {&o.save, &o.metrics_out, &o.summary_out, &o.trace_out}) {
      if (path->empty()) continue;
      try {
        check_creatable(*path);
      } catch (const IoError& e) {
        problem = e.what();
        break;
      }
    }
  float bad = problem.empty() ? 0.0f : 1.0f;
  if (pg.size() > 1) pg.all_reduce(&bad, 1, DType::F32, comm::ReduceOp::Max);
  if (!problem.empty()) throw IoError(problem);
  if (bad > 0.0f) throw IoError("rank 0 cannot create one of the run's output files (its error names it)");
}

int64_t micro_batch(const TrainOptions& o, int parts, const char* parts_name) {
  if (o.batch % (parts * o.grad_accum) != 0)
    throw InputError(fmt::format("global batch {} does not split into {} {} x {} equal micro-batches", o.batch,
                                 parts, parts_name, o.grad_accum));
  return o.batch / parts / o.grad_accum;
}

std::unique_ptr<Model> build_model(const TrainOptions& o, uint64_t seed) {
  std::map<std::string, std::string> hp = o.hparams;
  hp["dpt.model"] = o.model;
  if (!o.load.empty()) return model_from_file(o.load, hp);
  auto model = make_model(hp);
  model->init_params(seed);
  return model;
}

void write_summary(const std::string& path, nlohmann::json j, const TrainResult& r, bool mlp, bool evaluated) {
  if (!mlp) j["tokens_per_s"] = r.tokens_per_s;
  j["blas_core"] = blas_core();
  if (evaluated) {
    j[mlp ? "test_loss" : "val_loss"] = r.eval_loss;
    if (mlp) j["test_accuracy"] = r.eval_accuracy;
  }
  AtomicFile f(path);
  f.write(j.dump(2) + "\n");
  f.commit();
}

TrainResult run_training(TrainOptions o) {
  auto pg = comm::ProcessGroup::create();
  return run_training(std::move(o), *pg);
}

TrainResult run_training(TrainOptions o, comm::ProcessGroup& pg) {
  apply_defaults(o);
  const int rank = pg.rank(), world = pg.size();
  const bool lead = rank == 0;
  if (o.strategy.empty()) o.strategy = world > 1 ? "ddp" : "local";
  check_outputs(o, pg);
  if (o.strategy == "dp") {
    if (world > 1) throw InputError("--strategy dp runs in one process; start it without a launcher");
    if (!o.trace_out.empty()) throw InputError("--trace-out records local and ddp training, not --strategy dp");
    return run_dp_training(o);
  }
  if (o.strategy != "local" && o.strategy != "ddp")
    throw InputError(fmt::format("unknown strategy '{}' (expected local, ddp or dp)", o.strategy));
  if (o.strategy == "local" && world > 1)
    throw InputError(fmt::format("--strategy local trains one process, but {} ranks were launched; use ddp", world));
  const int64_t micro = micro_batch(o, world, "ranks");
  // Read now: a bad baseline must fail before training, not after it.
  const double baseline = o.baseline.empty() ? 0.0 : read_baseline_throughput(o.baseline);
  const bool ddp = o.strategy == "ddp";
  // Ranks other than 0 start from other weights on purpose: DDP's initial
  // broadcast must make them equal, and the replica check proves it did.
  auto model = build_model(o, o.seed + (ddp ? 1000003ULL * static_cast<uint64_t>(rank) : 0));
  const bool mlp = o.model == "mlp";
  std::unique_ptr<Reducer> reducer;
  if (ddp) {
    pg.broadcast(model->params(), model->param_count(), DType::F32, 0);
    verify_replicas(*model, pg, 0);
    reducer = std::make_unique<Reducer>(*model, pg, o.ddp);
  }

  DataSource data(o, *model, load_datasets(o, *model), micro, rank, world);
  const int64_t steps = data.steps(o);
  o.schedule.total_steps = steps;
  auto opt = make_optimizer(o.optimizer, model->layout(), 0, model->param_count());

  auto evaluate = [&]() -> std::optional<EvalResult> {
    if (!data.evaluable()) return std::nullopt;
    return combine(data.evaluate(*model, micro, o.eval_windows, rank, world), pg);
  };

  std::unique_ptr<AtomicFile> metrics;
  if (lead && !o.metrics_out.empty()) metrics = std::make_unique<AtomicFile>(o.metrics_out);
  const bool quiet = o.quiet || !lead;
  Progress progress(steps, quiet, mlp ? "samples/s" : "tokens/s");
  if (!quiet)
    std::printf("dpt train: %s, %zu parameters, %s, %s on %d rank%s, global batch %lld (%lld per rank%s), "
                "%lld steps, %d thread%s per rank\n",
                o.model.c_str(), model->param_count(), o.optimizer.name.c_str(), o.strategy.c_str(), world,
                world == 1 ? "" : "s", static_cast<long long>(o.batch), static_cast<long long>(o.batch / world),
                o.grad_accum > 1 ? fmt::format(", {} micro-batches of {}", o.grad_accum, micro).c_str() : "",
                static_cast<long long>(steps), threads(), threads() == 1 ? "" : "s");
  if (!quiet && !o.synthetic && !data.evaluable())
    std::printf("no held-out text (--val-fraction 0): evaluation is skipped\n");
  if (!quiet && reducer)
    std::printf("ddp: %zu buckets (first %.2f MiB, cap %.1f MiB)%s\n", reducer->buckets().size(),
                reducer->buckets().front().numel * 4.0 / (1 << 20), o.ddp.bucket_bytes / double(1 << 20),
                o.ddp.per_param ? ", one per parameter" : (o.ddp.overlap ? ", overlapped with backward" : ", after backward"));

  TrainResult r;
  Batch batch;
  std::vector<double> step_ms, data_ms, fwd_ms, bwd_ms, wait_ms, opt_ms;
  // Reserved up front so steps allocate nothing (capped: a run of millions
  // of steps grows these rarely, by doubling, rather than reserving GBs).
  for (auto* v : {&step_ms, &data_ms, &fwd_ms, &bwd_ms, &wait_ms, &opt_ms})
    v->reserve(static_cast<size_t>(std::min<int64_t>(steps, 1 << 16)));
  const double per_step = static_cast<double>(o.batch * (mlp ? 1 : model->positions()));
  // Under DDP the loss scale carries the 1/world of the average, so the
  // all-reduce is a plain sum and every gradient element is scaled once.
  const float loss_scale = 1.0f / static_cast<float>(o.grad_accum * (ddp ? world : 1));
  const uint64_t bytes_at_start = pg.ledger().total().bytes_sent;
  // The timeline records only the last trace_steps steps: per step data,
  // forward and backward per micro-batch, the wait, the optimizer and one
  // span per bucket.
  std::optional<Timeline> timeline;
  std::unique_ptr<AtomicFile> trace_file;
  if (lead && !o.trace_out.empty()) trace_file = std::make_unique<AtomicFile>(o.trace_out);
  if (!o.trace_out.empty())
    timeline.emplace(static_cast<size_t>(std::min(o.trace_steps, steps)) *
                     (3 * static_cast<size_t>(o.grad_accum) + 2 + (reducer ? reducer->buckets().size() : 0)));
  auto run_start = Clock::now();
  for (int64_t step = 0; step < steps; ++step) {
    auto t0 = Clock::now();
    Timeline* tl = timeline && step >= steps - o.trace_steps ? &*timeline : nullptr;
    double d_ms = 0, f_ms = 0, b_ms = 0, w_ms = 0;
    model->zero_grads();
    double loss = 0.0;
    for (int64_t k = 0; k < o.grad_accum; ++k) {
      auto td = Clock::now();
      data.next(batch);
      d_ms += since_ms(td);
      if (reducer) reducer->prepare(k == o.grad_accum - 1);  // no_sync before the last
      auto tf = Clock::now();
      loss += model->forward(batch).loss;
      auto tb = Clock::now();
      f_ms += std::chrono::duration<double, std::milli>(tb - tf).count();
      model->backward(loss_scale);
      b_ms += since_ms(tb);
      if (tl) {
        tl->add(Timeline::Data, step, -1, td, tf);
        tl->add(Timeline::Forward, step, -1, tf, tb);
        tl->add(Timeline::Backward, step, -1, tb, Clock::now());
      }
    }
    loss /= static_cast<double>(o.grad_accum);
    auto tw = Clock::now();
    if (reducer) w_ms = reducer->finish() * 1000.0;
    auto to = Clock::now();
    if (tl && reducer) {
      tl->add(Timeline::CommWait, step, -1, tw, to);
      const auto& buckets = reducer->buckets();
      for (size_t i = 0; i < buckets.size(); ++i)
        if (buckets[i].work)
          tl->add(Timeline::AllReduce, step, static_cast<int>(i), buckets[i].work->started_at(),
                  buckets[i].work->finished_at());
    }
    // The global gradient norm is needed to clip, and logged; it costs a
    // pass over the gradients, so it is skipped on other steps. After the
    // all-reduce every rank holds the same gradients: the norm is global.
    const bool log_step = (step + 1) % o.log_every == 0 || step + 1 == steps;
    double grad_norm = 0.0;
    if (o.clip > 0.0f || log_step) grad_norm = std::sqrt(sum_of_squares(model->grads(), model->param_count()));
    if (o.clip > 0.0f) scale(model->grads(), model->param_count(), clip_factor(grad_norm, o.clip));
    const float lr = o.schedule.at(step);
    opt->step(model->params(), model->grads(), lr);
    const double o_ms = since_ms(to);
    if (tl) tl->add(Timeline::Optimizer, step, -1, to, Clock::now());
    const double ms = since_ms(t0);
    step_ms.push_back(ms);
    data_ms.push_back(d_ms);
    fwd_ms.push_back(f_ms);
    bwd_ms.push_back(b_ms);
    wait_ms.push_back(w_ms);
    opt_ms.push_back(o_ms);
    if (!std::isfinite(loss))
      throw InputError(fmt::format("training diverged: loss is {} at step {}", loss, step));
    if (o.verify_every > 0 && world > 1 && (step + 1) % o.verify_every == 0) verify_replicas(*model, pg, step + 1);

    std::optional<EvalResult> ev;
    if (o.eval_every > 0 && (step + 1) % o.eval_every == 0 && step + 1 < steps) ev = evaluate();
    if (log_step || ev) {
      if (world > 1) {  // the loss of the global batch: the mean of the ranks'
        float l = static_cast<float>(loss);
        pg.all_reduce(&l, 1, DType::F32, comm::ReduceOp::Avg);
        loss = l;
      }
      double rate = per_step * 1000.0 / ms;
      progress.update(step + 1, loss, rate);
      if (ev) progress.line(mlp ? fmt::format("step {}: test loss {:.4f}, accuracy {:.2f}%", step + 1,
                                              ev->loss(), 100.0 * ev->accuracy())
                                : fmt::format("step {}: validation loss {:.4f}", step + 1, ev->loss()));
      if (metrics) {
        json j = {{"step", step + 1}, {"loss", loss}, {"lr", lr}, {"grad_norm", grad_norm},
                  {"step_ms", ms}, {"data_ms", d_ms}, {"forward_ms", f_ms}, {"backward_ms", b_ms},
                  {"comm_wait_ms", w_ms}, {"optimizer_ms", o_ms},
                  {mlp ? "samples_per_s" : "tokens_per_s", rate}};
        if (ev) {
          j[mlp ? "test_loss" : "val_loss"] = ev->loss();
          if (mlp) j["test_accuracy"] = ev->accuracy();
        }
        metrics->write(j.dump() + "\n");
        metrics->flush();
      }
    }
    if (step == 0) r.first_loss = loss;
    r.final_loss = loss;
  }
  progress.finish();
  if (timeline) {
    std::vector<size_t> bucket_bytes;
    if (reducer)
      for (const Bucket& b : reducer->buckets()) bucket_bytes.push_back(b.numel * sizeof(float));
    timeline->write(trace_file.get(), pg, bucket_bytes);
  }
  const double total_s = std::chrono::duration<double>(Clock::now() - run_start).count();
  r.steps = steps;
  r.comm_bytes_per_step = (pg.ledger().total().bytes_sent - bytes_at_start) / static_cast<uint64_t>(steps);

  const size_t skip = warmup_steps(step_ms.size());  // see core/stats.h
  auto steady = [](const std::vector<double>& v) { return steady_median(v); };
  r.step_ms_median = steady(step_ms);
  r.breakdown = {steady(data_ms), steady(fwd_ms), steady(bwd_ms), steady(wait_ms), steady(opt_ms), r.step_ms_median};
  // Throughput of the job: the slowest rank sets the pace. Per rank: data,
  // forward, backward, comm wait, optimizer, step (ms), peak RSS (bytes).
  constexpr size_t kPerRank = 7;
  const std::vector<double> all = gather(pg, {r.breakdown.data_ms, r.breakdown.forward_ms, r.breakdown.backward_ms,
                                              r.breakdown.comm_wait_ms, r.breakdown.optimizer_ms,
                                              r.breakdown.step_ms, static_cast<double>(peak_rss_bytes())});
  double slowest = 0.0;
  for (int q = 0; q < world; ++q) slowest = std::max(slowest, all[static_cast<size_t>(q) * kPerRank + 5]);
  if (slowest > 0) {
    r.samples_per_s = static_cast<double>(o.batch) * 1000.0 / slowest;
    if (!mlp) r.tokens_per_s = r.samples_per_s * static_cast<double>(model->positions());
    r.gflops = model->train_flops(o.batch) / (slowest * 1e-3) / 1e9;
  }
  if (baseline > 0) r.scaling_efficiency = r.samples_per_s / (world * baseline);
  r.sgemm_gflops = measure_sgemm_gflops() * world;
  r.mfu = r.sgemm_gflops > 0 ? r.gflops / r.sgemm_gflops : 0.0;

  // The weights and metrics are written before anything else can fail
  // (evaluation, the summary), so a finished run is never lost.
  if (lead && !o.save.empty()) save_weights(*model, o.save);
  if (metrics) metrics->commit();
  if (auto ev = evaluate()) {
    r.eval_loss = ev->loss();
    r.eval_accuracy = ev->accuracy();
  }
  r.peak_rss = peak_rss_bytes();

  const double MB = 1.0 / (1 << 20);
  const size_t param_bytes = model->param_count() * sizeof(float);
  if (!quiet) {
    std::printf("done: %lld steps in %.1f s, train loss %.4f -> %.4f", static_cast<long long>(steps), total_s,
                r.first_loss, r.final_loss);
    if (!data.evaluable() && !o.synthetic) {
      std::printf(", no evaluation (--val-fraction 0 holds no text out)");
    } else if (!o.synthetic) {
      if (mlp)
        std::printf(", test accuracy %.2f%% (loss %.4f)", 100.0 * r.eval_accuracy, r.eval_loss);
      else
        std::printf(", validation loss %.4f", r.eval_loss);
    }
    std::printf("\nthroughput: %.0f %s (median step %.2f ms after step %zu), %.1f GFLOP/s = %.0f%% of "
                "measured sgemm peak %.1f GFLOP/s (%d rank%s, OpenBLAS %s kernels)\n",
                mlp ? r.samples_per_s : r.tokens_per_s, mlp ? "samples/s" : "tokens/s", slowest, skip, r.gflops,
                100.0 * r.mfu, r.sgemm_gflops, world, world == 1 ? "" : "s", blas_core().c_str());
    std::printf("memory per rank: parameters %.1f MiB, gradients %.1f MiB, optimizer %.1f MiB, activations "
                "%.1f MiB, peak RSS %.1f MiB\n",
                param_bytes * MB, param_bytes * MB, opt->state_bytes() * MB, model->activation_bytes() * MB,
                r.peak_rss * MB);
    if (r.scaling_efficiency > 0)
      std::printf("scaling efficiency: %.1f%% of %d x the baseline's %.0f samples/s (%s)\n",
                  100.0 * r.scaling_efficiency, world, r.samples_per_s / (world * r.scaling_efficiency),
                  o.baseline.c_str());
    if (world > 1) {
      std::printf("step breakdown (median ms)   data  forward  backward  comm wait  optimizer    step\n");
      for (int q = 0; q < world; ++q) {
        const double* v = all.data() + static_cast<size_t>(q) * kPerRank;
        std::printf("  rank %-3d                 %6.2f %8.2f  %8.2f  %9.2f  %9.2f  %7.2f\n", q, v[0], v[1], v[2],
                    v[3], v[4], v[5]);
      }
      std::printf("communication: %.2f MiB sent per step per rank (gradients %.2f MiB: 2(N-1)/N = %.3f of "
                  "them); exposed %.1f%% of the step on rank 0\n",
                  r.comm_bytes_per_step * MB, param_bytes * MB,
                  static_cast<double>(r.comm_bytes_per_step) / static_cast<double>(param_bytes),
                  r.step_ms_median > 0 ? 100.0 * r.breakdown.comm_wait_ms / r.step_ms_median : 0.0);
    }
    if (!o.save.empty()) std::printf("saved %s\n", o.save.c_str());
  }
  if (lead && !o.summary_out.empty()) {
    json ranks = json::array();
    for (int q = 0; q < world; ++q) {
      const double* v = all.data() + static_cast<size_t>(q) * kPerRank;
      ranks.push_back({{"data_ms", v[0]}, {"forward_ms", v[1]}, {"backward_ms", v[2]}, {"comm_wait_ms", v[3]},
                       {"optimizer_ms", v[4]}, {"step_ms", v[5]}, {"peak_rss", v[6]}});
    }
    json j = {{"model", o.model}, {"strategy", o.strategy}, {"world", world}, {"threads", threads()},
              {"steps", steps}, {"batch", o.batch}, {"grad_accum", o.grad_accum},
              {"params", model->param_count()}, {"first_loss", r.first_loss}, {"final_loss", r.final_loss},
              {"step_ms_median", slowest}, {"samples_per_s", r.samples_per_s}, {"gflops", r.gflops},
              {"sgemm_gflops", r.sgemm_gflops}, {"mfu", r.mfu}, {"seconds", total_s},
              {"synthetic", o.synthetic}, {"ranks", ranks},
              {"comm_bytes_per_step", r.comm_bytes_per_step}, {"comm", pg.ledger().to_json()},
              {"bytes", {{"parameters", param_bytes}, {"gradients", param_bytes},
                         {"optimizer", opt->state_bytes()}, {"activations", model->activation_bytes()},
                         {"peak_rss", r.peak_rss}}}};
    if (reducer) {
      json buckets = json::array();
      for (const Bucket& b : reducer->buckets()) buckets.push_back({{"offset", b.offset}, {"numel", b.numel}});
      j["ddp"] = {{"buckets", buckets}, {"overlap", o.ddp.overlap}, {"per_param", o.ddp.per_param}};
    }
    if (r.scaling_efficiency > 0) j["scaling_efficiency"] = r.scaling_efficiency;
    write_summary(o.summary_out, std::move(j), r, mlp, data.evaluable());
  }
  return r;
}

}  // namespace dpt
