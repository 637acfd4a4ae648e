#include "comm/ring.h"

#include <algorithm>

namespace dpt::comm {

Ring::Ring(int rank, std::vector<int> rank_at, std::vector<Peer*> peers, Ledger* ledger)
    : rank_(rank), n_(static_cast<int>(rank_at.size())), rank_at_(std::move(rank_at)),
      peers_(std::move(peers)), ledger_(ledger) {
  pos_ = static_cast<int>(std::find(rank_at_.begin(), rank_at_.end(), rank) - rank_at_.begin());
}

Range Ring::chunk_at(size_t count, int position) const { return chunk_range(count, n_, at(position)); }

void Ring::step(const OpContext& ctx, int to, const char* src, size_t sbytes, int from, char* dst,
                size_t rbytes, Combine c) {
  Peer* tp = to >= 0 ? peers_[static_cast<size_t>(to)] : nullptr;
  Peer* fp = from >= 0 ? peers_[static_cast<size_t>(from)] : nullptr;
  exchange(ctx, tp, to, src, sbytes, fp, from, dst, rbytes, c);
  ledger_->add_transfer(ctx.op, ctx.phase, tp ? sbytes : 0, fp ? rbytes : 0);
}

namespace {
void scale(char* data, size_t count, float factor) {
  float* f = reinterpret_cast<float*>(data);
  for (size_t i = 0; i < count; ++i) f[i] *= factor;
}
}  // namespace

void Ring::reduce_scatter(const OpContext& ctx, char* data, size_t count, size_t esize, ReduceOp op) {
  const int next = at(pos_ + 1), prev = at(pos_ - 1);
  for (int s = 0; s < n_ - 1; ++s) {
    Range out = chunk_at(count, pos_ - s - 1), in = chunk_at(count, pos_ - s - 2);
    step(ctx, next, data + out.begin * esize, out.size * esize, prev, data + in.begin * esize,
         in.size * esize, combine_of(op, esize));
  }
  if (op == ReduceOp::Avg) {
    Range mine = chunk_range(count, n_, rank_);
    scale(data + mine.begin * esize, mine.size, 1.0f / static_cast<float>(n_));
  }
}

void Ring::all_gather(const OpContext& ctx, char* data, size_t count, size_t esize) {
  const int next = at(pos_ + 1), prev = at(pos_ - 1);
  for (int s = 0; s < n_ - 1; ++s) {
    Range out = chunk_at(count, pos_ - s), in = chunk_at(count, pos_ - s - 1);
    step(ctx, next, data + out.begin * esize, out.size * esize, prev, data + in.begin * esize,
         in.size * esize, Combine::Copy);
  }
}

void Ring::all_reduce(const OpContext& ctx, char* data, size_t count, size_t esize, ReduceOp op) {
  reduce_scatter(ctx, data, count, esize, op);
  all_gather(ctx, data, count, esize);
}

void Ring::broadcast(const OpContext& ctx, char* data, size_t bytes, int root) {
  // Relative position q: 0 is the root, n-1 the end of the chain.
  const int root_pos = static_cast<int>(std::find(rank_at_.begin(), rank_at_.end(), root) - rank_at_.begin());
  const int q = ((pos_ - root_pos) % n_ + n_) % n_;
  const int next = q < n_ - 1 ? at(pos_ + 1) : -1, prev = q > 0 ? at(pos_ - 1) : -1;
  const size_t pieces = (bytes + kPipe - 1) / kPipe;
  auto piece = [&](size_t k) { return std::min(kPipe, bytes - k * kPipe); };
  // Step k receives piece k and forwards piece k-1: every link busy at once.
  for (size_t k = 0; k <= pieces; ++k) {
    bool send = next >= 0 && (q == 0 ? k < pieces : k >= 1);
    size_t sk = q == 0 ? k : k - 1;
    bool recv = prev >= 0 && k < pieces;
    if (!send && !recv) continue;
    step(ctx, send ? next : -1, send ? data + sk * kPipe : nullptr, send ? piece(sk) : 0,
         recv ? prev : -1, recv ? data + k * kPipe : nullptr, recv ? piece(k) : 0, Combine::Copy);
  }
}

void Ring::reduce(const OpContext& ctx, char* data, size_t count, size_t esize, ReduceOp op, int root) {
  // The chain runs from the rank after the root (q = 1 ... n-1) backwards:
  // q = n-1 sends to n-2, which adds and passes on, down to the root (q = 0).
  const int root_pos = static_cast<int>(std::find(rank_at_.begin(), rank_at_.end(), root) - rank_at_.begin());
  const int q = ((pos_ - root_pos) % n_ + n_) % n_;
  const int to = q > 0 ? at(pos_ - 1) : -1, from = q < n_ - 1 ? at(pos_ + 1) : -1;
  const size_t bytes = count * esize;
  const size_t pieces = (bytes + kPipe - 1) / kPipe;
  auto piece = [&](size_t k) { return std::min(kPipe, bytes - k * kPipe); };
  const bool first = q == n_ - 1;  // the chain's start only sends
  for (size_t k = 0; k <= pieces; ++k) {
    bool recv = from >= 0 && k < pieces;
    bool send = to >= 0 && (first ? k < pieces : k >= 1);
    size_t sk = first ? k : k - 1;
    if (!send && !recv) continue;
    step(ctx, send ? to : -1, send ? data + sk * kPipe : nullptr, send ? piece(sk) : 0,
         recv ? from : -1, recv ? data + k * kPipe : nullptr, recv ? piece(k) : 0, combine_of(op, esize));
  }
  if (op == ReduceOp::Avg && q == 0) scale(data, count, 1.0f / static_cast<float>(n_));
}

void Ring::barrier(const OpContext& ctx) {
  std::vector<char> token(static_cast<size_t>(n_), 1);
  all_gather(ctx, token.data(), token.size(), 1);
}

void Ring::send(const OpContext& ctx, const char* data, size_t bytes, int peer) {
  step(ctx, peer, data, bytes, -1, nullptr, 0, Combine::Copy);
}

void Ring::recv(const OpContext& ctx, char* data, size_t bytes, int peer) {
  step(ctx, -1, nullptr, 0, peer, data, bytes, Combine::Copy);
}

}  // namespace dpt::comm
