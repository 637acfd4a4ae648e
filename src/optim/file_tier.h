// Optimizer state in a file of the rank's own, streamed through RAM in chunks
// (`--offload optimizer --offload-dir DIR`; docs/memory.md, "Offload").
//
// The file is created in DIR and unlinked at once: it exists only as long as
// its descriptor, so nothing outlives the process however it ends (a normal
// end, an exception, a peer's death, a signal, SIGKILL or the OOM killer).
// While the run lives it shows as `DIR/dpt-offload-rank<r>-<pid> (deleted)`
// in /proc/<pid>/fd, and its blocks count in df.
//
// It is read and written with O_DIRECT from 4 KiB-aligned buffers, so the
// state never enters the page cache (the host's memory goes down, not only
// the process's); where the filesystem refuses O_DIRECT, every write is
// flushed (sync_file_range) and its pages dropped (POSIX_FADV_DONTNEED).
// Space is reserved with fallocate when a region is added, so a full disk is
// an error before training, not in the middle of a step.
//
// One I/O thread serves requests in order. A stream keeps every chunk buffer
// busy: reads run ahead of the update as far as buffers allow, and a chunk's
// write is issued as soon as it is updated; the buffer returns once written.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "optim/state_tier.h"

namespace dpt {

// Refuses, in one sentence (InputError), an offload directory that cannot
// hold `bytes`: missing, not a directory, not writable, in memory (tmpfs,
// where offloading saves nothing), or without that much free space.
// Returns its free bytes (UINT64_MAX where the filesystem does not say).
uint64_t check_offload_dir(const std::string& dir, uint64_t bytes);

// RAM a FileTier holds for regions of `tensors` tensors whose longest span
// is `largest_span` elements: its chunk buffers (the memory estimate's
// figure; FileTier::ram_bytes once it has streamed).
size_t offload_buffer_bytes(size_t tensors, size_t largest_span, size_t chunk_bytes, size_t buffers = 4);

// The disk under `dir` as the tier uses it: `bytes` (rounded up to 4 MiB
// blocks) written and then read back sequentially with O_DIRECT, in a file
// created and unlinked at once; tens of MiB, well under a second. In GB/s
// (1e9 bytes/s) each way, for `dpt plan`'s offload estimates. InputError
// for a directory the tier refuses (check_offload_dir), IoError when the
// I/O fails.
struct DiskRates {
  double write_gbs = 0, read_gbs = 0;
};
DiskRates probe_disk(const std::string& dir, size_t bytes = size_t{32} << 20);

class FileTier : public StateTier {
 public:
  // chunk_bytes: per tensor per chunk, rounded down to 4 KiB (at least 4 KiB).
  FileTier(const std::string& dir, int rank, size_t chunk_bytes, size_t buffers = 4);
  ~FileTier() override;
  FileTier(const FileTier&) = delete;
  FileTier& operator=(const FileTier&) = delete;

  int add_region(size_t tensors, size_t n) override;
  void stream(const Job* jobs, size_t count) override;
  void read(int region, size_t tensor, size_t at, size_t n, float* out) override;
  void write(int region, size_t tensor, size_t at, size_t n, const float* in) override;
  float* data(int, size_t) override { return nullptr; }
  size_t ram_bytes() const override;
  size_t offloaded_bytes() const override;
  nlohmann::json detail() const override;

  const std::string& path() const { return path_; }
  bool direct() const { return direct_; }
  uint64_t file_bytes() const { return file_bytes_; }

 private:
  struct Region {
    size_t tensors, n, stride;  // stride: n rounded up to the alignment, in elements
    uint64_t offset;            // bytes, aligned
  };
  struct Buffer {
    float* data = nullptr;
    bool busy = false;  // an operation queued or running
    bool write = false;
    size_t tensors = 0, bytes = 0;
    uint64_t offsets[kMaxTensors] = {};
  };
  void ensure_buffers();
  void submit(size_t b, bool write, const Region& r, size_t lo, size_t k);
  void wait_idle(size_t b);
  size_t wait_any_free();
  void wait_all();
  void io_loop();
  void do_io(Buffer& b);
  void throw_if_failed();
  uint64_t tensor_offset(const Region& r, size_t tensor, size_t at) const;

  std::string dir_, path_;
  int fd_ = -1;
  bool direct_ = true;
  size_t chunk_;  // elements per tensor per chunk
  size_t nbuf_;
  std::vector<Region> regions_;
  uint64_t file_bytes_ = 0;
  size_t buf_tensors_ = 0;  // tensors each buffer holds
  size_t chunk_cap_ = 0;    // elements of each tensor in a buffer (<= chunk_)
  std::vector<Buffer> bufs_;  // their data: aligned_alloc, freed in the destructor

  std::mutex mu_;
  std::condition_variable queued_, done_;
  std::vector<size_t> queue_;  // ring of buffer indices, nbuf_ slots
  size_t head_ = 0, count_ = 0;
  bool stop_ = false;
  std::string error_;
  std::thread io_;

  // Statistics: bytes moved and seconds the update waited for them.
  uint64_t read_bytes_ = 0, written_bytes_ = 0;
  double wait_s_ = 0.0;
  int64_t streams_ = 0;
};

}  // namespace dpt
