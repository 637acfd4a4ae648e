#include "train/run_report.h"

#include <algorithm>
#include <cstdio>
#include <fstream>

#include <fmt/format.h>

#include "core/cpu_level.h"
#include "core/dot_rate.h"
#include "core/error.h"
#include "core/gemm_peak.h"
#include "core/memory.h"
#include "core/threads.h"
#include "io/atomic_file.h"
#include "io/read_checks.h"
#include "nn/gemm.h"
#include "models/decoder.h"
#include "train/gemm_rate.h"
#include "train/pipeline_executor.h"
#include "train/rank_setup.h"
#include "train/report.h"

namespace dpt {

using nlohmann::json;

namespace {

// Every rank's values, gathered as doubles (an all-gather moves bytes).
std::vector<double> gather(comm::ProcessGroup& pg, const std::vector<double>& mine) {
  const size_t k = mine.size();
  std::vector<double> all(k * static_cast<size_t>(pg.size()));
  std::copy(mine.begin(), mine.end(), all.begin() + static_cast<long>(k * static_cast<size_t>(pg.rank())));
  pg.all_gather(all.data(), all.size() * 2, DType::F32);
  return all;
}

// The pipeline's line: the mesh, the schedule, each stage's blocks and the
// bubble a balanced pipeline would have.
void print_pipeline(const TrainOptions& o, const Mesh& mesh, const Model& model) {
  const DecoderConfig& c = dynamic_cast<const Decoder&>(model).config();
  const PipeProgram program = run_program(o, mesh.pp);
  std::string blocks;
  for (const DecoderStage& st : pipe_stages(c, program, o.pp_split)) {
    std::string chunks;
    for (const BlockRange& r : st.chunks) chunks += fmt::format("{}{}-{}", chunks.empty() ? "" : "+", r.first, r.last - 1);
    blocks += fmt::format("{}{}", blocks.empty() ? "" : " | ", chunks);
  }
  const int M = static_cast<int>(o.grad_accum);
  std::printf("pipeline: %s, %s, %d micro-batches per step, blocks %s; bubble %s = %.0f%%%s\n",
              mesh.describe().c_str(), o.pp_schedule.c_str(), M, blocks.c_str(),
              program.schedule == "interleaved"    ? "(pp-1)/(vM+pp-1)"
              : pipe_splits_backward(program) ? "(simulated, F = B = W)"
                                              : "(pp-1)/(M+pp-1)",
              100.0 * pipe_bubble_of(program), M < mesh.pp ? " (fewer micro-batches than stages: mostly bubble)" : "");
}

// Every rank's step medians and peak RSS; the job's throughput from the
// slowest rank (it sets the pace), into r.
std::vector<RankTimes> gather_ranks(comm::ProcessGroup& pg, TrainResult& r, const TrainOptions& o,
                                    const Model& model, const StepTimes& times, double baseline, double total_s) {
  const StepBreakdown& b = r.breakdown;
  double slower = 0.0;
  r.lockstep_split = lockstep_split_made(pg.size(), o.tp, o.pp, o.device == Device::CPU);
  if (r.lockstep_split) {
    const auto steps = times.lockstep_steps();
    slower = b.comm_wait_ms * slower_rank_share(gather(pg, steps.busy), pg.size(), pg.rank(), steps.waits);
    r.straggler = find_straggler(gather(pg, steps.work), pg.size());
  }
  const std::vector<double> all = gather(pg, {b.data_ms, b.forward_ms, b.backward_ms, b.gather_ms, b.comm_wait_ms,
                                              slower, b.optimizer_ms, b.step_ms, static_cast<double>(r.peak_rss)});
  std::vector<RankTimes> ranks;
  double slowest = 0.0;
  for (int q = 0; q < pg.size(); ++q) {
    const double* v = all.data() + static_cast<size_t>(q) * RankTimes::kFields;
    ranks.push_back({v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8]});
    slowest = std::max(slowest, v[7]);
  }
  r.step_ms_median = slowest;
  if (slowest > 0) {
    r.samples_per_s = static_cast<double>(o.batch) * 1000.0 / slowest;
    if (o.model != "mlp") r.tokens_per_s = r.samples_per_s * static_cast<double>(model.positions());
    r.gflops = model.train_flops(o.batch) / (slowest * 1e-3) / 1e9;
  }
  if (baseline > 0) r.scaling_efficiency = r.samples_per_s / (pg.size() * baseline);
  // The peak's runs may take 2% of the run's time, at most 0.5 s: a short
  // test run measures as before, a benchmark's run long enough to see past
  // a passing sag; and the higher of that and the sample after the first
  // step (core/gemm_peak.h).
  r.gemm_gflops =
      std::max(r.early_gemm_gflops, measure_device_gemm_gflops(o.device, o.precision, std::min(0.5, 0.02 * total_s))) *
      pg.size();
  r.mfu = r.gemm_gflops > 0 ? r.gflops / r.gemm_gflops : 0.0;
  return ranks;
}

}  // namespace

double read_baseline_throughput(const std::string& path) {
  refuse_directory(path, "a --summary-out file");
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

void write_summary(const std::string& path, nlohmann::json j, const TrainResult& r, bool mlp, bool evaluated) {
  if (!mlp) j["tokens_per_s"] = r.tokens_per_s;
  if (r.checkpoints > 0 || r.resume_bytes > 0)
    j["checkpoints"] = {{"written", r.checkpoints}, {"write_s", r.checkpoint_s}, {"write_bytes", r.checkpoint_bytes},
                        {"resume_s", r.resume_s}, {"resume_bytes", r.resume_bytes}};
  j["blas_core"] = blas_core();
  j["gemm_detail"] = gemm_backend_detail();
  // How this run's bf16 GEMMs ran (nn/gemm.h): on bf16 kernels or widened
  // to fp32, and the measured rate auto decides by.
  j["bf16_gemm"] = gemm_bf16_native() ? "native" : "widened";
  j["bf16_dot_over_fma"] = bf16_dot_over_fma();
  j["cpu_kernels"] = cpu_kernel_level();
  if (evaluated) {
    j[mlp ? "test_loss" : "val_loss"] = r.eval_loss;
    if (mlp) j["test_accuracy"] = r.eval_accuracy;
  }
  AtomicFile f(path);
  f.write(j.dump(2) + "\n");
  f.commit();
}

void print_header(const TrainOptions& o, const Model& model, const Strategy& strategy, const Mesh& mesh,
                  int64_t micro, int64_t steps, bool evaluable, const nlohmann::json& topology) {
  const int world = mesh.world;
  // A bf16 transformer also names its attention products (docs/precision.md).
  std::string precision;
  if (o.precision == DType::BF16) {
    precision = " in bf16 mixed precision";
    if (o.model != "mlp")
      precision += fmt::format(" (attention products in {})", bf16_attention_products_for(o) ? "bf16" : "fp32");
  }
  std::printf("dpt train: %s, %zu parameters%s, %s, %s%s on %d rank%s, global batch %lld (%lld per %s%s), "
              "%lld steps, %d thread%s per rank\n",
              o.model.c_str(), model.param_count(),
              mesh.pp > 1 ? " on this stage" : mesh.tp > 1 ? " in this rank's tensor-parallel slice" : "",
              o.optimizer.name.c_str(), o.strategy.name().c_str(),
              precision.c_str(), world,
              world == 1 ? "" : "s", static_cast<long long>(o.batch), static_cast<long long>(o.batch / mesh.dp),
              mesh.pp > 1 || mesh.tp > 1 || mesh.cp > 1 ? "replica" : "rank",
              o.grad_accum > 1 ? fmt::format(", {} micro-batches of {}", o.grad_accum, micro).c_str() : "",
              static_cast<long long>(steps), threads(), threads() == 1 ? "" : "s");
  if (world > 1) std::printf("%s\n%s\n", strategy.describe().c_str(), topology_line(topology).c_str());
  if (mesh.pp > 1) print_pipeline(o, mesh, model);
  if (mesh.cp > 1) {
    const int64_t T = dynamic_cast<const Decoder&>(model).config().context;
    std::printf("context parallelism: %s; each sequence's %lld tokens in %d chunks of %lld, CP rank r holding chunks "
                "r and %d - r; keys and values passed round the ring (docs/context_parallel.md)\n",
                mesh.describe().c_str(), static_cast<long long>(T), 2 * mesh.cp,
                static_cast<long long>(T / (2 * mesh.cp)), 2 * mesh.cp - 1);
  }
  if (!o.synthetic && !evaluable) std::printf("no held-out text (--val-fraction 0): evaluation is skipped\n");
}


LedgerMark::LedgerMark(comm::ProcessGroup& pg)
    : bytes(pg.ledger().total(comm::Scope::Family).bytes_sent), phases(pg.ledger().phases(comm::Scope::Family)) {}

void count_comm(comm::ProcessGroup& pg, const LedgerMark& mark, const TrainOptions& o, const CommPlan& planned,
                int64_t start, int64_t steps, TrainResult& r) {
  const auto n = static_cast<uint64_t>(std::max<int64_t>(1, steps - start));
  const CommPlan& p = planned;
  const int64_t every = o.log_every;
  const auto logged = static_cast<uint64_t>(steps / every - start / every + (steps % every != 0 ? 1 : 0));
  const uint64_t normed = o.clip > 0.0f ? n : logged;
  r.planned_comm_bytes_per_step =
      (n * p.per_step() + logged * p.logged_other + normed * p.logged_optimizer + p.first_step) / n;
  uint64_t sent = pg.ledger().total(comm::Scope::Family).bytes_sent - mark.bytes;
  for (const auto& [phase, stats] : comm::difference(pg.ledger().phases(comm::Scope::Family), mark.phases)) {
    r.comm_bytes_per_phase[phase] = stats.bytes_sent / n;
    // --sample-every's gathers are not the step's traffic the plan counts:
    // reported as their own phase only.
    if (phase == "sample") sent -= stats.bytes_sent;
  }
  r.comm_bytes_per_step = sent / n;
}

void report_run(const TrainOptions& o, comm::ProcessGroup& pg, const Model& model, const Strategy& strategy,
                Executor& executor, bool evaluated, const StepTimes& times, double baseline, double total_s,
                bool quiet, TrainResult& r) {
  r.peak_rss = peak_rss_bytes();
  r.device_bytes = device_memory(o.device);  // before gather_ranks measures the GEMM peak there
  r.huge_pages = huge_page_bytes();
  r.memory = strategy.bytes();
  r.activation_bytes = executor.activation_bytes();
  std::vector<RankTimes> ranks = gather_ranks(pg, r, o, model, times, baseline, total_s);
  const Report report{.options = o, .model = model, .strategy = strategy, .result = r,
                      .ranks = std::move(ranks), .seconds = total_s, .skipped_steps = warmup_steps(times.size()),
                      .evaluated = evaluated, .ledger = pg.ledger().to_json(comm::Scope::Family),
                      .pipeline = executor.detail()};
  if (!quiet) report.print();
  if (pg.rank() == 0 && !o.summary_out.empty())
    write_summary(o.summary_out, report.json(), r, o.model == "mlp", evaluated);
}

double log_step_out(comm::ProcessGroup& pg, Progress& progress, MetricsFile* metrics, bool mlp, const LoggedStep& s,
                    double rate) {
  if (!std::isfinite(s.grad_norm))
    throw InputError(fmt::format("training diverged: gradient norm is {} at step {}", s.grad_norm, s.step));
  double loss = s.loss;
  // The loss of the global batch: the mean of the replicas' (pg is the
  // data-parallel group; every stage of a pipeline holds its replica's loss).
  if (pg.size() > 1) {
    float l = static_cast<float>(loss);
    pg.all_reduce(&l, 1, DType::F32, comm::ReduceOp::Avg);
    loss = l;
  }
  progress.update(s.step, loss, rate);
  if (s.ev)
    progress.line(mlp ? fmt::format("step {}: test loss {:.4f}, accuracy {:.2f}%", s.step, s.ev->loss(),
                                    100.0 * s.ev->accuracy())
                      : fmt::format("step {}: validation loss {:.4f}", s.step, s.ev->loss()));
  if (metrics) {
    json j = {{"step", s.step}, {"loss", loss}, {"lr", s.lr}, {"grad_norm", s.grad_norm},
              {"step_ms", s.t.step_ms}, {"data_ms", s.t.data_ms}, {"forward_ms", s.t.forward_ms},
              {"backward_ms", s.t.backward_ms}, {"gather_wait_ms", s.t.gather_ms},
              {"comm_wait_ms", s.t.comm_wait_ms}, {"optimizer_ms", s.t.optimizer_ms},
              {mlp ? "samples_per_s" : "tokens_per_s", rate}};
    if (s.ev) {
      j[mlp ? "test_loss" : "val_loss"] = s.ev->loss();
      if (mlp) j["test_accuracy"] = s.ev->accuracy();
    }
    metrics->write_line(j.dump());
  }
  return loss;
}
}  // namespace dpt
