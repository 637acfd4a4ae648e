// The registry of backends: which Kernels a Device gets, and the device
// memory and pointer questions answered by the backend that owns them. A new
// backend is a folder that implements device/kernels.h and one case here.
#include "device/device.h"

#include <atomic>
#include <string>

#include <fmt/format.h>

#include "core/error.h"
#include "device/cuda_backend.h"
#include "device/kernels.h"

namespace dpt {

const char* device_name(Device d) { return d == Device::CUDA ? "cuda" : "cpu"; }

bool cuda_built() {
#ifdef DPT_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

Device parse_device(const std::string& name, const char* flag) {
  if (name == "cpu") return Device::CPU;
  if (name == "cuda") {
    if (!cuda_built())
      throw InputError(fmt::format("{} cuda: this dpt was built without CUDA (no CUDA toolkit found, or "
                                   "-DDPT_CUDA=OFF)", flag));
    return Device::CUDA;
  }
  throw InputError(fmt::format("{} must be cpu or cuda, not '{}'", flag, name));
}

namespace {
// Set once this process has used its GPU: before that no pointer can be the
// GPU's, and CPU runs never touch the CUDA runtime.
std::atomic<bool> cuda_used{false};
}  // namespace

DeviceMemory device_memory(Device d) {
  if (d == Device::CUDA && cuda_used.load(std::memory_order_relaxed))
    return {cuda::backend().allocated_bytes(), cuda::backend().peak_allocated_bytes(), cuda::backend().scratch_bytes()};
  return {};
}

Device pointer_device(const void* p) {
  if (cuda_used.load(std::memory_order_relaxed) && cuda::backend().is_device_pointer(p)) return Device::CUDA;
  return Device::CPU;
}

const Kernels& kernels(Device d) {
  if (d == Device::CPU) return cpu_kernels();
  const Kernels& k = cuda::backend().kernels();
  cuda_used.store(true, std::memory_order_relaxed);
  return k;
}

}  // namespace dpt
