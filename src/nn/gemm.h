// The one matrix multiply every layer calls (linear, attention), on one of two
// backends chosen at run time:
//   OpenBLAS  cblas_sgemm (bf16 inputs are widened to fp32 first)
//   oneDNN    matmul primitives, created once per shape and cached
//
// Row-major, BLAS conventions:
//   C[M, N] = alpha * op(A) @ op(B) + beta * C
//   op(A) is [M, K]: A itself (Op::N, stored [M, K], row stride lda) or A^T
//   (Op::T, stored [K, M]); likewise op(B) is [K, N], stored [K, N] or [N, K].
// Leading dimensions may exceed the row length, so operands can be sub-blocks
// of the engine's flat buffers (a column block of dout: ld = OC; one head of
// qkv: ld = 3C) and nothing is copied. beta = 1 accumulates into C; beta = 0
// overwrites it (C's old contents, even NaN, are ignored, as in BLAS).
//
// bf16: A and B in bf16, C in fp32, products accumulated in fp32 (the mixed
// precision of the next step of issue 9). oneDNN computes it natively on CPUs
// with AVX512-BF16 or AMX; elsewhere (and on OpenBLAS, which Debian builds
// without sbgemm) both operands are widened into per-thread fp32 scratch and
// the fp32 path runs (widening is exact: an fp32 GEMM of the bf16 values, no
// speed-up). The widened path also runs where the CPU has bf16 kernels that
// are slower than its fp32 ones (set_bf16_gemm below). gemm_bf16_native()
// says which.
//
// Threads: a call outside a parallel region uses the engine's pool
// (set_threads); a call from inside an `omp parallel` region (attention runs
// one (batch, head) pair per thread) runs on the calling thread alone, on
// both backends. Results are deterministic for a given thread count.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace dpt {

enum class Op { N, T };  // an operand as stored, or its transpose

enum class GemmBackend { OpenBlas, OneDnn };
// The faster on this CPU (docs/performance.md, "The GEMM layer"): oneDNN
// where it runs AVX-512 kernels (1.7-1.9x OpenBLAS's fp32, and native bf16
// with AVX512-BF16), OpenBLAS on AVX2-only CPUs, where oneDNN 2.6's fp32
// kernels lose on transposed-A products (the weight gradients).
GemmBackend default_gemm_backend();

// "openblas" / "onednn" <-> the enum; parse throws InputError on anything else.
GemmBackend parse_gemm_backend(const std::string& name);
const char* gemm_backend_name(GemmBackend b);
// The backend in use, process-wide. Starts as DPT_GEMM from the environment
// if set (tests run whole programs under each backend that way), else
// default_gemm_backend().
GemmBackend gemm_backend();
void set_gemm_backend(GemmBackend b);

void gemm(Op op_a, Op op_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
          const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
void gemm(Op op_a, Op op_b, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A, int64_t lda,
          const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc);

// dst[0, n) = the n bf16 values of src widened to fp32, timed as GEMM work
// (gemm_seconds): what the widened path does to its operands, for a caller
// that widens an operand once for several GEMMs (nn/linear.cpp).
void gemm_widen(float* dst, const bf16* src, size_t n);

// C = op(A) op(B) + bias, the bias (N values) added to every row of C; C's
// old contents are not read. oneDNN adds the bias as it writes C; OpenBLAS
// gets C pre-filled with the bias and beta = 1 (one more pass over C).
void gemm_bias(Op op_a, Op op_b, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
               int64_t ldb, const float* bias, float* C, int64_t ldc);
void gemm_bias(Op op_a, Op op_b, int64_t M, int64_t N, int64_t K, const bf16* A, int64_t lda, const bf16* B,
               int64_t ldb, const float* bias, float* C, int64_t ldc);

// Seconds spent in gemm and gemm_bias calls since the process started, by
// the calling thread outside parallel regions and thread 0 inside them (so
// at one thread all of it; at several, about the wall time of the GEMMs):
// the step budget's GEMM time (train/step.cpp takes the difference over a
// step).
double gemm_seconds();

// How bf16 GEMMs run where oneDNN has bf16 kernels for this CPU:
//   native   on those kernels
//   widened  as the fp32 GEMM of the widened values (exact widening, fp32
//            FMAs; the products are the same, their sums' order is oneDNN's
//            fp32 kernel's)
//   auto     widened where the CPU has no AMX and its AVX-512 BF16 dot
//            products run under 0.75 of its fp32 FMAs' FLOP rate
//            (core/dot_rate.h: 0.5 on Intel's Sapphire and Emerald Rapids
//            with AMX hidden, where widened W-GPT bf16 runs 1.4-1.5x
//            faster), native elsewhere
// Process-wide; starts as DPT_BF16_GEMM from the environment if set, else
// auto. Every rank of a run on one host measures the same core, so they
// choose alike. Where oneDNN has no bf16 kernels (or the backend is
// OpenBLAS) bf16 GEMMs are widened whatever the setting.
enum class Bf16Gemm { Auto, Native, Widened };
// "auto" / "native" / "widened" <-> the enum; parse throws InputError on
// anything else.
Bf16Gemm parse_bf16_gemm(const std::string& name);
const char* bf16_gemm_name(Bf16Gemm b);
Bf16Gemm bf16_gemm_setting();
void set_bf16_gemm(Bf16Gemm b);
// auto's rule: widen where a core without AMX runs AVX-512 BF16 dot products
// (dot_over_fma > 0) at under 0.75 of its fp32 FMAs' FLOP rate.
bool auto_widens_bf16_gemm(double dot_over_fma, bool amx);
// The same setting for the engine's own bf16 products (the fused attention's
// tiles, nn/flash_attention.h), which have no AMX path: whether to run them
// on vdpbf16ps (native; auto: where dot products run at 0.75 of the FMAs'
// rate or more) or as fp32 FMAs on the bf16 values (widened). The CPU must
// have AVX-512 BF16 for the first either way.
bool bf16_dot_products_pay();

// Whether bf16 GEMMs on the current backend run on bf16 kernels (oneDNN on a
// CPU that has them, unless the setting above widens them) rather than
// through fp32 scratch.
bool gemm_bf16_native();
// Whether oneDNN has bf16 kernels for this CPU (what --bf16-gemm native
// needs), on the current backend.
bool gemm_bf16_kernels();

// The backend and what it runs, for reports: "OpenBLAS 0.3.21 (Haswell
// kernels)", "oneDNN 2.6.3 (avx2, bf16 via fp32)", "oneDNN 2.6.3
// (avx512_core_bf16, bf16 widened to fp32: this CPU's AVX-512 BF16 dot
// products at 0.49x its fp32 FMA rate)".
std::string gemm_backend_detail();

// GFLOP/s of a 1024^3 GEMM with fp32 (or bf16) inputs on the current backend
// and thread count: the peak that model FLOP utilisation is reported against
// (a bf16 run against the bf16 peak: on a CPU with bf16 kernels about twice
// the fp32 one; elsewhere the widened, slower path the run also takes).
// budget_s: core/gemm_peak.h's (more runs, a truer best).
double measure_gemm_gflops(DType inputs = DType::F32, double budget_s = 0.0);

// oneDNN primitive cache, summed over threads: primitives created (one per
// distinct shape, strides, transposes, dtype, alpha, beta, thread count and
// thread) and calls served from the cache. After the first training step the
// first stops growing (tests/test_gemm.cpp checks it).
struct GemmCacheStats {
  int64_t created = 0, hits = 0;
};
GemmCacheStats gemm_cache_stats();

}  // namespace dpt
