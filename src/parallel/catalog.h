// The strategy catalog: one record per strategy, written in the strategy's own
// file and listed once here, that the training loop, `dpt plan`, checkpoints
// and the command line all read. A record says what the strategy is called
// (and its aliases), its ZeRO stage, how to make it, what a rank holds under
// it, what it sends per step, what it refuses and why, and which of the
// settings only some strategies read (Setting) it reads. Names are parsed once,
// at the command line's edge, into a StrategyRef (a record); below the edge
// code asks the record, never the name.
//
// Adding a strategy: a class implementing parallel/strategy.h and a function
// returning its record, in one file, and one line in catalog.cpp's list (or,
// at run time, register_strategy: tests/test_catalog.cpp does that with a
// strategy defined in the test).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "models/model.h"
#include "parallel/strategy.h"
#include "parallel/strategy_ref.h"
#include "parallel/traffic.h"

namespace dpt {

// What a run asks of its strategy, for the refusals a record makes before
// anything is built.
struct RunAsk {
  int world = 1;              // ranks of the job
  int dp = 1;                 // the data-parallel group's ranks (world / (tp x pp))
  bool fp32 = true;           // --precision fp32
  bool fp32_reduce = true;    // --reduce-dtype fp32
  bool checkpoints = false;   // --checkpoint-dir or --resume
  bool trace = false;         // --trace-out
  bool offload = false;       // --offload
  bool zero_scatter = false;  // --zero-reduce scatter
};

// The command line's settings that only some strategies read. A record
// lists those its strategy reads; a flag setting one that the run's
// strategy does not read would be dropped without a word, and is refused
// (checked_flags, train/run_checks.cpp, which knows each setting's flags).
enum class Setting {
  Buckets,         // DDP's gradient buckets: --bucket-mb, --first-bucket-mb, --no-overlap, --per-param
  ZeroReduce,      // --zero-reduce: ZeRO-1 reduces by all-reduce (in the buckets) or by scatter
  ZeroAccumulate,  // --zero-accumulate: sharded gradients over --grad-accum's micro-batches
  Prefetch,        // --prefetch: when the next unit's parameters are gathered
  Reshard,         // --reshard-after-forward: whether a unit's gathered parameters are freed
  Replicas,        // --dp-replicas: replica threads of one process
};

// A setting a strategy reads, unless the run asks for what `unless` says
// (zero1 reduces in no buckets with --zero-reduce scatter).
struct SettingRead {
  Setting setting;
  std::string unless;                            // in the command line's words; "": always read
  std::function<bool(const RunAsk&)> unless_asked;  // whether the run asks for it
};

struct StrategyRecord {
  std::string name;                  // as --strategy takes it and the summary prints it
  std::vector<std::string> aliases;  // other names --strategy takes (fsdp: zero3)
  std::string help;                  // a few words for --help
  int zero_stage = 0;                // 0: each rank steps the whole model; 1-3: ZeRO's stages
  // How the strategy runs: over the ranks of a data-parallel group (the
  // engine's Strategy interface), in one process only (local: one replica),
  // or as threads of one process with a loop of its own (naive DP,
  // train/naive_dp.cpp; `make` is empty).
  enum class Runs { Ranks, OneProcess, Threads } runs = Runs::Ranks;
  bool shard_groups = false;         // takes --shard-group (hsdp)
  bool plannable = true;             // `dpt plan` has rows for it
  // Why a plan would pick it, in the field's words; `mesh`: a replica is a
  // tp x pp mesh of ranks.
  std::function<std::string(bool mesh)> fits_because;
  // The planned communication of a step, in words: the formula the summary
  // holds the measured bytes against ("ring all-reduce: 2(N-1)/N").
  std::function<std::string(const StrategyOptions&, int world)> formula;
  std::function<std::unique_ptr<Strategy>(const StrategyOptions&, Model&, comm::ProcessGroup&, const StrategyInit&)>
      make;
  // What rank `rank` of `world` holds (parallel/rank_bytes.h) and sends per
  // step (parallel/traffic.h).
  std::function<MemoryBytes(const StrategyOptions&, const Model&, int world, int rank)> bytes;
  std::function<CommPlan(const StrategyOptions&, const Model&, int world, int rank, int64_t grad_accum)> traffic;
  // Throws InputError, in one sentence, for a run the strategy cannot train.
  std::function<void(const RunAsk&)> refuse;
  // The settings it reads of those only some strategies read.
  std::vector<SettingRead> reads;

  // The entry of `reads` for s, or null.
  const SettingRead* read_of(Setting s) const;

  bool trains_one_replica() const { return runs != Runs::Ranks; }
  bool in_threads() const { return runs == Runs::Threads; }
};

// The records, in the order --help and `dpt plan` list them: from the one
// that holds the most per rank to the one that holds the least.
std::vector<const StrategyRecord*> strategies();
// The record named `name` (or one of its aliases); InputError listing the
// names otherwise.
const StrategyRecord& find_strategy(const std::string& name);
// Adds a record (its name and aliases must be new); returns it.
const StrategyRecord& register_strategy(StrategyRecord record);
// Every name --strategy takes, aliases included, and the sentence listing
// them ("local, ddp, ... or dp").
std::vector<std::string> strategy_names();
std::string strategy_names_sentence();
// "local, ddp (default with several ranks), ...": --strategy's help.
std::string strategy_help();

// The strategy a run gets when none is named: ddp on several data-parallel
// ranks, local on one.
const StrategyRecord& default_strategy(int dp);
// The data-parallel strategies a plan compares and a memory refusal
// suggests, from the one that holds the most per rank to the least.
std::vector<const StrategyRecord*> data_parallel_strategies();

// A strategy a plan can compare (its record's `plannable`); InputError
// listing those otherwise.
const StrategyRecord& plannable_strategy(const std::string& name);

// Refuses, in one sentence, a strategy that keeps its replicas in threads
// (naive DP) on a tensor- or pipeline-parallel mesh; `with` names the mesh
// ("with --tp 2").
void check_mesh_strategy(const StrategyRef& strategy, const std::string& with);

// Throws InputError for a shard group (--shard-group, > 0) given to a
// strategy that has none: only hsdp has shard groups.
void check_shard_group(const StrategyRef& strategy, int shard_group);

}  // namespace dpt
