// The CUDA side of nn/kernels.h (built when CMake finds the CUDA toolkit and
// DPT_CUDA is on). Plain C++: nothing here needs nvcc to include.
#pragma once

#include "nn/kernels.h"

namespace dpt::cuda {

// The CUDA kernels on this process's GPU (device 0 of those visible, or
// DPT_CUDA_DEVICE / the local rank's). The first call creates the stream and
// the cuBLASLt handle; it throws InputError when no GPU can be used
// ("no CUDA device: ...", naming the driver's reason).
const Kernels& kernels();

// Bytes the device holds in use now and at its peak (cudaMemGetInfo and the
// allocations made through kernels().alloc), for the run's summary.
size_t allocated_bytes();
size_t peak_allocated_bytes();

// Whether p points into GPU memory (src/cuda/pointer.cpp).
bool is_device_pointer(const void* p);

}  // namespace dpt::cuda
