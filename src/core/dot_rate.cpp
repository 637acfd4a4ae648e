#include "core/dot_rate.h"

#include <algorithm>
#include <atomic>
#include <chrono>

namespace dpt {

namespace {

#if defined(__x86_64__) && defined(__GNUC__)
// Twelve independent accumulators, each instruction of the loop reading the
// same two sources: enough in flight to cover either instruction's latency
// on the cores above, so the loop runs at the issue rate. Written in
// assembly so the compiler neither folds nor reorders the work. These two
// functions are the only AVX-512 code outside the kernels' clones besides
// the bf16 kernels (tests/test_cpu_level.cpp), and run only where the CPU
// has AVX-512 BF16.
#define DPT_TWELVE(op)                                                                                    \
  op " %%zmm30, %%zmm31, %%zmm0\n\t" op " %%zmm30, %%zmm31, %%zmm1\n\t" op " %%zmm30, %%zmm31, %%zmm2\n\t" \
  op " %%zmm30, %%zmm31, %%zmm3\n\t" op " %%zmm30, %%zmm31, %%zmm4\n\t" op " %%zmm30, %%zmm31, %%zmm5\n\t" \
  op " %%zmm30, %%zmm31, %%zmm6\n\t" op " %%zmm30, %%zmm31, %%zmm7\n\t" op " %%zmm30, %%zmm31, %%zmm8\n\t" \
  op " %%zmm30, %%zmm31, %%zmm9\n\t" op " %%zmm30, %%zmm31, %%zmm10\n\t" op " %%zmm30, %%zmm31, %%zmm11\n\t"

// Zeroed first: the loops then add products of zeros, so no denormal or
// infinity slows either one.
#define DPT_ZERO_ALL                                                                                         \
  "vpxord %%zmm0, %%zmm0, %%zmm0\n\tvmovaps %%zmm0, %%zmm1\n\tvmovaps %%zmm0, %%zmm2\n\tvmovaps %%zmm0, "     \
  "%%zmm3\n\tvmovaps %%zmm0, %%zmm4\n\tvmovaps %%zmm0, %%zmm5\n\tvmovaps %%zmm0, %%zmm6\n\tvmovaps %%zmm0, " \
  "%%zmm7\n\tvmovaps %%zmm0, %%zmm8\n\tvmovaps %%zmm0, %%zmm9\n\tvmovaps %%zmm0, %%zmm10\n\tvmovaps %%zmm0, " \
  "%%zmm11\n\tvmovaps %%zmm0, %%zmm30\n\tvmovaps %%zmm0, %%zmm31\n\t"

#define DPT_CLOBBERS                                                                                          \
  "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm30", \
      "xmm31"

__attribute__((target("avx512f"))) void dot_rate_probe_fma(long iters) {
  asm volatile(DPT_ZERO_ALL ::: DPT_CLOBBERS);
  for (long i = 0; i < iters; ++i) asm volatile(DPT_TWELVE("vfmadd231ps")::: DPT_CLOBBERS);
  asm volatile("vzeroupper" ::: "memory");
}

__attribute__((target("avx512f,avx512bf16"))) void dot_rate_probe_dpbf16(long iters) {
  asm volatile(DPT_ZERO_ALL ::: DPT_CLOBBERS);
  for (long i = 0; i < iters; ++i) asm volatile(DPT_TWELVE("vdpbf16ps")::: DPT_CLOBBERS);
  asm volatile("vzeroupper" ::: "memory");
}

template <class F>
double seconds(F f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double measure() {
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bf16")) return 0.0;
  // 4,000 iterations: 48,000 instructions, 25-100 us of either loop.
  constexpr long kIters = 4000;
  double fma = 1e9, dot = 1e9;
  dot_rate_probe_fma(kIters);  // wake the 512-bit units first
  for (int round = 0; round < 21; ++round) {
    fma = std::min(fma, seconds([] { dot_rate_probe_fma(kIters); }));
    dot = std::min(dot, seconds([] { dot_rate_probe_dpbf16(kIters); }));
  }
  // Per instruction a dot product is 64 FLOPs (32 lanes' pairs), an FMA 32.
  return (64.0 / dot) / (32.0 / fma);
}
#else
double measure() { return 0.0; }
#endif

// Measured at the first read or set (set_bf16_dot_over_fma may replace it).
std::atomic<double>& ratio_var() {
  static std::atomic<double> ratio{measure()};
  return ratio;
}

}  // namespace

double bf16_dot_over_fma() { return ratio_var().load(std::memory_order_relaxed); }
void set_bf16_dot_over_fma(double ratio) { ratio_var().store(ratio, std::memory_order_relaxed); }

}  // namespace dpt
