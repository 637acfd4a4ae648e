// The byte ledger: per operation kind, on this rank, how many operations
// ran, the bytes this rank sent and received for them, the time they took on
// the communication thread, and the time callers spent blocked in wait().
// Strategies read it per step (snapshot, then difference).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

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

class Ledger {
 public:
  // Bytes of a transfer, counted under its operation and under the phase of
  // the step it was issued in (forward, backward, optimizer, ...).
  void add_transfer(const std::string& op, const std::string& phase, uint64_t sent, uint64_t recv);
  void add_op(const std::string& op, double seconds);
  void add_wait(const std::string& op, double seconds);

  // A copy of all entries, keyed by operation ("all_reduce", ...).
  std::map<std::string, OpStats> snapshot() const;
  OpStats total() const;
  // Bytes per phase, keyed by the phase names the caller set.
  std::map<std::string, OpStats> phases() const;
  // {"all_reduce": {"count": .., "bytes_sent": .., ...}, ...}
  nlohmann::json to_json() const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, OpStats> ops_, phases_;
};

// after - before, entry by entry (a step's share of a running ledger).
std::map<std::string, OpStats> difference(const std::map<std::string, OpStats>& after,
                                          const std::map<std::string, OpStats>& before);

}  // namespace dpt::comm
