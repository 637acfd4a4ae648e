// Shared-memory links between the ranks of one host (the intra-host path
// NCCL and Gloo also have). The lowest rank of a host creates one segment in
// /dev/shm holding a one-way channel for every ordered pair of local ranks;
// each channel is a ring of slots with a producer count (head) and a
// consumer count (tail) on separate cache lines. A sender copies into free
// slots, a receiver copies or reduces out of full ones, so a large message
// streams through a few hundred KiB of shared memory that stays in cache.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "comm/peer.h"

namespace dpt::comm {

class ShmSegment {
 public:
  static constexpr size_t kSlots = 8;
  static constexpr size_t kSlotBytes = 64 * 1024;

  // head_word and tail_word repeat the counts' low 32 bits as futex words:
  // a receiver with nothing to read sleeps on head_word, a sender with no
  // free slot on tail_word, each having said so in its asleep flag so the
  // other side wakes it (and only then makes the system call).
  struct alignas(64) Channel {
    std::atomic<uint64_t> head;  // slots written (producer)
    std::atomic<uint32_t> head_word, receiver_asleep;
    char pad0[48];
    std::atomic<uint64_t> tail;  // slots consumed (consumer)
    std::atomic<uint32_t> tail_word, sender_asleep;
    char pad1[48];
    char* slot(uint64_t i) { return reinterpret_cast<char*>(this + 1) + (i % kSlots) * kSlotBytes; }
  };

  // Maps the segment `name` for `local_count` ranks; local_index 0 creates
  // it. The creator must call create() before the others call open(); the
  // caller synchronises (a barrier), then the creator unlinks the name.
  static std::unique_ptr<ShmSegment> create(const std::string& name, int local_count);
  static std::unique_ptr<ShmSegment> open(const std::string& name, int local_count);
  ~ShmSegment();
  void unlink();

  Channel* channel(int from_local, int to_local);
  // Each local rank publishes its pid so peers can tell it died.
  void set_pid(int local_index, pid_t pid);
  pid_t pid(int local_index) const;

 private:
  static size_t channel_bytes() { return sizeof(Channel) + kSlots * kSlotBytes; }
  static size_t total_bytes(int local_count);
  std::string name_;
  int local_count_ = 0;
  char* base_ = nullptr;
  size_t bytes_ = 0;
};

class ShmPeer : public Peer {
 public:
  ShmPeer(ShmSegment* seg, int my_local, int peer_local);
  void start_send(const void* src, size_t bytes) override;
  Transfer progress_send() override;
  void start_recv(void* dst, size_t bytes, Combine c) override;
  Transfer progress_recv() override;
  bool alive() override;
  bool sleep_until_moved(bool receiving, long timeout_ns) override;
  const char* kind() const override { return "shm"; }

 private:
  ShmSegment* seg_;
  int peer_local_;
  ShmSegment::Channel* out_;
  ShmSegment::Channel* in_;
  uint64_t out_head_ = 0, in_tail_ = 0;  // our own counters, cached
  const char* send_src_ = nullptr;
  size_t send_bytes_ = 0, send_off_ = 0;
  char* recv_dst_ = nullptr;
  size_t recv_bytes_ = 0, recv_off_ = 0;
  Combine recv_combine_ = Combine::Copy;
};

}  // namespace dpt::comm
