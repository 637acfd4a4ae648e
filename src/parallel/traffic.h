// The bytes a rank sends per step under a strategy, computed from the layout
// alone: the one computation behind `dpt plan`'s traffic column, the run
// summary's "planned" figure, and each catalog record's traffic
// (parallel/catalog.h). tests/test_plan_cli.cpp holds it equal to what real
// runs send (the ledger's count).
#pragma once

#include <cstddef>
#include <cstdint>

#include "models/decoder.h"
#include "models/model.h"
#include "parallel/strategy.h"

namespace dpt {

// Bytes one rank sends per step in the engine's ring collectives on one host
// (the ledger's count), by the phase the collective is issued in.
struct CommPlan {
  uint64_t forward = 0, backward = 0, optimizer = 0;  // every step once the run is going
  // zero3: the run's first step also gathers, in backward, the unit forward
  // ends on (it is kept for backward once the opening order is recorded).
  uint64_t first_step = 0;
  // Each logged step adds the loss average (phase "other") and, where
  // gradients are sharded, the gradient norm's all-gather ("optimizer").
  uint64_t logged_other = 0, logged_optimizer = 0;
  uint64_t per_step() const { return forward + backward + optimizer; }
  CommPlan& operator+=(const CommPlan& o);
};

// Bytes the ring sends from `rank` of `world` for an m-element collective of
// `es`-byte elements: a reduce-scatter sends every chunk but the rank's own,
// an all-gather every chunk but its next neighbour's (comm/ring.cpp), an
// all-reduce both.
struct RingSends {
  int world, rank;
  uint64_t rs(size_t m, size_t es) const;
  uint64_t ag(size_t m, size_t es) const;
  uint64_t ar(size_t m, size_t es) const { return rs(m, es) + ag(m, es); }
};

// The bytes rank `rank` of `world` sends per step under `options`
// (WORKLOADS.md's "Communication volume per step" with the ring's exact
// chunks), as the strategy's catalog record counts them; grad_accum
// micro-steps each.
CommPlan planned_comm(const StrategyOptions& options, const Model& model, int world, int rank, int64_t grad_accum);

// The building blocks the records count with. DDP's (and zero1's by
// all-reduce): the buckets' all-reduces in backward.
CommPlan bucket_traffic(const StrategyOptions& o, const Model& model, int world, int rank);
// ZeRO stage 1, 2 or 3 over `world` ranks: reduce-scatters (or zero1's
// buckets), the all-gathers after the step (1, 2) or as the model opens
// units (3: Model::unit_order), and a logged step's gradient-norm gather.
CommPlan zero_traffic(int stage, const StrategyOptions& o, const Model& model, int world, int rank,
                      int64_t grad_accum);

// Context parallelism's ring (nn/ring_attention.h) on one rank of a
// decoder's CP group of cp ranks: per block and micro-batch, forward sends
// cp - 1 blocks of keys and values (micro x T/cp rows of 2 kv x hd floats
// each, kv the key/value heads of its TP rank), backward cp - 1 again and cp of their gradients, and under
// activation checkpointing the recomputed forward's cp - 1 in backward.
// `blocks`: the blocks this rank holds (a pipeline stage's).
CommPlan context_traffic(const Decoder& model, int64_t blocks, int64_t micro, int64_t grad_accum);

}  // namespace dpt
