// The machine's sgemm rate, measured: the ceiling that model FLOP
// utilisation (MFU) is reported against.
#pragma once

#include <string>

namespace dpt {

// GFLOP/s of a 1024^3 fp32 GEMM on the current thread count (best of a few
// runs after a warm-up; about 0.1 s on one core).
double measure_sgemm_gflops();

// The kernel set OpenBLAS runs ("Haswell", "Cooperlake", ...): chosen from
// the CPU when the library loads, or forced by OPENBLAS_CORETYPE. On the same
// CPU the AVX-512 sets are about 1.8x the AVX2 ones (docs/performance.md), so
// every figure is reported with it.
std::string blas_core();

}  // namespace dpt
