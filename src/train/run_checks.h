// What a run is refused for, checked before anything large is built: the
// defaults filled in, then the mesh, the pipeline and tensor-parallel
// options, the output files, where the run computes, the memory of the
// ranks on this host and the offload directory. Each refusal is one
// sentence, the same on every rank.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "models/model.h"
#include "parallel/mesh.h"
#include "parallel/strategy.h"
#include "train/train.h"

namespace dpt {

// Fills the model-dependent defaults of opts (train.h's TrainOptions says
// which), and refuses a batch, accumulation or step count that cannot run.
void apply_defaults(TrainOptions& opts);

// Samples per micro-batch when the global batch is split over `parts`
// replicas (ranks or DP threads) and grad_accum micro-batches; throws
// InputError naming `parts_name` when it does not split evenly.
int64_t micro_batch(const TrainOptions& o, int parts, const char* parts_name);

// A run's start as rank `rank` of `world`: the defaults filled in
// (apply_defaults), --warmup against --steps (check_warmup), the mesh laid
// out (an impossible one is refused at once: Mesh::layout),
// the default strategy for the data-parallel degree named and the flags
// only some strategies read checked against it (check_strategy_flags), then
// the flags that can be checked before anything is built,
// in this order: the pipeline, tensor parallelism, the output files (rank 0
// can create them; only with pg: every rank of it agrees), where it
// computes, the shard group, --load with --resume, and the strategy's own
// refusals (its catalog record's). The model's configuration is resolved on
// the way (--load's file read once). Returns the mesh.
Mesh checked_flags(TrainOptions& o, int world, int rank, comm::ProcessGroup* pg);
// Refuses, in one sentence, a --warmup longer than the run's `steps` (its
// whole length, --resume or not): the learning rate would never reach --lr.
void check_warmup(const TrainOptions& o, int64_t steps);
// Refuses a model and batch past any machine (o.model_config's sizes, as
// doubles): more than 2^56 bytes for the parameters, their training state
// and one step's activations, a GEMM dimension past 2^31 - 1, or more than
// 65,536 blocks. The engine counts bytes in 64-bit integers and builds a
// named slot per tensor, so these must not reach it.
void check_sizes(const TrainOptions& o);
// --sample-every's refusals, one sentence each: not a gpt or llama model,
// and sample_text_setup's (train/sample.h: the tokenizer, the prompt).
void check_samples(const TrainOptions& o);
// The flags that set what only some strategies read (catalog.h's Setting):
// the command line records those given in TrainOptions::strategy_flags.
std::vector<std::string> strategy_flags();
// Refuses, in one sentence, a flag of o.strategy_flags that o.strategy does
// not read (its record's `reads`), naming what the flag sets, the strategy
// (`named`: given with --strategy; else the default for `dp` data-parallel
// ranks) and the strategies that read it; then check_zero_accumulate.
void check_strategy_flags(const TrainOptions& o, bool named, int dp);
// Refuses --zero-accumulate (`given`) with one micro-batch per step, where
// there is nothing to accumulate; `dpt plan`, which plans every strategy,
// checks only this.
void check_zero_accumulate(const TrainOptions& o, bool given);

// checked_flags on this rank of pg.
Mesh checked_mesh(TrainOptions& o, comm::ProcessGroup& pg);

// What `dpt launch` checks before it starts any rank (docs/launch.md):
// checked_flags as rank 0 of `world` ranks, and the batch's split over the
// data-parallel replicas. Throws what run_training would.
void check_launch(TrainOptions o, int world);

// Refuses, in one sentence, a pipeline the engine cannot run: another model
// than the GPT, a model with fewer blocks than stages, a bad --pp-split,
// --strategy dp and --device cuda.
void check_pipeline(const TrainOptions& o, const Mesh& mesh);

// Refuses, in one sentence, a --cp the engine cannot run: a model without
// causal attention, a context that does not split into 2 x cp chunks, the
// unfused attention, and the options not built with --cp yet. Nothing at
// cp = 1.
void check_context_parallel(const TrainOptions& o, const Mesh& mesh);

// Refuses, in one sentence, a --tp the engine cannot run: heads not
// divisible by tp, another model than the GPT, and the options not built
// with --tp yet. Nothing at tp = 1.
void check_tensor_parallel(const TrainOptions& o, const Mesh& mesh);

// Fails before training, with the sentence AtomicFile would give at the end,
// if rank 0 cannot create one of the run's output files (--save,
// --metrics-out, --summary-out, --trace-out). Every rank of the group calls
// it, and every rank fails.
void check_outputs(const TrainOptions& o, comm::ProcessGroup& pg);

// Refuses, before anything large is allocated, a run whose ranks on this
// host would together need more than the host has (or o.memory_budget):
// one sentence with the estimate per rank, what is available, and the
// strategy that would fit (seed 000's "when to use what").
// Under --pp, pg is the data-parallel group, `arenas` the micro-batches
// the stage holds at once, `world` every rank of the job and
// `pipeline_bytes` the stage's executor buffers (pipeline_buffer_bytes).
// `lead_bytes`: what one rank of this host holds besides (rank 0's model
// for --sample-every, sample_bytes), shared out over the host's ranks.
void check_memory(const TrainOptions& o, const StrategyOptions& so, const Model& model, int64_t micro,
                  comm::ProcessGroup& pg, int arenas = 1, int world = 0, size_t pipeline_bytes = 0,
                  size_t lead_bytes = 0);

// check_memory for this rank. Under --pp the stages hold different parts of
// the model, their arenas and the pipeline's buffers, and with
// --sample-every rank 0 holds the model for samples (sample_bytes): one
// that does not fit ends the run on every rank, with its sentence.
void check_rank_memory(const TrainOptions& o, const StrategyOptions& so, const Model& model, int64_t micro,
                       const Mesh& mesh, comm::ProcessGroup& dpg, comm::ProcessGroup& pg);

// Refuses, in one sentence on every rank, an --offload the run cannot have:
// an unsupported value, a strategy without an optimizer state to offload,
// or an --offload-dir that is missing, not writable, in memory or too small
// for the state of the ranks on this host (optim/file_tier.h). pg: the
// group the strategy runs over (the data-parallel group under --tp or
// --pp); world: every rank of the job, which all refuse together.
void check_offload(const TrainOptions& o, const StrategyOptions& so, const Model& model, comm::ProcessGroup& pg,
                   comm::ProcessGroup& world);

}  // namespace dpt
