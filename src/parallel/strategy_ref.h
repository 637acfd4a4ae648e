// A strategy as options carry it (StrategyOptions, TrainOptions): a record
// of the catalog (parallel/catalog.h), or unset (the default for the run's
// mesh). Made from a name where the command line's strings meet the engine
// (InputError for an unknown one); compared by record, never by name.
#pragma once

#include <iosfwd>
#include <string>

namespace dpt {

struct StrategyRecord;

class StrategyRef {
 public:
  StrategyRef() = default;
  StrategyRef(const StrategyRecord& r) : r_(&r) {}  // NOLINT: a record is a strategy
  StrategyRef(const std::string& name);               // NOLINT: parsed at the edge
  StrategyRef(const char* name) : StrategyRef(std::string(name)) {}  // NOLINT
  bool set() const { return r_ != nullptr; }
  const StrategyRecord& operator*() const;  // InternalError when unset
  const StrategyRecord* operator->() const { return &**this; }
  const std::string& name() const;
  bool operator==(const StrategyRef& o) const { return r_ == o.r_; }

 private:
  const StrategyRecord* r_ = nullptr;
};

// Its name (test messages, logs).
std::ostream& operator<<(std::ostream& os, const StrategyRef& s);

}  // namespace dpt
