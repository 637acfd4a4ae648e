// The engine's own collective algorithms over point-to-point Peers.
//
// Ranks form a ring ordered by host, then rank, so a ring crosses between
// hosts as few times as possible (each crossing uses MPI, every other edge
// shared memory). Position p's neighbours are p-1 (prev) and p+1 (next).
//
// Chunk arithmetic. A buffer of `count` elements is cut into n chunks with
// chunk_range (sizes differ by at most one; no padding). Rank r owns chunk r
// wherever r sits in the ring; below, "chunk at position q" means the chunk
// of the rank at position q.
//
// reduce-scatter (n-1 steps): at step s, position p sends its chunk at
//   position p-s-1 to next and receives the chunk at p-s-2 from prev,
//   reducing it into its own copy. After step n-2, position p holds the
//   reduction of its own chunk. Each rank sends and receives B(n-1)/n bytes.
// all-gather (n-1 steps): at step s, p sends the chunk at p-s (its own at
//   s = 0) and receives the chunk at p-s-1, copying. B(n-1)/n each way.
// all-reduce: reduce-scatter then all-gather: 2B(n-1)/n each way, the
//   bandwidth-optimal volume. Avg scales each rank's own chunk once between
//   the phases.
// broadcast: a chain from the root along the ring, in pieces of kPipe bytes
//   so every link streams at once: each rank but the last sends B.
// reduce: the same chain run backwards into the root, reducing as it goes.
// barrier: an all-gather of one byte per rank: nobody leaves before every
//   rank has arrived.
// Within each step, a transfer streams through the transport's slots, so
// the receiver reduces the first bytes while the last are still being sent.
#pragma once

#include <cstddef>
#include <vector>

#include "comm/ledger.h"
#include "comm/peer.h"
#include "comm/types.h"

namespace dpt::comm {

class Ring {
 public:
  static constexpr size_t kPipe = 1 << 20;  // broadcast/reduce piece

  // rank_at[p] is the rank at ring position p; peers[r] reaches rank r
  // (null for this rank).
  Ring(int rank, std::vector<int> rank_at, std::vector<Peer*> peers, Ledger* ledger);

  void reduce_scatter(const OpContext& ctx, char* data, size_t count, size_t esize, ReduceOp op);
  void all_gather(const OpContext& ctx, char* data, size_t count, size_t esize);
  void all_reduce(const OpContext& ctx, char* data, size_t count, size_t esize, ReduceOp op);
  void broadcast(const OpContext& ctx, char* data, size_t bytes, int root);
  void reduce(const OpContext& ctx, char* data, size_t count, size_t esize, ReduceOp op, int root);
  void barrier(const OpContext& ctx);
  void send(const OpContext& ctx, const char* data, size_t bytes, int peer);
  void recv(const OpContext& ctx, char* data, size_t bytes, int peer);

 private:
  Range chunk_at(size_t count, int position) const;
  int at(int position) const { return rank_at_[static_cast<size_t>(((position % n_) + n_) % n_)]; }
  // One exchange with the ring neighbours, recorded in the ledger.
  void step(const OpContext& ctx, int to, const char* src, size_t sbytes, int from, char* dst,
            size_t rbytes, Combine c);

  int rank_, n_, pos_;
  std::vector<int> rank_at_;
  std::vector<Peer*> peers_;
  Ledger* ledger_;
};

}  // namespace dpt::comm
