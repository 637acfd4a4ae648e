// The planner behind `dpt plan` (docs/memory.md): for each configuration of
// a run that makes sense (strategy x precision x activation checkpointing x
// offload), what a rank holds by category, what it sends per step, an
// estimated step time from measured machine rates, whether it fits, and the
// fastest that fits with the reason.
//
// Its byte figures are not a second formula: they come from rank_bytes
// (parallel/rank_bytes.h), which also sizes ZeroStrategy's buffer pools and
// backs the memory check before training (check_fits below), and
// Model::activation_bytes_for, which lays out the arena a run allocates.
// tests/test_plan_cli.cpp holds them, and planned_comm, equal to what real
// runs account and send.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/model.h"
#include "parallel/mesh.h"
#include "parallel/strategy.h"
#include "parallel/traffic.h"
#include "train/train.h"

namespace dpt {

// MemAvailable from /proc/meminfo, in bytes (0 if unknown).
size_t host_available_bytes();

// Ranks of this job on this host: the launcher says (Open MPI), else all.
int ranks_on_host(int world);

// True when `ranks_here` ranks needing `per_rank` bytes each fit in
// `available` bytes: the test of both the planner and check_fits.
bool fits_on_host(size_t per_rank, int ranks_here, size_t available);

// Throws InputError, in one sentence, when the `ranks_here` ranks of this
// host would need more than `available` bytes under `options` (rank_bytes
// plus each rank's activations): the need per rank and for the host, what
// is available, and the first of ddp, zero1, zero2, zero3 that would fit
// (seed 000's "when to use what"), or that none does.
void check_fits(const StrategyOptions& options, const Model& model, size_t activation_bytes, int world,
                int ranks_here, size_t available);

// One configuration. Precision is fp32 or bf16 (mixed: bf16 compute copies,
// fp32 masters); offload is none, optimizer (the optimizer state in a file)
// or params (with the fp32 masters too: bf16 under ZeRO only, as `dpt
// train` refuses it otherwise).
struct PlanPoint {
  StrategyRef strategy;  // local, ddp, zero1, zero2, zero3
  std::string precision = "fp32";
  bool checkpoint = false;  // activation checkpointing
  std::string offload = "none";
  int tp = 1, pp = 1, cp = 1;  // the mesh (dp = ranks / (tp x pp x cp))
};

// The machine, measured (or given): what the time estimates divide by.
struct MachineRates {
  double gemm_gflops = 0;    // one rank's fp32 GEMM rate at its threads
  double gemm_bf16_gflops = 0;  // the same with bf16 inputs (mixed precision); 0: as fp32
  double copy_gbs = 0;       // one rank's memcpy rate (bytes copied) with the host's ranks copying at once
  // The offload directory's disk, sequential with direct I/O (probe_disk):
  // the host's, shared by its ranks.
  double disk_write_gbs = 0, disk_read_gbs = 0;
  // A rank's resident memory besides the accounted buffers: `dpt plan`
  // reads its own (the same binary and libraries) before allocating.
  size_t runtime_bytes = 0;
  int threads = 1;           // per rank
};

// Measures the rates for ranks of `threads` threads, `ranks_here` of them
// copying at once (about half a second).
MachineRates measure_machine(int threads, int ranks_here);

// One pipeline stage's rank (its TP rank 0 of replica 0) under a mesh; the
// whole model's rank 0 without --pp.
struct StagePlan {
  MemoryBytes bytes;         // as its strategy accounts them, over the DP group
  int arenas = 1;            // arenas held at once over the rank's chunks (pipe_arenas)
  size_t arena = 0;          // one micro-batch's activation arena
  size_t activations = 0;    // arenas x arena
  // The pipeline's own buffers besides the strategy's: the first stage's
  // gathered embedding unit and the head's gradient for wte it receives;
  // the last stage's copy of wte and the head's gradient for it.
  size_t pipeline = 0;
  size_t need = 0;           // bytes + activations + pipeline
  // Peers' shared-window pages this rank touches (DDP in place): its chunk
  // of every peer's reduced buffer. Counted in its RSS, not in `need`: the
  // host holds each page once.
  size_t window_peer = 0;
  CommPlan comm;             // the DP strategy's, the TP all-reduces and the stage's sends
  double compute_s = 0, comm_s = 0, optimizer_s = 0;
};

struct PlanRow {
  PlanPoint point;
  // The stage that needs the most memory (rank 0 without --pp): what
  // decides whether the row fits.
  MemoryBytes bytes;
  size_t activations = 0;    // that stage's arenas held at once
  size_t pipeline = 0;       // that stage's pipeline buffers
  size_t need = 0;           // bytes + activations + pipeline: what the memory check counts
  size_t window_peer = 0;    // that stage's peers' shared-window pages (StagePlan)
  size_t peak_rss = 0;       // need + window_peer + the runtime: the predicted high-water mark
  CommPlan comm;             // of the stage that sends the most (rank 0 without --pp)
  std::vector<StagePlan> stages;  // every stage, in order (one without --pp)
  double bubble = 0;              // the pipeline's idle fraction, (pp - 1) / (M + pp - 1)
  // disk_s: the offloaded state read and written once per step by the
  // host's ranks; the tier overlaps it with the update (optimizer_s), so
  // the step counts the larger of the two.
  double compute_s = 0, comm_s = 0, optimizer_s = 0, disk_s = 0, step_s = 0;
  bool fits = false;  // in memory, and for offload rows on the disk too
};

struct PlanRequest {
  // The run as `dpt train` would take it: the mesh (tp, pp, pp_schedule,
  // pp_split), the model and the options that training's checks read, so
  // the plan refuses what training refuses and leaves out the rows
  // training does not run on a mesh (check_pipeline, check_tensor_parallel).
  TrainOptions run;
  StrategyOptions base;          // everything but the strategy's name
  std::vector<StrategyRef> strategies;  // the rows' strategies; empty: all that make sense
  // Every tp x pp mesh of the world that training runs (--meshes) instead
  // of run.tp x run.pp alone; run.pp_schedule and grad_accum apply to each.
  bool all_meshes = false;
  int64_t batch = 0;             // global samples per step
  int64_t grad_accum = 1;        // micro-batches per step (M under --pp)
  int world = 1, ranks_here = 1;
  // The ring with shared windows allowed (not --comm-algo mpi, not
  // DPT_COMM_IN_PLACE=0): with every rank on one host, DDP's all-reduce
  // runs in place (comm/shm_window.h).
  bool in_place = true;
  size_t available = 0;          // bytes for the ranks_here ranks together
  // Offload rows: where the state would go (--offload-dir) and its free
  // bytes, which the ranks_here ranks' offloaded state must fit in.
  std::string offload_dir;
  uint64_t disk_free = 0;
  MachineRates machine;
};

// Step-time estimates closer than this fraction are not told apart: they
// count GEMMs at the measured peak, copies and the optimizer's sweep, and
// leave out the elementwise kernels (the same work under every strategy),
// so a few percent between two rows is below what they resolve. Among such
// rows the plan takes the simpler (less sharded, without checkpointing).
constexpr double kTieMargin = 0.05;

struct Plan {
  std::vector<PlanRow> rows;
  int best = -1;       // the fastest row that fits (up to kTieMargin), or -1
  std::string reason;  // why, in words, with the numbers
};

// "zero3 bf16 +ckpt +offload params", "tp2 pp2 local": a row's name in the
// table and reasons.
std::string row_name(const PlanPoint& point);

// Every row, the recommendation and its reason. Switches the model's
// activation checkpointing per row (restored before returning). Under a
// mesh (request.run.tp or pp above 1) each row is planned per stage from the
// stage's sliced model, as training builds it; an impossible mesh throws
// training's own sentence (Mesh::layout, check_pipeline,
// check_tensor_parallel, micro_batch).
Plan make_plan(const PlanRequest& request, Model& model);

// One stage's rank under `options` on the request's mesh: what it holds
// and sends per step (rank_bytes and planned_comm over the DP group, plus
// the TP all-reduces and the pipeline's transfers: train/plan_mesh.cpp).
// `stage_model` is the stage's sliced model with the row's precision and
// checkpointing.
StagePlan plan_stage(const PlanRequest& request, const StrategyOptions& options, const Model& stage_model,
                     const Mesh& mesh, int stage, int64_t micro);

// The plan as JSON (`dpt plan --json`).
nlohmann::json plan_json(const PlanRequest& request, const Model& model, const Plan& plan);

// "15.7 GiB", "38.2 MiB": GiB from 1 GiB up (the memory check's sentence
// and the plan's table).
std::string human_bytes(size_t bytes);

}  // namespace dpt
