#include "comm/shm_window.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "comm/futex.h"

namespace dpt::comm {

namespace {
// A reduced piece small enough to stay in L1 between its reduction and the
// writes that hand it to every rank.
constexpr size_t kPieceBytes = 16 * 1024;

bool reached(uint32_t value, uint32_t tag) { return static_cast<int32_t>(value - tag) >= 0; }

size_t block_bytes_for(size_t bytes) { return (ShmWindow::kHeaderBytes + bytes + 4095) / 4096 * 4096; }
}  // namespace

std::unique_ptr<ShmWindow> ShmWindow::create(const std::string& name, size_t bytes, int ranks, int rank) {
  auto w = std::unique_ptr<ShmWindow>(new ShmWindow);
  w->name_ = name;
  w->bytes_ = bytes;
  w->block_bytes_ = block_bytes_for(bytes);
  w->ranks_ = ranks;
  w->rank_ = rank;
  w->blocks_.assign(static_cast<size_t>(ranks), nullptr);
  w->scratch_.resize(kPieceBytes);
  int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) throw CommError(fmt::format("cannot create shared memory {}: {}", name, std::strerror(errno)));
  // posix_fallocate returns its error (it does not set errno). Reserving the
  // pages now turns a /dev/shm too small into this error instead of a SIGBUS
  // at the first touch of a page it could not supply.
  int err = ::posix_fallocate(fd, 0, static_cast<off_t>(w->block_bytes_));
  if (err != 0) {
    ::close(fd);
    ::shm_unlink(name.c_str());
    throw CommError(fmt::format("cannot reserve {} bytes of shared memory for {}: {}", w->block_bytes_, name,
                                std::strerror(err)));
  }
  void* p = ::mmap(nullptr, w->block_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  err = errno;
  ::close(fd);
  if (p == MAP_FAILED) {
    ::shm_unlink(name.c_str());
    throw CommError(fmt::format("cannot map shared memory {}: {}", name, std::strerror(err)));
  }
  w->blocks_[static_cast<size_t>(rank)] = static_cast<char*>(p);  // zero-filled: counters start at 0
  return w;
}

void ShmWindow::map_peer(int r, const std::string& name) {
  int fd = ::shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) throw CommError(fmt::format("cannot open shared memory {}: {}", name, std::strerror(errno)));
  void* p = ::mmap(nullptr, block_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) throw CommError(fmt::format("cannot map shared memory {}: {}", name, std::strerror(err)));
  blocks_[static_cast<size_t>(r)] = static_cast<char*>(p);
}

ShmWindow::~ShmWindow() {
  for (char* b : blocks_)
    if (b) ::munmap(b, block_bytes_);
}

void ShmWindow::unlink() { ::shm_unlink(name_.c_str()); }

bool ShmWindow::holds(const void* p, size_t n) const {
  const char* c = static_cast<const char*>(p);
  return c >= data() && c + n <= data() + bytes_;
}

void ShmWindow::agree(const OpContext& ctx, Counter& (ShmWindow::*which)(int) const, uint32_t tag,
                      const std::vector<Peer*>& peers) {
  std::atomic<uint32_t>& mine = (this->*which)(rank_).value;
  mine.store(tag, std::memory_order_release);
  futex_wake_all(&mine);
  for (int r = 0; r < ranks_; ++r) {
    if (r == rank_) continue;
    std::atomic<uint32_t>& theirs = (this->*which)(r).value;
    Peer* peer = peers[static_cast<size_t>(r)];
    Backoff backoff(ctx);
    // A peer that is nearly there is a few microseconds away: spin first.
    for (int spin = 0; spin < 512 && !reached(theirs.load(std::memory_order_acquire), tag); ++spin)
      backoff.idle(peer, r);
    for (uint32_t seen; !reached(seen = theirs.load(std::memory_order_acquire), tag);) {
      futex_wait(&theirs, seen, 100'000'000L);
      backoff.check(peer, r);
    }
  }
}

void ShmWindow::run(const OpContext& ctx, Collective kind, size_t offset, size_t count, size_t esize, ReduceOp op,
                    const std::vector<int>& rank_at, const std::vector<Peer*>& peers, Ledger* ledger) {
  const int n = ranks_;
  // Every rank runs the same collectives on a window, so its own count of
  // them is the same everywhere: the tag of this one.
  const uint32_t tag = ++ops_;
  agree(ctx, &ShmWindow::arrived, tag, peers);

  const int pos = static_cast<int>(std::find(rank_at.begin(), rank_at.end(), rank_) - rank_at.begin());
  auto at = [&](int p) { return rank_at[static_cast<size_t>(((p % n) + n) % n)]; };
  const Range mine = chunk_range(count, n, rank_);
  if (kind == Collective::AllGather) {
    // Every peer's chunk, from its block into the same place in ours.
    for (int r = 0; r < n; ++r) {
      if (r == rank_) continue;
      const Range theirs = chunk_range(count, n, r);
      const size_t at_bytes = (offset + theirs.begin) * esize;
      std::memcpy(data() + at_bytes, data(r) + at_bytes, theirs.size * esize);
    }
  } else {
    const Combine c = combine_of(op, esize);
    const size_t begin = (offset + mine.begin) * esize, total = mine.size * esize;
    char* acc = scratch_.data();
    for (size_t off = 0; off < total; off += kPieceBytes) {
      const size_t m = std::min(kPieceBytes, total - off);
      // The ring's order: the sum starts at the next position and travels
      // round to this one, each rank adding its own elements.
      std::memcpy(acc, data(at(pos + 1)) + begin + off, m);
      for (int k = 2; k <= n; ++k) combine_bytes(acc, data(at(pos + k)) + begin + off, m, c);
      if (op == ReduceOp::Avg) {
        float* f = reinterpret_cast<float*>(acc);
        const float factor = 1.0f / static_cast<float>(n);
        for (size_t i = 0; i < m / sizeof(float); ++i) f[i] *= factor;
      }
      if (kind == Collective::AllReduce) {
        for (int r = 0; r < n; ++r) std::memcpy(data(r) + begin + off, acc, m);
      } else {
        std::memcpy(data() + begin + off, acc, m);
      }
    }
  }

  agree(ctx, &ShmWindow::left, tag, peers);
  // The ledger gets what the ring sends and receives for the same
  // collective (as for NCCL): between ranks the same bytes cross (each
  // rank's chunk pulled by the n-1 others for a reduction, each reduced or
  // gathered chunk pushed or pulled once per peer); with uneven chunks the
  // ring's split between ranks is the convention. Its reduce-scatter sends
  // every chunk but its own and receives every chunk but the previous
  // position's; its all-gather sends every chunk but the next position's
  // and receives every chunk but its own; its all-reduce is both.
  auto size_at = [&](int p) { return static_cast<uint64_t>(chunk_range(count, n, at(p)).size); };
  const uint64_t rs_sent = count - mine.size, rs_recv = count - size_at(pos - 1);
  const uint64_t ag_sent = count - size_at(pos + 1), ag_recv = count - mine.size;
  uint64_t sent = 0, recv = 0;
  switch (kind) {
    case Collective::AllReduce: sent = rs_sent + ag_sent, recv = rs_recv + ag_recv; break;
    case Collective::ReduceScatter: sent = rs_sent, recv = rs_recv; break;
    case Collective::AllGather: sent = ag_sent, recv = ag_recv; break;
  }
  ledger->add_transfer(ctx.op, ctx.phase, sent * esize, recv * esize);
}

}  // namespace dpt::comm
