// How fast this core runs AVX-512 BF16 dot products against fp32 FMAs.
//
// A bf16 GEMM on the CPU runs on vdpbf16ps (two bf16 products and their sum
// into each fp32 lane) unless the CPU has AMX. Whether that beats an fp32
// GEMM of the same values depends on the core, not on the ISA: on AMD's
// Zen 4 and Zen 5 bf16 GEMMs ran at twice the fp32 rate (the earlier
// sessions' hosts; this probe not yet run there); Intel's
// Sapphire and Emerald Rapids (as a VM sees them, AMX hidden) issue it every
// other cycle, so a bf16 GEMM runs at half the fp32 rate there (measured: 82
// against 169 GFLOP/s of instructions, oneDNN 74-82 against 116-157). The
// GEMM layer (nn/gemm.h, --bf16-gemm auto) reads this ratio to decide.
#pragma once

namespace dpt {

// The FLOP rate of 512-bit vdpbf16ps over that of 512-bit vfmadd231ps on
// the calling core, each over independent accumulators (throughput, not
// latency): about 2 where dot products are full rate, 0.5 where they issue
// every other cycle. 0 where the CPU has no AVX-512 BF16. Measured once per
// process (about 1 ms: the fastest of 21 alternating timings of each loop, so
// a time slice lost to another process does not move it), unless set below.
double bf16_dot_over_fma();

// Replaces this process's figure. The ranks of a job take rank 0's
// (comm/agree.h): --bf16-gemm auto then takes one path on every rank.
void set_bf16_dot_over_fma(double ratio);

}  // namespace dpt
