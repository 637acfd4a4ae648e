#include "comm/ledger.h"

namespace dpt::comm {

OpStats& OpStats::operator+=(const OpStats& o) {
  count += o.count;
  bytes_sent += o.bytes_sent;
  bytes_recv += o.bytes_recv;
  seconds += o.seconds;
  wait_seconds += o.wait_seconds;
  return *this;
}

OpStats OpStats::operator-(const OpStats& o) const {
  OpStats d;
  d.count = count - o.count;
  d.bytes_sent = bytes_sent - o.bytes_sent;
  d.bytes_recv = bytes_recv - o.bytes_recv;
  d.seconds = seconds - o.seconds;
  d.wait_seconds = wait_seconds - o.wait_seconds;
  return d;
}

void Ledger::add_transfer(const std::string& op, const std::string& phase, uint64_t sent, uint64_t recv) {
  std::lock_guard<std::mutex> lock(mu_);
  for (OpStats* s : {&ops_[op], &phases_[phase.empty() ? "other" : phase]}) {
    s->bytes_sent += sent;
    s->bytes_recv += recv;
  }
}

std::map<std::string, OpStats> Ledger::phases() const {
  std::lock_guard<std::mutex> lock(mu_);
  return phases_;
}

void Ledger::add_op(const std::string& op, double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  OpStats& s = ops_[op];
  s.count += 1;
  s.seconds += seconds;
}

void Ledger::add_wait(const std::string& op, double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  ops_[op].wait_seconds += seconds;
}

std::map<std::string, OpStats> Ledger::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ops_;
}

OpStats Ledger::total() const {
  std::lock_guard<std::mutex> lock(mu_);
  OpStats t;
  for (const auto& [name, s] : ops_) t += s;
  return t;
}

nlohmann::json Ledger::to_json() const {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [name, s] : snapshot())
    j[name] = {{"count", s.count}, {"bytes_sent", s.bytes_sent}, {"bytes_recv", s.bytes_recv},
               {"seconds", s.seconds}, {"wait_seconds", s.wait_seconds}};
  return j;
}

std::map<std::string, OpStats> difference(const std::map<std::string, OpStats>& after,
                                          const std::map<std::string, OpStats>& before) {
  std::map<std::string, OpStats> d;
  for (const auto& [name, s] : after) {
    auto it = before.find(name);
    d[name] = it == before.end() ? s : s - it->second;
  }
  return d;
}

}  // namespace dpt::comm
