// Which OpenBLAS kernels run our GEMMs, and getting the fast ones.
//
// OpenBLAS picks its kernels once, when the library loads, from the CPU it
// recognises. A release older than the CPU (Debian 12 ships OpenBLAS 0.3.21,
// which predates AMD Zen 5) does not recognise it and falls back to its AVX2
// (Haswell) kernels even when the CPU has AVX-512: on a Zen 5 core that is
// half the sgemm rate (108 against 200 GFLOP/s measured, docs/performance.md).
// OpenBLAS reads OPENBLAS_CORETYPE at load time only, so the fix has to
// happen before the process starts: dpt re-executes itself once with the
// variable set (prefer_avx512_blas). A value the user set is never changed.
#pragma once

#include <string>

namespace dpt {

// The kernel set OpenBLAS chose for this process ("Haswell", "SkylakeX", ...).
std::string blas_core();

// The kernel set to force, or "" to keep what OpenBLAS chose. Pure, for tests:
//   current    OpenBLAS's choice (any case)
//   avx512     the CPU and OS support AVX-512 F, CD, BW, DQ and VL
//   avx512bf16 ... and AVX-512 BF16
//   user_set   OPENBLAS_CORETYPE is already in the environment
// Forces "Cooperlake" (SkylakeX plus bf16 kernels) or "SkylakeX" only when
// OpenBLAS chose a kernel set without AVX-512 on a CPU that has it.
std::string better_blas_core(const std::string& current, bool avx512, bool avx512bf16, bool user_set);

// Called first thing in main(): when better_blas_core says so, sets
// OPENBLAS_CORETYPE and re-executes /proc/self/exe with the same arguments
// (same pid, so launchers do not notice). Returns normally when nothing is to
// be done or the exec fails (then the slower kernels run; nothing else changes).
// DPT_KEEP_BLAS_CORE=1 turns it off.
void prefer_avx512_blas(char** argv);

}  // namespace dpt
