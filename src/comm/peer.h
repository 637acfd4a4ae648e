// Point-to-point links between two ranks, the ground the ring algorithms
// stand on. A Peer is how this rank reaches one other rank: through shared
// memory on the same host, or MPI point-to-point across hosts.
//
// A peer carries at most one outgoing and one incoming message at a time
// (the ring algorithms never need more), so its state lives in the Peer and
// nothing is allocated per message. Both ends issue the same messages in the
// same order, so messages need no tags.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/types.h"

namespace dpt::comm {

// What a receive does with the incoming bytes: copy them, or combine them
// elementwise (fp32) into what the destination already holds.
// SumBf16: bf16 elements added in fp32 and rounded back (bf16 reductions).
enum class Combine { Copy, Sum, Max, SumBf16 };

// Applies a Combine to n bytes.
void combine_bytes(void* dst, const void* src, size_t n, Combine c);
// How a reduction combines elements of esize bytes: bf16 (esize 2)
// reductions are sums only (ProcessGroup checks).
Combine combine_of(ReduceOp op, size_t esize);

// What one progress call achieved for a transfer. Idle tells the caller's wait loop to back
// off; Moved (some bytes went, not all) must not, or a long message would
// stream with naps between its pieces.
enum class Transfer { Idle, Moved, Done };

class Peer {
 public:
  virtual ~Peer() = default;
  virtual void start_send(const void* src, size_t bytes) = 0;
  // Moves what can be moved without blocking.
  virtual Transfer progress_send() = 0;
  virtual void start_recv(void* dst, size_t bytes, Combine c) = 0;
  virtual Transfer progress_recv() = 0;
  // False once the peer is known to have died (shared memory checks its pid).
  virtual bool alive() { return true; }
  // Sleeps until the transfer under way in one direction (the receive, or
  // else the send) may move, or at most timeout_ns; false, at once, where
  // the transport cannot tell (the caller naps instead).
  virtual bool sleep_until_moved(bool /*receiving*/, long /*timeout_ns*/) { return false; }
  virtual const char* kind() const = 0;  // "shm" or "mpi"
};

// The operation a transfer belongs to, for its error message and deadline.
struct OpContext {
  const char* op = "";
  const char* phase = "";  // the caller's phase when it was issued (ProcessGroup::set_phase)
  uint64_t seq = 0;
  size_t bytes = 0;
  std::chrono::steady_clock::time_point deadline;
  std::chrono::milliseconds timeout{0};
  // The group's host name per rank, so an error can say where a peer runs
  // (across hosts, "rank 2" alone does not say which machine to look at).
  const std::vector<std::string>* hosts = nullptr;
};

// "rank 2 (host b)", or "rank 2" where ctx knows no hosts.
std::string peer_name(const OpContext& ctx, int rank);

// How a rank waits on its peers: spin briefly (a partner that is ready is
// microseconds away), yield a little, then sleep until the peer moves the
// transfer (shared memory: a futex the peer wakes) or, where the transport
// cannot say, nap in short sleeps, so a peer that is still computing does
// not find this rank's communication thread burning a core its own compute
// thread (or, with ranks sharing cores, its neighbour) needs: a pipeline's
// receive is posted an operation ahead, and 20-us naps through a 2 ms
// operation were 3,000 context switches a step on 2 cores. Every so often it checks the deadline and whether the
// peer waited on is still alive (only shared-memory peers can tell).
class Backoff {
 public:
  explicit Backoff(const OpContext& ctx);
  // Something moved: the next wait starts with spinning again.
  void reset() { idle_ = 0; }
  // One idle round waiting on `peer` (rank peer_rank): for its receive, its
  // send, or either (both under way: only naps can wait on two). Throws
  // CommError when the peer has exited or the deadline has passed.
  enum class Waiting { Receive, Send, Either };
  void idle(Peer* peer, int peer_rank, Waiting waiting = Waiting::Either);
  // The checks alone (the peer's health at most every 100 ms), for a
  // caller that waits its own way.
  void check(Peer* peer, int peer_rank);

 private:
  const OpContext& ctx_;
  uint64_t idle_ = 0;
  std::chrono::steady_clock::time_point last_health_;
};

// Sends [src, src + send_bytes) to `to` while receiving recv_bytes from
// `from` into dst, progressing both together (so a ring of ranks all sending
// first cannot deadlock on full buffers). Either side may be null or empty.
// Throws CommError naming ctx's operation and the peer when a peer dies, its
// transport fails or the deadline passes.
void exchange(const OpContext& ctx, Peer* to, int to_rank, const void* src, size_t send_bytes,
              Peer* from, int from_rank, void* dst, size_t recv_bytes, Combine c);

}  // namespace dpt::comm
