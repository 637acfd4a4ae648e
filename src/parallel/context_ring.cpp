#include "parallel/context_ring.h"

#include <chrono>

namespace dpt {

void GroupRing::start(const float* send, float* recv, size_t n) {
  const int next = (rank() + 1) % size(), prev = (rank() + size() - 1) % size();
  if (rank() % 2 == 0) {
    pending_.push_back(group_.send_async(send, n, DType::F32, next));
    pending_.push_back(group_.recv_async(recv, n, DType::F32, prev));
  } else {
    pending_.push_back(group_.recv_async(recv, n, DType::F32, prev));
    pending_.push_back(group_.send_async(send, n, DType::F32, next));
  }
}

void GroupRing::wait() {
  const auto t0 = std::chrono::steady_clock::now();
  // Every handle waited even if one throws (a peer that died): none is left
  // pending on buffers the caller frees.
  std::exception_ptr first;
  for (auto& w : pending_) try {
      w->wait();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  pending_.clear();
  waited_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (first) std::rethrow_exception(first);
}

}  // namespace dpt
