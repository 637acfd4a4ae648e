// The devices a run can compute on, and what the engine asks of them
// without computing: names, memory held, and whose memory a pointer is in.
// The kernels themselves are device/kernels.h; each backend is one folder
// (the CPU's here and in nn/, CUDA's in src/cuda/, loaded at run time by
// device/cuda_loader.cpp) registered in device/device.cpp.
#pragma once

#include <cstddef>
#include <string>

namespace dpt {

enum class Device { CPU, CUDA };
const char* device_name(Device d);  // "cpu", "cuda"
// "cpu" or "cuda"; throws InputError naming the flag otherwise, or when
// "cuda" is asked of a build without CUDA.
Device parse_device(const std::string& name, const char* flag = "--device");
// Whether this build holds the CUDA kernels (CMake DPT_CUDA).
bool cuda_built();

// Bytes a device's allocations (Kernels::alloc) hold now and held at most
// since the process started, and the part of in_use that is the backend's
// own scratch; zeros for the CPU, whose figure is the RSS.
struct DeviceMemory {
  size_t in_use = 0, peak = 0, scratch = 0;
};
DeviceMemory device_memory(Device d);

// The device whose memory p is in (CPU for host memory and in builds
// without CUDA).
Device pointer_device(const void* p);

}  // namespace dpt
