// `dpt plan`: what each strategy and technique would hold, send and take
// per step for a model on N ranks, and the fastest that fits (train/plan.h,
// docs/memory.md).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "comm/types.h"
#include "core/error.h"
#include "core/memory.h"
#include "nn/gemm.h"
#include "optim/file_tier.h"
#include "tools/commands.h"
#include "tools/flag_checks.h"
#include "parallel/catalog.h"
#include "train/pipeline_executor.h"
#include "train/plan.h"
#include "train/plan_context.h"
#include "train/rank_setup.h"
#include "train/run_checks.h"

namespace dpt {

namespace {

// "24G", "512MiB", "1.5 GB", "1073741824": bytes (K, M, G, T are powers of
// 1024, with or without "B" or "iB"). InputError naming the flag otherwise.
size_t parse_bytes(const std::string& text) {
  const char* s = text.c_str();
  char* end = nullptr;
  const double v = std::strtod(s, &end);
  std::string unit = end ? std::string(end) : std::string();
  unit.erase(0, unit.find_first_not_of(' '));
  double scale = 0;
  for (const auto& [names, factor] : std::initializer_list<std::pair<std::vector<std::string>, double>>{
           {{"", "B"}, 1.0},
           {{"K", "KB", "KiB", "k"}, 0x1p10},
           {{"M", "MB", "MiB"}, 0x1p20},
           {{"G", "GB", "GiB"}, 0x1p30},
           {{"T", "TB", "TiB"}, 0x1p40}})
    for (const std::string& n : names)
      if (unit == n) scale = factor;
  if (end == s || scale == 0 || !std::isfinite(v) || v <= 0)
    throw InputError(fmt::format("--memory '{}' is not a positive number of bytes (e.g. 24G, 512MiB, 1073741824)", text));
  // Converting a double past size_t's range is undefined (in practice 0 or 2^63).
  if (v * scale >= 0x1p64) throw InputError(fmt::format("--memory '{}' is more bytes than 16 EiB", text));
  return static_cast<size_t>(v * scale);
}

std::string mib(uint64_t bytes) { return fmt::format("{:.1f}", static_cast<double>(bytes) / (1 << 20)); }

void print_plan(const PlanRequest& r, const Model& model, const Plan& plan, const std::string& model_name,
                bool measured, bool disk_measured) {
  const MachineRates& m = r.machine;
  // A replica's share of the batch: a rank's without a mesh; with --meshes
  // it differs from mesh to mesh.
  const bool mesh = r.run.tp > 1 || r.run.pp > 1 || r.run.cp > 1;
  const int dp = r.world / (r.run.tp * r.run.pp * r.run.cp);
  const std::string share =
      r.all_meshes ? ""
                   : fmt::format(" ({} per {}{})", r.batch / dp, mesh ? "replica" : "rank",
                                 r.grad_accum > 1 ? fmt::format(" in {} micro-batches", r.grad_accum) : "");
  std::printf("dpt plan: %s, %zu parameters, %s, global batch %lld%s, %d rank%s, %d on this host\n",
              model_name.c_str(), model.param_count(), r.base.optimizer.name.c_str(),
              static_cast<long long>(r.batch), share.c_str(), r.world, r.world == 1 ? "" : "s", r.ranks_here);
  if (r.all_meshes)
    std::printf("meshes: every tp x pp x cp of %d ranks that dpt train runs for this model (rows tpN ppN cpN; dp = "
                "ranks / (tp x pp x cp)); pipelines %s over %lld micro-batches; a pipeline's figures are its largest "
                "stage's\n",
                r.world, r.run.pp_schedule.c_str(), static_cast<long long>(r.grad_accum));
  else if (r.run.cp > 1)
    std::printf("mesh: dp %d x cp %d; each sequence in %d chunks, two per CP rank; ZeRO shards over dp x cp = %d "
                "ranks\n",
                dp, r.run.cp, 2 * r.run.cp, dp * r.run.cp);
  else if (r.run.tp > 1 || r.run.pp > 1)
    std::printf("mesh: pp %d x dp %d x tp %d%s; a pipeline's figures are its largest stage's (--json: every "
                "stage's)\n",
                r.run.pp, dp, r.run.tp,
                r.run.pp > 1 ? fmt::format(", {} over {} micro-batches, bubble {:.1f}%", r.run.pp_schedule,
                                           r.grad_accum, 100.0 * pipe_bubble_of(run_program(r.run, r.run.pp)))
                                   .c_str()
                             : "");
  if (r.run.pp > 1 && !r.all_meshes) {
    std::string line;
    for (const ScheduleIdle& s : pipe_schedule_idles(DecoderConfig::from(model_hparams(r.run)), r.run.pp,
                                                     static_cast<int>(r.grad_accum)))
      line += fmt::format("{}{}{} {:.1f} / {:.1f}%", line.empty() ? "" : ", ", s.schedule,
                          s.v > 1 ? fmt::format(" (v {})", s.v) : "", 100.0 * s.idle_first, 100.0 * s.idle_mean);
    std::printf("schedules at pp %d, M %lld, idle simulated from FLOPs (F, B, W per chunk, the head's on the last; "
                "transfers free), rank 0 / the ranks' mean: %s\n",
                r.run.pp, static_cast<long long>(r.grad_accum), line.c_str());
  }
  std::printf("memory: %s for the %d rank%s on this host; rates %s: GEMM %.1f GFLOP/s per rank (%s, %d thread%s), "
              "bf16 %.1f, memcpy %.2f GB/s per rank; runtime %.1f MiB per rank\n",
              human_bytes(r.available).c_str(), r.ranks_here, r.ranks_here == 1 ? "" : "s",
              measured ? "measured" : "given", m.gemm_gflops, gemm_backend_name(gemm_backend()), m.threads,
              m.threads == 1 ? "" : "s", m.gemm_bf16_gflops > 0 ? m.gemm_bf16_gflops : m.gemm_gflops, m.copy_gbs, static_cast<double>(m.runtime_bytes) / (1 << 20));
  std::printf("offload: %s, %s free; disk %s: %.2f GB/s write, %.2f GB/s read (direct I/O, shared by the host's "
              "ranks)\n",
              r.offload_dir.c_str(), human_bytes(r.disk_free).c_str(), disk_measured ? "probed" : "given",
              m.disk_write_gbs, m.disk_read_gbs);
  std::printf("MiB per rank:                            params    grads    optim gathered  scratch     acts    total peak RSS"
              "     file | MiB sent/step  s/step (compute comm optim disk) | fits\n");
  for (size_t i = 0; i < plan.rows.size(); ++i) {
    const PlanRow& row = plan.rows[i];
    const MemoryBytes& b = row.bytes;
    const std::string name = row_name(row.point);
    std::printf("%c %-36s %8s %8s %8s %8s %8s %8s %8s %8s %8s | %13s %7.3g (%.3g %.3g %.3g %.3g) | %s\n",
                static_cast<int>(i) == plan.best ? '*' : ' ', name.c_str(), mib(b.parameters).c_str(),
                mib(b.gradients).c_str(), mib(b.optimizer).c_str(), mib(b.gathered).c_str(), mib(b.scratch).c_str(),
                mib(row.activations).c_str(), mib(row.need).c_str(), mib(row.peak_rss).c_str(),
                mib(b.offloaded).c_str(), mib(row.comm.per_step()).c_str(), row.step_s, row.compute_s, row.comm_s,
                row.optimizer_s, row.disk_s, row.fits ? "yes" : "no");
  }
  std::printf("%s: %s\n", plan.best >= 0 ? "recommended" : "none fits", plan.reason.c_str());
}

void print_context_limits(const PlanPoint& point, const std::vector<ContextLimit>& limits) {
  if (limits.empty()) return;
  std::string line;
  for (const ContextLimit& l : limits)
    line += fmt::format("{}{} {}{}", line.empty() ? "" : ", ",
                        l.mode == "fused+ckpt" ? "fused + checkpointing" : l.mode, l.context, l.capped ? "+" : "");
  std::printf("largest context that fits (%s, this batch and these ranks): %s\n", row_name(point).c_str(),
              line.c_str());
}

}  // namespace

PlanCommand::PlanCommand(CLI::App& app) {
  cmd_ = app.add_subcommand("plan", "bytes per rank, traffic and step time of each strategy for a model; the "
                                    "fastest that fits");
  model_.add(cmd_);
  cmd_->add_option("--ranks", ranks_, "ranks of the job (default 1)")->check(positive());
  cmd_->add_option("--ranks-per-host", ranks_per_host_, "ranks sharing this host's memory (default: all)")
      ->check(positive());
  cmd_->add_option("--memory", memory_,
                   "bytes the ranks on this host may use together, e.g. 24G (default: MemAvailable)");
  run_flags_.add(cmd_, opts_);
  cmd_->add_flag("--meshes", meshes_,
                 "rows for every tp x pp mesh of the ranks that dpt train runs for the model (instead of --tp, --pp)");
  // Split in run(): CLI11's delimiter drops empty items, so "ddp,,zero1" and
  // "ddp," passed as if whole.
  cmd_->add_option("--strategy", strategies_, "only these strategies (repeat or comma-separate; default: all)");
  cmd_->add_option("--threads", threads_, "threads per rank (default: cores / ranks on this host)")
      ->check(positive());
  add_gemm_flag(cmd_, gemm_);
  cmd_->add_option("--gemm-gflops", gemm_gflops_, "a rank's GEMM rate instead of measuring it")->check(positive());
  cmd_->add_option("--copy-gbs", copy_gbs_, "a rank's memcpy GB/s instead of measuring it")->check(positive());
  cmd_->add_option("--offload-dir", offload_dir_,
                   "where the offload rows' state would go: its disk is probed (32 MiB written and read with "
                   "direct I/O) and its free space must hold the state (default /var/tmp)");
  cmd_->add_option("--disk-gbs", disk_gbs_, "the offload disk's GB/s (each way) instead of probing it")
      ->check(positive());
  cmd_->add_flag("--json", json_, "print the plan as JSON");
}

int PlanCommand::run() {
  // Before anything is allocated: this process is the same binary with the
  // same libraries as a rank.
  const size_t runtime = current_rss_bytes();
  set_gemm_flag(gemm_);
  opts_.hparams = model_.hparams();
  opts_.hparams.erase("dpt.model");
  opts_.model = model_.kind();
  if (opts_.model.empty()) throw InputError("--model is required (mlp, gpt or a GPT-2 preset)");
  run_flags_.apply(cmd_, opts_);
  if (meshes_ && (cmd_->count("--tp") > 0 || cmd_->count("--pp") > 0 || cmd_->count("--cp") > 0))
    throw InputError("--meshes plans every tp x pp x cp of the ranks; give it or --tp/--pp/--cp, not both");
  apply_defaults(opts_);
  check_zero_accumulate(opts_, cmd_->count("--zero-accumulate") > 0);
  resolve_model(opts_);
  PlanRequest r;
  r.run = opts_;
  r.base = strategy_options(opts_);
  for (const std::string& given : strategies_)
    for (const std::string& s : split_list(given, "--strategy", "name")) r.strategies.push_back(plannable_strategy(s));
  r.all_meshes = meshes_;
  r.batch = opts_.batch;
  r.grad_accum = opts_.grad_accum;
  r.world = ranks_;
  // Clamped to the job, a typo (--ranks-per-host 8 of --ranks 4) planned
  // another host than the one asked about without a word.
  if (ranks_per_host_ > ranks_)
    throw InputError(fmt::format("--ranks-per-host {} is more than the job's {} rank{}{}: a host holds at most all "
                                 "of them",
                                 ranks_per_host_, ranks_, ranks_ == 1 ? "" : "s",
                                 cmd_->count("--ranks") > 0 ? "" : " (--ranks is not given)"));
  r.ranks_here = ranks_per_host_ > 0 ? ranks_per_host_ : ranks_;
  {
    const comm::Config config = comm::Config::from_env();  // what `dpt train` would start with
    r.in_place = config.algo == comm::Algo::Ring && config.in_place;
  }
  // Given empty, --memory is refused, not read as the default.
  r.available = cmd_->count("--memory") == 0 ? host_available_bytes() : parse_bytes(memory_);
  r.offload_dir = offload_dir_;
  r.disk_free = check_offload_dir(offload_dir_, 0);  // one sentence for a directory the tier would refuse
  auto model = make_model(model_hparams(opts_));
  set_attention(opts_, *model);
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const int threads = threads_ > 0 ? threads_ : std::max(1, cores / r.ranks_here);
  const bool measured = gemm_gflops_ <= 0 || copy_gbs_ <= 0;
  r.machine = measured ? measure_machine(threads, r.ranks_here) : MachineRates{};
  r.machine.threads = threads;
  r.machine.runtime_bytes = runtime;
  if (gemm_gflops_ > 0) r.machine.gemm_gflops = gemm_gflops_;
  if (copy_gbs_ > 0) r.machine.copy_gbs = copy_gbs_;
  const DiskRates disk = disk_gbs_ > 0 ? DiskRates{disk_gbs_, disk_gbs_} : probe_disk(offload_dir_);
  r.machine.disk_write_gbs = disk.write_gbs;
  r.machine.disk_read_gbs = disk.read_gbs;
  const Plan plan = make_plan(r, *model);
  // The largest context per attention mode, for the recommended row (or,
  // where none fits, the first).
  const PlanPoint point = plan.best >= 0 ? plan.rows[static_cast<size_t>(plan.best)].point : plan.rows.front().point;
  const std::vector<ContextLimit> limits = largest_contexts(r, point);
  if (json_) {
    nlohmann::json j = plan_json(r, *model, plan);
    if (!limits.empty()) j["largest_context"] = context_limits_json(point, limits);
    if (opts_.model != "mlp") j["attention"] = fused_attention_for(opts_) ? "fused" : "unfused";
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    print_plan(r, *model, plan, model_.model, measured, disk_gbs_ <= 0);
    if (opts_.model != "mlp")
      std::printf("attention: %s (the rows' activations)\n", fused_attention_for(opts_) ? "fused" : "unfused");
    print_context_limits(point, limits);
  }
  return 0;
}

}  // namespace dpt
