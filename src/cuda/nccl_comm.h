// NCCL on GPU buffers for one process group (comm/process_group.cpp uses it
// from its communication thread; docs/gpu.md). Plain C++: no CUDA or NCCL
// types here.
//
// Each call first waits for the compute stream's queued work (the buffer's
// producer), runs NCCL on the communicator's own stream and waits for it, so
// the buffer is ready for the caller when the call returns. Waits poll
// ncclCommGetAsyncError until `deadline`; past it the communicator is
// aborted and CommError names the operation (a dead peer never hangs a rank).
// Chunked operations follow the engine's contract (comm::chunk_range: uneven
// chunks, in place), as grouped NCCL reduces and broadcasts.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "comm/types.h"

namespace dpt::cuda {

class NcclComm {
 public:
  // NCCL's unique id, made by one rank and given to all (ncclGetUniqueId).
  static constexpr size_t kIdBytes = 128;
  static void make_id(char id[kIdBytes]);
  NcclComm(const char id[kIdBytes], int size, int rank);
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  using Deadline = std::chrono::steady_clock::time_point;
  void all_reduce(void* data, size_t count, DType dtype, comm::ReduceOp op, const std::string& what, Deadline d);
  void reduce_scatter(void* data, size_t count, DType dtype, comm::ReduceOp op, const std::string& what, Deadline d);
  void all_gather(void* data, size_t count, size_t elem_bytes, const std::string& what, Deadline d);
  void broadcast(void* data, size_t bytes, int root, const std::string& what, Deadline d);
  void reduce(void* data, size_t count, DType dtype, comm::ReduceOp op, int root, const std::string& what, Deadline d);
  void send(const void* data, size_t bytes, int peer, const std::string& what, Deadline d);
  void recv(void* data, size_t bytes, int peer, const std::string& what, Deadline d);

  // "NCCL 2.28.3"
  static std::string version();
  // This process's GPU's UUID (16 bytes), to tell ranks that share a GPU
  // (NCCL refuses two ranks on one GPU).
  static void device_uuid(char uuid[16]);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dpt::cuda
