// The GEMM rate a device's kernels reach: the peak a run's model FLOP
// utilisation (MFU) is reported against, measured on the device the run
// computes on.
#pragma once

#include "core/dtype.h"
#include "device/device.h"

namespace dpt {

// GFLOP/s of C[n, n] = A[n, n] B[n, n]^T with fp32 or bf16 inputs (fp32
// out). On the CPU: nn/gemm.h's measure_gemm_gflops (n 1024, the backend
// and bf16 path in use). On a GPU: its linear_forward (cuBLASLt; fp32
// without TF32) at n 8192, where a product (1.1 TFLOP) is long enough that
// the launch does not count, on values of both signs; the three matrices'
// device memory (768 MiB in fp32) is held only while it runs, and n is
// 4096 or 2048 where the run left no room for them (0: nothing fits).
// core/gemm_peak.h's best_gflops rule: the budget buys more runs.
double measure_device_gemm_gflops(Device d, DType inputs, double budget_s = 0.0);

// The name the throughput line gives that peak: the CPU's GEMM backend
// ("onednn", "openblas") or the device ("cuda").
const char* device_gemm_name(Device d);

}  // namespace dpt
