// A handle on an operation issued to the communication thread (PyTorch's
// c10d Work): wait() blocks until it finished and rethrows its error.
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <string>

namespace dpt::comm {

class Ledger;

class Work {
 public:
  Work(std::string op, Ledger* ledger)
      : op_(std::move(op)), ledger_(ledger), queued_(std::chrono::steady_clock::now()) {}

  // Blocks until the operation finished; rethrows the error it stored. The
  // time spent blocked is added to the ledger's wait time for this op.
  void wait();
  bool is_completed() const;
  // The stored error (nullptr while running or after success).
  std::exception_ptr error() const;

  // When the caller queued the operation (made it), and when the
  // communication thread began and ended it; read them after wait() (the
  // timeline of a step, docs/ddp.md).
  std::chrono::steady_clock::time_point queued_at() const { return queued_; }
  std::chrono::steady_clock::time_point started_at() const;
  std::chrono::steady_clock::time_point finished_at() const;

  // Called by the communication thread.
  void start();
  void finish(std::exception_ptr error);

 private:
  std::string op_;
  Ledger* ledger_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  const std::chrono::steady_clock::time_point queued_;
  std::chrono::steady_clock::time_point started_, finished_;
  std::exception_ptr error_;
};

}  // namespace dpt::comm
