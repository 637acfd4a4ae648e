#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "comm/types.h"
#include "device/cuda_backend.h"
#include "cuda/module.h"

namespace dpt::cuda {

namespace {

void check_cuda(cudaError_t e, const char* call) {
  if (e != cudaSuccess) throw comm::CommError(fmt::format("{} failed: {}", call, cudaGetErrorString(e)));
}

ncclDataType_t nccl_type(DType t) { return t == DType::BF16 ? ncclBfloat16 : ncclFloat32; }

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;
    case ReduceOp::Max: return ncclMax;
  }
  return ncclSum;
}


class Nccl final : public NcclComm {
 public:
  Nccl(const char id[kIdBytes], int size, int rank);
  ~Nccl() override;
  void after(void* ready) override;
  void all_reduce(void* data, size_t count, DType dtype, ReduceOp op, const std::string& what,
                  Deadline d) override;
  void reduce_scatter(void* data, size_t count, DType dtype, ReduceOp op, const std::string& what,
                      Deadline d) override;
  void all_gather(void* data, size_t count, size_t elem_bytes, const std::string& what, Deadline d) override;
  void broadcast(void* data, size_t bytes, int root, const std::string& what, Deadline d) override;
  void reduce(void* data, size_t count, DType dtype, ReduceOp op, int root, const std::string& what,
              Deadline d) override;
  void send(const void* data, size_t bytes, int peer, const std::string& what, Deadline d) override;
  void recv(void* data, size_t bytes, int peer, const std::string& what, Deadline d) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct Nccl::Impl {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t done = nullptr;
  int size = 1, rank = 0;
  bool aborted = false;

  void check(ncclResult_t r, const char* call, const std::string& what) {
    if (r != ncclSuccess && r != ncclInProgress)
      throw comm::CommError(fmt::format("{}: {} failed: {}", what, call, ncclGetErrorString(r)));
  }
  // Before: the buffer's producer (the compute stream) is done.
  cudaEvent_t ready = nullptr;  // after(): the next operation's producer
  void begin() {
    if (ready) {
      check_cuda(cudaStreamWaitEvent(stream, ready, 0), "cudaStreamWaitEvent");
      ready = nullptr;
    } else {
      kernels().synchronize();
    }
  }
  // After issuing: waits for the NCCL stream, watching the communicator
  // for asynchronous errors (a peer that died) and the deadline.
  void finish(const std::string& what, Deadline deadline) {
    check_cuda(cudaEventRecord(done, stream), "cudaEventRecord");
    for (;;) {
      const cudaError_t q = cudaEventQuery(done);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) check_cuda(q, "cudaEventQuery");
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        abort();
        throw comm::CommError(fmt::format("{}: NCCL reported {}", what, ncclGetErrorString(async)));
      }
      if (std::chrono::steady_clock::now() > deadline) {
        abort();
        throw comm::CommError(fmt::format("{} timed out in NCCL (a peer died or never joined)", what));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  void abort() {
    if (!aborted && comm) ncclCommAbort(comm);
    aborted = true;
    comm = nullptr;
  }
};

}  // namespace

void nccl_id(char id[NcclComm::kIdBytes]) {
  static_assert(sizeof(ncclUniqueId) == NcclComm::kIdBytes, "NCCL's unique id size");
  ncclUniqueId u;
  const ncclResult_t r = ncclGetUniqueId(&u);
  if (r != ncclSuccess) throw comm::CommError(fmt::format("ncclGetUniqueId failed: {}", ncclGetErrorString(r)));
  std::memcpy(id, &u, NcclComm::kIdBytes);
}

namespace {

Nccl::Nccl(const char id[kIdBytes], int size, int rank) : impl_(std::make_unique<Impl>()) {
  kernels();  // this process's GPU chosen and current
  impl_->size = size;
  impl_->rank = rank;
  ncclUniqueId u;
  std::memcpy(&u, id, kIdBytes);
  impl_->check(ncclCommInitRank(&impl_->comm, size, u, rank), "ncclCommInitRank", "NCCL set-up");
  check_cuda(cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking), "cudaStreamCreate");
  check_cuda(cudaEventCreateWithFlags(&impl_->done, cudaEventDisableTiming), "cudaEventCreate");
}

void Nccl::after(void* ready) { impl_->ready = static_cast<cudaEvent_t>(ready); }

Nccl::~Nccl() {
  if (impl_->comm) ncclCommDestroy(impl_->comm);
  if (impl_->done) cudaEventDestroy(impl_->done);
  if (impl_->stream) cudaStreamDestroy(impl_->stream);
}

void Nccl::all_reduce(void* data, size_t count, DType dtype, ReduceOp op, const std::string& what,
                          Deadline d) {
  impl_->begin();
  impl_->check(ncclAllReduce(data, data, count, nccl_type(dtype), nccl_op(op), impl_->comm, impl_->stream),
               "ncclAllReduce", what);
  impl_->finish(what, d);
}

void Nccl::reduce_scatter(void* data, size_t count, DType dtype, ReduceOp op, const std::string& what,
                              Deadline d) {
  // Chunk r reduced onto rank r, in place: one reduce per chunk, grouped.
  const size_t es = dtype_size(dtype);
  char* c = static_cast<char*>(data);
  impl_->begin();
  impl_->check(ncclGroupStart(), "ncclGroupStart", what);
  for (int r = 0; r < impl_->size; ++r) {
    const comm::Range k = comm::chunk_range(count, impl_->size, r);
    impl_->check(ncclReduce(c + k.begin * es, c + k.begin * es, k.size, nccl_type(dtype), nccl_op(op), r,
                            impl_->comm, impl_->stream),
                 "ncclReduce", what);
  }
  impl_->check(ncclGroupEnd(), "ncclGroupEnd", what);
  impl_->finish(what, d);
}

void Nccl::all_gather(void* data, size_t count, size_t elem_bytes, const std::string& what, Deadline d) {
  // Chunk r from rank r to all: one broadcast per chunk, grouped.
  char* c = static_cast<char*>(data);
  impl_->begin();
  impl_->check(ncclGroupStart(), "ncclGroupStart", what);
  for (int r = 0; r < impl_->size; ++r) {
    const comm::Range k = comm::chunk_range(count, impl_->size, r);
    impl_->check(ncclBroadcast(c + k.begin * elem_bytes, c + k.begin * elem_bytes, k.size * elem_bytes, ncclUint8,
                               r, impl_->comm, impl_->stream),
                 "ncclBroadcast", what);
  }
  impl_->check(ncclGroupEnd(), "ncclGroupEnd", what);
  impl_->finish(what, d);
}

void Nccl::broadcast(void* data, size_t bytes, int root, const std::string& what, Deadline d) {
  impl_->begin();
  impl_->check(ncclBroadcast(data, data, bytes, ncclUint8, root, impl_->comm, impl_->stream), "ncclBroadcast", what);
  impl_->finish(what, d);
}

void Nccl::reduce(void* data, size_t count, DType dtype, ReduceOp op, int root, const std::string& what,
                      Deadline d) {
  impl_->begin();
  impl_->check(ncclReduce(data, data, count, nccl_type(dtype), nccl_op(op), root, impl_->comm, impl_->stream),
               "ncclReduce", what);
  impl_->finish(what, d);
}

void Nccl::send(const void* data, size_t bytes, int peer, const std::string& what, Deadline d) {
  impl_->begin();
  impl_->check(ncclSend(data, bytes, ncclUint8, peer, impl_->comm, impl_->stream), "ncclSend", what);
  impl_->finish(what, d);
}

void Nccl::recv(void* data, size_t bytes, int peer, const std::string& what, Deadline d) {
  impl_->begin();
  impl_->check(ncclRecv(data, bytes, ncclUint8, peer, impl_->comm, impl_->stream), "ncclRecv", what);
  impl_->finish(what, d);
}

}  // namespace

std::unique_ptr<NcclComm> nccl_comm(const char id[NcclComm::kIdBytes], int size, int rank) {
  return std::make_unique<Nccl>(id, size, rank);
}

void device_uuid(char uuid[16]) {
  kernels();
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  cudaDeviceProp prop{};
  check_cuda(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties");
  std::memcpy(uuid, prop.uuid.bytes, 16);
}

}  // namespace dpt::cuda
