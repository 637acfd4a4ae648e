// The CUDA backend as the engine sees it: a shared library (libdpt_cuda.so,
// built from src/cuda/ when CMake finds the CUDA toolkit) loaded the first
// time a GPU is asked for (device/kernels.h's kernels(Device::CUDA)). A CPU run
// never loads it, so it never maps the CUDA runtime, cuBLAS or NCCL (about
// 150 MiB of resident pages per process when linked in directly).
//
// Plain C++: nothing here needs CUDA's headers. The library exports one C
// function, dpt_cuda_backend(), returning the table below.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "core/reduce_op.h"
#include "device/kernels.h"

namespace dpt::cuda {

// NCCL on GPU buffers for one process group (used by comm/process_group.cpp
// from its communication thread; docs/gpu.md).
//
// Each call starts on the communicator's own stream once the event given to
// after() has passed (recorded on the compute stream when the collective was
// issued: the buffer's producer is done, later kernels may still run), or,
// without one, once the compute stream's queued work is done; it waits for
// the NCCL stream, so the buffer is ready when the call returns. Waits poll NCCL's asynchronous
// error until `deadline`; past it the communicator is aborted and CommError
// names the operation (a dead peer never hangs a rank). Chunked operations
// follow the engine's contract (comm::chunk_range: uneven chunks, in place),
// as grouped NCCL reduces and broadcasts.
class NcclComm {
 public:
  static constexpr size_t kIdBytes = 128;  // ncclUniqueId
  using Deadline = std::chrono::steady_clock::time_point;
  virtual ~NcclComm() = default;
  // The next operation starts after `ready` (Backend::record_ready's).
  virtual void after(void* ready) = 0;
  virtual void all_reduce(void* data, size_t count, DType dtype, ReduceOp op, const std::string& what,
                          Deadline d) = 0;
  virtual void reduce_scatter(void* data, size_t count, DType dtype, ReduceOp op, const std::string& what,
                              Deadline d) = 0;
  virtual void all_gather(void* data, size_t count, size_t elem_bytes, const std::string& what, Deadline d) = 0;
  virtual void broadcast(void* data, size_t bytes, int root, const std::string& what, Deadline d) = 0;
  virtual void reduce(void* data, size_t count, DType dtype, ReduceOp op, int root, const std::string& what,
                      Deadline d) = 0;
  virtual void send(const void* data, size_t bytes, int peer, const std::string& what, Deadline d) = 0;
  virtual void recv(void* data, size_t bytes, int peer, const std::string& what, Deadline d) = 0;
};

// Bumped whenever the table changes, so an old library is refused.
constexpr int kBackendAbi = 7;  // 7: Backend::scratch_bytes; 6: Kernels::pinned_alloc/pinned_free (5: Backend lost nccl_version, flash_attention_*forward took out16; 4: Kernels::flash_attention_bf16_*)

struct Backend {
  int abi = kBackendAbi;
  // The CUDA kernels on this process's GPU (DPT_CUDA_DEVICE, else the local
  // rank modulo the GPUs, else 0). Throws InputError "no CUDA device: ..."
  // when none can be used.
  const Kernels& (*kernels)();
  // Bytes the GPU allocations hold now and held at most, and how many of
  // those now are the backend's own scratch (grown on demand, kept).
  size_t (*allocated_bytes)();
  size_t (*peak_allocated_bytes)();
  size_t (*scratch_bytes)();
  bool (*is_device_pointer)(const void* p);
  // NCCL: a unique id (on one rank), a communicator from it, this GPU's UUID
  // (16 bytes: ranks sharing a GPU cannot share an NCCL communicator).
  void (*nccl_id)(char id[NcclComm::kIdBytes]);
  std::unique_ptr<NcclComm> (*nccl_comm)(const char id[NcclComm::kIdBytes], int size, int rank);
  void (*device_uuid)(char uuid[16]);
  // Ordering collectives after the compute that produced their buffers
  // without stopping it: record_ready marks the compute stream now (an
  // event from a pool); release_ready gives it back once used.
  // download_after copies device to host on a copy stream once `ready` has
  // passed; upload_copy copies host to device on that stream; both return
  // when the copy is done (the host-staged collectives' path).
  void* (*record_ready)();
  void (*release_ready)(void* ready);
  void (*download_after)(void* host, const void* dev, size_t bytes, void* ready);
  void (*upload_copy)(void* dev, const void* host, size_t bytes);
};

// The loaded backend (dpt_lib side, device/cuda_loader.cpp). Throws InputError
// naming the reason when this build has none or the library cannot load.
const Backend& backend();

}  // namespace dpt::cuda

extern "C" const dpt::cuda::Backend* dpt_cuda_backend();
