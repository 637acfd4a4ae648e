#include "train/report.h"

#include <algorithm>
#include <cstdio>

#include <fmt/format.h>

#include "core/cpu_level.h"
#include "core/threads.h"
#include "nn/activations_avx512.h"
#include "nn/gemm.h"
#include "train/gemm_rate.h"
#include "train/rank_setup.h"

namespace dpt {

namespace {
constexpr double kMiB = 1.0 / (1 << 20);
}

void Report::print() const {
  const TrainOptions& o = options;
  const TrainResult& r = result;
  const bool mlp = o.model == "mlp";
  const int world = static_cast<int>(ranks.size());
  std::printf("done: %lld steps in %.1f s, train loss %.4f -> %.4f", static_cast<long long>(r.steps), seconds,
              r.first_loss, r.final_loss);
  if (evaluated) {
    if (mlp)
      std::printf(", test accuracy %.2f%% (loss %.4f)", 100.0 * r.eval_accuracy, r.eval_loss);
    else
      std::printf(", validation loss %.4f", r.eval_loss);
  } else if (!o.synthetic) {
    std::printf(", no evaluation (--val-fraction 0 holds no text out)");
  }
  std::printf("\nthroughput: %.0f %s (median step %.2f ms after step %zu), %.1f GFLOP/s = %.0f%% of "
              "measured %s GEMM peak %.1f GFLOP/s%s (%d rank%s, %s; elementwise kernels %s%s)\n",
              mlp ? r.samples_per_s : r.tokens_per_s, mlp ? "samples/s" : "tokens/s", r.step_ms_median,
              skipped_steps, r.gflops, 100.0 * r.mfu, device_gemm_name(o.device), r.gemm_gflops,
              o.precision == DType::BF16 ? " with bf16 inputs" : "", world, world == 1 ? "" : "s",
              gemm_backend_detail().c_str(), cpu_kernel_level(),
              o.precision == DType::BF16 && o.model != "mlp" && o.device == Device::CPU && avx512_activations::enabled()
                  ? ", bf16 GELU/SiLU in AVX-512 BF16"
                  : "");
  print_step_budget();
  const MemoryBytes& m = r.memory;
  std::printf("memory per rank: parameters %.1f MiB, gradients %.1f MiB, optimizer %.1f MiB, ", m.parameters * kMiB,
              m.gradients * kMiB, m.optimizer * kMiB);
  if (m.gathered || m.scratch)
    std::printf("gathered units %.1f MiB, communication scratch %.1f MiB, ", m.gathered * kMiB, m.scratch * kMiB);
  std::printf("activations %.1f MiB, peak RSS %.1f MiB (%.1f MiB on huge pages at the end)\n",
              r.activation_bytes * kMiB, r.peak_rss * kMiB, r.huge_pages * kMiB);
  if (o.device != Device::CPU) {
    const DeviceMemory& dm = r.device_bytes;
    std::printf("device memory (%s): %.1f MiB allocated (%.1f MiB of it the backend's scratch), peak %.1f MiB\n",
                device_name(o.device), dm.in_use * kMiB, dm.scratch * kMiB, dm.peak * kMiB);
  }
  print_offload();
  if (r.checkpoints > 0)
    std::printf("checkpoints: %lld written, %.1f MiB each, %.2f s each (%.0f MiB/s), %.1f%% of the run\n",
                static_cast<long long>(r.checkpoints), r.checkpoint_bytes * kMiB / static_cast<double>(r.checkpoints),
                r.checkpoint_s / static_cast<double>(r.checkpoints), r.checkpoint_bytes * kMiB / r.checkpoint_s,
                100.0 * r.checkpoint_s / seconds);
  if (r.scaling_efficiency > 0)
    std::printf("scaling efficiency: %.1f%% of %d x the baseline's %.0f samples/s (%s)\n",
                100.0 * r.scaling_efficiency, world, r.samples_per_s / (world * r.scaling_efficiency),
                o.baseline.c_str());
  if (world > 1) {
    print_ranks();
    print_pipeline();
    print_context();
    print_communication();
  }
  if (!o.save.empty()) std::printf("saved %s\n", o.save.c_str());
}

double Report::gemm_rate() const {
  const TrainResult& r = result;
  const StepBreakdown& b = r.breakdown;
  if (b.step_ms <= 0 || b.gemm_ms <= 0) return 0.0;
  // The GEMMs' share of the model's FLOPs (a fused attention's products
  // run outside GEMM calls).
  const double all = model.train_flops(1) + model.recompute_flops(1);
  const double gemm_share = all > 0 ? 1.0 - model.non_gemm_flops(1) / all : 1.0;
  const double world = static_cast<double>(ranks.size());
  const double flops_per_rank = gemm_share * r.gflops * 1e9 * r.step_ms_median * 1e-3 / world;
  return flops_per_rank / (b.gemm_ms * 1e-3) / 1e9;
}

// Where this rank's median step went: inside GEMM calls (nn/gemm.h's
// gemm_seconds) or anything else, and the rate the GEMMs ran at
// (gemm_rate), against the same measured peak as the utilisation above. A
// step at the peak's rate needs both: GEMMs at the peak and nothing else.
void Report::print_step_budget() const {
  const TrainResult& r = result;
  const StepBreakdown& b = r.breakdown;
  if (b.step_ms <= 0 || b.gemm_ms <= 0) return;
  const auto world = static_cast<double>(ranks.size());
  const double gemm_rate = this->gemm_rate(), peak = r.gemm_gflops / world;
  const double other = std::max(0.0, b.step_ms - b.gemm_ms);
  std::printf("step budget (%s median step %.2f ms): GEMMs %.2f ms (%.0f%%) at %.1f GFLOP/s = %.0f%% of the "
              "peak; everything else %.2f ms (%.0f%%)\n",
              world > 1 ? "rank 0's" : "the", b.step_ms, b.gemm_ms, 100.0 * b.gemm_ms / b.step_ms, gemm_rate,
              peak > 0 ? 100.0 * gemm_rate / peak : 0.0, other, 100.0 * other / b.step_ms);
}

// Each rank's step medians by phase, and the straggler where the comm wait
// is split.
void Report::print_pipeline() const {
  if (pipeline.is_null() || !pipeline.contains("op_ms")) return;
  const nlohmann::json& c = pipeline["op_ms"];
  std::string measured, predicted;
  for (const nlohmann::json& st : pipeline["stages"]) {
    measured += fmt::format("{}{:.1f}%", measured.empty() ? "" : " / ", 100.0 * st["idle_measured"].get<double>());
    predicted += fmt::format("{}{:.1f}%", predicted.empty() ? "" : " / ", 100.0 * st["idle_predicted"].get<double>());
  }
  const bool split = c["W"].get<double>() > 0.0;
  std::printf("pipeline idle per rank: measured %s; simulated %s from the measured ms per chunk op (F %.2f, %s) "
              "and per transfer (%.3f, the sends' mean from issue to received)\n",
              measured.c_str(), predicted.c_str(), c["F"].get<double>(),
              split ? fmt::format("B {:.2f}, W {:.2f}", c["B"].get<double>(), c["W"].get<double>()).c_str()
                    : fmt::format("BW {:.2f}", c["BW"].get<double>()).c_str(),
              pipeline.value("transfer_ms", 0.0));
}

// Under --cp: how much of the ring's transfers the compute hid (rank 0's
// wait), and the causal balance of the chunks (every rank's forward and
// backward, the slowest over the fastest).
void Report::print_context() const {
  if (options.cp == 1) return;
  const double step = ranks[0].step_ms;
  std::printf("context parallelism: rank 0 waited %.2f ms per step for ring attention's keys and values (%.1f%% of "
              "its step); forward + backward per rank %s ms, slowest / fastest %.3f\n",
              result.ring_wait_ms, step > 0 ? 100.0 * result.ring_wait_ms / step : 0.0, work_list().c_str(),
              work_balance());
}

std::string Report::work_list() const {
  std::string out;
  for (const RankTimes& v : ranks) out += fmt::format("{}{:.2f}", out.empty() ? "" : ", ", v.forward_ms + v.backward_ms);
  return out;
}

double Report::work_balance() const {
  double lo = 0.0, hi = 0.0;
  for (const RankTimes& v : ranks) {
    const double w = v.forward_ms + v.backward_ms;
    lo = lo == 0.0 ? w : std::min(lo, w);
    hi = std::max(hi, w);
  }
  return lo > 0.0 ? hi / lo : 0.0;
}

void Report::print_ranks() const {
  const TrainResult& r = result;
  const int world = static_cast<int>(ranks.size());
  const bool split = r.lockstep_split;
  std::printf("step breakdown (median ms)   data  forward  backward  gather wait  comm wait%s  optimizer    step\n",
              split ? " (slower rank  comm)" : "");
  for (int q = 0; q < world; ++q) {
    const RankTimes& v = ranks[static_cast<size_t>(q)];
    std::printf("  rank %-3d                 %6.2f %8.2f  %8.2f  %11.2f  %9.2f", q, v.data_ms, v.forward_ms,
                v.backward_ms, v.gather_ms, v.comm_wait_ms);
    if (split) std::printf("  (%11.2f %5.2f)", v.slower_rank_ms, v.comm_wait_ms - v.slower_rank_ms);
    std::printf("  %9.2f  %7.2f\n", v.optimizer_ms, v.step_ms);
  }
  if (r.straggler.rank >= 0)  // only where the split is made
    std::printf("lock-step: rank %d was the slowest on %.0f%% of the steps, working %.2f ms longer than the "
                "fastest rank at the median step (docs/ddp.md)\n",
                r.straggler.rank, 100.0 * r.straggler.share, r.straggler.spread_ms);
}

// The bytes sent per step against the layout's planned traffic, how much of
// the step waited on communication, and the bytes by phase.
void Report::print_communication() const {
  const TrainResult& r = result;
  const bool split = r.lockstep_split;
  const double param_bytes = static_cast<double>(model.param_count() * sizeof(float));
  const RankTimes& r0 = ranks[0];
  auto share = [&](double ms) { return r0.step_ms > 0 ? 100.0 * ms / r0.step_ms : 0.0; };
  // Measured against the layout's own plan: its strategy's formula over the
  // data-parallel group (the ranks that hold the same stage and slice, not
  // the world), and on a mesh its stage's tensor- and pipeline-parallel
  // transfers, in the bytes `dpt plan` counts (with the logged steps' loss
  // and norm collectives).
  const double planned = static_cast<double>(r.planned_comm_bytes_per_step);
  std::printf("communication: %.2f MiB sent per step per rank = %.3f x the %.2f MiB of parameters; planned %.2f MiB "
              "= %.3f x (%s%s), measured/planned %.3f; exposed %.1f%% of the step on rank 0",
              r.comm_bytes_per_step * kMiB, static_cast<double>(r.comm_bytes_per_step) / param_bytes,
              param_bytes * kMiB, planned * kMiB, planned / param_bytes, r.comm_formula.c_str(),
              mesh_traffic().c_str(),
              planned > 0 ? static_cast<double>(r.comm_bytes_per_step) / planned : 0.0,
              share(r0.comm_wait_ms + r0.gather_ms));
  if (split)
    std::printf(" (%s%.1f%% waiting for a slower rank, %.1f%% communicating)",
                r0.gather_ms > 0 ? fmt::format("gather waits {:.1f}%, comm wait ", share(r0.gather_ms)).c_str() : "",
                share(r0.slower_rank_ms), share(r0.comm_wait_ms - r0.slower_rank_ms));
  std::printf("\n");
  std::printf("  by phase (MiB per step):");
  for (const char* phase : {"forward", "backward", "optimizer", "other"}) {
    const auto it = r.comm_bytes_per_phase.find(phase);
    std::printf(" %s %.2f", phase, it == r.comm_bytes_per_phase.end() ? 0.0 : it->second * kMiB);
  }
  // --sample-every's gathers, apart from the step's traffic above.
  if (const auto it = r.comm_bytes_per_phase.find("sample"); it != r.comm_bytes_per_phase.end())
    std::printf(" (samples %.2f, not in the step's)", it->second * kMiB);
  std::printf("\n");
}

// ", plus the ... of the tp x pp mesh" for a mesh run: what its stage sends
// besides the strategy's collectives.
std::string Report::mesh_traffic() const {
  const TrainOptions& o = options;
  if (o.cp > 1) return fmt::format(", plus ring attention's keys and values over cp {}", o.cp);
  if (o.tp == 1 && o.pp == 1) return "";
  const char* what = o.tp > 1 && o.pp > 1 ? "tensor-parallel all-reduces and pipeline transfers"
                     : o.tp > 1           ? "tensor-parallel all-reduces"
                                          : "pipeline transfers";
  return fmt::format(", plus the {} of the tp {} x pp {} mesh", what, o.tp, o.pp);
}

// Where the optimizer state went (--offload): the file, its traffic per
// step and the time the update waited for it.
void Report::print_offload() const {
  const nlohmann::json d = strategy.offload_detail();
  if (d.is_null()) return;
  if (d.contains("host_update")) print_host_update(d);
  if (!d.contains("dir")) return;
  const double steps = std::max(1.0, d["streams"].get<double>());
  std::printf("offload: %.1f MiB of optimizer state per rank in %s (%s), through %zu buffers of %.0f KiB; per "
              "step %.1f MiB read, %.1f MiB written, %.3f s waited\n",
              d["state_bytes"].get<double>() * kMiB, d["dir"].get<std::string>().c_str(),
              d["direct_io"].get<bool>() ? "direct I/O" : "buffered, pages dropped", d["buffers"].get<size_t>(),
              d["chunk_bytes"].get<double>() / 1024.0, d["read_bytes"].get<double>() / steps * kMiB,
              d["written_bytes"].get<double>() / steps * kMiB, d["wait_s"].get<double>() / steps);
}

// A GPU run's update on the host (parallel/host_update.h): where its
// state is, what it holds in host memory and what a step moves.
void Report::print_host_update(const nlohmann::json& d) const {
  const nlohmann::json& h = d["host_update"];
  const std::string where = d.contains("dir") ? "in the offload file (below)"
                                              : fmt::format("{:.1f} MiB in pinned host memory",
                                                            d["ram_bytes"].get<double>() * kMiB);
  std::printf("offload: the update on the host: optimizer state %s, fp32 parameters and gradients %.1f MiB pinned; "
              "per step %.1f MiB down, %.1f MiB up, %.3f s down, %.3f s updating, %.3f s up\n",
              where.c_str(), h["host_bytes"].get<double>() * kMiB, h["down_bytes"].get<double>() * kMiB,
              h["up_bytes"].get<double>() * kMiB, h["down_s"].get<double>(), h["update_s"].get<double>(),
              h["up_s"].get<double>());
}

nlohmann::json topology_json(comm::ProcessGroup& pg) {
  nlohmann::json ring = nlohmann::json::array();
  for (const comm::ProcessGroup::Link& l : pg.ring_links())
    ring.push_back({{"from", l.from}, {"to", l.to}, {"transport", l.transport}});
  return {{"hosts", pg.hosts()}, {"ring", ring}};
}

std::string topology_line(const nlohmann::json& topology) {
  // Hosts in order of their first rank, with their rank counts.
  std::vector<std::pair<std::string, int>> hosts;
  for (const auto& h : topology.at("hosts")) {
    const std::string name = h.get<std::string>();
    auto it = std::find_if(hosts.begin(), hosts.end(), [&](const auto& e) { return e.first == name; });
    if (it == hosts.end())
      hosts.emplace_back(name, 1);
    else
      ++it->second;
  }
  std::string line = fmt::format("ranks on {} host{} (", hosts.size(), hosts.size() == 1 ? "" : "s");
  for (size_t i = 0; i < hosts.size(); ++i)
    line += fmt::format("{}{}: {}", i ? ", " : "", hosts[i].first, hosts[i].second);
  int shm = 0, mpi = 0;
  for (const auto& l : topology.at("ring")) ++(l.at("transport") == "shm" ? shm : mpi);
  return line + fmt::format("); ring links: {} shared memory, {} MPI", shm, mpi);
}

nlohmann::json Report::json() const {
  using nlohmann::json;
  const TrainOptions& o = options;
  const TrainResult& r = result;
  json per_rank = json::array();
  for (const RankTimes& v : ranks) {
    per_rank.push_back({{"data_ms", v.data_ms}, {"forward_ms", v.forward_ms}, {"backward_ms", v.backward_ms},
                        {"gather_wait_ms", v.gather_ms}, {"comm_wait_ms", v.comm_wait_ms},
                        {"optimizer_ms", v.optimizer_ms}, {"step_ms", v.step_ms},
                        {"peak_rss", static_cast<size_t>(v.peak_rss)}});
    if (r.lockstep_split) {
      per_rank.back()["comm_wait_slower_rank_ms"] = v.slower_rank_ms;
      per_rank.back()["comm_wait_communicating_ms"] = v.comm_wait_ms - v.slower_rank_ms;
    }
  }
  const MemoryBytes& m = r.memory;
  json j = {{"model", o.model}, {"strategy", strategy.name()}, {"world", ranks.size()}, {"threads", threads()},
            {"steps", r.steps}, {"batch", o.batch}, {"grad_accum", o.grad_accum},
            {"precision", precision_name(o.precision)}, {"reduce_dtype", precision_name(o.ddp.reduce_dtype)},
            {"attention", o.model == "mlp" ? "none" : fused_attention_for(o) ? "fused" : "unfused"},
            {"attention_products", o.model == "mlp" ? "none" : bf16_attention_products_for(o) ? "bf16" : "fp32"},
            {"params", model.param_count()}, {"first_loss", r.first_loss}, {"final_loss", r.final_loss},
            {"step_ms_median", r.step_ms_median}, {"step_cpu_ms_median", r.step_cpu_ms_median},
            {"step_gemm_ms_median", r.step_gemm_ms_median}, {"step_gemm_gflops", gemm_rate()},
            {"samples_per_s", r.samples_per_s}, {"gflops", r.gflops},
            {"gemm", device_gemm_name(o.device)}, {"gemm_gflops", r.gemm_gflops}, {"mfu", r.mfu}, {"seconds", seconds},
            {"synthetic", o.synthetic}, {"ranks", per_rank},
            {"comm_bytes_per_step", r.comm_bytes_per_step},
            {"planned_comm_bytes_per_step", r.planned_comm_bytes_per_step}, {"comm_formula", r.comm_formula}, {"comm_bytes_per_phase", r.comm_bytes_per_phase},
            {"comm", ledger},
            {"bytes", {{"parameters", m.parameters}, {"gradients", m.gradients}, {"optimizer", m.optimizer},
                       {"gathered", m.gathered}, {"scratch", m.scratch}, {"activations", r.activation_bytes},
                       {"offloaded", m.offloaded}, {"peak_rss", r.peak_rss},
                       {"huge_pages", r.huge_pages}}},
            {"strategy_detail", strategy.describe()},
            {"mesh", {{"tp", o.tp}, {"pp", o.pp}, {"cp", o.cp}, {"dp", static_cast<int>(ranks.size()) / (o.tp * o.pp * o.cp)}}}};
  if (!r.topology.is_null()) j["topology"] = r.topology;
  if (o.cp > 1) j["context_parallel"] = {{"ring_wait_ms_per_step", r.ring_wait_ms}, {"work_balance", work_balance()}};
  if (r.straggler.rank >= 0)
    j["lockstep"] = {{"slowest_rank", r.straggler.rank}, {"slowest_share", r.straggler.share},
                     {"spread_ms", r.straggler.spread_ms}};
  if (r.scaling_efficiency > 0) j["scaling_efficiency"] = r.scaling_efficiency;
  j["device"] = device_name(o.device);
  if (o.device != Device::CPU) {
    const DeviceMemory& dm = r.device_bytes;
    j["device_bytes"] = {{"in_use", dm.in_use}, {"peak", dm.peak}, {"scratch", dm.scratch}};
  }
  if (auto d = strategy.offload_detail(); !d.is_null()) j["offload"] = std::move(d);
  if (!pipeline.is_null()) j["pipeline"] = pipeline;
  if (auto d = strategy.detail(); !d.is_null()) j[strategy.name()] = std::move(d);
  return j;
}

}  // namespace dpt
