// The ring of a context-parallel group (nn/ring_attention.h's ContextRing)
// over its process group: each exchange a send to the next rank and a
// receive from the previous one. A group runs its operations one at a time
// and a send ends only when received, so even ranks send first and odd ranks
// receive first: some rank is always receiving, and no ring of sends waits
// on itself (for any size, odd ones too).
#pragma once

#include <memory>
#include <vector>

#include "comm/process_group.h"
#include "nn/ring_attention.h"

namespace dpt {

class GroupRing : public ContextRing {
 public:
  explicit GroupRing(comm::ProcessGroup& group) : group_(group) {}
  int size() const override { return group_.size(); }
  int rank() const override { return group_.rank(); }
  void start(const float* send, float* recv, size_t n) override;
  void wait() override;
  // Milliseconds spent in wait() so far: the transfers the compute did not
  // hide (the run's summary reports it per step).
  double waited_ms() const { return waited_ms_; }

 private:
  comm::ProcessGroup& group_;
  std::vector<std::shared_ptr<comm::Work>> pending_;
  double waited_ms_ = 0.0;
};

}  // namespace dpt
