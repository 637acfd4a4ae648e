#include "optim/file_tier.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>

#include <fmt/format.h>

#include "core/error.h"

namespace dpt {

namespace {

// O_DIRECT wants offsets, lengths and addresses aligned to the device's
// logical block; 4 KiB covers 512-byte and 4 KiB devices alike.
constexpr size_t kAlignBytes = 4096;
constexpr size_t kAlign = kAlignBytes / sizeof(float);  // elements

size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

std::string human(uint64_t bytes) {
  const double b = static_cast<double>(bytes);
  return b >= double(1u << 30) ? fmt::format("{:.2f} GiB", b / double(1u << 30))
                               : fmt::format("{:.1f} MiB", b / double(1u << 20));
}

// Whole transfers: pread/pwrite may move less than asked (and EINTR).
bool transfer(int fd, bool write, char* p, size_t bytes, uint64_t offset) {
  while (bytes > 0) {
    const ssize_t got = write ? ::pwrite(fd, p, bytes, static_cast<off_t>(offset))
                              : ::pread(fd, p, bytes, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      if (got == 0) errno = EIO;  // the file was fallocated: a short read is a fault
      return false;
    }
    p += got;
    bytes -= static_cast<size_t>(got);
    offset += static_cast<uint64_t>(got);
  }
  return true;
}

}  // namespace

uint64_t check_offload_dir(const std::string& dir, uint64_t bytes) {
  if (dir.empty())
    throw InputError("--offload optimizer needs --offload-dir DIR, a directory on a local disk with room for the "
                     "optimizer state");
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) throw InputError(fmt::format("--offload-dir {}: no such directory", dir));
  if (!S_ISDIR(st.st_mode)) throw InputError(fmt::format("--offload-dir {}: not a directory", dir));
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    throw InputError(fmt::format("--offload-dir {}: not writable ({})", dir, std::strerror(errno)));
  struct statfs fsinfo {};
  if (::statfs(dir.c_str(), &fsinfo) == 0 &&
      (fsinfo.f_type == TMPFS_MAGIC || fsinfo.f_type == RAMFS_MAGIC))
    throw InputError(fmt::format("--offload-dir {}: is in memory (tmpfs): the state would stay in RAM; give a "
                                 "directory on a disk",
                                 dir));
  struct statvfs vfs {};
  if (::statvfs(dir.c_str(), &vfs) != 0) return UINT64_MAX;
  const uint64_t free_bytes = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  if (free_bytes < bytes)
    throw InputError(fmt::format("--offload-dir {}: {} free, but the ranks on this host offload {} of optimizer "
                                 "state",
                                 dir, human(free_bytes), human(bytes)));
  return free_bytes;
}

size_t offload_buffer_bytes(size_t tensors, size_t largest_span, size_t chunk_bytes, size_t buffers) {
  const size_t chunk = std::max(kAlign, chunk_bytes / kAlignBytes * kAlign);
  return buffers * tensors * std::min(chunk, round_up(std::max<size_t>(largest_span, 1), kAlign)) * sizeof(float);
}

DiskRates probe_disk(const std::string& dir, size_t bytes) {
  check_offload_dir(dir, 0);  // no room for the probe: fallocate's sentence below
  constexpr size_t kBlock = size_t{4} << 20;  // the tier's default chunk
  bytes = round_up(std::max(bytes, kBlock), kBlock);
  const std::string path = (std::filesystem::path(dir) / fmt::format("dpt-disk-probe-{}", ::getpid())).string();
  const int flags = O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC;
  bool direct = true;
  int fd = ::open(path.c_str(), flags | O_DIRECT, 0600);
  if (fd < 0 && errno == EINVAL) {  // as the tier: without direct I/O, pages dropped instead
    direct = false;
    fd = ::open(path.c_str(), flags, 0600);
  }
  if (fd < 0) throw IoError(fmt::format("{}: cannot create the disk probe's file: {}", path, std::strerror(errno)));
  ::unlink(path.c_str());
  const std::unique_ptr<void, void (*)(void*)> mem(std::aligned_alloc(kAlignBytes, kBlock), std::free);
  const std::unique_ptr<int, void (*)(int*)> closer(&fd, [](int* f) { ::close(*f); });
  if (!mem) throw std::bad_alloc();
  std::memset(mem.get(), 1, kBlock);
  if (const int e = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)); e != 0)
    throw IoError(fmt::format("{}: cannot reserve {} for the disk probe: {}", dir, human(bytes), std::strerror(e)));
  auto seconds = [&](bool write) {
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t off = 0; off < bytes; off += kBlock)
      if (!transfer(fd, write, static_cast<char*>(mem.get()), kBlock, off))
        throw IoError(fmt::format("{}: the disk probe's {} failed: {}", dir, write ? "write" : "read",
                                  std::strerror(errno)));
    if (write && ::fdatasync(fd) != 0)
      throw IoError(fmt::format("{}: the disk probe's write failed: {}", dir, std::strerror(errno)));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!direct) ::posix_fadvise(fd, 0, static_cast<off_t>(bytes), POSIX_FADV_DONTNEED);  // read from the disk
    return std::max(s, 1e-9);
  };
  DiskRates r;
  r.write_gbs = static_cast<double>(bytes) / seconds(true) / 1e9;
  r.read_gbs = static_cast<double>(bytes) / seconds(false) / 1e9;
  return r;
}

FileTier::FileTier(const std::string& dir, int rank, size_t chunk_bytes, size_t buffers)
    : dir_(dir),
      chunk_(std::max(kAlign, chunk_bytes / kAlignBytes * kAlign)),
      nbuf_(std::clamp<size_t>(buffers, 2, 16)) {
  path_ = (std::filesystem::path(dir) / fmt::format("dpt-offload-rank{}-{}", rank, ::getpid())).string();
  const int flags = O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC;
  fd_ = ::open(path_.c_str(), flags | O_DIRECT, 0600);
  if (fd_ < 0 && errno == EINVAL) {  // the filesystem has no direct I/O
    direct_ = false;
    fd_ = ::open(path_.c_str(), flags, 0600);
  }
  if (fd_ < 0) throw IoError(fmt::format("{}: cannot create the offload file: {}", path_, std::strerror(errno)));
  ::unlink(path_.c_str());  // see the header: the file lives exactly as long as the process holds it
  bufs_.resize(nbuf_);
  queue_.resize(nbuf_);
  io_ = std::thread([this] { io_loop(); });
}

FileTier::~FileTier() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  queued_.notify_all();
  io_.join();  // finishes what is queued: the buffers outlive every transfer into them
  for (Buffer& b : bufs_) std::free(b.data);
  ::close(fd_);
}

int FileTier::add_region(size_t tensors, size_t n) {
  DPT_CHECK(tensors <= kMaxTensors, "a region of {} tensors (at most {})", tensors, kMaxTensors);
  const Region r{tensors, n, round_up(n, kAlign), file_bytes_};
  const uint64_t bytes = static_cast<uint64_t>(r.tensors) * r.stride * sizeof(float);
  // Reserved now, so a full disk stops the run before its first step.
  if (bytes > 0 && ::fallocate(fd_, 0, static_cast<off_t>(r.offset), static_cast<off_t>(bytes)) != 0) {
    const int e = errno;
    if (e == ENOSPC)
      throw IoError(fmt::format("--offload-dir {}: not enough space for the offloaded optimizer state ({} reserved, "
                                "{} more needed)",
                                dir_, human(file_bytes_), human(bytes)));
    if (e != EOPNOTSUPP || ::ftruncate(fd_, static_cast<off_t>(r.offset + bytes)) != 0)
      throw IoError(fmt::format("{}: cannot reserve {} for the offloaded optimizer state: {}", path_, human(bytes),
                                std::strerror(e)));
  }
  file_bytes_ += bytes;
  regions_.push_back(r);
  return static_cast<int>(regions_.size() - 1);
}

size_t FileTier::ram_bytes() const {
  size_t b = 0;
  for (const Buffer& buf : bufs_)
    if (buf.data) b += buf_tensors_ * chunk_cap_ * sizeof(float);
  return b;
}

size_t FileTier::offloaded_bytes() const {
  size_t b = 0;
  for (const Region& r : regions_) b += r.tensors * r.n * sizeof(float);
  return b;
}

nlohmann::json FileTier::detail() const {
  return {{"dir", dir_}, {"file", path_}, {"direct_io", direct_}, {"file_bytes", file_bytes_},
          {"state_bytes", offloaded_bytes()},
          {"chunk_bytes", chunk_cap_ * sizeof(float)}, {"buffers", nbuf_}, {"ram_bytes", ram_bytes()},
          {"read_bytes", read_bytes_}, {"written_bytes", written_bytes_}, {"wait_s", wait_s_},
          {"streams", streams_}};
}

// Buffers for the largest region's tensors, each chunk no longer than the
// longest span (a small model needs no 4 MiB chunks). Regions are added
// when the strategy is built, so this allocates once.
void FileTier::ensure_buffers() {
  size_t tensors = 1, longest = 1;
  for (const Region& r : regions_) {
    tensors = std::max(tensors, r.tensors);
    longest = std::max(longest, r.n);
  }
  const size_t cap = std::min(chunk_, round_up(longest, kAlign));
  if (tensors == buf_tensors_ && cap == chunk_cap_) return;
  wait_all();
  for (Buffer& b : bufs_) {
    std::free(b.data);
    b.data = static_cast<float*>(std::aligned_alloc(kAlignBytes, tensors * cap * sizeof(float)));
    if (!b.data) throw std::bad_alloc();
  }
  buf_tensors_ = tensors;
  chunk_cap_ = cap;
}

uint64_t FileTier::tensor_offset(const Region& r, size_t tensor, size_t at) const {
  return r.offset + (static_cast<uint64_t>(tensor) * r.stride + at) * sizeof(float);
}

// ---------------------------------------------------------------- the I/O thread

void FileTier::submit(size_t b, bool write, const Region& r, size_t lo, size_t k) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    Buffer& buf = bufs_[b];
    buf.busy = true;
    buf.write = write;
    buf.tensors = r.tensors;
    // Whole 4 KiB blocks: the region's stride leaves room past its end.
    buf.bytes = round_up(k, kAlign) * sizeof(float);
    for (size_t i = 0; i < r.tensors; ++i) buf.offsets[i] = tensor_offset(r, i, lo);
    queue_[(head_ + count_) % nbuf_] = b;
    ++count_;
  }
  queued_.notify_one();
}

void FileTier::io_loop() {
  for (;;) {
    size_t b;
    {
      std::unique_lock<std::mutex> lock(mu_);
      queued_.wait(lock, [&] { return count_ > 0 || stop_; });
      if (count_ == 0) return;  // stopping, nothing left
      b = queue_[head_];
      head_ = (head_ + 1) % nbuf_;
      --count_;
    }
    do_io(bufs_[b]);  // the buffer is this thread's until busy is cleared
    {
      std::lock_guard<std::mutex> lock(mu_);
      bufs_[b].busy = false;
    }
    done_.notify_all();
  }
}

void FileTier::do_io(Buffer& b) {
  for (size_t i = 0; i < b.tensors; ++i) {
    char* p = reinterpret_cast<char*>(b.data + i * chunk_cap_);
    if (!transfer(fd_, b.write, p, b.bytes, b.offsets[i])) {
      std::lock_guard<std::mutex> lock(mu_);
      if (error_.empty())
        error_ = fmt::format("{}: cannot {} the offloaded optimizer state: {}", path_, b.write ? "write" : "read",
                             std::strerror(errno));
      return;
    }
    if (!direct_) {
      // Without O_DIRECT the pages would stay cached: write them out now,
      // then drop them, so the state leaves the host's memory too.
      if (b.write)
        ::sync_file_range(fd_, static_cast<off_t>(b.offsets[i]), static_cast<off_t>(b.bytes),
                          SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
      ::posix_fadvise(fd_, static_cast<off_t>(b.offsets[i]), static_cast<off_t>(b.bytes), POSIX_FADV_DONTNEED);
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  (b.write ? written_bytes_ : read_bytes_) += b.tensors * b.bytes;
}

void FileTier::wait_idle(size_t b) {
  std::unique_lock<std::mutex> lock(mu_);
  done_.wait(lock, [&] { return !bufs_[b].busy; });
}

size_t FileTier::wait_any_free() {
  std::unique_lock<std::mutex> lock(mu_);
  size_t found = nbuf_;
  done_.wait(lock, [&] {
    for (size_t b = 0; b < nbuf_; ++b)
      if (!bufs_[b].busy) return (found = b), true;
    return false;
  });
  return found;
}

void FileTier::wait_all() {
  std::unique_lock<std::mutex> lock(mu_);
  done_.wait(lock, [&] { return std::none_of(bufs_.begin(), bufs_.end(), [](const Buffer& b) { return b.busy; }); });
}

void FileTier::throw_if_failed() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!error_.empty()) throw IoError(error_);
}

// ---------------------------------------------------------------- streaming

// The jobs' chunks as one sequence: reads run ahead into every buffer not in
// use, in the order the chunks are updated (a ring of buffers); an updated
// chunk is written from its buffer, which is free again once written. Jobs
// follow each other without a gap, so the next region's first chunk is read
// while the last one's is updated.
void FileTier::stream(const Job* jobs, size_t count) {
  ensure_buffers();
  throw_if_failed();
  ++streams_;
  const auto t0 = std::chrono::steady_clock::now();
  double busy_s = 0.0;  // in the kernels
  struct Pos {
    size_t j = 0, lo = 0;
  };
  auto region = [&](const Pos& p) -> const Region& { return regions_[static_cast<size_t>(jobs[p.j].region)]; };
  auto settle = [&](Pos& p) {  // to the next chunk that holds state
    while (p.j < count && (region(p).tensors == 0 || p.lo >= region(p).n)) {
      ++p.j;
      p.lo = 0;
    }
  };
  auto advance = [&](Pos& p) {
    p.lo += chunk_cap_;
    settle(p);
  };
  // A kernel without state (SGD without momentum) runs once, with no I/O.
  for (size_t j = 0; j < count; ++j)
    if (regions_[static_cast<size_t>(jobs[j].region)].tensors == 0) {
      float* none[kMaxTensors] = {};
      jobs[j].kernel->update(0, regions_[static_cast<size_t>(jobs[j].region)].n, none);
    }
  Pos fetch, work;
  settle(fetch);
  settle(work);
  size_t ring[16], rhead = 0, rcount = 0;
  bool held[16] = {};  // in the ring: read issued, not yet updated
  auto free_buffer = [&]() -> size_t {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t b = 0; b < nbuf_; ++b)
      if (!bufs_[b].busy && !held[b]) return b;
    return nbuf_;
  };
  while (work.j < count) {
    // Reads ahead into every free buffer; when none is in the ring, wait for one.
    while (fetch.j < count) {
      size_t b = free_buffer();
      if (b == nbuf_) {
        if (rcount > 0) break;
        b = wait_any_free();
      }
      const Region& r = region(fetch);
      submit(b, false, r, fetch.lo, std::min(chunk_cap_, r.n - fetch.lo));
      held[b] = true;
      ring[(rhead + rcount++) % nbuf_] = b;
      advance(fetch);
    }
    const size_t b = ring[rhead];
    rhead = (rhead + 1) % nbuf_;
    --rcount;
    wait_idle(b);
    throw_if_failed();
    const Region& r = region(work);
    const size_t k = std::min(chunk_cap_, r.n - work.lo);
    float* tensors[kMaxTensors] = {};
    for (size_t i = 0; i < r.tensors; ++i) tensors[i] = bufs_[b].data + i * chunk_cap_;
    const auto tk = std::chrono::steady_clock::now();
    jobs[work.j].kernel->update(work.lo, k, tensors);
    busy_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - tk).count();
    held[b] = false;
    submit(b, true, r, work.lo, k);
    advance(work);
  }
  wait_all();
  wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() - busy_s;
  throw_if_failed();
}

// ---------------------------------------------------------------- checkpoints

// Through the first buffer, in aligned windows of at most a buffer: a window
// the values do not cover whole is read first (read, modify, write).
void FileTier::read(int region, size_t tensor, size_t at, size_t n, float* out) {
  ensure_buffers();
  wait_all();
  throw_if_failed();
  const Region& r = regions_[static_cast<size_t>(region)];
  DPT_CHECK(tensor < r.tensors && at + n <= r.n, "read past region {}", region);
  const size_t cap = buf_tensors_ * chunk_cap_;
  float* buf = bufs_[0].data;
  for (size_t e = at; e < at + n;) {
    const size_t a = e / kAlign * kAlign, b = std::min(round_up(at + n, kAlign), a + cap);
    if (!transfer(fd_, false, reinterpret_cast<char*>(buf), (b - a) * sizeof(float), tensor_offset(r, tensor, a)))
      throw IoError(fmt::format("{}: cannot read the offloaded optimizer state: {}", path_, std::strerror(errno)));
    if (!direct_)
      ::posix_fadvise(fd_, static_cast<off_t>(tensor_offset(r, tensor, a)), static_cast<off_t>((b - a) * 4),
                      POSIX_FADV_DONTNEED);
    const size_t m = std::min(at + n, b) - e;
    std::memcpy(out + (e - at), buf + (e - a), m * sizeof(float));
    e += m;
  }
}

void FileTier::write(int region, size_t tensor, size_t at, size_t n, const float* in) {
  ensure_buffers();
  wait_all();
  throw_if_failed();
  const Region& r = regions_[static_cast<size_t>(region)];
  DPT_CHECK(tensor < r.tensors && at + n <= r.n, "write past region {}", region);
  const size_t cap = buf_tensors_ * chunk_cap_;
  float* buf = bufs_[0].data;
  for (size_t e = at; e < at + n;) {
    const size_t a = e / kAlign * kAlign, b = std::min(round_up(at + n, kAlign), a + cap);
    const size_t m = std::min(at + n, b) - e;
    const uint64_t off = tensor_offset(r, tensor, a);
    const size_t bytes = (b - a) * sizeof(float);
    const bool partial = e > a || e + m < b;
    bool ok = !partial || transfer(fd_, false, reinterpret_cast<char*>(buf), bytes, off);
    if (ok) {
      std::memcpy(buf + (e - a), in + (e - at), m * sizeof(float));
      ok = transfer(fd_, true, reinterpret_cast<char*>(buf), bytes, off);
    }
    if (!ok)
      throw IoError(fmt::format("{}: cannot write the offloaded optimizer state: {}", path_, std::strerror(errno)));
    if (!direct_) {
      ::sync_file_range(fd_, static_cast<off_t>(off), static_cast<off_t>(bytes),
                        SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
      ::posix_fadvise(fd_, static_cast<off_t>(off), static_cast<off_t>(bytes), POSIX_FADV_DONTNEED);
    }
    e += m;
  }
}

}  // namespace dpt
