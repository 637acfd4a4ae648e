#include "parallel/strategy.h"

#include <algorithm>
#include <string>
#include <vector>

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

std::string plannable_strategy(const std::string& name) {
  const std::string s = name == "fsdp" ? "zero3" : name;
  const auto& dp = data_parallel_strategies();
  if (!trains_one_replica(s) && std::find(dp.begin(), dp.end(), s) == dp.end())
    throw InputError(fmt::format("unknown strategy '{}' (expected local, ddp, zero1, zero2, zero3 or fsdp)", name));
  return s;
}

bool trains_one_replica(const std::string& name) { return name == "local"; }

const char* fits_because(const std::string& name, bool mesh) {
  switch (zero_stage(name)) {
    case 0:
      if (name == "ddp") return "the model, its gradients and optimizer state fit on every rank: DDP";
      return mesh ? "one replica's ranks (its tp x pp mesh) hold everything" : "one rank holds everything";
    case 1:
      return "the model and its gradients fit, the optimizer state does not: ZeRO-1";
    case 2:
      return "the model fits, its gradients and optimizer state do not: ZeRO-2 / FSDP SHARD_GRAD_OP";
    default:
      return "the model does not fit: ZeRO-3 / FSDP FULL_SHARD";
  }
}

const std::vector<std::string>& data_parallel_strategies() {
  static const std::vector<std::string> names{"ddp", "zero1", "zero2", "zero3"};
  return names;
}

std::unique_ptr<Strategy> make_strategy(const StrategyOptions& given, Model& model, comm::ProcessGroup& pg,
                                        const StrategyInit& init) {
  const StrategyOptions options = resolve_options(given, pg);
  if (options.name == "local") {
    if (pg.size() > 1)
      throw InputError(fmt::format("--strategy local trains one process, but {} ranks were launched; use ddp",
                                   pg.size()));
    return std::make_unique<LocalStrategy>(options, model, pg, init);
  }
  if (options.name == "ddp") return std::make_unique<DdpStrategy>(options, model, pg, init);
  if (options.name == "hsdp") return std::make_unique<ZeroStrategy>(options, model, pg, init, 3);
  if (const int stage = zero_stage(options.name)) return std::make_unique<ZeroStrategy>(options, model, pg, init, stage);
  throw InputError(
      fmt::format("unknown strategy '{}' (expected local, ddp, zero1, zero2, zero3, fsdp or hsdp)", options.name));
}

namespace {
// The ranks of one host, when every host holds the same number of
// consecutive ranks (shard groups are consecutive ranks). Decided from the
// host list every rank holds alike, so every rank accepts or refuses alike.
int ranks_per_host(const std::vector<std::string>& hosts) {
  const auto on = [&](const std::string& h) { return static_cast<int>(std::count(hosts.begin(), hosts.end(), h)); };
  const int s = on(hosts.front());
  for (size_t r = 0; r < hosts.size(); ++r) {
    if (on(hosts[r]) != s)
      throw InputError(fmt::format("hsdp's default shard group is the ranks of one host, but host {} has {} and "
                                   "host {} has {}: give --shard-group",
                                   hosts.front(), s, hosts[r], on(hosts[r])));
    const size_t first = r - r % static_cast<size_t>(s);  // of r's would-be shard group
    if (hosts[r] != hosts[first])
      throw InputError(fmt::format("hsdp's default shard group is the ranks of one host, but ranks {}-{} span "
                                   "hosts {} and {}: place ranks host by host (mpirun's default, --map-by slot) "
                                   "or give --shard-group",
                                   first, first + static_cast<size_t>(s) - 1, hosts[first], hosts[r]));
  }
  return s;
}
}  // namespace

void check_shard_group(const std::string& strategy, int shard_group) {
  if (shard_group > 0 && strategy != "hsdp")
    throw InputError(fmt::format("--shard-group is hsdp's; --strategy {} has no shard groups", strategy));
}

StrategyOptions resolve_options(StrategyOptions options, const comm::ProcessGroup& pg) {
  check_shard_group(options.name, options.shard_group);
  if (options.name == "hsdp") options.shard_group = shard_group_size(options, pg);
  return options;
}

int shard_group_size(const StrategyOptions& options, const comm::ProcessGroup& pg) {
  const int s = options.shard_group > 0 ? options.shard_group : ranks_per_host(pg.hosts());
  if (pg.size() % s != 0)
    throw InputError(fmt::format("--shard-group {} does not divide the {} data-parallel ranks", s, pg.size()));
  return s;
}

}  // namespace dpt
