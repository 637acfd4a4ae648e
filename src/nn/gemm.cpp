#include "nn/gemm.h"

#include <cblas.h>
#include <omp.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include "core/dot_rate.h"
#include "core/error.h"
#include "core/gemm_peak.h"
#ifdef DPT_HAVE_ONEDNN
#include "nn/gemm_onednn.h"
#endif

namespace dpt {

namespace {

GemmBackend initial_backend() {
  const char* env = std::getenv("DPT_GEMM");
  return env && *env ? parse_gemm_backend(env) : default_gemm_backend();
}

std::atomic<GemmBackend>& backend_var() {
  static std::atomic<GemmBackend> b{initial_backend()};
  return b;
}

Bf16Gemm initial_bf16_gemm() {
  const char* env = std::getenv("DPT_BF16_GEMM");
  return env && *env ? parse_bf16_gemm(env) : Bf16Gemm::Auto;
}

std::atomic<Bf16Gemm>& bf16_gemm_var() {
  static std::atomic<Bf16Gemm> b{initial_bf16_gemm()};
  return b;
}

// Whether the setting widens bf16 products; amx: whether they would run on
// AMX tiles (the GEMMs where oneDNN has them; never the engine's own).
bool widens(bool amx) {
  switch (bf16_gemm_setting()) {
    case Bf16Gemm::Native: return false;
    case Bf16Gemm::Widened: return true;
    case Bf16Gemm::Auto: break;
  }
  return auto_widens_bf16_gemm(bf16_dot_over_fma(), amx);
}

// The time GEMM calls take, for the run summary's step budget: counted by
// the thread that calls outside any parallel region, or by thread 0 of one
// (attention's per-head products: its share, about the region's GEMM time
// when the heads are spread evenly). Nested calls (the widened bf16 path,
// gemm_bias's pre-filled path) count once. Two clock reads per call: a
// W-GPT step makes about 1,600 calls, 0.05% of the step.
std::atomic<int64_t> gemm_ns{0};
thread_local int gemm_depth = 0;

class GemmClock {
 public:
  GemmClock() : on_(gemm_depth++ == 0 && omp_get_thread_num() == 0) {
    if (on_) t0_ = std::chrono::steady_clock::now();
  }
  ~GemmClock() {
    --gemm_depth;
    if (on_)
      gemm_ns.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0_)
                            .count(),
                        std::memory_order_relaxed);
  }
  GemmClock(const GemmClock&) = delete;
  GemmClock& operator=(const GemmClock&) = delete;

 private:
  bool on_;
  std::chrono::steady_clock::time_point t0_;
};

CBLAS_TRANSPOSE cblas_op(Op op) { return op == Op::N ? CblasNoTrans : CblasTrans; }

// The [rows, cols] block of a row-major operand with leading dimension ld,
// widened to fp32 into dst (dense: ld = cols).
void widen(float* dst, const bf16* src, int64_t rows, int64_t cols, int64_t ld) {
  if (ld == cols) return convert(dst, src, static_cast<size_t>(rows * cols));  // the AVX-512 copy where there is one
  // On the engine's threads (serial when called from a parallel region).
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[r * cols + c] = to_f32(src[r * ld + c]);
}

// No bf16 kernel (or widened on purpose): both operands (as stored,
// transposed or not) widened into this thread's scratch for the fp32 path.
// Widening is exact, so the result is the fp32 GEMM of the bf16 values. The
// scratch only grows (resizing a vector up to a larger call's size would
// zero what the widening then overwrites).
struct Widened {
  const float* a;
  const float* b;
  int64_t lda, ldb;

  Widened(Op op_a, Op op_b, int64_t M, int64_t N, int64_t K, const bf16* A, int64_t lda_in, const bf16* B,
          int64_t ldb_in) {
    static thread_local std::vector<float> a32, b32;
    const int64_t a_rows = op_a == Op::N ? M : K, b_rows = op_b == Op::N ? K : N;
    lda = op_a == Op::N ? K : M;
    ldb = op_b == Op::N ? N : K;
    a = into(a32, A, a_rows, lda, lda_in);
    b = into(b32, B, b_rows, ldb, ldb_in);
  }

 private:
  static const float* into(std::vector<float>& dst, const bf16* src, int64_t rows, int64_t cols, int64_t ld) {
    if (dst.size() < static_cast<size_t>(rows * cols)) dst.resize(static_cast<size_t>(rows * cols));
    widen(dst.data(), src, rows, cols, ld);
    return dst.data();
  }
};

}  // namespace

GemmBackend default_gemm_backend() {
#ifdef DPT_HAVE_ONEDNN
  if (onednn::avx512()) return GemmBackend::OneDnn;
#endif
  return GemmBackend::OpenBlas;
}

GemmBackend parse_gemm_backend(const std::string& name) {
  if (name == "openblas") return GemmBackend::OpenBlas;
  if (name == "onednn") {
#ifndef DPT_HAVE_ONEDNN
    throw InputError("GEMM backend onednn: this dpt was built without oneDNN (-DDPT_ONEDNN=OFF)");
#endif
    return GemmBackend::OneDnn;
  }
  throw InputError(fmt::format("unknown GEMM backend '{}' (expected onednn or openblas)", name));
}

const char* gemm_backend_name(GemmBackend b) { return b == GemmBackend::OpenBlas ? "openblas" : "onednn"; }

Bf16Gemm parse_bf16_gemm(const std::string& name) {
  if (name == "auto") return Bf16Gemm::Auto;
  if (name == "native") return Bf16Gemm::Native;
  if (name == "widened") return Bf16Gemm::Widened;
  throw InputError(fmt::format("unknown bf16 GEMM mode '{}' (expected auto, native or widened)", name));
}

const char* bf16_gemm_name(Bf16Gemm b) {
  return b == Bf16Gemm::Native ? "native" : b == Bf16Gemm::Widened ? "widened" : "auto";
}

bool auto_widens_bf16_gemm(double dot_over_fma, bool amx) {
  // AMX's tiles outrun any fp32 GEMM; without them the dot products' rate
  // decides. 0.75 lies between the cores met so far (0.5 measured on
  // Emerald Rapids; about 2 on Zen 4 and 5, where bf16 GEMMs ran at twice
  // fp32's rate), and under it the fp32 GEMM's FLOP rate pays for widening
  // both operands.
  return !amx && dot_over_fma > 0 && dot_over_fma < 0.75;
}

Bf16Gemm bf16_gemm_setting() { return bf16_gemm_var().load(std::memory_order_relaxed); }
void set_bf16_gemm(Bf16Gemm b) { bf16_gemm_var().store(b, std::memory_order_relaxed); }

GemmBackend gemm_backend() { return backend_var().load(std::memory_order_relaxed); }
void set_gemm_backend(GemmBackend b) { backend_var().store(b, std::memory_order_relaxed); }

void gemm(Op op_a, Op op_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
          const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  DPT_CHECK(K > 0, "gemm with K = {}", K);
  const GemmClock clock;
#ifdef DPT_HAVE_ONEDNN
  if (gemm_backend() == GemmBackend::OneDnn) {
    onednn::matmul(op_a, op_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, false);
    return;
  }
#endif
  {
    cblas_sgemm(CblasRowMajor, cblas_op(op_a), cblas_op(op_b), static_cast<int>(M), static_cast<int>(N),
                static_cast<int>(K), alpha, A, static_cast<int>(lda), B, static_cast<int>(ldb), beta, C,
                static_cast<int>(ldc));
  }
}

void gemm(Op op_a, Op op_b, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A, int64_t lda,
          const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  DPT_CHECK(K > 0, "gemm with K = {}", K);
  const GemmClock clock;
#ifdef DPT_HAVE_ONEDNN
  if (gemm_bf16_native()) {
    onednn::matmul(op_a, op_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, true);
    return;
  }
#endif
  const Widened w(op_a, op_b, M, N, K, A, lda, B, ldb);
  gemm(op_a, op_b, M, N, K, alpha, w.a, w.lda, w.b, w.ldb, beta, C, ldc);
}

void gemm_widen(float* dst, const bf16* src, size_t n) {
  const GemmClock clock;
  convert(dst, src, n);
}

namespace {
template <typename T>
void gemm_bias_rows(Op op_a, Op op_b, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B,
                    int64_t ldb, const float* bias, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  const GemmClock clock;
  if constexpr (std::is_same_v<T, bf16>) {
    if (!gemm_bf16_native()) {  // widened: the fp32 path's bias handling too (oneDNN's fused bias)
      const Widened w(op_a, op_b, M, N, K, A, lda, B, ldb);
      return gemm_bias_rows(op_a, op_b, M, N, K, w.a, w.lda, w.b, w.ldb, bias, C, ldc);
    }
  }
#ifdef DPT_HAVE_ONEDNN
  if (std::is_same_v<T, bf16> || gemm_backend() == GemmBackend::OneDnn) {  // bf16 here: native
    DPT_CHECK(K > 0, "gemm with K = {}", K);
    onednn::matmul(op_a, op_b, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, ldc, std::is_same_v<T, bf16>, bias);
    return;
  }
#endif
#pragma omp parallel for schedule(static)
  for (int64_t m = 0; m < M; ++m) std::memcpy(C + m * ldc, bias, sizeof(float) * static_cast<size_t>(N));
  gemm(op_a, op_b, M, N, K, 1.0f, A, lda, B, ldb, 1.0f, C, ldc);
}
}  // namespace

void gemm_bias(Op op_a, Op op_b, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
               int64_t ldb, const float* bias, float* C, int64_t ldc) {
  gemm_bias_rows(op_a, op_b, M, N, K, A, lda, B, ldb, bias, C, ldc);
}

void gemm_bias(Op op_a, Op op_b, int64_t M, int64_t N, int64_t K, const bf16* A, int64_t lda, const bf16* B,
               int64_t ldb, const float* bias, float* C, int64_t ldc) {
  gemm_bias_rows(op_a, op_b, M, N, K, A, lda, B, ldb, bias, C, ldc);
}

double gemm_seconds() { return 1e-9 * static_cast<double>(gemm_ns.load(std::memory_order_relaxed)); }

#ifdef DPT_HAVE_ONEDNN
bool gemm_bf16_kernels() { return gemm_backend() == GemmBackend::OneDnn && onednn::bf16_supported(); }
GemmCacheStats gemm_cache_stats() { return onednn::stats(); }
#else
// Without oneDNN the backend is always OpenBLAS (parse refuses onednn): no
// native bf16 kernel, no primitive cache.
bool gemm_bf16_kernels() { return false; }
GemmCacheStats gemm_cache_stats() { return {}; }
#endif

bool bf16_dot_products_pay() { return !widens(false); }

bool gemm_bf16_native() {
#ifdef DPT_HAVE_ONEDNN
  static const bool amx = onednn::amx();
  return gemm_bf16_kernels() && !widens(amx);
#else
  return false;
#endif
}

std::string gemm_backend_detail() {
#ifdef DPT_HAVE_ONEDNN
  if (gemm_backend() == GemmBackend::OneDnn) {
    std::string bf16 = "bf16 via fp32";
    if (gemm_bf16_native())
      bf16 = "bf16 kernels";
    else if (gemm_bf16_kernels() && bf16_gemm_setting() == Bf16Gemm::Widened)
      bf16 = "bf16 widened to fp32 (--bf16-gemm widened)";
    else if (gemm_bf16_kernels())
      bf16 = fmt::format("bf16 widened to fp32: this CPU's AVX-512 BF16 dot products at {:.2f}x its fp32 FMA rate",
                         bf16_dot_over_fma());
    return onednn::describe(bf16);
  }
#endif
  return fmt::format("OpenBLAS ({} kernels)", blas_core());
}

double measure_gemm_gflops(DType inputs, double budget_s) {
  if (inputs == DType::BF16) {
    std::vector<bf16> a16, b16;
    return measure_gflops(
        [&](int n, const float* a, const float* b, float* c) {
          const size_t nn = static_cast<size_t>(n) * static_cast<size_t>(n);
          if (a16.size() != nn) {  // the untimed first run converts
            a16.resize(nn);
            b16.resize(nn);
            convert(a16.data(), a, nn);
            convert(b16.data(), b, nn);
          }
          gemm(Op::N, Op::T, n, n, n, 1.0f, a16.data(), n, b16.data(), n, 0.0f, c, n);
        },
        budget_s);
  }
  if (gemm_backend() == GemmBackend::OpenBlas) return measure_sgemm_gflops(budget_s);
  return measure_gflops(
      [](int n, const float* a, const float* b, float* c) {
        gemm(Op::N, Op::T, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
      },
      budget_s);
}

}  // namespace dpt
