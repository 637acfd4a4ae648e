// The byte ledger: per operation kind, on this rank, how many operations
// ran, the bytes this rank sent and received for them, the time they took on
// the communication thread, and the time callers spent blocked in wait().
// Strategies read it per step (snapshot, then difference).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dpt::comm {

struct OpStats {
  int64_t count = 0;
  uint64_t bytes_sent = 0, bytes_recv = 0;
  double seconds = 0.0;       // executing on the communication thread
  double wait_seconds = 0.0;  // callers blocked in Work::wait()
  OpStats& operator+=(const OpStats& o);
  OpStats operator-(const OpStats& o) const;
};

// Own: this group's collectives; Family: with those of its subgroups (made
// by ProcessGroup::split, alive or gone), what a run's report sums.
enum class Scope { Own, Family };

class Ledger {
 public:
  Ledger() = default;
  Ledger(const Ledger&) = delete;
  Ledger& operator=(const Ledger&) = delete;
  ~Ledger();
  // Counts child's entries in this ledger's Family views, also after the
  // child is destroyed.
  void adopt(Ledger* child);

  // Bytes of a transfer, counted under its operation and under the phase of
  // the step it was issued in (forward, backward, optimizer, ...).
  void add_transfer(const std::string& op, const std::string& phase, uint64_t sent, uint64_t recv);
  void add_op(const std::string& op, double seconds);
  void add_wait(const std::string& op, double seconds);

  // A copy of all entries, keyed by operation ("all_reduce", ...).
  std::map<std::string, OpStats> snapshot(Scope scope = Scope::Own) const;
  OpStats total(Scope scope = Scope::Own) const;
  // Bytes per phase, keyed by the phase names the caller set.
  std::map<std::string, OpStats> phases(Scope scope = Scope::Own) const;
  // {"all_reduce": {"count": .., "bytes_sent": .., ...}, ...}
  nlohmann::json to_json(Scope scope = Scope::Own) const;

 private:
  void retire(Ledger* child, const std::map<std::string, OpStats>& ops, const std::map<std::string, OpStats>& phases);
  mutable std::mutex mu_;
  std::map<std::string, OpStats> ops_, phases_;
  Ledger* parent_ = nullptr;
  std::vector<Ledger*> children_;
  std::map<std::string, OpStats> retired_ops_, retired_phases_;  // of children destroyed
};

// after - before, entry by entry (a step's share of a running ledger).
std::map<std::string, OpStats> difference(const std::map<std::string, OpStats>& after,
                                          const std::map<std::string, OpStats>& before);

}  // namespace dpt::comm
