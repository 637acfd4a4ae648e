#include "comm/work.h"

#include <chrono>

#include "comm/ledger.h"

namespace dpt::comm {

void Work::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  if (!done_) {
    auto t0 = std::chrono::steady_clock::now();
    cv_.wait(lock, [this] { return done_; });
    if (ledger_)
      ledger_->add_wait(op_, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  if (error_) std::rethrow_exception(error_);
}

bool Work::is_completed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

std::exception_ptr Work::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

std::chrono::steady_clock::time_point Work::started_at() const {
  std::lock_guard<std::mutex> lock(mu_);
  return started_;
}

std::chrono::steady_clock::time_point Work::finished_at() const {
  std::lock_guard<std::mutex> lock(mu_);
  return finished_;
}

void Work::start() {
  std::lock_guard<std::mutex> lock(mu_);
  started_ = std::chrono::steady_clock::now();
}

void Work::finish(std::exception_ptr error) {
  const auto now = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    finished_ = now;
    error_ = std::move(error);
    done_ = true;
  }
  cv_.notify_all();
}

}  // namespace dpt::comm
