// A deadline for a process group's set-up. MPI's start-up and its set-up
// calls (initialisation, duplicating and splitting communicators, the
// exchange of ranks and host names, the shared-memory handshake) block until
// every member arrives and take no timeout. A member that never arrives (its
// host cannot be reached, or it stopped before joining) would leave the
// others waiting forever, so a guard thread watches the set-up: if it
// outlasts the collective timeout, the process names the call and its group
// in one sentence and leaves with status 1, which ends the job.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace dpt::comm {

class SetupDeadline {
 public:
  SetupDeadline(std::chrono::milliseconds timeout, std::string group);
  ~SetupDeadline();
  SetupDeadline(const SetupDeadline&) = delete;
  SetupDeadline& operator=(const SetupDeadline&) = delete;
  // Names the call about to block (the sentence's subject if it never returns).
  void at(const char* call);

 private:
  void watch(std::chrono::milliseconds timeout);
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;  // under mu_
  const char* call_ = "start-up";  // under mu_
  std::string group_;
  std::thread thread_;
};

// The rank the launcher gave this process, readable before MPI is up (0 without one).
int launcher_rank();

}  // namespace dpt::comm
