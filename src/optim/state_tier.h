// Where optimizer state lives: a tier that holds regions of float tensors and
// brings them to the update chunk by chunk (docs/memory.md, "Offload").
//
// A region is `tensors` tensors of n floats each (AdamW's m and v, SGD's
// momentum buffer) for one optimizer's span. The optimizer never holds a
// pointer into its state across calls: a step is an elementwise kernel the
// tier runs over chunks it has brought into RAM, and checkpoints copy state
// in and out through read() and write(). So the state can live anywhere:
//
//   RamTier   in RAM, each region one FlatBuffer; a step is one call over
//             the whole span (the engine without offload).
//   FileTier  in a file of the rank's own on a disk (optim/file_tier.h),
//             streamed through a few chunk buffers, reads and writes
//             overlapped with the update (ZeRO-Infinity's NVMe offload).
//
//   RamTier   pinned for a GPU: in page-locked host memory, the state of a
//             GPU run's `--offload optimizer` (parallel/host_update.h runs
//             its update on the CPU cores).
//
// fp32 master weights (`--offload params`) are one more tensor per region.
#pragma once

#include <cstddef>
#include <deque>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "tensor/flat_buffer.h"

namespace dpt {

// What runs on each chunk of a region: elements [lo, lo + k) of the span,
// tensors[i] pointing at tensor i's element lo. Elementwise, so any cut into
// chunks gives the same values.
class ChunkKernel {
 public:
  virtual ~ChunkKernel() = default;
  virtual void update(size_t lo, size_t k, float* const* tensors) = 0;
};

class StateTier {
 public:
  static constexpr size_t kMaxTensors = 4;

  virtual ~StateTier() = default;
  // A region of `tensors` (at most kMaxTensors) tensors of n floats, zeroed.
  // Returns its id. Throws IoError (a full disk) for a file tier.
  virtual int add_region(size_t tensors, size_t n) = 0;

  // One pass of kernels[j] over region regions[j]'s elements, for j in
  // order: the tier may fetch a region's chunks while an earlier one's are
  // updated. Returns when every update is written back.
  struct Job {
    int region;
    ChunkKernel* kernel;
  };
  virtual void stream(const Job* jobs, size_t count) = 0;

  // Elements [at, at + n) of tensor `tensor` of `region`, out of and into
  // the tier (checkpoints; between steps).
  virtual void read(int region, size_t tensor, size_t at, size_t n, float* out) = 0;
  virtual void write(int region, size_t tensor, size_t at, size_t n, const float* in) = 0;
  // The tensor in RAM, or nullptr where the tier keeps it elsewhere.
  virtual float* data(int region, size_t tensor) = 0;

  // Bytes of RAM the tier holds (the state itself, or its chunk buffers),
  // and bytes of state it keeps off RAM.
  virtual size_t ram_bytes() const = 0;
  virtual size_t offloaded_bytes() const { return 0; }
  // For the summary (null: nothing to say).
  virtual nlohmann::json detail() const { return nullptr; }
  // Where data() points and the chunk kernels' pointers live.
  virtual Device device() const { return Device::CPU; }
};

class RamTier : public StateTier {
 public:
  // The state in the memory of `device` (a GPU's for --device cuda).
  explicit RamTier(Device device = Device::CPU) : device_(device) {}
  // The state in host memory page-locked for `gpu` (Kernels::pinned_alloc):
  // a GPU run's state offloaded to the host. Its device() is the CPU.
  static std::unique_ptr<RamTier> pinned_for(Device gpu);
  int add_region(size_t tensors, size_t n) override;
  void stream(const Job* jobs, size_t count) override;
  void read(int region, size_t tensor, size_t at, size_t n, float* out) override;
  void write(int region, size_t tensor, size_t at, size_t n, const float* in) override;
  float* data(int region, size_t tensor) override;
  size_t ram_bytes() const override;
  nlohmann::json detail() const override;
  Device device() const override { return device_; }

 private:
  Device device_;
  Device pinned_for_ = Device::CPU;  // CPU: ordinary memory of device_
  struct Region {
    size_t tensors, n;
    FlatBuffer buf;
  };
  std::deque<Region> regions_;  // a deque: buffers stay where they are as it grows
};

// What --offload moves to a file: nothing (the state in RAM), the
// optimizer state, or that and the fp32 master weights ("params").
enum class Offload { None, Optimizer, Params };
// "optimizer" or "params" ("" and "none": None); InputError otherwise.
Offload parse_offload(const std::string& s);

// Where a strategy keeps its optimizers' state.
struct OffloadOptions {
  Offload what = Offload::None;
  std::string dir;           // --offload-dir
  size_t chunk_bytes = 4u << 20;  // per tensor per chunk (--offload-chunk-mb)
};

// The tier for a rank: a RamTier on `device`; with --offload, a FileTier in
// options.dir (its file named for the rank), or for a GPU run without a
// directory a RamTier pinned for the GPU.
std::unique_ptr<StateTier> make_state_tier(const OffloadOptions& options, int rank, Device device);

}  // namespace dpt
