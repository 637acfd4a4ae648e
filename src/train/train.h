// What `dpt train` takes and gives: its options (parsed at the command line's
// edge, tools/), its per-step times and its result, and run_training, the
// loop itself (train.cpp; its parts in run_checks.h, rank_setup.h, step.h,
// resume.h and run_report.h).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/process_group.h"
#include "device/device.h"
#include "models/model.h"
#include "models/weights.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "parallel/reducer.h"
#include "parallel/strategy.h"
#include "train/lockstep.h"

namespace dpt {

// Where the token embedding lives under --tp: whole on every TP rank, or its
// rows split over them with a vocabulary-parallel head (nn/vocab_parallel.h).
enum class TpEmbedding { Replicated, Vocab };

struct TrainOptions {
  std::string model = "mlp";                 // "mlp", "gpt" or "llama"
  std::map<std::string, std::string> hparams;  // model sizes as flags give them (see make_model)
  // The model's whole configuration, resolved once (resolve_model in
  // train/rank_setup.h): the flags over what --load's file says, with the
  // model's name. Checks, the planner and the set-up read it; empty until
  // resolved.
  std::map<std::string, std::string> model_config;
  std::string data;         // mlp: IDX directory; gpt: text, or token shards (file, directory or glob)
  std::string data_format;  // gpt: llmc, u16 or bytes; empty: from the magic number (docs/data.md)
  std::string val_data;     // gpt: held-out shards or text; empty: the last val_fraction of data
  bool synthetic = false;   // random batches; measures compute only
  int64_t steps = 0;        // optimizer steps; 0: from epochs (mlp) or 200 (gpt)
  int64_t epochs = 3;       // mlp, when steps == 0
  int64_t batch = 0;        // global samples per step; 0: 256 (mlp) or 16 (gpt)
  int64_t grad_accum = 1;   // micro-batches per step (each rank's share split evenly)
  // The strategy's catalog record (parallel/catalog.h): local, ddp (the
  // default on more than one rank), zero1, zero2, zero3 (= fsdp), hsdp, or dp
  // (naive single-process data parallelism over dp_replicas threads). Unset:
  // the default for the mesh's data-parallel degree.
  StrategyRef strategy;
  int dp_replicas = 2;
  // Keep only each unit's input in forward and recompute the unit in
  // backward: less activation memory for about one more forward (docs/memory.md).
  bool checkpoint_activations = false;
  // --attention fused or unfused (models/decoder.h); empty: the default,
  // fused on the CPU and unfused on CUDA (fused_attention_for, docs/memory.md).
  std::string attention;
  // --attention-products: fp32 or bf16 (the fused attention's products on
  // bf16 copies of their inputs; --precision bf16 on the CPU); empty: the
  // default, bf16 where it can run (bf16_attention_products_for).
  std::string attention_products;
  // Compute precision (docs/precision.md): F32, or BF16 (bf16 compute copies
  // of the parameters, fp32 master weights, fp32 gradients and reductions).
  DType precision = DType::F32;
  // Where the model computes (--device): the CPU, or this rank's GPU.
  Device device = Device::CPU;
  ReducerOptions ddp;       // buckets, overlap, per-parameter mode
  // The flags given that only some strategies read (strategy_flags(),
  // train/run_checks.h: --bucket-mb, --prefetch, --zero-accumulate...),
  // each refused under a strategy that does not read it once the default
  // strategy is known (checked_flags).
  std::vector<std::string> strategy_flags;
  bool zero_scatter = false;          // zero1: reduce-scatter instead of all-reduce
  bool zero_accumulate_locally = false;  // zero2/3 + grad_accum: reduce once per step
  bool reshard_after_forward = true;  // zero3
  Prefetch prefetch = Prefetch::Both;  // zero3: the next unit's all-gather
  int shard_group = 0;                // hsdp: ranks per shard group (0: one host's)
  // The mesh (parallel/mesh.h): tensor- and pipeline-parallel degrees; the
  // data-parallel degree is what is left of the world. Pipeline stages run
  // their grad_accum micro-batches (--micro-batches) in pp_schedule's order
  // (gpipe, 1f1b, interleaved, zb-h1, zb-v; run_program), with blocks per
  // chunk from pp_split ("2,1,1"; empty:
  // balanced by parameters). docs/pipeline.md.
  int tp = 1;
  TpEmbedding tp_embedding = TpEmbedding::Replicated;  // or Vocab: wte's rows split over the TP group
  bool sequence_parallel = false;  // norms and residuals split along the rows over the TP group
  int pp = 1;
  int cp = 1;  // context parallelism: ranks that split each sequence (docs/context_parallel.md)
  std::string pp_schedule = "1f1b";  // parallel/pipe_program.h's names
  int virtual_stages = 0;            // chunks per rank; 0: the schedule's (interleaved, zb-v: 2; else 1)
  std::string pp_split;
  // Bytes the ranks on this host may use together; 0: the host's available
  // memory (MemAvailable). A run whose estimate exceeds it is refused.
  size_t memory_budget = 0;
  // Optimizer state off RAM: Optimizer keeps it in a file per rank under
  // offload_dir, streamed through RAM in chunks of offload_chunk_bytes per
  // state tensor during the optimizer step (docs/memory.md, "Offload").
  Offload offload = Offload::None;
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
  // --sample-every: steps between printed samples (docs/generate.md); 0 =
  // none. A gpt or llama model under any layout: the prompt (its bytes, or
  // its ids under sample_tokenizer), then sample_tokens tokens at
  // temperature 1, decoded by sample_tokenizer (a byte-level model: none).
  int64_t sample_every = 0;
  std::string sample_prompt = "\n";
  int64_t sample_tokens = 64;
  std::string sample_tokenizer;
  int64_t eval_windows = 256; // gpt: windows per periodic evaluation (0 = all)
  int64_t log_every = 10;
  std::string load;         // safetensors to start from
  std::string load_format;  // its layout: dpt or hf; empty: told by names and shapes (models/hf_gpt2.h)
  std::string save;         // safetensors to write at the end
  uint64_t save_shard_bytes = 0;    // --save-shard-mb: a sharded set of files this big at most (0: one file)
  DType save_dtype = DType::F32;     // --save-dtype: the saved tensors' type
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
  // Of step_ms, the time inside GEMM calls (nn/gemm.h's gemm_seconds): the
  // summary's step budget, GEMMs against everything else.
  double gemm_ms = 0;
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
  // What the layout's plan says this rank sends per step (dpt plan's count,
  // the logged steps' collectives spread over the steps; on a tp x pp mesh
  // its stage's data-parallel rank 0's, as dpt plan counts it), and the
  // strategy's formula in words (its catalog record's).
  uint64_t planned_comm_bytes_per_step = 0;
  std::string comm_formula;
  // The same split by the phase a collective was issued in: forward,
  // backward, optimizer, other (evaluation, the logged loss).
  std::map<std::string, uint64_t> comm_bytes_per_phase;
  double first_loss = 0.0, final_loss = 0.0;  // training loss, first and last step
  double eval_loss = 0.0, eval_accuracy = 0.0;  // final evaluation (not synthetic)
  double step_ms_median = 0.0;  // steady state: steps after the first 20 (or after 1)
  double step_cpu_ms_median = 0.0;  // this rank's, the same steps (StepBreakdown::cpu_ms)
  double step_gemm_ms_median = 0.0;  // this rank's, the same steps (StepBreakdown::gemm_ms)
  double samples_per_s = 0.0;   // images (mlp) or sequences (gpt)
  double tokens_per_s = 0.0;    // gpt
  double gflops = 0.0, mfu = 0.0, gemm_gflops = 0.0;  // the GEMM backend's peak, measured
  // This rank's GEMM rate sampled after the first step of a CPU run expected
  // to last a few seconds (0: not sampled): the summary's peak is the higher
  // of it and the one measured at the end, two moments apart, so one sag
  // of a shared host does not set it (core/gemm_peak.h).
  double early_gemm_gflops = 0.0;
  double scaling_efficiency = 0.0;  // with a baseline, else 0
  size_t peak_rss = 0;
  // A GPU run's device memory (zeros on the CPU), read before the GEMM
  // peak's measurement allocates its operands on the device.
  DeviceMemory device_bytes;
  size_t huge_pages = 0;    // of it, on transparent huge pages at the end (core/host_alloc.h)
  double ring_wait_ms = 0;  // --cp: this rank's mean wait per step for ring attention's transfers
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

// Runs training on the group's ranks (a group of one for a single process);
// throws Error subclasses for bad input and CommError when a peer fails.
// --save's layout, cap per file and tensor type, from the flags.
SaveOptions save_options(const TrainOptions& o);

TrainResult run_training(TrainOptions opts, comm::ProcessGroup& pg);
// The same on a fresh world of one.
TrainResult run_training(TrainOptions opts);

}  // namespace dpt
