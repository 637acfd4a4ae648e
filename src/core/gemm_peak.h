// The machine's sgemm rate, measured: the ceiling that model FLOP
// utilisation (MFU) is reported against.
#pragma once

namespace dpt {

// GFLOP/s of a 1024^3 fp32 GEMM on the current thread count (best of a few
// runs after a warm-up; about 0.1 s on one core).
double measure_sgemm_gflops();

}  // namespace dpt
