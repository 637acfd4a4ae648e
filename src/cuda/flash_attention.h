// Causal attention without the T x T matrix on the GPU (issue 35): the
// CUDA side of Kernels::flash_attention_forward/backward, computing what
// nn/flash_attention.h computes on the CPU, in its layouts (qkv rows of NH
// query heads, NKV key heads, NKV value heads of hd channels; out
// [B, T, NH hd]; lse [B, NH, T]), in fp32. docs/gpu.md describes the
// kernels and their launch shapes.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "device/kernels.h"

namespace dpt::cuda {

inline constexpr int64_t kFlashMaxHead = kGpuFlashMaxHead;  // device/kernels.h

// out and lse written; every launch on `stream`.
void flash_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                   int64_t hd, cudaStream_t stream);

// dqkv written whole. D: device scratch of B * NH * T floats (rowsum(dO * O)).
void flash_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse, float* D,
                    int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t hd, cudaStream_t stream);

}  // namespace dpt::cuda
