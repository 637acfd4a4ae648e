#include "parallel/catalog.h"

#include <algorithm>
#include <deque>
#include <mutex>
#include <ostream>

#include <fmt/format.h>

#include "core/error.h"
#include "parallel/rank_bytes.h"
#include "parallel/replicated.h"
#include "parallel/zero.h"

namespace dpt {

namespace {

// Naive DP (--strategy dp): replicas in threads of one process with a loop
// of its own (train/naive_dp.cpp, above this layer), kept to be measured
// against DDP. Its record says what it refuses; it has no Strategy.
StrategyRecord naive_dp_record() {
  StrategyRecord r;
  r.name = "dp";
  r.help = "dp (threads)";
  r.runs = StrategyRecord::Runs::Threads;
  r.plannable = false;
  r.reads = {{Setting::Replicas, "", nullptr}};
  r.refuse = [](const RunAsk& a) {
    if (a.world > 1) throw InputError("--strategy dp runs in one process; start it without a launcher");
    if (a.trace) throw InputError("--trace-out records training across ranks, not --strategy dp");
    if (a.checkpoints) throw InputError("--strategy dp keeps no checkpoints; use local, ddp or zero1/2/3");
    if (!a.fp32)
      throw InputError("--strategy dp computes in fp32 only; use local, ddp or zero1/2/3 for --precision bf16");
    if (a.offload) throw InputError("--strategy dp offloads nothing; use local, ddp or zero1/2/3");
    if (!a.fp32_reduce)
      throw InputError(
          "--strategy dp sums its replicas' gradients in fp32 only; use ddp or zero1/2/3 for --reduce-dtype bf16");
  };
  return r;
}

// The built-in strategies, in the order they are listed: each record comes
// from its strategy's own file.
std::deque<StrategyRecord> builtins() {
  std::deque<StrategyRecord> list;
  list.push_back(local_record());
  list.push_back(ddp_record());
  for (int stage : {1, 2, 3}) list.push_back(zero_record(stage));
  list.push_back(hsdp_record());
  list.push_back(naive_dp_record());
  return list;
}

// A deque: registering keeps every record where it is (StrategyRefs point
// at them).
std::deque<StrategyRecord>& records() {
  static std::deque<StrategyRecord> all = builtins();
  return all;
}
std::mutex& records_mutex() {
  static std::mutex mu;
  return mu;
}

bool answers_to(const StrategyRecord& r, const std::string& name) {
  return r.name == name || std::find(r.aliases.begin(), r.aliases.end(), name) != r.aliases.end();
}

const StrategyRecord* lookup(const std::string& name) {
  for (const StrategyRecord& r : records())
    if (answers_to(r, name)) return &r;
  return nullptr;
}

// The names and aliases of the records that `keep` keeps, in order.
template <typename Keep>
std::vector<std::string> names_of(const std::vector<const StrategyRecord*>& records, Keep keep) {
  std::vector<std::string> names;
  for (const StrategyRecord* r : records)
    if (keep(*r)) {
      names.push_back(r->name);
      names.insert(names.end(), r->aliases.begin(), r->aliases.end());
    }
  return names;
}

// "a, b or c".
std::string sentence(const std::vector<std::string>& names) {
  std::string s;
  for (size_t i = 0; i < names.size(); ++i) s += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return s;
}

}  // namespace

std::vector<const StrategyRecord*> strategies() {
  std::lock_guard<std::mutex> lock(records_mutex());
  std::vector<const StrategyRecord*> out;
  for (const StrategyRecord& r : records()) out.push_back(&r);
  return out;
}

const StrategyRecord& find_strategy(const std::string& name) {
  {
    std::lock_guard<std::mutex> lock(records_mutex());
    if (const StrategyRecord* r = lookup(name)) return *r;
  }
  throw InputError(fmt::format("unknown strategy '{}' (expected {})", name, strategy_names_sentence()));
}

const StrategyRecord& register_strategy(StrategyRecord record) {
  // What the loop, the planner and the summary call on every record.
  const bool runs_here = !record.in_threads();
  if (record.name.empty() || !record.fits_because || !record.formula || !record.bytes || !record.traffic ||
      (runs_here && !record.make))
    throw InputError(fmt::format("strategy '{}' cannot be registered: a record needs a name, fits_because, formula, "
                                 "bytes, traffic and (unless it runs in threads) make",
                                 record.name));
  std::lock_guard<std::mutex> lock(records_mutex());
  std::vector<std::string> names = record.aliases;
  names.push_back(record.name);
  for (const std::string& n : names)
    if (lookup(n)) throw InputError(fmt::format("a strategy named '{}' is already registered", n));
  records().push_back(std::move(record));
  return records().back();
}

std::vector<std::string> strategy_names() {
  return names_of(strategies(), [](const StrategyRecord&) { return true; });
}

std::string strategy_names_sentence() { return sentence(strategy_names()); }

std::string strategy_help() {
  std::string s;
  for (const StrategyRecord* r : strategies()) s += (s.empty() ? "" : ", ") + r->help;
  return s;
}

const StrategyRecord& default_strategy(int dp) { return find_strategy(dp > 1 ? "ddp" : "local"); }

std::vector<const StrategyRecord*> data_parallel_strategies() {
  std::vector<const StrategyRecord*> out;
  for (const StrategyRecord* r : strategies())
    if (r->plannable && !r->trains_one_replica()) out.push_back(r);
  return out;
}

const StrategyRecord& plannable_strategy(const std::string& name) {
  const std::vector<const StrategyRecord*> all = strategies();
  for (const StrategyRecord* r : all)
    if (r->plannable && answers_to(*r, name)) return *r;
  const auto plannable = [](const StrategyRecord& r) { return r.plannable; };
  throw InputError(fmt::format("unknown strategy '{}' (expected {})", name, sentence(names_of(all, plannable))));
}

const SettingRead* StrategyRecord::read_of(Setting s) const {
  for (const SettingRead& r : reads)
    if (r.setting == s) return &r;
  return nullptr;
}

StrategyRef::StrategyRef(const StrategyRecord& r) : r_(&r), name_(r.name) {}

StrategyRef::StrategyRef(const std::string& name) : r_(&find_strategy(name)), name_(name) {}

const StrategyRecord& StrategyRef::operator*() const {
  DPT_CHECK(r_ != nullptr, "a strategy was asked of options that name none");
  return *r_;
}

const std::string& StrategyRef::name() const {
  DPT_CHECK(r_ != nullptr, "a strategy's name was asked of options that name none");
  return name_;
}

std::ostream& operator<<(std::ostream& os, const StrategyRef& s) { return os << (s.set() ? s.name() : "(default)"); }

void check_mesh_strategy(const StrategyRef& strategy, const std::string& with) {
  if (strategy.set() && strategy->in_threads())
    throw InputError(fmt::format("--strategy {} keeps its replicas in threads of one process and does not run {}; "
                                 "use local, ddp, zero1/2/3 or hsdp (over the data-parallel group)",
                                 strategy.name(), with));
}

void check_shard_group(const StrategyRef& strategy, int shard_group) {
  if (shard_group > 0 && !strategy->shard_groups)
    throw InputError(fmt::format("--shard-group is hsdp's; --strategy {} has no shard groups", strategy.name()));
}

}  // namespace dpt
