// A strategy decides where a run's parameters, gradients and optimizer state
// live across the ranks and when they move. The training loop talks to this
// interface only, in this order, and never asks which strategy it has:
//
//   Strategy s = make_strategy(...)       set-up: broadcast or shard
//   per step:  s.begin_step()             gradients zeroed where they live
//     per micro-step k: s.begin_micro_step(last)   sync or accumulate
//                       model.forward / model.backward (the model calls the
//                       strategy's UnitStore at unit boundaries; gradient
//                       ranges become final and start their reduction)
//              s.finish_backward()        wait for the reductions
//              s.grad_norm_squared()      global, across shards
//              s.scale_grads(clip)        clipping
//              s.step(lr)                 the optimizer, then any all-gather
//   eval and save: s.gather_unit(u, out)  full weights, a unit at a time
//   checkpoints:   s.state_spans()        what this rank writes and reads
//                  s.restored(step)       after a resume's reads
//
// Implementations: local (one process) and ddp (replicas, bucketed
// all-reduce; parallel/replicated.cpp), zero1/zero2/zero3 and hsdp
// (parallel/zero.cpp), each with its record in the strategy catalog
// (parallel/catalog.h), which makes it. Naive DP keeps its own threaded loop
// (train/naive_dp.cpp; docs/architecture.md says why).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/process_group.h"
#include "models/hf_gpt2.h"
#include "models/model.h"
#include "optim/optimizer.h"
#include "parallel/reducer.h"
#include "parallel/strategy_ref.h"

namespace dpt {

class Timeline;

enum class Prefetch { None, Forward, Backward, Both };
Prefetch parse_prefetch(const std::string& s);  // throws InputError
const char* prefetch_name(Prefetch p);          // "none", "forward", "backward", "both"

struct StrategyOptions {
  StrategyRef strategy = "local";  // its catalog record (parallel/catalog.h)
  OptimizerConfig optimizer;
  ReducerOptions ddp;           // ddp and zero1 (all-reduce): buckets
  // zero1: reduce the gradients with a reduce-scatter per unit instead of
  // DDP's bucketed all-reduce (each rank then holds only its shard reduced).
  bool zero_scatter = false;
  // zero2/zero3 with gradient accumulation: false reduce-scatters every
  // micro-step into the gradient shard (memory: no full gradients); true
  // accumulates full unit gradients locally and reduce-scatters only on the
  // last micro-step (communication: one reduction per step, 4 bytes per
  // parameter of gradients held).
  bool accumulate_locally = false;
  // zero3: free a unit's gathered parameters after its forward (true, FSDP's
  // FULL_SHARD) or keep them until its backward (false, SHARD_GRAD_OP).
  bool reshard_after_forward = true;
  Prefetch prefetch = Prefetch::Both;  // zero3: next unit's all-gather
  // hsdp: ZeRO-3 inside groups of this many consecutive ranks, replicated
  // across the groups (0: the ranks of one host; shard_group_size resolves it).
  int shard_group = 0;
  // Where the optimizer state lives: RAM, or a file per rank streamed in
  // chunks (`--offload optimizer`, optim/state_tier.h).
  OffloadOptions offload;
};

// Bytes a rank holds, per category (the summary's memory table).
struct MemoryBytes {
  size_t parameters = 0;   // the rank's parameters (a full copy, or its shards)
  size_t gradients = 0;    // persistent gradients (full, or shards)
  size_t optimizer = 0;    // optimizer state (full, or shards)
  size_t gathered = 0;     // zero3: buffers that hold gathered units
  size_t scratch = 0;      // communication scratch (zero2/3 unit gradients)
  size_t total() const { return parameters + gradients + optimizer + gathered + scratch; }
  // Optimizer state kept off RAM (--offload optimizer: in a file; the
  // optimizer figure above is then its chunk buffers). Not in total().
  size_t offloaded = 0;
};

// A span [begin, begin + n) of the model's flat parameter buffer and where
// this rank keeps it: its parameters, and its optimizer state (each of the
// optimizer's state tensors from element `at` of the optimizer's own span).
// params is nullptr where the (fp32 master) parameters are the optimizer's
// master tensor, in its tier (`--offload params`).
struct StateSpan {
  size_t begin = 0, n = 0;
  float* params = nullptr;
  Optimizer* optimizer = nullptr;
  size_t at = 0;
};

class Strategy {
 public:
  virtual ~Strategy() = default;
  virtual const std::string& name() const = 0;
  // One line for the run's header (buckets, shards, units).
  virtual std::string describe() const = 0;
  // The same as JSON for the summary, under the strategy's name (null: none).
  virtual nlohmann::json detail() const { return nullptr; }
  // The factor the loss is scaled by on top of 1/grad_accum: 1/world under
  // every data-parallel strategy, so reductions are plain sums.
  virtual float loss_scale() const = 0;

  virtual void begin_step() = 0;
  // Before micro-step k's forward; last = it ends the step (reduce now).
  virtual void begin_micro_step(bool last) = 0;
  // After the last micro-step's backward: every reduction complete.
  // Returns the seconds spent waiting (exposed communication).
  virtual double finish_backward() = 0;
  // Sum of squares of the reduced gradient over all parameters (every rank
  // gets the same value; a collective where gradients are sharded).
  virtual double grad_norm_squared() = 0;
  virtual void scale_grads(float factor) = 0;
  // The optimizer step on what this rank owns; sharded strategies then start
  // the all-gather of the updated parameters (finished before their next use).
  // The gradients are the strategy's again afterwards: only begin_step's
  // zeros are promised (the replicated ones clear them in the update).
  virtual void step(float lr) = 0;

  // Collective: the full parameters of unit u into out (rank 0 needs them;
  // other ranks may get them too). Called for every unit, in order, by every
  // rank.
  virtual void gather_unit(int unit, float* out) = 0;
  // Collective: checks that replicas are identical (replicated strategies).
  virtual void verify(int64_t /*step*/) {}

  // Checkpoints (train/checkpoint.h): the spans this rank writes, and on
  // resume reads. Over the ranks that write (writes_state) they cover every
  // element exactly once, so a checkpoint is written and read in parallel
  // with nothing read twice (a replicated strategy cuts the model into
  // chunks as ZeRO does). Called between steps.
  virtual std::vector<StateSpan> state_spans() = 0;
  // Whether this rank writes its spans: hsdp's replica groups hold the same
  // shards, so only the first shard group writes them (every group reads).
  virtual bool writes_state() const { return true; }
  // Collective, once every rank has read its spans: the optimizer's step
  // count set, and state this rank holds but did not read (the other chunks
  // of a replica) gathered from the ranks that did.
  virtual void restored(int64_t optimizer_steps) = 0;

  virtual MemoryBytes bytes() const = 0;
  // Where the optimizer state lives, for the summary (null: in RAM).
  virtual nlohmann::json offload_detail() const { return nullptr; }
  // Seconds this rank waited for parameter all-gathers since the last call
  // (exposed all-gather: inside forward and backward under zero3, at the
  // start of forward under zero1/2).
  virtual double take_gather_wait() { return 0.0; }
  // Adds this step's collectives to the timeline.
  virtual void trace(Timeline& /*tl*/, int64_t /*step*/) const {}
  // Spans trace() adds per step at most, to reserve the timeline.
  virtual size_t trace_spans() const { return 0; }
};

// Builds the strategy for `model` on `pg` and puts the initial weights where
// it keeps them: from `init.load` (a safetensors path) or from `init.seed`
// (Model::init_range), each rank filling only what it holds. DDP starts
// ranks other than 0 from other seeds and broadcasts rank 0's weights, so
// its replica check proves the broadcast; the others need no broadcast.
struct StrategyInit {
  uint64_t seed = 0;
  std::string load;
  WeightFormat load_format = WeightFormat::Auto;  // the file's layout (models/hf_gpt2.h)
};
// The options go through resolve_options first; the record makes it.
std::unique_ptr<Strategy> make_strategy(const StrategyOptions& options, Model& model, comm::ProcessGroup& pg,
                                        const StrategyInit& init);

// hsdp's shard group size on `pg`: options.shard_group, or, when 0, the
// ranks of one host (refused unless every host holds as many, consecutive
// ranks, as mpirun places them by default). Throws InputError when it does
// not divide the ranks.
int shard_group_size(const StrategyOptions& options, const comm::ProcessGroup& pg);


// The options as the named strategy runs them on `pg` (make_strategy runs
// them so; the memory and offload checks made before it exists need them
// too): checked by check_shard_group, hsdp's shard group resolved
// (shard_group_size).
StrategyOptions resolve_options(StrategyOptions options, const comm::ProcessGroup& pg);



}  // namespace dpt
