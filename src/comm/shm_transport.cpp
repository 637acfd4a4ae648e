#include "comm/shm_transport.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "comm/futex.h"
#include "comm/types.h"

namespace dpt::comm {

namespace {
constexpr size_t kHeaderBytes = 4096;  // pids of the local ranks

// A count moved: its futex word follows, and a peer asleep on it is woken.
void publish(std::atomic<uint32_t>& word, std::atomic<uint32_t>& asleep, uint64_t count) {
  word.store(static_cast<uint32_t>(count), std::memory_order_seq_cst);
  if (asleep.load(std::memory_order_seq_cst) != 0) futex_wake_all(&word);
}
}  // namespace

size_t ShmSegment::total_bytes(int local_count) {
  const size_t pairs = static_cast<size_t>(local_count) * static_cast<size_t>(local_count);
  return kHeaderBytes + pairs * channel_bytes();
}

std::unique_ptr<ShmSegment> ShmSegment::create(const std::string& name, int local_count) {
  DPT_CHECK(local_count > 0 && static_cast<size_t>(local_count) * sizeof(pid_t) <= kHeaderBytes,
            "local ranks {}", local_count);
  int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) throw CommError(fmt::format("cannot create shared memory {}: {}", name, std::strerror(errno)));
  auto seg = std::unique_ptr<ShmSegment>(new ShmSegment);
  seg->name_ = name;
  seg->local_count_ = local_count;
  seg->bytes_ = total_bytes(local_count);
  if (::ftruncate(fd, static_cast<off_t>(seg->bytes_)) != 0) {
    int err = errno;
    ::close(fd);
    ::shm_unlink(name.c_str());
    throw CommError(fmt::format("cannot size shared memory {} to {} bytes: {}", name, seg->bytes_,
                                std::strerror(err)));
  }
  void* p = ::mmap(nullptr, seg->bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) {
    ::shm_unlink(name.c_str());
    throw CommError(fmt::format("cannot map shared memory {}: {}", name, std::strerror(errno)));
  }
  seg->base_ = static_cast<char*>(p);
  // ftruncate zero-fills: every head and tail starts at 0.
  return seg;
}

std::unique_ptr<ShmSegment> ShmSegment::open(const std::string& name, int local_count) {
  int fd = ::shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) throw CommError(fmt::format("cannot open shared memory {}: {}", name, std::strerror(errno)));
  auto seg = std::unique_ptr<ShmSegment>(new ShmSegment);
  seg->name_ = name;
  seg->local_count_ = local_count;
  seg->bytes_ = total_bytes(local_count);
  void* p = ::mmap(nullptr, seg->bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED)
    throw CommError(fmt::format("cannot map shared memory {}: {}", name, std::strerror(errno)));
  seg->base_ = static_cast<char*>(p);
  return seg;
}

ShmSegment::~ShmSegment() {
  if (base_) ::munmap(base_, bytes_);
}

void ShmSegment::unlink() { ::shm_unlink(name_.c_str()); }

ShmSegment::Channel* ShmSegment::channel(int from_local, int to_local) {
  const size_t index = static_cast<size_t>(from_local) * static_cast<size_t>(local_count_) +
                       static_cast<size_t>(to_local);
  return reinterpret_cast<Channel*>(base_ + kHeaderBytes + index * channel_bytes());
}

void ShmSegment::set_pid(int local_index, pid_t pid) {
  reinterpret_cast<std::atomic<pid_t>*>(base_)[local_index].store(pid, std::memory_order_release);
}

pid_t ShmSegment::pid(int local_index) const {
  return reinterpret_cast<const std::atomic<pid_t>*>(base_)[local_index].load(std::memory_order_acquire);
}

ShmPeer::ShmPeer(ShmSegment* seg, int my_local, int peer_local)
    : seg_(seg),
      peer_local_(peer_local),
      out_(seg->channel(my_local, peer_local)),
      in_(seg->channel(peer_local, my_local)) {}

void ShmPeer::start_send(const void* src, size_t bytes) {
  send_src_ = static_cast<const char*>(src);
  send_bytes_ = bytes;
  send_off_ = 0;
}

Transfer ShmPeer::progress_send() {
  // Fill every free slot; publish each with a release store of head so the
  // receiver's acquire load of head sees the bytes.
  const uint64_t tail = out_->tail.load(std::memory_order_acquire);
  const size_t before = send_off_;
  while (send_off_ < send_bytes_ && out_head_ - tail < ShmSegment::kSlots) {
    const size_t n = std::min(ShmSegment::kSlotBytes, send_bytes_ - send_off_);
    std::memcpy(out_->slot(out_head_), send_src_ + send_off_, n);
    out_->head.store(++out_head_, std::memory_order_release);
    send_off_ += n;
  }
  if (send_off_ != before) publish(out_->head_word, out_->receiver_asleep, out_head_);
  if (send_off_ == send_bytes_) return Transfer::Done;
  return send_off_ != before ? Transfer::Moved : Transfer::Idle;
}

void ShmPeer::start_recv(void* dst, size_t bytes, Combine c) {
  recv_dst_ = static_cast<char*>(dst);
  recv_bytes_ = bytes;
  recv_off_ = 0;
  recv_combine_ = c;
}

Transfer ShmPeer::progress_recv() {
  const uint64_t head = in_->head.load(std::memory_order_acquire);
  const size_t before = recv_off_;
  while (recv_off_ < recv_bytes_ && in_tail_ < head) {
    const size_t n = std::min(ShmSegment::kSlotBytes, recv_bytes_ - recv_off_);
    combine_bytes(recv_dst_ + recv_off_, in_->slot(in_tail_), n, recv_combine_);
    in_->tail.store(++in_tail_, std::memory_order_release);
    recv_off_ += n;
  }
  if (recv_off_ != before) publish(in_->tail_word, in_->sender_asleep, in_tail_);
  if (recv_off_ == recv_bytes_) return Transfer::Done;
  return recv_off_ != before ? Transfer::Moved : Transfer::Idle;
}

bool ShmPeer::sleep_until_moved(bool receiving, long timeout_ns) {
  // The sleeper raises its flag, then looks once more (sequentially
  // consistent on both sides: either the other side's publish sees the flag
  // and wakes it, or this look sees the new count and does not sleep).
  std::atomic<uint32_t>& word = receiving ? in_->head_word : out_->tail_word;
  std::atomic<uint32_t>& asleep = receiving ? in_->receiver_asleep : out_->sender_asleep;
  // Nothing to read: head is still our tail. No free slot: tail is still
  // kSlots behind our head.
  const auto stuck = static_cast<uint32_t>(receiving ? in_tail_ : out_head_ - ShmSegment::kSlots);
  asleep.store(1, std::memory_order_seq_cst);
  if (word.load(std::memory_order_seq_cst) == stuck) futex_wait(&word, stuck, timeout_ns);
  asleep.store(0, std::memory_order_relaxed);
  return true;
}

bool ShmPeer::alive() {
  // A dead child stays a zombie until its launcher reaps it, and kill(pid, 0)
  // still succeeds on a zombie: read its state instead.
  pid_t pid = seg_->pid(peer_local_);
  if (pid <= 0) return true;  // not published yet
  char path[64], buf[256];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  int fd = ::open(path, O_RDONLY);
  if (fd < 0) return false;
  ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  const char* close_paren = std::strrchr(buf, ')');  // state follows "(comm) "
  char state = close_paren && close_paren[1] ? close_paren[2] : '?';
  return state != 'Z' && state != 'X';
}

}  // namespace dpt::comm
