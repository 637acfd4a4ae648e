// The end-of-run report of `dpt train`: the summary printed on rank 0 (loss,
// throughput, memory per category, the per-rank step breakdown and the
// bytes moved) and the same as JSON for --summary-out.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/process_group.h"
#include "models/model.h"
#include "parallel/strategy.h"
#include "train/train.h"

namespace dpt {

// Per rank, the medians of a step's phases and the rank's peak RSS, as
// gathered from every rank (kFields doubles per rank).
struct RankTimes {
  static constexpr size_t kFields = 9;
  // slower_rank_ms: the part of comm_wait_ms spent waiting for a slower
  // rank; the rest is communication (train/lockstep.h; 0 where the split
  // is not made: TrainResult::lockstep_split).
  double data_ms, forward_ms, backward_ms, gather_ms, comm_wait_ms, slower_rank_ms, optimizer_ms, step_ms, peak_rss;
};

struct Report {
  const TrainOptions& options;
  const Model& model;
  const Strategy& strategy;
  const TrainResult& result;
  std::vector<RankTimes> ranks;
  double seconds = 0.0;      // the whole training loop
  size_t skipped_steps = 0;  // steps before the steady state
  bool evaluated = false;
  nlohmann::json ledger;     // the group's bytes per collective
  nlohmann::json pipeline;   // the pipeline's stages (null without --pp)

  void print() const;
  nlohmann::json json() const;

 private:
  void print_offload() const;
  void print_host_update(const nlohmann::json& detail) const;
  void print_context() const;
  std::string work_list() const;
  double work_balance() const;
  void print_step_budget() const;
  // The GEMMs' rate in GFLOP/s per rank: the model's GEMM FLOPs (without a
  // fused attention's) over the time inside GEMM calls; 0 without a step
  // breakdown.
  double gemm_rate() const;
  void print_ranks() const;
  // Under --pp: each rank's idle fraction, measured and simulated.
  void print_pipeline() const;
  void print_communication() const;
  std::string mesh_traffic() const;
};

// Collective: each rank's host and every link of the group's ring with its
// transport: {"hosts": [...], "ring": [{"from", "to", "transport"}, ...]}.
nlohmann::json topology_json(comm::ProcessGroup& pg);
// The header's line for it: "ranks on 2 hosts (a: 2, b: 2); ring links: 2
// shared memory, 2 MPI".
std::string topology_line(const nlohmann::json& topology);

}  // namespace dpt
