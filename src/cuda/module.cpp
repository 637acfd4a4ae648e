// The one symbol libdpt_cuda.so exports to the engine (device/cuda_backend.h).
#include "cuda/module.h"

extern "C" __attribute__((visibility("default"))) const dpt::cuda::Backend* dpt_cuda_backend() {
  using namespace dpt::cuda;
  static const Backend table{kBackendAbi,   &kernels,          &allocated_bytes, &peak_allocated_bytes,
                             &scratch_bytes, &is_device_pointer, &nccl_id,         &nccl_comm,
                             &device_uuid,   &record_ready,      &release_ready,   &download_after,
                             &upload_copy};
  return &table;
}
