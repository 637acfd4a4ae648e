#include "nn/flash_attention.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/cpu_level.h"
#include "core/dtype.h"
#include "core/error.h"
#include "nn/fast_exp.h"

// AVX-512 BF16's vdpbf16ps, compiled for that target alone (no x86-64
// level includes it) and run where the CPU has it (flash_attention_dpbf16).
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define DPT_FLASH_DPBF16 1
#define DPT_DPBF16_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512cd,avx512bf16,avx2,fma,bmi,bmi2,f16c,lzcnt,movbe")))
#endif

namespace dpt {

namespace {

// The tile products are small (64 x 64 x head dim): through the GEMM layer
// each is a library call whose fixed cost (oneDNN's primitive lookup,
// OpenBLAS's packing) was most of the kernel's time at T <= 512 (1.43x the
// unfused layer at T 128). They run here as register-blocked loops over
// GCC's vector extension, on operands packed into per-thread scratch padded
// with zeros to whole 16-float vectors, so no product has a ragged edge,
// and the causal mask is skipped a row block at a time rather than a tile
// at a time. The registers: with AVX-512 (the x86-64-v4 clone), 4 rows x 4
// vectors of 16 floats of accumulators; without it, 4 rows x 2 vectors of 8
// (a 16-float vector type there is lowered piece by piece through memory:
// 27-35x slower, measured).
typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4), may_alias));
typedef float v8 __attribute__((vector_size(32)));
typedef float v8u __attribute__((vector_size(32), aligned(4), may_alias));
template <typename V>
struct Unaligned;
template <>
struct Unaligned<v16> {
  using type = v16u;
};
template <>
struct Unaligned<v8> {
  using type = v8u;
};
constexpr int64_t kV = 16;  // floats per padded vector
constexpr int64_t kMR = 4;  // rows per register block
constexpr int64_t kTile = kFlashTile;

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

std::atomic<bool> force_narrow{false};
std::atomic<bool> force_no_dpbf16{false};

// How the tile products compute: fp32 (FlashProducts::F32); or on bf16
// values (FlashProducts::BF16) through vdpbf16ps (Dp) or through fp32 FMAs
// on the same values widened (Widen: what runs without AVX-512 BF16).
enum class Mode { F32, Widen, Dp };

// Whether this copy of the code runs 16-float vectors in registers: the
// x86-64-v4 clone, which the loader picks exactly on CPUs with these
// (core/cpu_level.h); without clones, what the build targets.
bool wide_vectors() {
  if (force_narrow.load(std::memory_order_relaxed)) return false;
#if defined(DPT_CPU_CLONES_ON)
  static const bool wide = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                           __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
                           __builtin_cpu_supports("avx512vl");
  return wide;
#elif defined(__AVX512F__)
  return true;
#else
  return false;
#endif
}

// C[m][0 .. NV vectors) (+)= sum over k in [k0, k1) of A(m, k) B[k][...],
// for the kMR rows m of a block; A(m, k) = A[m sam + k sak], so A may be
// read as stored (sak = 1) or transposed (sam = 1).
template <typename V, int NV>
__attribute__((always_inline)) inline void block(float* C, int64_t ldc, const float* A, int64_t sam, int64_t sak,
                                                 const float* B, int64_t ldb, int64_t k0, int64_t k1, bool acc) {
  using VU = typename Unaligned<V>::type;
  constexpr int64_t kL = sizeof(V) / sizeof(float);
  V c[kMR][NV];
#pragma GCC unroll 4
  for (int m = 0; m < kMR; ++m)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) c[m][v] = acc ? *reinterpret_cast<const VU*>(C + m * ldc + v * kL) : V{};
  for (int64_t k = k0; k < k1; ++k) {
    V b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) b[v] = *reinterpret_cast<const VU*>(B + k * ldb + v * kL);
#pragma GCC unroll 4
    for (int m = 0; m < kMR; ++m) {
      const float a = A[m * sam + k * sak];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) c[m][v] += a * b[v];
    }
  }
#pragma GCC unroll 4
  for (int m = 0; m < kMR; ++m)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) *reinterpret_cast<VU*>(C + m * ldc + v * kL) = c[m][v];
}

// The same over nv 16-float vectors of columns: four at a time in 16-float
// registers (wide), else one at a time in two 8-float ones.
__attribute__((always_inline)) inline void block_cols(bool wide, int64_t nv, float* C, int64_t ldc, const float* A,
                                                      int64_t sam, int64_t sak, const float* B, int64_t ldb,
                                                      int64_t k0, int64_t k1, bool acc) {
  if (!wide) {
    for (int64_t v0 = 0; v0 < nv; ++v0, C += kV, B += kV) block<v8, 2>(C, ldc, A, sam, sak, B, ldb, k0, k1, acc);
    return;
  }
  for (int64_t v0 = 0; v0 < nv; v0 += 4, C += 4 * kV, B += 4 * kV) switch (std::min<int64_t>(4, nv - v0)) {
      case 1: block<v16, 1>(C, ldc, A, sam, sak, B, ldb, k0, k1, acc); break;
      case 2: block<v16, 2>(C, ldc, A, sam, sak, B, ldb, k0, k1, acc); break;
      case 3: block<v16, 3>(C, ldc, A, sam, sak, B, ldb, k0, k1, acc); break;
      default: block<v16, 4>(C, ldc, A, sam, sak, B, ldb, k0, k1, acc); break;
    }
}

// The bf16 products. vdpbf16ps adds to each of 16 fp32 lanes the products
// of a pair of bf16s (elements 2i and 2i + 1 of its operands, the low and
// high halves of 32-bit word i), so both operands hold pairs along the
// reduction: A(m, p) is the 32-bit word of the pair (A(m, 2p), A(m, 2p + 1))
// at A[m lda + p], broadcast; B's word p, column n at B[p ldb + n], 16
// columns to a vector. k0, k1 count pairs. Without vdpbf16ps (Widen) the
// same words are widened to fp32 (a bf16 is the top half of an fp32) and
// multiplied with FMAs: each product of two bf16s is exact in fp32 either
// way; the sums may round differently.
typedef uint32_t w16 __attribute__((vector_size(64)));
typedef uint32_t w16u __attribute__((vector_size(64), aligned(4), may_alias));
typedef uint32_t w8 __attribute__((vector_size(32)));
typedef uint32_t w8u __attribute__((vector_size(32), aligned(4), may_alias));
typedef uint32_t word __attribute__((may_alias));
template <typename V>
struct Words;
template <>
struct Words<v16> {
  using type = w16;
  using unaligned = w16u;
};
template <>
struct Words<v8> {
  using type = w8;
  using unaligned = w8u;
};

inline float low_half(uint32_t w) { return std::bit_cast<float>(w << 16); }
inline float high_half(uint32_t w) { return std::bit_cast<float>(w & 0xffff0000u); }


inline uint16_t round_bf16(float x) { return to_bf16(x).bits; }
inline float bf16_value(uint16_t b) { return to_f32(bf16{b}); }
inline const word* words(const std::vector<uint16_t>& b) { return reinterpret_cast<const word*>(b.data()); }

// The bf16 packings, each rounding once: rows [0, n) of a head's slice
// (times scale) into dst [rows][hdp] (a row's channels in pairs: A of a
// product over channels) ...
__attribute__((always_inline)) inline void pack_rows_bf16(uint16_t* dst, const float* src, int64_t ld, int64_t n,
                                                          int64_t rows, int64_t hd, int64_t hdp, float scale) {
  for (int64_t r = 0; r < n; ++r) {
    uint16_t* d = dst + r * hdp;
    for (int64_t c = 0; c < hd; ++c) d[c] = round_bf16(src[r * ld + c] * scale);
    std::fill(d + hd, d + hdp, uint16_t{0});
  }
  std::fill(dst + n * hdp, dst + rows * hdp, uint16_t{0});
}

// ... into pairs of rows, [rows / 2][hdp] words (B of a product over rows
// or keys) ...
__attribute__((always_inline)) inline void pack_row_pairs_bf16(uint16_t* dst, const float* src, int64_t ld,
                                                               int64_t n, int64_t rows, int64_t hd, int64_t hdp,
                                                               float scale) {
  std::fill(dst, dst + rows * hdp, uint16_t{0});
  for (int64_t r = 0; r < n; ++r) {
    uint16_t* d = dst + (r / 2) * hdp * 2 + (r & 1);
    for (int64_t c = 0; c < hd; ++c) d[2 * c] = round_bf16(src[r * ld + c] * scale);
  }
}

// ... and transposed into pairs of channels, [hdp / 2][kTile] words (B of
// a product over channels: K^T, V^T).
__attribute__((always_inline)) inline void pack_channel_pairs_bf16(uint16_t* dst, const float* src, int64_t ld,
                                                                   int64_t n, int64_t hd, int64_t hdp) {
  std::fill(dst, dst + hdp * kTile, uint16_t{0});
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < hd; ++c) dst[((c / 2) * kTile + r) * 2 + (c & 1)] = round_bf16(src[r * ld + c]);
}

// Rows [0, n) of a head's slice (hd channels at stride ld) into dst
// [rows][hdp], times `scale`; the padding (channels hd.., rows n..rows)
// zero.
__attribute__((always_inline)) inline void pack_rows(float* dst, const float* src, int64_t ld, int64_t n, int64_t rows,
                                                     int64_t hd, int64_t hdp, float scale) {
  for (int64_t r = 0; r < n; ++r) {
    float* d = dst + r * hdp;
    for (int64_t c = 0; c < hd; ++c) d[c] = src[r * ld + c] * scale;
    std::fill(d + hd, d + hdp, 0.0f);
  }
  std::fill(dst + n * hdp, dst + rows * hdp, 0.0f);
}

// Rows [0, n) of a head's slice transposed into dst [hd][kTile], columns
// n.. zero.
__attribute__((always_inline)) inline void pack_transposed(float* dst, const float* src, int64_t ld, int64_t n,
                                                           int64_t hd) {
  for (int64_t d = 0; d < hd; ++d) std::fill(dst + d * kTile + n, dst + (d + 1) * kTile, 0.0f);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t d = 0; d < hd; ++d) dst[d * kTile + r] = src[r * ld + d];
}

// FlashBlock's layout, per head: the padded head width and the group size.
inline int64_t hd_padded(const FlashBlock& s) { return round_up(s.hd, kV); }
inline int64_t group_of(const FlashBlock& s) { return s.NH / s.NKV; }

// The keys a row block [r0, r0 + kMR) of query tile i0 sees in key tile j0
// of nj keys: up to and including its last row's position (query row r sees
// key c when r + delta >= c).
inline int64_t live_keys(int64_t i0, int64_t r0, int64_t delta, int64_t j0, int64_t nj) {
  return std::clamp<int64_t>(i0 + r0 + delta + kMR - j0, 0, nj);
}

// The keys of key tile j0 (nj keys) query row i sees: 0 .. nj.
inline int64_t live_row(int64_t i, int64_t delta, int64_t j0, int64_t nj) {
  return std::clamp<int64_t>(i + delta + 1 - j0, 0, nj);
}

struct ForwardScratch {
  std::vector<float> q, kt, v, s, o, m, l;
  std::vector<uint16_t> qb, kt2;  // bf16 products: Q row-major, K^T in pairs of channels
};


struct BackScratch {
  std::vector<float> q, dout, dq, D, L;  // the head's, [Tp][hdp] and [Tp]
  std::vector<float> kt, vt, k, dk, dv;  // the key tile's
  std::vector<float> p, ds;              // the tile pair's
  // bf16 products: the head's Q (scaled) and dO row-major and in pairs of
  // rows; the key tile's K^T and V^T in pairs of channels, K in pairs of
  // rows; the tile pair's P and dS row-major and transposed; each query
  // row's sum of dS's rounding (E) and the key-bias correction's running sum.
  std::vector<uint16_t> qb, q2, dob, do2, kt2, vt2, k2, pb, pt, dsb, dst;
  std::vector<float> E, corr;
  // Sized for Tp padded positions of hd (padded: hdp) channels; grows once.
  void size(int64_t Tp, int64_t hd, int64_t hdp) {
    for (auto* b : {&q, &dout, &dq}) b->resize(static_cast<size_t>(Tp * hdp));
    for (auto* b : {&D, &L}) b->resize(static_cast<size_t>(Tp));
    for (auto* b : {&kt, &vt}) b->resize(static_cast<size_t>(hd * kTile));
    for (auto* b : {&k, &dk, &dv}) b->resize(static_cast<size_t>(kTile * hdp));
    for (auto* b : {&p, &ds}) b->resize(static_cast<size_t>(kTile * kTile));
  }
  void size_bf16(int64_t Tp, int64_t hdp) {
    for (auto* b : {&qb, &q2, &dob, &do2}) b->resize(static_cast<size_t>(Tp * hdp));
    for (auto* b : {&kt2, &vt2, &k2}) b->resize(static_cast<size_t>(kTile * hdp));
    for (auto* b : {&pb, &pt, &dsb, &dst}) b->resize(static_cast<size_t>(kTile * kTile));
    E.resize(static_cast<size_t>(Tp));
    corr.resize(static_cast<size_t>(hdp));
  }
};

// dK's share of dS's bf16 rounding, taken back out. A softmax ignores a
// constant added to every score, so rowsum(dS) = 0 and the keys' gradients
// sum to zero in the key bias's direction: in fp32 that sum is rounding
// (about 1e-9 of the value bias's gradient), but rounding dS to bf16 leaves
// each row a residual E_r = rowsum(bf16(dS) - dS) and the keys' sum
// sum_r E_r q_r, bf16 noise that AdamW would turn into lr-sized steps of the
// key bias (docs/precision.md). Each row's residual is spread evenly over the
// n_r keys of this block it sees: key c loses sum over the rows r that see
// it of E_r q_r / n_r (a suffix sum over the rows), which takes the whole
// sum_r E_r q_r back out and moves each key by bf16-rounding-sized amounts.
// w.qb holds the head's (scaled, rounded) Q, w.E its rows' residuals.
__attribute__((always_inline)) inline void key_bias_correction(const FlashBlock& s, BackScratch& w, float* dk,
                                                               int64_t hd, int64_t hdp) {
  const int64_t Tq = s.Tq, Tk = s.Tk, delta = s.delta;
  float* acc = w.corr.data();
  std::fill(acc, acc + hd, 0.0f);
  int64_t r = Tq - 1;
  for (int64_t c = std::min(Tk, Tq + delta) - 1; c >= 0; --c) {
    for (; r >= 0 && r + delta >= c; --r) {  // the rows that see key c and not key c + 1
      const float e = w.E[static_cast<size_t>(r)] / static_cast<float>(std::min(Tk, r + delta + 1));
      const uint16_t* qr = w.qb.data() + r * hdp;
      for (int64_t d = 0; d < hd; ++d) acc[d] += e * bf16_value(qr[d]);
    }
    float* dkr = dk + c * s.kv_ld;
    for (int64_t d = 0; d < hd; ++d) dkr[d] -= acc[d];
  }
}


// The tile kernels: for the build's targets, and for AVX-512 BF16.
namespace tiles {
#include "nn/flash_tiles.inc"
}  // namespace tiles
#if defined(DPT_FLASH_DPBF16)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512cd,avx512bf16,avx2,fma,bmi,bmi2,f16c,lzcnt,movbe")
namespace tiles_dp {
#include "nn/flash_tiles.inc"
}  // namespace tiles_dp
#pragma GCC pop_options
#endif

DPT_CPU_CLONES void forward_tile(const FlashBlock& s, const float* q, const float* k, const float* v, float* out,
                                 float* lse, int64_t i0, int64_t ni, float scale, bool wide, bool merge,
                                 ForwardScratch& w) {
  tiles::forward_tile_as<Mode::F32>(s, q, k, v, out, lse, i0, ni, scale, wide, merge, w);
}
DPT_CPU_CLONES void forward_tile_widen(const FlashBlock& s, const float* q, const float* k, const float* v,
                                       float* out, float* lse, int64_t i0, int64_t ni, float scale, bool wide,
                                       bool merge, ForwardScratch& w) {
  tiles::forward_tile_as<Mode::Widen>(s, q, k, v, out, lse, i0, ni, scale, wide, merge, w);
}
#if defined(DPT_FLASH_DPBF16)
DPT_DPBF16_TARGET void forward_tile_dp(const FlashBlock& s, const float* q, const float* k, const float* v,
                                       float* out, float* lse, int64_t i0, int64_t ni, float scale, bool merge,
                                       ForwardScratch& w) {
  tiles_dp::forward_tile_as<Mode::Dp>(s, q, k, v, out, lse, i0, ni, scale, true, merge, w);
}
#endif

DPT_CPU_CLONES void backward_group(const FlashBlock& s, const float* q, const float* k, const float* v,
                                   const float* dout, const float* out, const float* lse, float* dq, float* dk,
                                   float* dv, int64_t g, float scale, bool wide, bool accumulate, BackScratch& w) {
  tiles::backward_group_as<Mode::F32>(s, q, k, v, dout, out, lse, dq, dk, dv, g, scale, wide, accumulate, w);
}
DPT_CPU_CLONES void backward_group_widen(const FlashBlock& s, const float* q, const float* k, const float* v,
                                         const float* dout, const float* out, const float* lse, float* dq, float* dk,
                                         float* dv, int64_t g, float scale, bool wide, bool accumulate,
                                         BackScratch& w) {
  tiles::backward_group_as<Mode::Widen>(s, q, k, v, dout, out, lse, dq, dk, dv, g, scale, wide, accumulate, w);
}
#if defined(DPT_FLASH_DPBF16)
DPT_DPBF16_TARGET void backward_group_dp(const FlashBlock& s, const float* q, const float* k, const float* v,
                                         const float* dout, const float* out, const float* lse, float* dq, float* dk,
                                         float* dv, int64_t g, float scale, bool accumulate, BackScratch& w) {
  tiles_dp::backward_group_as<Mode::Dp>(s, q, k, v, dout, out, lse, dq, dk, dv, g, scale, true, accumulate, w);
}
#endif

// The whole-sequence layout of flash_attention_*: qkv rows, delta 0.
FlashBlock whole_sequence(const float* qkv, int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t hd,
                          FlashProducts products) {
  const int64_t ld = (NH + 2 * NKV) * hd;
  FlashBlock s{};
  s.B = B, s.NH = NH, s.NKV = NKV, s.hd = hd, s.Tq = T, s.Tk = T, s.delta = 0;
  s.q = qkv, s.q_ld = ld, s.q_batch = T * ld;
  s.k = qkv + NH * hd, s.v = qkv + (NH + NKV) * hd, s.kv_ld = ld, s.kv_batch = T * ld;
  s.out_ld = NH * hd, s.out_batch = T * NH * hd, s.lse_T = T;
  s.products = products;
  return s;
}

void check(const FlashBlock& s) {
  DPT_CHECK(s.B >= 0 && s.Tq >= 0 && s.Tk >= 0 && s.hd > 0 && s.NKV > 0 && s.NH % s.NKV == 0 && s.delta >= 0,
            "flash attention needs a positive head size, query heads a multiple of the key/value heads and a "
            "delta >= 0 (got hd {}, {} / {} heads, delta {})",
            s.hd, s.NH, s.NKV, s.delta);
}

bool has_dpbf16() {
#if defined(DPT_FLASH_DPBF16)
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
  return has && !force_narrow.load(std::memory_order_relaxed) && !force_no_dpbf16.load(std::memory_order_relaxed);
#else
  return false;
#endif
}

Mode mode_of(const FlashBlock& s) {
  if (s.products == FlashProducts::F32) return Mode::F32;
  return has_dpbf16() ? Mode::Dp : Mode::Widen;
}

// Forward over (sequence, head, query tile); merge as forward_tile's.
void run_forward(const FlashBlock& s, float* out, float* lse, bool merge) {
  check(s);
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.hd));
  const bool wide = wide_vectors();
  const Mode mode = mode_of(s);
  const int64_t tiles = (s.Tq + kTile - 1) / kTile;
#pragma omp parallel
  {
    static thread_local ForwardScratch w;
    // Later query tiles see more keys: handed out one at a time.
#pragma omp for collapse(3) schedule(dynamic, 1)
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t h = 0; h < s.NH; ++h)
        for (int64_t i = 0; i < tiles; ++i) {
          const int64_t g = h / group_of(s), i0 = i * kTile, kv = b * s.kv_batch + g * s.hd;
          const float *q = s.q + b * s.q_batch + h * s.hd, *k = s.k + kv, *v = s.v + kv;
          float *o = out + b * s.out_batch + h * s.hd, *l = lse + (b * s.NH + h) * s.lse_T;
          const int64_t ni = std::min(kTile, s.Tq - i0);
          if (mode == Mode::F32)
            forward_tile(s, q, k, v, o, l, i0, ni, scale, wide, merge, w);
#if defined(DPT_FLASH_DPBF16)
          else if (mode == Mode::Dp)
            forward_tile_dp(s, q, k, v, o, l, i0, ni, scale, merge, w);
#endif
          else
            forward_tile_widen(s, q, k, v, o, l, i0, ni, scale, wide, merge, w);
        }
  }
}

// Backward over (sequence, key/value head); accumulate as backward_group's.
void run_backward(const FlashBlock& s, const float* out, const float* dout, const float* lse, float* dq, float* dk,
                  float* dv, bool accumulate) {
  check(s);
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.hd));
  const bool wide = wide_vectors();
  const Mode mode = mode_of(s);
#pragma omp parallel
  {
    static thread_local BackScratch w;
#pragma omp for collapse(2) schedule(static)
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t g = 0; g < s.NKV; ++g) {
        const int64_t qb = b * s.q_batch, kvb = b * s.kv_batch, ob = b * s.out_batch;
        const float *q = s.q + qb, *k = s.k + kvb, *v = s.v + kvb, *l = lse + b * s.NH * s.lse_T;
        if (mode == Mode::F32)
          backward_group(s, q, k, v, dout + ob, out + ob, l, dq + qb, dk + kvb, dv + kvb, g, scale, wide, accumulate,
                         w);
#if defined(DPT_FLASH_DPBF16)
        else if (mode == Mode::Dp)
          backward_group_dp(s, q, k, v, dout + ob, out + ob, l, dq + qb, dk + kvb, dv + kvb, g, scale, accumulate, w);
#endif
        else
          backward_group_widen(s, q, k, v, dout + ob, out + ob, l, dq + qb, dk + kvb, dv + kvb, g, scale, wide,
                               accumulate, w);
      }
  }
}

}  // namespace

void set_flash_attention_narrow_for_testing(bool on) { force_narrow.store(on); }
void set_flash_attention_no_dpbf16_for_testing(bool on) { force_no_dpbf16.store(on); }
bool flash_attention_dpbf16() { return has_dpbf16(); }

void flash_attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                             int64_t hd, FlashProducts products) {
  run_forward(whole_sequence(qkv, B, T, NH, NKV, hd, products), out, lse, false);
}

void flash_attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                              int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t hd, FlashProducts products) {
  run_backward(whole_sequence(qkv, B, T, NH, NKV, hd, products), out, dout, lse, dqkv, dqkv + NH * hd,
               dqkv + (NH + NKV) * hd, false);
}

void flash_block_forward(const FlashBlock& blk, float* out, float* lse) { run_forward(blk, out, lse, true); }

void flash_block_backward(const FlashBlock& blk, const float* out, const float* dout, const float* lse, float* dq,
                          float* dk, float* dv) {
  run_backward(blk, out, dout, lse, dq, dk, dv, true);
}

}  // namespace dpt
