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
  StrategyRef(const StrategyRecord& r);  // NOLINT: a record is a strategy
  StrategyRef(const std::string& name);               // NOLINT: parsed at the edge
  StrategyRef(const char* name) : StrategyRef(std::string(name)) {}  // NOLINT
  bool set() const { return r_ != nullptr; }
  const StrategyRecord& operator*() const;  // InternalError when unset
  const StrategyRecord* operator->() const { return &**this; }
  // The name it was given by (an alias, "fsdp", stays one: the summary and
  // checkpoints say what the user said); the record's name for a record.
  const std::string& name() const;
  bool operator==(const StrategyRef& o) const { return r_ == o.r_; }

 private:
  const StrategyRecord* r_ = nullptr;
  std::string name_;
};

// Its name (test messages, logs).
std::ostream& operator<<(std::ostream& os, const StrategyRef& s);

}  // namespace dpt
