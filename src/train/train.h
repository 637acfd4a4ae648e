// The single-process training loop behind `dpt train`: data, model,
// optimizer, schedule, clipping, progress, periodic evaluation, metrics and
// a summary. Strategies across ranks build on the same pieces.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "comm/process_group.h"
#include "models/model.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "parallel/reducer.h"
#include "parallel/strategy.h"
#include "train/lockstep.h"

namespace dpt {

struct TrainOptions {
  std::string model = "mlp";                 // "mlp" or "gpt"
  std::map<std::string, std::string> hparams;  // model sizes (see make_model)
  std::string data;         // mlp: IDX directory; gpt: text, or token shards (file, directory or glob)
  std::string data_format;  // gpt: llmc, u16 or bytes; empty: from the magic number (docs/data.md)
  std::string val_data;     // gpt: held-out shards or text; empty: the last val_fraction of data
  bool synthetic = false;   // random batches; measures compute only
  int64_t steps = 0;        // optimizer steps; 0: from epochs (mlp) or 200 (gpt)
  int64_t epochs = 3;       // mlp, when steps == 0
  int64_t batch = 0;        // global samples per step; 0: 256 (mlp) or 16 (gpt)
  int64_t grad_accum = 1;   // micro-batches per step (each rank's share split evenly)
  // "local" (one process), "ddp" (the default on more than one rank),
  // "zero1", "zero2", "zero3" (= "fsdp"), or "dp" (naive single-process data
  // parallelism over dp_replicas threads).
  std::string strategy;
  int dp_replicas = 2;
  // Keep only each unit's input in forward and recompute the unit in
  // backward: less activation memory for about one more forward (docs/memory.md).
  bool checkpoint_activations = false;
  // Compute precision (docs/precision.md): F32, or BF16 (bf16 compute copies
  // of the parameters, fp32 master weights, fp32 gradients and reductions).
  DType precision = DType::F32;
  // Where the model computes (--device): the CPU, or this rank's GPU.
  Device device = Device::CPU;
  ReducerOptions ddp;       // buckets, overlap, per-parameter mode
  bool zero_scatter = false;          // zero1: reduce-scatter instead of all-reduce
  bool zero_accumulate_locally = false;  // zero2/3 + grad_accum: reduce once per step
  bool reshard_after_forward = true;  // zero3
  std::string prefetch = "both";      // zero3: none, forward, backward, both
  int shard_group = 0;                // hsdp: ranks per shard group (0: one host's)
  // The mesh (parallel/mesh.h): tensor- and pipeline-parallel degrees; the
  // data-parallel degree is what is left of the world. Pipeline stages run
  // their grad_accum micro-batches (--micro-batches) in pp_schedule's order
  // (gpipe or 1f1b), with blocks per stage from pp_split ("2,1,1"; empty:
  // balanced by parameters). docs/pipeline.md.
  int tp = 1;
  std::string tp_embedding = "replicated";  // or "vocab": wte's rows split over the TP group
  int pp = 1;
  std::string pp_schedule = "1f1b";
  std::string pp_split;
  // Bytes the ranks on this host may use together; 0: the host's available
  // memory (MemAvailable). A run whose estimate exceeds it is refused.
  size_t memory_budget = 0;
  // Optimizer state off RAM: "optimizer" keeps it in a file per rank under
  // offload_dir, streamed through RAM in chunks of offload_chunk_bytes per
  // state tensor during the optimizer step (docs/memory.md, "Offload").
  std::string offload;
  std::string offload_dir;
  size_t offload_chunk_bytes = 4u << 20;
  std::string sampler_tail = "drop";  // DistributedSampler: drop or pad
  int64_t verify_every = 0; // steps between cross-rank replica checks (0: at start only)
  // Unset fields take the model's defaults: name sgd (mlp) or adamw (gpt);
  // weight decay 0 (sgd) or 0.1 (adamw); lr 0.05 (sgd) or 3e-4 (adamw).
  OptimizerConfig optimizer{.name = "", .weight_decay = -1.0f};
  Schedule schedule{.lr = 0.0f};
  float clip = 0.0f;        // max global gradient norm; 0 = off
  uint64_t seed = 0;
  double val_fraction = 0.1;  // gpt: held-out tail of the corpus
  int64_t eval_every = 0;     // steps between evaluations; 0 = only at the end
  int64_t eval_windows = 256; // gpt: windows per periodic evaluation (0 = all)
  int64_t log_every = 10;
  std::string load;         // safetensors to start from
  std::string load_format;  // its layout: dpt or hf; empty: told by names and shapes (models/hf_gpt2.h)
  std::string save;         // safetensors to write at the end
  std::string save_format = "dpt";  // dpt (the engine's layout) or hf (Hugging Face GPT-2's)
  std::string metrics_out;  // one JSON line per logged step
  std::string summary_out;  // one JSON object at the end
  // Checkpoints (train/checkpoint.h): every checkpoint_every steps (0: only
  // when a signal stops the run) into checkpoint_dir, keeping the `keep`
  // newest (0: all); resume: a checkpoint, or a directory of them.
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
  int keep = 3;
  std::string resume;
  std::string trace_out;    // a Chrome trace of the last trace_steps steps (timeline.h)
  int64_t trace_steps = 4;
  // A 1-rank run's --summary-out: the summary then reports scaling
  // efficiency, throughput / (ranks x that run's throughput).
  std::string baseline;
  bool quiet = false;       // no progress or summary on stdout
};

// Per-step time of one rank, split by phase (medians over the steady state).
// gather_ms: waits for parameter all-gathers (inside forward and backward
// under zero3); comm_wait_ms: the wait for gradient reductions after backward.
struct StepBreakdown {
  double data_ms = 0, forward_ms = 0, backward_ms = 0, gather_ms = 0, comm_wait_ms = 0, optimizer_ms = 0,
         step_ms = 0;
  // CPU time this process spent in the step, all its threads together: at
  // --threads 1 the step's work, which other programs taking turns on the
  // cores (a shared machine) do not inflate as they do step_ms.
  double cpu_ms = 0;
  // From leaving the last step's gradient reduction to arriving at this
  // one's: the previous step's update, what ran between the steps, data,
  // forward and backward, and any collective on the way (ZeRO's gathers),
  // where a rank that waited for a slower one left together with it.
  // Lock-step ranks compare it (train/lockstep.h): ranks leave a collective
  // together, they need not start a step together.
  double busy_ms = 0;
};

struct TrainResult {
  int64_t steps = 0;
  int stopped_by = 0;            // the signal that stopped the run early (after a checkpoint), or 0
  // Checkpoints written (their seconds and bytes, all ranks' files) and the
  // one resumed from.
  int64_t checkpoints = 0;
  double checkpoint_s = 0.0, resume_s = 0.0;
  uint64_t checkpoint_bytes = 0, resume_bytes = 0;
  StepBreakdown breakdown;       // this rank
  uint64_t comm_bytes_per_step = 0;  // sent by this rank (ledger)
  // The same split by the phase a collective was issued in: forward,
  // backward, optimizer, other (evaluation, the logged loss).
  std::map<std::string, uint64_t> comm_bytes_per_phase;
  double first_loss = 0.0, final_loss = 0.0;  // training loss, first and last step
  double eval_loss = 0.0, eval_accuracy = 0.0;  // final evaluation (not synthetic)
  double step_ms_median = 0.0;  // steady state: steps after the first 20 (or after 1)
  double step_cpu_ms_median = 0.0;  // this rank's, the same steps (StepBreakdown::cpu_ms)
  double samples_per_s = 0.0;   // images (mlp) or sequences (gpt)
  double tokens_per_s = 0.0;    // gpt
  double gflops = 0.0, mfu = 0.0, gemm_gflops = 0.0;  // the GEMM backend's peak, measured
  double scaling_efficiency = 0.0;  // with a baseline, else 0
  size_t peak_rss = 0;
  MemoryBytes memory;          // this rank, as the strategy accounts it
  size_t activation_bytes = 0; // this rank's activation arena
  // Where the ranks ran and how the ring joined them (topology_json).
  nlohmann::json topology;
  // Whether the ranks' comm waits were split (lockstep_split_made), and the
  // rank that held the others up most often (train/lockstep.h; rank -1
  // where the split is not made).
  bool lockstep_split = false;
  Straggler straggler;
};

// Writes a run's summary JSON `j` (atomically) after adding the fields every
// strategy shares: tokens/s for the GPT, the final evaluation if there was one.
void write_summary(const std::string& path, nlohmann::json j, const TrainResult& r, bool mlp, bool evaluated);

// Samples per micro-batch when the global batch is split over `parts`
// replicas (ranks or DP threads) and grad_accum micro-batches; throws
// InputError naming `parts_name` when it does not split evenly.
int64_t micro_batch(const TrainOptions& o, int parts, const char* parts_name);

// The run's model: loaded from o.load, or built from o.hparams and
// initialised from `seed` (naive DP's replicas).
std::unique_ptr<Model> build_model(const TrainOptions& o, uint64_t seed);

// Refuses, before anything large is allocated, a run whose ranks on this
// host would together need more than the host has (or o.memory_budget):
// one sentence with the estimate per rank, what is available, and the
// strategy that would fit (seed 000's "when to use what").
// Under --pp, pg is the data-parallel group, `arenas` the micro-batches
// the stage holds at once, `world` every rank of the job and
// `pipeline_bytes` the stage's executor buffers (pipeline_buffer_bytes).
void check_memory(const TrainOptions& o, const StrategyOptions& so, const Model& model, int64_t micro,
                  comm::ProcessGroup& pg, int arenas = 1, int world = 0, size_t pipeline_bytes = 0);

// Refuses, in one sentence on every rank, an --offload the run cannot have:
// an unsupported value, a strategy without an optimizer state to offload,
// or an --offload-dir that is missing, not writable, in memory or too small
// for the state of the ranks on this host (optim/file_tier.h). pg: the
// group the strategy runs over (the data-parallel group under --tp or
// --pp); world: every rank of the job, which all refuse together.
void check_offload(const TrainOptions& o, const StrategyOptions& so, const Model& model, comm::ProcessGroup& pg,
                   comm::ProcessGroup& world);

// Fails before training, with the sentence AtomicFile would give at the end,
// if rank 0 cannot create one of the run's output files (--save,
// --metrics-out, --summary-out, --trace-out). Every rank of the group calls
// it, and every rank fails.
void check_outputs(const TrainOptions& o, comm::ProcessGroup& pg);

// The model's hyper-parameters: the flags over what --load's file describes
// (its metadata, read from the header alone, or a config.json beside it;
// see hparams_for_file), and the model's name.
std::map<std::string, std::string> model_hparams(const TrainOptions& o);

// The strategy's share of the options.
StrategyOptions strategy_options(const TrainOptions& o);

// Fills the model-dependent defaults of opts (see the comments above).
void apply_defaults(TrainOptions& opts);

// What `dpt launch` checks before it starts any rank (docs/launch.md): the
// checks of run_training that need no peer and write nothing (the mesh,
// --pp, --tp, placement, shard group, --load with --resume, --strategy dp,
// the micro-batch split; --pp and --tp read --load's header), as rank 0 of
// `world` ranks. Throws what run_training would.
void check_launch(TrainOptions o, int world);

// Runs training on the group's ranks (a group of one for a single process);
// throws Error subclasses for bad input and CommError when a peer fails.
TrainResult run_training(TrainOptions opts, comm::ProcessGroup& pg);
// The same on a fresh world of one.
TrainResult run_training(TrainOptions opts);

}  // namespace dpt
