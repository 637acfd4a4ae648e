// The engine's elementwise CPU kernels in two x86-64 levels, one binary.
//
// DPT_CPU_CLONES before a kernel's definition has GCC compile it twice: for
// the build's baseline (x86-64-v3: AVX2 and FMA, which every x86 server of
// the last decade has) and for x86-64-v4 (AVX-512), and pick the copy this
// CPU runs once, when the program loads (target_clones: an ifunc, so a call
// costs what any call into a shared library costs). Why: the GEMMs pick
// their kernels at run time (oneDNN), but GELU, LayerNorm, softmax, the bf16
// conversions and the optimizers' updates are compiled code; on an AVX-512
// CPU they were a quarter of a bf16 step, and the AVX-512 copies (twice the
// vector width, glibc's 16-wide expf) take that down while the same binary
// still runs where there is no AVX-512.
//
// The two copies may round differently where a loop's sum is reordered
// (the vector width sets the order): every rank of a run on one host takes
// the same copy, so strategies stay bitwise equal to each other there.
// A -DDPT_NATIVE=ON build compiles everything for its host alone (no
// clones); -DDPT_KERNEL_CLONES=OFF keeps only the baseline (to measure
// what the clones give).
#pragma once

#if defined(DPT_KERNEL_CLONES) && defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DPT_CPU_CLONES_ON 1
#define DPT_CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "default")))
#else
#define DPT_CPU_CLONES
#endif

namespace dpt {

// Which copy of the kernels this process runs: "x86-64-v4 (AVX-512)",
// "x86-64-v3 (AVX2)", or "native" for a -DDPT_NATIVE=ON build; from the
// same load-time dispatch the kernels use, so it names what ran.
const char* cpu_kernel_level();
// Whether this build holds the x86-64-v4 copies (DPT_CPU_CLONES is on).
bool cpu_kernels_cloned();

}  // namespace dpt
