#include "parallel/strategy.h"

#include <algorithm>
#include <string>
#include <vector>

#include "core/error.h"
#include "parallel/catalog.h"

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

std::unique_ptr<Strategy> make_strategy(const StrategyOptions& given, Model& model, comm::ProcessGroup& pg,
                                        const StrategyInit& init) {
  const StrategyOptions options = resolve_options(given, pg);
  DPT_CHECK(static_cast<bool>(options.strategy->make), "--strategy {} is not made through the Strategy interface",
            options.strategy.name());
  return options.strategy->make(options, model, pg, init);
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

StrategyOptions resolve_options(StrategyOptions options, const comm::ProcessGroup& pg) {
  check_shard_group(options.strategy, options.shard_group);
  if (options.strategy->shard_groups) options.shard_group = shard_group_size(options, pg);
  return options;
}

int shard_group_size(const StrategyOptions& options, const comm::ProcessGroup& pg) {
  const int s = options.shard_group > 0 ? options.shard_group : ranks_per_host(pg.hosts());
  if (pg.size() % s != 0)
    throw InputError(fmt::format("--shard-group {} does not divide the {} data-parallel ranks", s, pg.size()));
  return s;
}

}  // namespace dpt
