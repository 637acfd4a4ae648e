// The device mesh of a run: the world's ranks laid out as Megatron-LM does,
// tensor-parallel ranks innermost (adjacent, so on one host), then the
// context-parallel ranks of a replica, then data-parallel replicas, then
// pipeline stages (torchtitan's order):
//
//   rank = ((pp_rank * dp + dp_rank) * cp + cp_rank) * tp + tp_rank
//
// and the subgroups each rank computes with: its TP group (the ranks that
// split one stage's matrices: the activations' all-reduces), its CP group
// (the ranks that split one replica's sequences: the ring that passes keys
// and values, docs/context_parallel.md), its DP group (the ranks that hold
// the same stage and TP slice, the CP ranks included: what a data-parallel
// strategy reduces and shards over) and its PP group (one replica's stages,
// in order).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "comm/process_group.h"

namespace dpt {

struct Mesh {
  int world = 1, tp = 1, dp = 1, pp = 1, cp = 1;
  int tp_rank = 0, dp_rank = 0, pp_rank = 0, cp_rank = 0;

  // The layout of `rank` in a world of `world` ranks; throws InputError,
  // one sentence, when tp x pp x cp does not divide the world.
  static Mesh layout(int world, int rank, int tp, int pp, int cp = 1);
  int rank_of(int tp_rank, int dp_rank, int pp_rank, int cp_rank = 0) const {
    return ((pp_rank * dp + dp_rank) * cp + cp_rank) * tp + tp_rank;
  }
  // The ranks a data-parallel strategy spans: the replicas times their CP
  // ranks (each CP rank's gradient is its share of its replica's).
  int dp_cp() const { return dp * cp; }
  // "pp 2 x dp 2 x tp 1" (and "x cp 2" under context parallelism)
  std::string describe() const;
};


// The subgroups of a mesh on the world group. A degree of 1 needs no group
// of its own: dp() is the world itself when tp = pp = 1 (so a run without
// --tp or --pp communicates exactly as before), tp() is null at tp = 1, and
// the PP links are unused at pp = 1.
class MeshGroups {
 public:
  // Collective over `world`: every rank calls it with its own mesh.
  MeshGroups(const Mesh& mesh, comm::ProcessGroup& world);
  comm::ProcessGroup& world() { return world_; }
  // The ranks of this rank's stage and TP slice across replicas and their
  // CP ranks, ranked by (dp_rank, cp_rank).
  comm::ProcessGroup& dp() { return dp_ ? *dp_ : world_; }
  // The ranks that hold the other chunks of this rank's sequences, ranked
  // by cp_rank; null at cp = 1.
  comm::ProcessGroup* cp() { return cp_.get(); }
  // The ranks that hold the other slices of this rank's matrices, ranked
  // by tp_rank; null at tp = 1.
  comm::ProcessGroup* tp() { return tp_.get(); }
  // This replica's stages, ranked by stage: the loss, the gradient norm,
  // the tied embedding's gradient and weights, saving.
  comm::ProcessGroup& pp() { return pp_ ? *pp_ : world_; }
  // The same ranks again, one group per direction of the pipeline: a
  // group runs its operations one at a time in issue order and a send ends
  // only when it is received, so activations (stage s to s + 1) and their
  // gradients (s + 1 to s) each get a queue of their own and never wait
  // behind the other's transfers.
  comm::ProcessGroup& activations() { return *act_; }
  comm::ProcessGroup& gradients() { return *grad_; }

 private:
  comm::ProcessGroup& world_;
  std::unique_ptr<comm::ProcessGroup> tp_, cp_, dp_, pp_, act_, grad_;
};

}  // namespace dpt
