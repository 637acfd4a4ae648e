#include "parallel/mesh.h"

#include <fmt/format.h>

#include "core/error.h"

namespace dpt {

Mesh Mesh::layout(int world, int rank, int tp, int pp, int cp) {
  if (tp < 1 || pp < 1 || cp < 1)
    throw InputError(fmt::format("--tp {}, --pp {} and --cp {} must be at least 1", tp, pp, cp));
  // In 64 bits: --tp 65536 --pp 65536 is 2^32, 0 as an int (a division by
  // zero below).
  const int64_t cells = int64_t{tp} * pp * cp;
  if (cells > world || world % cells != 0) {
    const std::string cps = cp > 1 ? fmt::format(" x --cp {}", cp) : "";
    throw InputError(fmt::format("{} ranks do not split into --tp {} x --pp {}{} (a multiple of {} is needed)", world,
                                 tp, pp, cps, cells));
  }
  Mesh m;
  m.world = world;
  m.tp = tp;
  m.pp = pp;
  m.cp = cp;
  m.dp = world / (tp * pp * cp);
  m.tp_rank = rank % tp;
  m.cp_rank = rank / tp % cp;
  m.dp_rank = rank / (tp * cp) % m.dp;
  m.pp_rank = rank / (tp * cp * m.dp);
  return m;
}

std::string Mesh::describe() const {
  return fmt::format("pp {} x dp {} x tp {}{}", pp, dp, tp, cp > 1 ? fmt::format(" x cp {}", cp) : "");
}

MeshGroups::MeshGroups(const Mesh& m, comm::ProcessGroup& world) : world_(world) {
  // Colors name the group, keys order it: a TP group is one replica's
  // ranks of one stage ranked by slice; a DP group is one stage's ranks
  // ranked by replica; a PP group is one replica's ranks ranked by stage.
  // A CP group is one replica's ranks of one stage and TP slice ranked by
  // chunk; the DP group takes the CP ranks in with the replicas.
  if (m.tp > 1) tp_ = world.split((m.pp_rank * m.dp + m.dp_rank) * m.cp + m.cp_rank, m.tp_rank, "tp");
  if (m.cp > 1) cp_ = world.split((m.pp_rank * m.dp + m.dp_rank) * m.tp + m.tp_rank, m.cp_rank, "cp");
  if (m.tp > 1 || m.pp > 1) dp_ = world.split(m.pp_rank * m.tp + m.tp_rank, m.dp_rank * m.cp + m.cp_rank, "dp");
  if (m.pp == 1) return;
  const int line = (m.dp_rank * m.cp + m.cp_rank) * m.tp + m.tp_rank;  // one replica's stages
  pp_ = world.split(line, m.pp_rank, "pp");
  act_ = world.split(line, m.pp_rank, "pp activations");
  grad_ = world.split(line, m.pp_rank, "pp gradients");
}

}  // namespace dpt
