#include "train/train.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <ctime>
#include <cstdlib>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/cpu_level.h"
#include "core/error.h"
#include "core/fault.h"
#include "core/stats.h"
#include "core/gemm_peak.h"
#include "core/memory.h"
#include "core/threads.h"
#include "nn/gemm.h"
#include "io/atomic_file.h"
#include "optim/file_tier.h"
#include "io/safetensors.h"
#include "models/weights.h"
#include "parallel/mesh.h"
#include "parallel/rank_bytes.h"
#include "parallel/tensor_parallel.h"
#include "parallel/replicas.h"
#include "train/checkpoint.h"
#include "train/data_source.h"
#include "train/executor.h"
#include "train/lockstep.h"
#include "train/metrics_file.h"
#include "train/pipeline_executor.h"
#include "train/plan.h"
#include "train/progress.h"
#include "train/report.h"
#include "train/stop_signal.h"
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

// CPU time of the whole process (every thread), in ms.
double process_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
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

std::map<std::string, std::string> model_hparams(const TrainOptions& o) {
  std::map<std::string, std::string> flags = o.hparams;
  flags["dpt.model"] = o.model;
  return o.load.empty() ? flags : hparams_for_file(o.load, flags);
}

StrategyOptions strategy_options(const TrainOptions& o) {
  StrategyOptions so;
  so.name = o.strategy;
  so.optimizer = o.optimizer;
  so.ddp = o.ddp;
  so.zero_scatter = o.zero_scatter;
  so.accumulate_locally = o.zero_accumulate_locally;
  so.reshard_after_forward = o.reshard_after_forward;
  so.prefetch = parse_prefetch(o.prefetch);
  so.shard_group = o.shard_group;
  so.offload = {.what = o.offload, .dir = o.offload_dir, .chunk_bytes = o.offload_chunk_bytes};
  return so;
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
  std::unique_ptr<Model> model;
  if (!o.load.empty()) {
    model = model_from_file(o.load, hp, parse_weight_format(o.load_format));
  } else {
    model = make_model(hp);
    model->init_params(seed);
  }
  model->set_checkpoint_activations(o.checkpoint_activations);
  model->set_precision(o.precision);
  return model;
}

void write_summary(const std::string& path, nlohmann::json j, const TrainResult& r, bool mlp, bool evaluated) {
  if (!mlp) j["tokens_per_s"] = r.tokens_per_s;
  if (r.checkpoints > 0 || r.resume_bytes > 0)
    j["checkpoints"] = {{"written", r.checkpoints}, {"write_s", r.checkpoint_s}, {"write_bytes", r.checkpoint_bytes},
                        {"resume_s", r.resume_s}, {"resume_bytes", r.resume_bytes}};
  j["blas_core"] = blas_core();
  j["gemm_detail"] = gemm_backend_detail();
  j["cpu_kernels"] = cpu_kernel_level();
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

namespace {

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
                             t.optimizer_ms, t.step_ms,    t.cpu_ms,      t.busy_ms};
    size_t i = 0;
    for (auto* v : all()) v->push_back(values[i++]);
  }
  StepBreakdown medians() const {  // see core/stats.h
    return {steady_median(data_), steady_median(fwd_), steady_median(bwd_),  steady_median(gather_),
            steady_median(wait_), steady_median(opt_), steady_median(step_), steady_median(cpu_),
            steady_median(busy_)};
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
  std::array<std::vector<double>*, 9> all() {
    return {&data_, &fwd_, &bwd_, &gather_, &wait_, &opt_, &step_, &cpu_, &busy_};
  }
  std::vector<double> data_, fwd_, bwd_, gather_, wait_, opt_, step_, cpu_, busy_;
};

// The pipeline's line: the mesh, the schedule, each stage's blocks and the
// bubble a balanced pipeline would have.
void print_pipeline(const TrainOptions& o, const Mesh& mesh, const Model& model) {
  const GptConfig& c = dynamic_cast<const Gpt&>(model).config();
  std::string blocks;
  for (const GptStage& st : gpt_stages(c, mesh.pp, o.pp_split))
    blocks += fmt::format("{}{}-{}", blocks.empty() ? "" : " | ", st.first, st.last - 1);
  const int M = static_cast<int>(o.grad_accum);
  std::printf("pipeline: %s, %s, %d micro-batches per step, blocks %s; bubble (pp-1)/(M+pp-1) = %.0f%%%s\n",
              mesh.describe().c_str(), o.pp_schedule.c_str(), M, blocks.c_str(), 100.0 * pipe_bubble(mesh.pp, M),
              M < mesh.pp ? " (fewer micro-batches than stages: mostly bubble)" : "");
}

void print_header(const TrainOptions& o, const Model& model, const Strategy& strategy, const Mesh& mesh,
                  int64_t micro, int64_t steps, bool evaluable, const nlohmann::json& topology) {
  const int world = mesh.world;
  std::printf("dpt train: %s, %zu parameters%s, %s, %s%s on %d rank%s, global batch %lld (%lld per %s%s), "
              "%lld steps, %d thread%s per rank\n",
              o.model.c_str(), model.param_count(),
              mesh.pp > 1 ? " on this stage" : mesh.tp > 1 ? " in this rank's tensor-parallel slice" : "",
              o.optimizer.name.c_str(), o.strategy.c_str(),
              o.precision == DType::BF16 ? " in bf16 mixed precision" : "", world,
              world == 1 ? "" : "s", static_cast<long long>(o.batch), static_cast<long long>(o.batch / mesh.dp),
              mesh.pp > 1 || mesh.tp > 1 ? "replica" : "rank",
              o.grad_accum > 1 ? fmt::format(", {} micro-batches of {}", o.grad_accum, micro).c_str() : "",
              static_cast<long long>(steps), threads(), threads() == 1 ? "" : "s");
  if (world > 1) std::printf("%s\n%s\n", strategy.describe().c_str(), topology_line(topology).c_str());
  if (mesh.pp > 1) print_pipeline(o, mesh, model);
  if (!o.synthetic && !evaluable) std::printf("no held-out text (--val-fraction 0): evaluation is skipped\n");
}

// Every rank's step medians and peak RSS; the job's throughput from the
// slowest rank (it sets the pace), into r.
std::vector<RankTimes> gather_ranks(comm::ProcessGroup& pg, TrainResult& r, const TrainOptions& o,
                                    const Model& model, const StepTimes& times, double baseline) {
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
  r.gemm_gflops = measure_gemm_gflops(o.precision) * pg.size();
  r.mfu = r.gemm_gflops > 0 ? r.gflops / r.gemm_gflops : 0.0;
  return ranks;
}

// One logged step: what the progress line and --metrics-out show.
struct LoggedStep {
  int64_t step;  // 1-based
  double loss, lr, grad_norm;
  StepBreakdown t;
  std::optional<EvalResult> ev;
};

// Checks what is logged (a gradient norm that is not finite means the update
// just applied put NaN or infinity into the parameters), averages the loss
// over the ranks, and shows the step. Returns the global batch's loss.
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

}  // namespace

void check_memory(const TrainOptions& o, const StrategyOptions& so, const Model& model, int64_t micro,
                  comm::ProcessGroup& pg, int arenas, int world, size_t pipeline_bytes) {
  const size_t available = o.memory_budget > 0 ? o.memory_budget : host_available_bytes();
  if (available == 0) return;
  check_fits(so, model, static_cast<size_t>(arenas) * model.activation_bytes_for(micro) + pipeline_bytes, pg.size(),
             ranks_on_host(world > 0 ? world : pg.size()), available);
}

namespace {

// What --device cuda runs today (docs/gpu.md). The rest is refused before
// anything starts.
void check_placement(const TrainOptions& o) {
  if (o.device == Device::CPU) return;
  if (o.strategy == "dp")
    throw InputError("--device cuda: --strategy dp (threads over one process) runs on the CPU only");
  if (o.ddp.reduce_dtype != DType::F32)
    throw InputError("--device cuda: --reduce-dtype bf16 is not built for GPU runs yet");
  if (!o.checkpoint_dir.empty() || !o.resume.empty())
    throw InputError("--device cuda: --checkpoint-dir and --resume are not built for GPU runs yet (--save is)");
}

// The flags that can be checked before anything is built; they need no
// peer, so check_launch runs them before any rank starts.
void check_flags(const TrainOptions& o, const Mesh& mesh) {
  check_pipeline(o, mesh);
  check_tensor_parallel(o, mesh);
  check_placement(o);
  check_shard_group(o.strategy, o.shard_group);
  if (!o.load.empty() && !o.resume.empty())
    throw InputError("--load and --resume both give the starting weights; give one");
}

// The same, and the outputs rank 0 must be able to create.
void check_run(const TrainOptions& o, const Mesh& mesh, comm::ProcessGroup& pg) {
  check_flags(o, mesh);
  check_outputs(o, pg);
}

}  // namespace

void check_offload(const TrainOptions& o, const StrategyOptions& so, const Model& model, comm::ProcessGroup& pg,
                   comm::ProcessGroup& world) {
  if (o.offload.empty()) {
    if (!o.offload_dir.empty()) throw InputError("--offload-dir is given without --offload optimizer");
    return;
  }
  if (o.offload != "optimizer" && o.offload != "params")
    throw InputError(fmt::format("unknown --offload '{}' (expected optimizer or params)", o.offload));
  if (o.offload == "params") {
    // The fp32 masters leave RAM; what computes is their bf16 copy.
    if (o.precision != DType::BF16)
      throw InputError("--offload params moves the fp32 master weights to disk and computes on bf16 copies: it "
                       "needs --precision bf16");
    if (zero_stage(so.name) == 0)
      throw InputError(fmt::format("--offload params needs a sharded strategy (zero1, zero2, zero3, hsdp), not {}",
                                   so.name));
  }
  // Every rank checks the directory it sees (ranks on other hosts see other
  // disks); any rank's refusal ends the run on every rank.
  std::string problem;
  try {
    const MemoryBytes b = rank_bytes(so, model, pg.size());
    check_offload_dir(o.offload_dir, static_cast<uint64_t>(b.offloaded) * ranks_on_host(world.size()));
  } catch (const InputError& e) {
    problem = e.what();
  }
  float bad = problem.empty() ? 0.0f : 1.0f;
  if (world.size() > 1) world.all_reduce(&bad, 1, DType::F32, comm::ReduceOp::Max);
  if (!problem.empty()) throw InputError(problem);
  if (bad > 0.0f) throw InputError("another rank cannot use its --offload-dir (its error names it)");
}

namespace {

// A float as the user wrote it (0.9, not 0.8999999761581421).
json number(float f) { return json::parse(fmt::format("{}", f)); }

// The settings that decide a run's numbers, kept in its checkpoints: a run
// resumed with other values continues, but is told it is not the same run.
json run_settings(const TrainOptions& o) {
  const OptimizerConfig& opt = o.optimizer;
  const Schedule& s = o.schedule;
  return {{"model", o.model},
          {"data", o.data},
          {"synthetic", o.synthetic},
          {"batch", o.batch},
          {"grad_accum", o.grad_accum},
          {"precision", precision_name(o.precision)},
          {"reduce_dtype", precision_name(o.ddp.reduce_dtype)},
          {"seed", o.seed},
          {"clip", number(o.clip)},
          {"val_fraction", o.val_fraction},
          {"sampler_tail", o.sampler_tail},
          {"optimizer", {{"name", opt.name}, {"momentum", number(opt.momentum)}, {"beta1", number(opt.beta1)},
                         {"beta2", number(opt.beta2)}, {"eps", number(opt.eps)},
                         {"weight_decay", number(opt.weight_decay)}}},
          {"schedule", {{"kind", s.kind}, {"lr", number(s.lr)}, {"min_lr", number(s.min_lr)}, {"warmup", s.warmup},
                        {"total_steps", s.total_steps}}}};
}

// "batch: 16 in the checkpoint, 32 now" for every setting that differs.
std::vector<std::string> changed_settings(const json& saved, const json& now, const std::string& prefix = "") {
  std::vector<std::string> out;
  for (const auto& [k, v] : now.items()) {
    const std::string name = prefix + k;
    if (!saved.contains(k)) {
      out.push_back(fmt::format("{}: not in the checkpoint, {} now", name, v.dump()));
    } else if (v.is_object() && saved[k].is_object()) {
      auto inner = changed_settings(saved[k], v, name + ".");
      out.insert(out.end(), inner.begin(), inner.end());
    } else if (saved[k] != v) {
      out.push_back(fmt::format("{}: {} in the checkpoint, {} now", name, saved[k].dump(), v.dump()));
    }
  }
  return out;
}

// The checkpoint's model, with the flags over it (a flag that disagrees is
// then refused by load_checkpoint, naming both values).
std::map<std::string, std::string> resumed_hparams(const TrainOptions& o, const CheckpointInfo& saved) {
  std::map<std::string, std::string> hp = saved.model;
  for (const auto& [k, v] : o.hparams) hp[k] = v;
  hp["dpt.model"] = o.model;
  return hp;
}

// Every rank stops at the same step: the first signal any rank got.
int agreed_signal(comm::ProcessGroup& pg) {
  float sig = static_cast<float>(StopSignals::received());
  if (pg.size() > 1) pg.all_reduce(&sig, 1, DType::F32, comm::ReduceOp::Max);
  return static_cast<int>(sig);
}

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
StepOutcome train_step(StepContext& c, int64_t step, bool log_step, Timeline* tl) {
  const TrainOptions& o = c.o;
  const int rank = c.pg.rank();
  StepOutcome out;
  StepBreakdown& t = out.t;
  auto t0 = Clock::now();
  const double cpu0 = process_cpu_ms();
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
  if (!std::isfinite(out.loss))
    throw InputError(fmt::format("training diverged: loss is {} at step {}", out.loss, step));
  return out;
}

// (Its world, the ranks that write files, is write_checkpoint's to count.)
CheckpointInfo checkpoint_info(const TrainOptions& o, const Model& model, const DataSource& data, int64_t step) {
  CheckpointInfo info;
  info.step = step;
  info.model = model.metadata();
  info.optimizer = o.optimizer.name;
  info.settings = run_settings(o);
  info.data = data.position();
  info.data["samples"] = step * o.batch;
  info.strategy = o.strategy;
  return info;
}

// Loads the checkpoint into the strategy, moves the data to where it
// stood, and tells the user what continues. Returns the step to start at.
int64_t resume_from(const std::string& path, const CheckpointInfo& saved, const TrainOptions& o, Model& model,
                    Strategy& strategy, DataSource& data, comm::ProcessGroup& pg, int64_t steps, TrainResult& r) {
  if (saved.step >= steps)
    throw InputError(fmt::format("{}: the checkpoint is at step {}, and this run has {} steps: nothing to resume",
                                 path, saved.step, steps));
  const auto t0 = Clock::now();
  r.resume_bytes = load_checkpoint(path, saved, strategy, model, pg);
  r.resume_s = std::chrono::duration<double>(Clock::now() - t0).count();
  data.skip_steps(saved.step, o.batch, o.grad_accum);
  if (pg.rank() == 0 && !o.quiet) {
    std::printf("resuming %s at step %lld (written by %s on %d rank%s; %.1f MiB read in %.2f s)\n", path.c_str(),
                static_cast<long long>(saved.step), saved.strategy.c_str(), saved.world, saved.world == 1 ? "" : "s",
                static_cast<double>(r.resume_bytes) / (1 << 20), r.resume_s);
    for (const std::string& c : changed_settings(saved.settings, run_settings(o)))
      std::printf("note: %s; the run continues, but not as the run that wrote the checkpoint\n", c.c_str());
  }
  return saved.step;
}

// The bytes this rank sent per step since the ledger stood at
// (bytes_at_start, phases_at_start), over `ran` steps, in total and by phase.
void count_comm(comm::ProcessGroup& pg, uint64_t bytes_at_start, const std::map<std::string, comm::OpStats>& phases_at_start,
                int64_t ran, TrainResult& r) {
  const auto n = static_cast<uint64_t>(std::max<int64_t>(1, ran));
  r.comm_bytes_per_step = (pg.ledger().total(comm::Scope::Family).bytes_sent - bytes_at_start) / n;
  for (const auto& [phase, stats] : comm::difference(pg.ledger().phases(comm::Scope::Family), phases_at_start))
    r.comm_bytes_per_phase[phase] = stats.bytes_sent / n;
}

// Writes a checkpoint of the state after `done` steps and counts its time
// and bytes in r. Returns its path.
std::string checkpoint_now(const TrainOptions& o, const Model& model, Strategy& strategy, const DataSource& data,
                           comm::ProcessGroup& pg, int64_t done, TrainResult& r) {
  const auto t0 = Clock::now();
  // A pipeline stage's ranks write its pieces; the manifest lists the whole model.
  std::optional<Gpt> whole;
  if (o.pp > 1) whole.emplace(dynamic_cast<const Gpt&>(model).config());
  const WrittenCheckpoint written =
      write_checkpoint(o.checkpoint_dir, checkpoint_info(o, model, data, done), strategy, model, pg, o.keep,
                       o.tp == 1 || pg.rank() % o.tp == 0,  // TP rank 0 writes the replicated tensors
                       whole ? &*whole : nullptr);
  ++r.checkpoints;
  r.checkpoint_s += std::chrono::duration<double>(Clock::now() - t0).count();
  r.checkpoint_bytes += written.bytes;
  return written.path;
}

// With checkpoints on, after `done` steps: every rank learns of a signal
// any rank got, and a checkpoint is written when one is due or a signal
// came. Returns the checkpoint's path when a signal stops the run here.
std::optional<std::string> checkpoint_or_stop(const TrainOptions& o, const Model& model, Strategy& strategy,
                                              const DataSource& data, comm::ProcessGroup& pg, int64_t done,
                                              int64_t steps, TrainResult& r) {
  r.stopped_by = agreed_signal(pg);
  const bool due = o.checkpoint_every > 0 && done % o.checkpoint_every == 0 && done < steps;
  if (!r.stopped_by && !due) return std::nullopt;
  std::string path = checkpoint_now(o, model, strategy, data, pg, done, r);
  if (!r.stopped_by) return std::nullopt;
  return path;
}

// The timeline of a run with --trace-out: it records only the last
// trace_steps steps (per step data, forward and backward per micro-batch,
// the wait, the optimizer and the strategy's collectives).
std::optional<Timeline> make_timeline(const TrainOptions& o, int64_t steps, const Executor& executor,
                                      const Strategy& strategy) {
  std::optional<Timeline> timeline;
  if (!o.trace_out.empty())
    timeline.emplace(static_cast<size_t>(std::min(o.trace_steps, steps)) *
                     (executor.trace_spans() + 2 + strategy.trace_spans()));
  return timeline;
}

// A finished run's report: every rank's medians and memory gathered, the
// summary printed (unless quiet) and written (rank 0, --summary-out).
void report_run(const TrainOptions& o, comm::ProcessGroup& pg, const Model& model, const Strategy& strategy,
                Executor& executor, bool evaluated, const StepTimes& times, double baseline, double total_s,
                bool quiet, TrainResult& r) {
  r.peak_rss = peak_rss_bytes();
  r.memory = strategy.bytes();
  r.activation_bytes = executor.activation_bytes();
  std::vector<RankTimes> ranks = gather_ranks(pg, r, o, model, times, baseline);
  const Report report{.options = o, .model = model, .strategy = strategy, .result = r,
                      .ranks = std::move(ranks), .seconds = total_s, .skipped_steps = warmup_steps(times.size()),
                      .evaluated = evaluated, .ledger = pg.ledger().to_json(comm::Scope::Family),
                      .pipeline = executor.detail()};
  if (!quiet) report.print();
  if (pg.rank() == 0 && !o.summary_out.empty())
    write_summary(o.summary_out, report.json(), r, o.model == "mlp", evaluated);
}

// Naive DP, kept for comparison, runs in one process, in fp32, without
// the strategies' checkpoints and traces: anything else is refused.
void check_dp_options(const TrainOptions& o, int world) {
  if (world > 1) throw InputError("--strategy dp runs in one process; start it without a launcher");
  if (!o.trace_out.empty()) throw InputError("--trace-out records training across ranks, not --strategy dp");
  if (!o.checkpoint_dir.empty() || !o.resume.empty())
    throw InputError("--strategy dp keeps no checkpoints; use local, ddp or zero1/2/3");
  if (o.precision != DType::F32)
    throw InputError("--strategy dp computes in fp32 only; use local, ddp or zero1/2/3 for --precision bf16");
  if (!o.offload.empty()) throw InputError("--strategy dp offloads nothing; use local, ddp or zero1/2/3");
  if (o.ddp.reduce_dtype != DType::F32)
    throw InputError("--strategy dp sums its replicas' gradients in fp32 only; use ddp or zero1/2/3 for --reduce-dtype bf16");
}

// This rank's model: its stage under --pp (with every stage, cut as the
// flags ask), its slice of every block under --tp, else the whole model;
// its shape that of the checkpoint it resumes (saved), set up as the flags
// ask. Its parameters are the strategy's to fill.
struct RankModel {
  std::unique_ptr<Model> model;
  std::vector<GptStage> stages;  // under --pp
};
RankModel rank_model(const TrainOptions& o, const Mesh& mesh, const std::optional<CheckpointInfo>& saved) {
  const std::map<std::string, std::string> hparams = saved ? resumed_hparams(o, *saved) : model_hparams(o);
  std::vector<GptStage> stages;
  if (mesh.pp > 1) stages = gpt_stages(GptConfig::from(hparams), mesh.pp, o.pp_split);
  if (saved && o.tp_embedding == "vocab") check_vocab_rows(GptConfig::from(hparams), mesh.tp);
  std::unique_ptr<Model> model;
  const GptTp tp{mesh.tp, mesh.tp_rank, o.tp_embedding == "vocab"};
  if (mesh.pp > 1)
    model = std::make_unique<Gpt>(GptConfig::from(hparams), stages[static_cast<size_t>(mesh.pp_rank)], tp);
  else if (mesh.tp > 1)
    model = std::make_unique<Gpt>(GptConfig::from(hparams), GptStage{}, tp);
  else
    model = make_model(hparams);
  model->set_checkpoint_activations(o.checkpoint_activations);
  model->set_precision(o.precision);
  model->set_device(o.device);
  return {std::move(model), std::move(stages)};
}

// Under --tp the GPT sums (or maxes) its partial results over its TP group.
void connect_tensor_parallel(Model& model, comm::ProcessGroup* tpg) {
  if (!tpg) return;
  dynamic_cast<Gpt&>(model).set_tensor_reduce([tpg](float* x, size_t n, TpReduce op) {
    tpg->all_reduce(x, n, DType::F32, op == TpReduce::Max ? comm::ReduceOp::Max : comm::ReduceOp::Sum);
  });
}

// Who runs a step's micro-batches: a pipeline stage under --pp, else the
// sequential executor over the whole (or TP-sliced) model.
std::unique_ptr<Executor> make_executor(const TrainOptions& o, comm::ProcessGroup& pg, const Mesh& mesh,
                                        MeshGroups& groups, Model& model, Strategy& strategy, DataSource& data,
                                        float loss_scale, const std::vector<GptStage>& stages) {
  if (mesh.pp > 1)
    return std::make_unique<PipelineExecutor>(
        mesh, groups, dynamic_cast<Gpt&>(model), strategy, data, loss_scale,
        PipelineOptions{parse_pipe_schedule(o.pp_schedule), static_cast<int>(o.grad_accum), stages});
  return std::make_unique<SequentialExecutor>(o, pg, model, strategy, data, loss_scale, mesh, groups.tp());
}

// check_memory for this rank. Under --pp the stages hold different parts of
// the model, their arenas and the pipeline's buffers: one that does not fit
// ends the run on every rank, with its sentence.
void check_rank_memory(const TrainOptions& o, const StrategyOptions& so, const Model& model, int64_t micro,
                       const Mesh& mesh, comm::ProcessGroup& dpg, comm::ProcessGroup& pg) {
  if (mesh.pp == 1) {
    check_memory(o, so, model, micro, dpg, 1, pg.size());
    return;
  }
  std::string too_big;
  try {
    check_memory(o, so, model, micro, dpg,
                 pipe_slots(parse_pipe_schedule(o.pp_schedule), mesh.pp, mesh.pp_rank, static_cast<int>(o.grad_accum)),
                 pg.size(), pipeline_buffer_bytes(dynamic_cast<const Gpt&>(model), mesh.pp, mesh.pp_rank));
  } catch (const InputError& e) {
    too_big = e.what();
  }
  agree_on_error(pg, too_big);
}

}  // namespace

void check_launch(TrainOptions o, int world) {
  apply_defaults(o);
  const Mesh mesh = Mesh::layout(world, 0, o.tp, o.pp);
  if (o.strategy.empty()) o.strategy = default_strategy(mesh.dp);
  check_flags(o, mesh);
  if (o.strategy == "dp") return check_dp_options(o, world);
  micro_batch(o, mesh.dp, mesh.pp == 1 && mesh.tp == 1 ? "ranks" : "data-parallel replicas");
}

TrainResult run_training(TrainOptions o, comm::ProcessGroup& pg) {
  apply_defaults(o);
  const int rank = pg.rank(), world = pg.size();
  const bool lead = rank == 0;
  // The mesh first: an impossible one is refused before anything else.
  const Mesh mesh = Mesh::layout(world, rank, o.tp, o.pp);
  if (o.strategy.empty()) o.strategy = default_strategy(mesh.dp);
  check_run(o, mesh, pg);
  if (o.strategy == "dp") {
    check_dp_options(o, world);
    return run_dp_training(o);
  }
  const int64_t micro = micro_batch(o, mesh.dp, mesh.pp == 1 && mesh.tp == 1 ? "ranks" : "data-parallel replicas");
  // Read now: a bad baseline or checkpoint must fail before training, not after it.
  const double baseline = o.baseline.empty() ? 0.0 : read_baseline_throughput(o.baseline);
  const std::string resume_path = o.resume.empty() ? "" : find_checkpoint(o.resume);
  std::optional<CheckpointInfo> saved;
  if (!resume_path.empty()) saved = read_checkpoint_info(resume_path);
  const bool mlp = o.model == "mlp";

  // The model's shape first; where its parameters live, and their initial
  // values, are the strategy's (a zero3 rank never holds them all). Under
  // --pp a data-parallel strategy runs over the ranks of the same stage.
  auto [model, stages] = rank_model(o, mesh, saved);
  MeshGroups groups(mesh, pg);
  comm::ProcessGroup& dpg = groups.dp();
  connect_tensor_parallel(*model, groups.tp());
  const StrategyOptions so = resolve_options(strategy_options(o), dpg);
  check_offload(o, so, *model, dpg, pg);
  check_rank_memory(o, so, *model, micro, mesh, dpg, pg);
  auto strategy = make_strategy(so, *model, dpg, {o.seed, o.load, parse_weight_format(o.load_format)});

  // All stages of a replica read the same sequences.
  DataSource data(o, *model, load_datasets(o, *model), micro, mesh.dp_rank, mesh.dp);
  // The strategy's loss scale carries the 1/dp of the average, so every
  // reduction is a plain sum and every gradient element is scaled once.
  const float loss_scale = strategy->loss_scale() / static_cast<float>(o.grad_accum);
  const int64_t steps = data.steps(o);
  o.schedule.total_steps = steps;
  TrainResult r;
  if (world > 1) r.topology = topology_json(pg);
  const int64_t start = saved ? resume_from(resume_path, *saved, o, *model, *strategy, data, pg, steps, r) : 0;
  // After the resume: a pipeline's last stage copies wte from the first.
  const std::unique_ptr<Executor> executor =
      make_executor(o, pg, mesh, groups, *model, *strategy, data, loss_scale, stages);

  auto evaluate = [&]() -> std::optional<EvalResult> {
    if (!data.evaluable()) return std::nullopt;
    // A replica's TP ranks evaluate the same windows together (their equal
    // copies in the combined sums leave the mean as it is).
    return combine(
        data.evaluate(*model, micro, o.eval_windows, mesh.dp_rank, mesh.dp, executor->eval_forward()), pg);
  };

  std::unique_ptr<MetricsFile> metrics;
  if (lead && !o.metrics_out.empty()) metrics = std::make_unique<MetricsFile>(o.metrics_out, saved ? start : -1);
  const bool quiet = o.quiet || !lead;
  Progress progress(steps, quiet, mlp ? "samples/s" : "tokens/s");
  if (!quiet) print_header(o, *model, *strategy, mesh, micro, steps, data.evaluable(), r.topology);

  StepTimes times(steps - start);
  const double per_step = static_cast<double>(o.batch * (mlp ? 1 : model->positions()));
  StepContext context{o, pg, *strategy, *executor};
  const uint64_t bytes_at_start = pg.ledger().total(comm::Scope::Family).bytes_sent;
  const auto phases_at_start = pg.ledger().phases(comm::Scope::Family);
  std::optional<Timeline> timeline = make_timeline(o, steps, *executor, *strategy);
  // Created now: an unwritable --trace-out fails before training, not after it.
  const auto trace_file = lead && timeline ? std::make_unique<AtomicFile>(o.trace_out) : nullptr;
  // With checkpoints on, a signal stops the run after its step (with a
  // checkpoint); without, it ends the process as it always has.
  const bool checkpointing = !o.checkpoint_dir.empty();
  std::optional<StopSignals> signals;
  if (checkpointing) signals.emplace();
  strategy->take_gather_wait();
  auto run_start = Clock::now();
  for (int64_t step = start; step < steps; ++step) {
    Timeline* tl = timeline && step >= steps - o.trace_steps ? &*timeline : nullptr;
    const bool log_step = (step + 1) % o.log_every == 0 || step + 1 == steps;
    const StepOutcome s = train_step(context, step, log_step, tl);
    times.add(s.t);
    if (o.verify_every > 0 && world > 1 && (step + 1) % o.verify_every == 0) strategy->verify(step + 1);

    std::optional<EvalResult> ev;
    if (o.eval_every > 0 && (step + 1) % o.eval_every == 0 && step + 1 < steps) ev = evaluate();
    double loss = s.loss;
    if (log_step || ev)
      loss = log_step_out(dpg, progress, metrics.get(), mlp, {step + 1, s.loss, s.lr, s.grad_norm, s.t, ev},
                          per_step * 1000.0 / s.t.step_ms);
    if (step == start) r.first_loss = loss;
    r.final_loss = loss;
    if (!checkpointing) continue;
    const std::optional<std::string> stop = checkpoint_or_stop(o, *model, *strategy, data, pg, step + 1, steps, r);
    if (!stop) continue;
    progress.finish();
    if (!quiet) std::printf("stopped by signal %d after step %lld; checkpoint %s\n", r.stopped_by,
                            static_cast<long long>(step + 1), stop->c_str());
    r.steps = step + 1;
    return r;
  }
  progress.finish();
  if (timeline) timeline->write(trace_file.get(), pg);
  const double total_s = std::chrono::duration<double>(Clock::now() - run_start).count();
  r.steps = steps;
  count_comm(pg, bytes_at_start, phases_at_start, steps - start, r);

  // The weights are written before anything else can fail (evaluation, the
  // summary), so a finished run is never lost.
  if (!o.save.empty()) executor->save(o.save, parse_weight_format(o.save_format));
  metrics.reset();
  if (auto ev = evaluate()) {
    r.eval_loss = ev->loss();
    r.eval_accuracy = ev->accuracy();
  }

  r.breakdown = times.medians();
  r.step_cpu_ms_median = r.breakdown.cpu_ms;
  report_run(o, pg, *model, *strategy, *executor, data.evaluable(), times, baseline, total_s, quiet, r);
  return r;
}

}  // namespace dpt
