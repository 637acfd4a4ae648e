#include "parallel/mesh.h"

#include <fmt/format.h>

#include "core/error.h"

namespace dpt {

Mesh Mesh::layout(int world, int rank, int tp, int pp) {
  if (tp < 1 || pp < 1) throw InputError(fmt::format("--tp {} and --pp {} must be at least 1", tp, pp));
  if (world % (tp * pp) != 0)
    throw InputError(fmt::format("{} ranks do not split into --tp {} x --pp {} (a multiple of {} is needed)", world,
                                 tp, pp, tp * pp));
  Mesh m;
  m.world = world;
  m.tp = tp;
  m.pp = pp;
  m.dp = world / (tp * pp);
  m.tp_rank = rank % tp;
  m.dp_rank = rank / tp % m.dp;
  m.pp_rank = rank / (tp * m.dp);
  return m;
}

std::string Mesh::describe() const { return fmt::format("pp {} x dp {} x tp {}", pp, dp, tp); }

MeshGroups::MeshGroups(const Mesh& m, comm::ProcessGroup& world) : world_(world) {
  // Colors name the group, keys order it: a TP group is one replica's
  // ranks of one stage ranked by slice; a DP group is one stage's ranks
  // ranked by replica; a PP group is one replica's ranks ranked by stage.
  if (m.tp > 1) tp_ = world.split(m.pp_rank * m.dp + m.dp_rank, m.tp_rank, "tp");
  if (m.tp > 1 || m.pp > 1) dp_ = world.split(m.pp_rank * m.tp + m.tp_rank, m.dp_rank, "dp");
  if (m.pp == 1) return;
  pp_ = world.split(m.dp_rank * m.tp + m.tp_rank, m.pp_rank, "pp");
  act_ = world.split(m.dp_rank * m.tp + m.tp_rank, m.pp_rank, "pp activations");
  grad_ = world.split(m.dp_rank * m.tp + m.tp_rank, m.pp_rank, "pp gradients");
}

}  // namespace dpt
