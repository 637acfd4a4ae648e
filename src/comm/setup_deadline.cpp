#include "comm/setup_deadline.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace dpt::comm {

SetupDeadline::SetupDeadline(std::chrono::milliseconds timeout, std::string group) : group_(std::move(group)) {
  thread_ = std::thread([this, timeout] { watch(timeout); });
}

SetupDeadline::~SetupDeadline() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

void SetupDeadline::at(const char* call) {
  std::lock_guard<std::mutex> lock(mu_);
  call_ = call;
}

void SetupDeadline::watch(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (cv_.wait_for(lock, timeout, [this] { return done_; })) return;
  // Not an exception: the caller's thread is inside a call that never
  // returns, so only this thread can end the process.
  std::fprintf(stderr,
               "dpt[rank %d]: error: %s group: the set-up's %s did not finish within %.0f s: a rank never joined "
               "(its host cannot be reached, or it stopped before joining)\n",
               launcher_rank(), group_.c_str(), call_, static_cast<double>(timeout.count()) / 1000.0);
  std::fflush(stderr);
  ::_exit(1);
}

int launcher_rank() {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"})
    if (const char* v = std::getenv(var)) return std::atoi(v);
  return 0;
}

}  // namespace dpt::comm
