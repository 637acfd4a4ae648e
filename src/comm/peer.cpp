#include "comm/peer.h"

#include <sched.h>
#include <time.h>

#include <algorithm>
#include <cstring>

#include "comm/types.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define DPT_CPU_RELAX() _mm_pause()
#else
#define DPT_CPU_RELAX() ((void)0)
#endif

namespace dpt::comm {

void combine_bytes(void* dst, const void* src, size_t n, Combine c) {
  if (c == Combine::Copy) {
    std::memcpy(dst, src, n);
    return;
  }
  if (c == Combine::SumBf16) {
    bf16* d = static_cast<bf16*>(dst);
    const bf16* s = static_cast<const bf16*>(src);
    const size_t m = n / sizeof(bf16);
    for (size_t i = 0; i < m; ++i) d[i] = to_bf16(to_f32(d[i]) + to_f32(s[i]));
    return;
  }
  float* d = static_cast<float*>(dst);
  const float* s = static_cast<const float*>(src);
  const size_t m = n / sizeof(float);
  if (c == Combine::Sum) {
#pragma omp simd
    for (size_t i = 0; i < m; ++i) d[i] += s[i];
  } else {
#pragma omp simd
    for (size_t i = 0; i < m; ++i) d[i] = d[i] > s[i] ? d[i] : s[i];
  }
}

Combine combine_of(ReduceOp op, size_t esize) {
  if (esize == sizeof(bf16)) return Combine::SumBf16;
  return op == ReduceOp::Max ? Combine::Max : Combine::Sum;
}

std::string peer_name(const OpContext& ctx, int rank) {
  if (!ctx.hosts || rank < 0 || static_cast<size_t>(rank) >= ctx.hosts->size()) return fmt::format("rank {}", rank);
  return fmt::format("rank {} (host {})", rank, (*ctx.hosts)[static_cast<size_t>(rank)]);
}

void exchange(const OpContext& ctx, Peer* to, int to_rank, const void* src, size_t send_bytes,
              Peer* from, int from_rank, void* dst, size_t recv_bytes, Combine c) {
  bool sent = to == nullptr, received = from == nullptr;
  if (!sent) to->start_send(src, send_bytes);
  if (!received) from->start_recv(dst, recv_bytes, c);
  Backoff backoff(ctx);
  while (!(sent && received)) {
    bool moved = false;
    // A transport's own failure (MPI's, when a connection breaks) names
    // only its call: say which operation and which peer it hit.
    auto progress = [&](bool& done, int peer_rank, auto&& step) {
      if (done) return;
      Transfer p = Transfer::Idle;
      try {
        p = step();
      } catch (const CommError& e) {
        throw CommError(fmt::format("{} #{} of {} bytes failed with {}: {}", ctx.op, ctx.seq, ctx.bytes,
                                    peer_name(ctx, peer_rank), e.what()));
      }
      done = p == Transfer::Done;
      moved |= p != Transfer::Idle;
    };
    progress(sent, to_rank, [&] { return to->progress_send(); });
    progress(received, from_rank, [&] { return from->progress_recv(); });
    if (moved) {
      backoff.reset();
      continue;
    }
    using W = Backoff::Waiting;
    if (!received)
      backoff.idle(from, from_rank, sent ? W::Receive : W::Either);
    else
      backoff.idle(to, to_rank, W::Send);
  }
}

Backoff::Backoff(const OpContext& ctx) : ctx_(ctx), last_health_(std::chrono::steady_clock::now()) {}

void Backoff::idle(Peer* peer, int peer_rank, Waiting waiting) {
  ++idle_;
  if (idle_ < 512) {
    DPT_CPU_RELAX();
  } else if (idle_ < 640) {
    sched_yield();
  } else if (waiting != Waiting::Either && peer->sleep_until_moved(waiting == Waiting::Receive, 10'000'000L)) {
    check(peer, peer_rank);  // a sleep can be 10 ms: the health and the deadline after each
  } else {
    timespec ts{0, 20000};
    nanosleep(&ts, nullptr);
  }
  if (idle_ % 128 == 0) check(peer, peer_rank);
}

void Backoff::check(Peer* peer, int peer_rank) {
  auto now = std::chrono::steady_clock::now();
  if (now - last_health_ > std::chrono::milliseconds(100)) {
    last_health_ = now;
    if (!peer->alive())
      throw CommError(fmt::format("{} #{} of {} bytes failed: rank {} has exited", ctx_.op, ctx_.seq, ctx_.bytes,
                                  peer_rank));
  }
  if (now > ctx_.deadline)
    throw CommError(fmt::format(
        "{} #{} of {} bytes timed out after {:.1f} s waiting for {} (dead, unreachable, or not "
        "issuing the same collective)",
        ctx_.op, ctx_.seq, ctx_.bytes, static_cast<double>(ctx_.timeout.count()) / 1000.0,
        peer_name(ctx_, peer_rank)));
}

}  // namespace dpt::comm
