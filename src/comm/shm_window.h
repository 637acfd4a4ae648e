// Shared windows: memory that every rank of a group on one host maps, so a
// collective can read its peers' data where it lies and write results
// straight into their buffers, instead of streaming every byte through the
// transport's slots (a copy in, a copy out). NCCL's intra-node P2P and
// MPI's single-copy shared memory rest on the same idea.
//
// One window is one allocation per rank: rank r's block is a small header
// (its arrival and departure counters, on their own cache lines) and then
// the data. Every rank maps every block of the group.
//
// The in-place all-reduce (for n ranks, over elements [offset, offset +
// count) of the data; reduce-scatter and all-gather are its halves):
//   1. arrive: publish "my data for collective #k is final", wait until
//      every rank has;
//   2. reduce: the rank at ring position p owns chunk p of the range (the
//      ring's chunk_range cut); it sums that chunk over all n blocks in small
//      pieces that stay in L1, in the order the ring's reduce-scatter adds
//      them (results are bitwise the ring's), scales for Avg, and writes
//      each reduced piece into every rank's block, its own included;
//   (reduce-scatter writes the reduced chunk into its own block only;
//   all-gather copies each peer's chunk from the peer's block into its own)
//   3. leave: publish "done with #k", wait until every rank has: nobody
//      returns (and lets its compute thread touch the buffer) while a peer
//      may still read or write it.
// Waiting in steps 1 and 3 sleeps on the peer's counter (a futex in the
// shared block) rather than polling it.
// No two ranks write the same bytes (chunks are disjoint), and nobody reads
// a chunk another rank writes. Between ranks the ring's bytes cross (each
// rank's chunk is pulled by the n-1 others and pushed back to them reduced)
// and the ledger records the ring's per-rank figures; what goes away are
// the two copies through the slots at every step.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/ledger.h"
#include "comm/peer.h"
#include "comm/types.h"

namespace dpt::comm {

class ShmWindow {
 public:
  // Rank r's block: a 4 KiB header, then `bytes` of data.
  static constexpr size_t kHeaderBytes = 4096;

  // Creates this rank's block under `name` (shm_open; the space is reserved
  // with posix_fallocate, so a full /dev/shm is an error here, not a SIGBUS
  // later). Throws CommError naming the failure.
  static std::unique_ptr<ShmWindow> create(const std::string& name, size_t bytes, int ranks, int rank);
  ~ShmWindow();
  ShmWindow(const ShmWindow&) = delete;
  ShmWindow& operator=(const ShmWindow&) = delete;

  // Maps rank r's block (created under `name` by that rank).
  void map_peer(int r, const std::string& name);
  // Removes this rank's name (every peer has mapped it; the memory stays
  // until the last mapping goes).
  void unlink();

  char* data(int r) const { return blocks_[static_cast<size_t>(r)] + kHeaderBytes; }
  char* data() const { return data(rank_); }
  size_t bytes() const { return bytes_; }
  // True when [p, p + n) lies inside this rank's data.
  bool holds(const void* p, size_t n) const;

  // The in-place collectives above, on elements [offset, offset + count)
  // of the data (offset in elements), with the process group's meaning of
  // each (process_group.h): all-reduce; reduce-scatter (this rank's chunk
  // reduced in its own block, the rest of it left as it was); all-gather
  // (every peer's chunk copied from its block into ours). rank_at is the
  // group's ring order; peers[r] reaches rank r (for its liveness).
  enum class Collective { AllReduce, ReduceScatter, AllGather };
  void run(const OpContext& ctx, Collective kind, size_t offset, size_t count, size_t esize, ReduceOp op,
           const std::vector<int>& rank_at, const std::vector<Peer*>& peers, Ledger* ledger);

 private:
  ShmWindow() = default;
  // 32 bits: a futex word (the waits sleep on it). Tags wrap after 2^32
  // collectives; comparisons are by signed difference.
  struct alignas(64) Counter {
    std::atomic<uint32_t> value;
    char pad[60];
  };
  Counter& arrived(int r) const { return reinterpret_cast<Counter*>(blocks_[static_cast<size_t>(r)])[0]; }
  Counter& left(int r) const { return reinterpret_cast<Counter*>(blocks_[static_cast<size_t>(r)])[1]; }
  // Sets my counter to tag (waking whoever sleeps on it), then waits until
  // every rank's has reached tag: a short spin, then sleeps on the peer's
  // counter (futex), waking every 100 ms for the deadline and its health.
  // Sleeping, not napping in a loop: the wait often overlaps this rank's
  // own backward, and a waiter that woke every few microseconds would
  // keep taking the core from it.
  void agree(const OpContext& ctx, Counter& (ShmWindow::*which)(int) const, uint32_t tag,
             const std::vector<Peer*>& peers);

  std::string name_;
  size_t bytes_ = 0, block_bytes_ = 0;
  int ranks_ = 0, rank_ = 0;
  uint32_t ops_ = 0;           // collectives run on this window
  std::vector<char*> blocks_;  // by rank; null until mapped
  std::vector<char> scratch_;  // one reduced piece
};

}  // namespace dpt::comm
