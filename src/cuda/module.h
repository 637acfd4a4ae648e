// Inside libdpt_cuda.so: the functions behind the Backend table
// (device/cuda_backend.h), defined in the module's source files.
#pragma once

#include <cstddef>
#include <memory>

#include "device/cuda_backend.h"

namespace dpt::cuda {

const Kernels& kernels();  // cuda_kernels.cu
size_t allocated_bytes();
size_t peak_allocated_bytes();
size_t scratch_bytes();
bool is_device_pointer(const void* p);  // pointer.cpp
void nccl_id(char id[NcclComm::kIdBytes]);  // nccl_comm.cpp
std::unique_ptr<NcclComm> nccl_comm(const char id[NcclComm::kIdBytes], int size, int rank);
void device_uuid(char uuid[16]);
void* record_ready();  // cuda_kernels.cu
void release_ready(void* ready);
void download_after(void* host, const void* dev, size_t bytes, void* ready);
void upload_copy(void* dev, const void* host, size_t bytes);

}  // namespace dpt::cuda
