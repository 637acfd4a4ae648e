#include "parallel/strategy.h"

#include <algorithm>

#include "core/error.h"
#include "parallel/rank_bytes.h"
#include "parallel/replicated.h"
#include "parallel/zero.h"

namespace dpt {

Prefetch parse_prefetch(const std::string& s) {
  if (s == "none") return Prefetch::None;
  if (s == "forward") return Prefetch::Forward;
  if (s == "backward") return Prefetch::Backward;
  if (s == "both") return Prefetch::Both;
  throw InputError(fmt::format("unknown prefetch '{}' (expected none, forward, backward or both)", s));
}

const char* prefetch_name(Prefetch p) {
  static const char* kNames[] = {"none", "forward", "backward", "both"};
  return kNames[static_cast<int>(p)];
}

std::string default_strategy(int world) { return world > 1 ? "ddp" : "local"; }

std::unique_ptr<Strategy> make_strategy(const StrategyOptions& options, Model& model, comm::ProcessGroup& pg,
                                        const StrategyInit& init) {
  if (options.name == "local") {
    if (pg.size() > 1)
      throw InputError(fmt::format("--strategy local trains one process, but {} ranks were launched; use ddp",
                                   pg.size()));
    return std::make_unique<LocalStrategy>(options, model, pg, init);
  }
  if (options.name == "ddp") return std::make_unique<DdpStrategy>(options, model, pg, init);
  if (options.name == "hsdp") {
    StrategyOptions o = options;
    o.shard_group = shard_group_size(options, pg);
    return std::make_unique<ZeroStrategy>(o, model, pg, init, 3);
  }
  if (const int stage = zero_stage(options.name)) return std::make_unique<ZeroStrategy>(options, model, pg, init, stage);
  throw InputError(
      fmt::format("unknown strategy '{}' (expected local, ddp, zero1, zero2, zero3, fsdp or hsdp)", options.name));
}

int shard_group_size(const StrategyOptions& options, const comm::ProcessGroup& pg) {
  int s = options.shard_group;
  if (s <= 0) {
    const std::string& mine = pg.hosts()[static_cast<size_t>(pg.rank())];
    s = static_cast<int>(std::count(pg.hosts().begin(), pg.hosts().end(), mine));
  }
  if (pg.size() % s != 0)
    throw InputError(fmt::format("--shard-group {} does not divide the {} data-parallel ranks", s, pg.size()));
  return s;
}

}  // namespace dpt
