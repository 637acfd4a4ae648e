// The machine's GEMM rate, measured: the ceiling that model FLOP
// utilisation (MFU) is reported against.
#pragma once

#include <functional>
#include <string>

namespace dpt {

// C[n, n] = A[n, n] B[n, n]^T, all fp32, by some GEMM.
using SquareGemm = std::function<void(int n, const float* a, const float* b, float* c)>;

// GFLOP/s of `gemm` at 1024^3 on the current thread count: the best of
// three runs after a warm-up (about 0.06 s on one core), then of more runs
// until budget_s has passed (at most 64). A peak is a best case: on a shared
// host the rate sags for a few hundred milliseconds at a time (a VM's
// neighbours: 120 against 155 GFLOP/s, docs/performance.md), and three runs
// inside a sag would put a run's MFU above what it is.
double measure_gflops(const SquareGemm& gemm, double budget_s = 0.0);

// The rule under it, for any product of `flops` FLOPs that `run` completes
// (train/gemm_rate.h's on a GPU): a warm-up run, then the best rate of
// three, and of more until budget_s has passed (at most 64 runs in all).
double best_gflops(const std::function<void()>& run, double flops, double budget_s);

// The same for OpenBLAS's cblas_sgemm (nn/gemm.h's measure_gemm_gflops
// measures whichever backend is in use).
double measure_sgemm_gflops(double budget_s = 0.0);

// The kernel set OpenBLAS runs ("Haswell", "Cooperlake", ...): chosen from
// the CPU when the library loads, or forced by OPENBLAS_CORETYPE. On the same
// CPU the AVX-512 sets are about 1.8x the AVX2 ones (docs/performance.md), so
// every figure is reported with it.
std::string blas_core();

}  // namespace dpt
