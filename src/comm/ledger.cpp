#include "comm/ledger.h"

#include <algorithm>

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

namespace {
void add_into(std::map<std::string, OpStats>& to, const std::map<std::string, OpStats>& from) {
  for (const auto& [name, st] : from) to[name] += st;
}
}  // namespace

Ledger::~Ledger() {
  std::map<std::string, OpStats> ops, phases;
  Ledger* parent;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (Ledger* c : children_) c->parent_ = nullptr;
    parent = parent_;
    ops = ops_;
    phases = phases_;
    add_into(ops, retired_ops_);
    add_into(phases, retired_phases_);
  }
  if (parent) parent->retire(this, ops, phases);
}

void Ledger::adopt(Ledger* child) {
  std::lock_guard<std::mutex> lock(mu_);
  children_.push_back(child);
  child->parent_ = this;
}

void Ledger::retire(Ledger* child, const std::map<std::string, OpStats>& ops,
                    const std::map<std::string, OpStats>& phases) {
  std::lock_guard<std::mutex> lock(mu_);
  children_.erase(std::remove(children_.begin(), children_.end(), child), children_.end());
  add_into(retired_ops_, ops);
  add_into(retired_phases_, phases);
}

std::map<std::string, OpStats> Ledger::phases(Scope scope) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::string, OpStats> p = phases_;
  if (scope == Scope::Family) {
    add_into(p, retired_phases_);
    for (const Ledger* c : children_) add_into(p, c->phases(Scope::Family));
  }
  return p;
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

std::map<std::string, OpStats> Ledger::snapshot(Scope scope) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::string, OpStats> o = ops_;
  if (scope == Scope::Family) {
    add_into(o, retired_ops_);
    for (const Ledger* c : children_) add_into(o, c->snapshot(Scope::Family));
  }
  return o;
}

OpStats Ledger::total(Scope scope) const {
  OpStats t;
  for (const auto& [name, s] : snapshot(scope)) t += s;
  return t;
}

nlohmann::json Ledger::to_json(Scope scope) const {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [name, s] : snapshot(scope))
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
