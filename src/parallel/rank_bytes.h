// The bytes a rank holds under a strategy, by category, computed from the
// layout alone (nothing allocated): the one computation behind the memory
// check before training (train/plan.h's check_fits), `dpt plan`, and the
// buffer pools ZeroStrategy reserves, so a plan and a run cannot drift apart
// (tests/test_plan_cli.cpp holds them equal to what runs account).
#pragma once

#include <cstddef>
#include <vector>

#include "parallel/strategy.h"
#include "models/model.h"

namespace dpt {

// The buffers (element counts) a zero2/zero3 rank reserves before its first
// step and never grows past: `gathered` holds all-gathered units (zero3),
// `scratch` unit gradients while backward writes them and while they are
// reduce-scattered (zero2/3 without local accumulation). Empty when the
// strategy needs none. The model's unit order says which units a pass opens
// twice (the GPT's tied embedding).
struct ZeroPools {
  std::vector<size_t> gathered, scratch;
  std::vector<size_t> wire;  // --reduce-dtype bf16: bf16 copies of units being reduce-scattered
};
ZeroPools zero_pools(const StrategyOptions& options, const Model& model);

// Optimizer state a rank holds for n parameters (optim/optimizer.h's
// state_floats per element).
size_t optimizer_state_bytes(const OptimizerConfig& config, size_t n);

// What rank `rank` of `world` holds under `options`: parameters, gradients
// and optimizer state (full or its shard), gathered units and communication
// scratch (the pools above). Rank 0's shard is the largest (chunk_range puts
// the larger chunks first), so rank 0's figures bound every rank's.
// With options.offload, the optimizer state moves to `offloaded` and the
// tier's chunk buffers take its place in the optimizer figure.
// The strategy's record computes it (parallel/catalog.h) from sharded_bytes.
MemoryBytes rank_bytes(const StrategyOptions& options, const Model& model, int world, int rank = 0);

// The building block the records compute with: what a rank holds at ZeRO
// stage `stage` (0: everything whole) over `world` ranks; `buckets`: the
// gradients are all-reduced in DDP's buckets (a bf16 copy of them under
// --reduce-dtype bf16).
MemoryBytes sharded_bytes(const StrategyOptions& options, const Model& model, int world, int rank, int stage,
                          bool buckets);

// What a rank keeps in shared windows when every rank of its group is on
// one host (comm/shm_window.h), as DDP's reducer and
// ZeroStrategy::place_in_windows place it: the bytes (its RSS counts
// (N-1)/N of them again, its chunk of each peer's) and whether every
// collective of a step runs in place (else some go through the ring's slots).
struct SharedWindows {
  size_t bytes = 0;
  bool every_collective = false;
};
SharedWindows shared_windows(const StrategyOptions& options, const Model& model);

}  // namespace dpt
