// Which memory a pointer is in, asked of the CUDA runtime (comm/ stages GPU
// buffers through the host; it must tell them from host buffers).
#include <cuda_runtime.h>

#include "cuda/module.h"

namespace dpt::cuda {

bool is_device_pointer(const void* p) {
  if (p == nullptr) return false;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();  // a plain host pointer may leave an error behind on old runtimes: clear it
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

}  // namespace dpt::cuda
