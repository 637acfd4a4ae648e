#include "nn/flash_attention.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/cpu_level.h"
#include "core/error.h"
#include "nn/fast_exp.h"
#include "nn/gemm.h"

// AVX-512 BF16's vdpbf16ps, compiled for that target alone (no x86-64
// level includes it) and run where the CPU has it (flash_attention_dpbf16);
// GCC's target pragma and attribute, as core/cpu_level.h's clones.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
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
// values (FlashProducts::BF16) through vdpbf16ps on bf16 pairs (Dp), or
// through the fp32 path's products on the same values rounded to bf16 and
// kept in fp32 (Widen: what runs without AVX-512 BF16; the products of two
// bf16s are exact in fp32, so only the order of the sums differs from Dp's).
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

// The vdpbf16ps products (Mode::Dp). vdpbf16ps adds to each of 16 fp32
// lanes the products of a pair of bf16s (elements 2i and 2i + 1 of its
// operands, the low and high halves of 32-bit word i), so both operands
// hold pairs along the reduction: A(m, p), the 32-bit word of the pair
// (A(m, 2p), A(m, 2p + 1)), at A[m sam + p sak], broadcast; B's word p,
// column n at B[p ldb + n], 16 columns to a vector. k0, k1 count pairs.
typedef uint32_t w16 __attribute__((vector_size(64)));
typedef uint32_t w16u __attribute__((vector_size(64), aligned(4), may_alias));
typedef uint32_t word __attribute__((may_alias));
template <typename V>
struct Words;
template <>
struct Words<v16> {
  using type = w16;
  using unaligned = w16u;
};


// An fp32's bits rounded to bf16 in the top half (to nearest, ties to
// even; a NaN stays a quiet NaN), as core/dtype.h's to_bf16, but without
// its branch, so the loops of Mode::Widen vectorize.
inline uint32_t rounded_bits(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  return (u & 0x7fffffffu) > 0x7f800000u ? (u | 0x00400000u) : u + 0x7fffu + ((u >> 16) & 1u);
}
inline float bf16_value(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }
inline const word* words(const std::vector<uint16_t>& b) { return reinterpret_cast<const word*>(b.data()); }

// A head's rows are ld floats apart (a qkv row holds every head), a few
// cache lines each: in a training step, where a layer's activations come
// back from memory, the hardware prefetchers left the packing loops waiting
// on them (the kernels took 1.8-2x their time on cached data there).
// The loops ask for row r + kAhead of the n rows as they read (kWrite:
// write) row r.
constexpr int64_t kAhead = 8;
template <int kWrite = 0, typename T>
__attribute__((always_inline)) inline void prefetch_ahead(const T* x, int64_t ld, int64_t r, int64_t n, int64_t hd) {
  if (r + kAhead >= n) return;
  const T* row = x + (r + kAhead) * ld;
  for (int64_t c = 0; c < hd; c += 64 / static_cast<int64_t>(sizeof(T))) __builtin_prefetch(row + c, kWrite, 3);
  __builtin_prefetch(row + hd - 1, kWrite, 3);
}

#if defined(DPT_FLASH_DPBF16)
// Mode::Dp's packings, on AVX-512 BF16's own conversions: vcvtneps2bf16
// and vcvtne2ps2bf16 round to nearest even as rounded_bits does, except
// that a denormal input (below 1.2e-38: nothing a product of attention's
// values would show) becomes zero, 16 or 32 values an
// instruction; and the transposes in 16 x 16 blocks of words in registers.
// As scalar loops (rounded_bits and one store an element) the packings and
// the rounding of P and dS were a third of the bf16 backward's time at
// T 128 (perf). Compiled for AVX-512 BF16 alone: the tile kernels that call
// them are (flash_tiles.h's second copy).
#define DPT_DP_INLINE DPT_DPBF16_TARGET __attribute__((always_inline)) inline

// The lanes of [c, c + 16) below n.
DPT_DP_INLINE __mmask16 lanes_below(int64_t n, int64_t c) {
  return static_cast<__mmask16>((1u << std::clamp<int64_t>(n - c, 0, 16)) - 1u);
}
// x[c, c + 16), the lanes at or past n zero.
DPT_DP_INLINE __m512 load16(const float* x, int64_t c, int64_t n) {
  return _mm512_maskz_loadu_ps(lanes_below(n, c), x + c);
}
DPT_DP_INLINE __m256i bf16x16(__m512 x) { return reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x)); }
// bf16s back in fp32 (exact). (Zero-masked forms under an all-ones mask:
// the plain ones start from _mm512_undefined_epi32, which GCC 12 warns of.)
DPT_DP_INLINE __m512 widened16(__m256i b) {
  return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xffff, _mm512_maskz_cvtepu16_epi32(0xffff, b), 16));
}
// The 16 words of pairs (lo[j], hi[j]): lo's bf16 in the low half.
DPT_DP_INLINE __m512i pair_words16(__m512 lo, __m512 hi) {
  alignas(64) static constexpr uint16_t kZip[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                                    8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i halves = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));  // lo's 16, then hi's
  return _mm512_permutexvar_epi16(_mm512_load_si512(kZip), halves);
}

// Rows [0, n) of a head's slice (times scale) into dst [rows][hdp] bf16s
// (A of a product over channels); the padding zero.
DPT_DP_INLINE void pack_rows_dp(uint16_t* dst, const float* src, int64_t ld, int64_t n, int64_t rows, int64_t hd,
                                int64_t hdp, float scale) {
  const __m512 sc = _mm512_set1_ps(scale);
  for (int64_t r = 0; r < n; ++r) {
    prefetch_ahead(src, ld, r, n, hd);
    for (int64_t c = 0; c < hdp; c += 16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + r * hdp + c),
                          bf16x16(_mm512_mul_ps(load16(src + r * ld, c, hd), sc)));
  }
  std::fill(dst + n * hdp, dst + rows * hdp, uint16_t{0});
}

// The same rounded and kept in fp32 (V of the forward's P V).
DPT_DP_INLINE void pack_rows_rounded_dp(float* dst, const float* src, int64_t ld, int64_t n, int64_t rows,
                                        int64_t hd, int64_t hdp) {
  for (int64_t r = 0; r < n; ++r) {
    prefetch_ahead(src, ld, r, n, hd);
    for (int64_t c = 0; c < hdp; c += 16)
      _mm512_storeu_ps(dst + r * hdp + c, widened16(bf16x16(load16(src + r * ld, c, hd))));
  }
  std::fill(dst + n * hdp, dst + rows * hdp, 0.0f);
}

// Rows [0, n) into pairs of rows, [rows / 2][hdp] words (B of a product
// over rows or keys).
DPT_DP_INLINE void pack_row_pairs_dp(uint32_t* dst, const float* src, int64_t ld, int64_t n, int64_t rows,
                                     int64_t hd, int64_t hdp, float scale) {
  const __m512 sc = _mm512_set1_ps(scale);
  for (int64_t r = 0; r < rows; r += 2) {
    prefetch_ahead(src, ld, r, n, hd);
    prefetch_ahead(src, ld, r + 1, n, hd);
    for (int64_t c = 0; c < hdp; c += 16) {
      const __m512 lo = r < n ? load16(src + r * ld, c, hd) : _mm512_setzero_ps();
      const __m512 hi = r + 1 < n ? load16(src + (r + 1) * ld, c, hd) : _mm512_setzero_ps();
      _mm512_storeu_si512(dst + r / 2 * hdp + c, pair_words16(_mm512_mul_ps(lo, sc), _mm512_mul_ps(hi, sc)));
    }
  }
}

// 16 vectors of 16 words transposed in registers: x[i] word j -> x[j] word
// i (zero-masked forms as widened16's).
DPT_DP_INLINE void transpose16(__m512i* x) {
  constexpr __mmask16 k16 = 0xffff;
  constexpr __mmask8 k8 = 0xff;
  __m512i t[16], u[16];
  for (int i = 0; i < 16; i += 2) {  // words of row pairs
    t[i] = _mm512_maskz_unpacklo_epi32(k16, x[i], x[i + 1]);
    t[i + 1] = _mm512_maskz_unpackhi_epi32(k16, x[i], x[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // u[i + j] lane l: rows i .. i + 3 of word 4 l + j
    u[i] = _mm512_maskz_unpacklo_epi64(k8, t[i], t[i + 2]);
    u[i + 1] = _mm512_maskz_unpackhi_epi64(k8, t[i], t[i + 2]);
    u[i + 2] = _mm512_maskz_unpacklo_epi64(k8, t[i + 1], t[i + 3]);
    u[i + 3] = _mm512_maskz_unpackhi_epi64(k8, t[i + 1], t[i + 3]);
  }
  for (int j = 0; j < 4; ++j) {  // lanes gathered: rows 0 .. 15 of words j, 4 + j, 8 + j, 12 + j
    const __m512i a0 = _mm512_maskz_shuffle_i32x4(k16, u[j], u[4 + j], 0x88);
    const __m512i a1 = _mm512_maskz_shuffle_i32x4(k16, u[j], u[4 + j], 0xdd);
    const __m512i b0 = _mm512_maskz_shuffle_i32x4(k16, u[8 + j], u[12 + j], 0x88);
    const __m512i b1 = _mm512_maskz_shuffle_i32x4(k16, u[8 + j], u[12 + j], 0xdd);
    x[j] = _mm512_maskz_shuffle_i32x4(k16, a0, b0, 0x88);
    x[8 + j] = _mm512_maskz_shuffle_i32x4(k16, a0, b0, 0xdd);
    x[4 + j] = _mm512_maskz_shuffle_i32x4(k16, a1, b1, 0x88);
    x[12 + j] = _mm512_maskz_shuffle_i32x4(k16, a1, b1, 0xdd);
  }
}

// Rows [0, n) of a key tile transposed into pairs of channels, [hdp / 2]
// [kTile] words (B of a product over channels: K^T, V^T); keys n.. zero.
DPT_DP_INLINE void pack_channel_pairs_dp(uint32_t* dst, const float* src, int64_t ld, int64_t n, int64_t hd,
                                         int64_t hdp) {
  const int64_t pairs = hdp / 2;
  for (int64_t r0 = 0; r0 < kTile; r0 += 16)
    for (int64_t p0 = 0; p0 < pairs; p0 += 16) {
      __m512i x[16];  // row r0 + i's words p0.. (channels 2 p0 ..)
      for (int64_t i = 0; i < 16; ++i) {
        if (p0 == 0) prefetch_ahead(src, ld, r0 + i, n, hd);
        const float* row = src + (r0 + i) * ld;
        x[i] = r0 + i < n ? reinterpret_cast<__m512i>(
                                _mm512_cvtne2ps_pbh(load16(row, 2 * p0 + 16, hd), load16(row, 2 * p0, hd)))
                          : _mm512_setzero_si512();
      }
      transpose16(x);
      for (int64_t j = 0; j < std::min<int64_t>(16, pairs - p0); ++j)
        _mm512_storeu_si512(dst + (p0 + j) * kTile + r0, x[j]);
    }
}
#endif

// x itself (kRound false), or rounded to bf16 and kept in fp32.
template <bool kRound>
__attribute__((always_inline)) inline float as_products_read(float x) {
  if constexpr (kRound)
    return std::bit_cast<float>(rounded_bits(x) & 0xffff0000u);
  else
    return x;
}

// Rows [0, n) of a head's slice (hd channels at stride ld) into dst
// [rows][hdp], times `scale` (kRound: then rounded to bf16); the padding
// (channels hd.., rows n..rows) zero.
template <bool kRound = false>
__attribute__((always_inline)) inline void pack_rows(float* dst, const float* src, int64_t ld, int64_t n, int64_t rows,
                                                     int64_t hd, int64_t hdp, float scale) {
  for (int64_t r = 0; r < n; ++r) {
    prefetch_ahead(src, ld, r, n, hd);
    float* d = dst + r * hdp;
    for (int64_t c = 0; c < hd; ++c) d[c] = as_products_read<kRound>(src[r * ld + c] * scale);
    std::fill(d + hd, d + hdp, 0.0f);
  }
  std::fill(dst + n * hdp, dst + rows * hdp, 0.0f);
}

// Rows [0, n) of a head's slice transposed into dst [hd][kTile] (kRound:
// rounded to bf16), columns n.. zero.
template <bool kRound = false>
__attribute__((always_inline)) inline void pack_transposed(float* dst, const float* src, int64_t ld, int64_t n,
                                                           int64_t hd) {
  for (int64_t d = 0; d < hd; ++d) std::fill(dst + d * kTile + n, dst + (d + 1) * kTile, 0.0f);
  for (int64_t r = 0; r < n; ++r) {
    prefetch_ahead(src, ld, r, n, hd);
    for (int64_t d = 0; d < hd; ++d) dst[d * kTile + r] = as_products_read<kRound>(src[r * ld + d]);
  }
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
  std::vector<uint16_t> qb;       // bf16 products: Q row-major
  std::vector<uint32_t> kt2;      // K^T in pairs of channels
};

// Row reductions in kV running lanes over whole vectors (the columns past
// n masked), which vectorise: GCC keeps a plain float sum serial, in order,
// a chain of dependent adds, and leaves a loop's last partial vector to
// scalar code; with the products on vdpbf16ps those were most of the bf16
// forward's time. The lanes are then folded as a tree (4 levels, not a
// chain of 15). The bf16 paths use them; the fp32 path keeps its serial
// sums and so its bits. x is read up to n rounded up to kV (<= kTile).
__attribute__((always_inline)) inline float fold_max(float* part) {
  for (int64_t w = kV / 2; w >= 1; w /= 2)
    for (int64_t j = 0; j < w; ++j) part[j] = std::max(part[j], part[j + w]);
  return part[0];
}
__attribute__((always_inline)) inline float fold_sum(float* part) {
  for (int64_t w = kV / 2; w >= 1; w /= 2)
    for (int64_t j = 0; j < w; ++j) part[j] += part[j + w];
  return part[0];
}
// The largest of init and x[0, n).
__attribute__((always_inline)) inline float max_in_lanes(const float* x, int64_t n, float init) {
  float part[kV];
  std::fill(part, part + kV, init);
  for (int64_t c = 0; c < n; c += kV)
#pragma omp simd
    for (int64_t j = 0; j < kV; ++j)
      part[j] = std::max(part[j], c + j < n ? x[c + j] : -std::numeric_limits<float>::infinity());
  return fold_max(part);
}
// x[0, n) replaced by e^(x - mx) (and x[n, n rounded up) by 0); their sum.
__attribute__((always_inline)) inline float exp_sum_in_lanes(float* x, int64_t n, float mx) {
  float part[kV] = {};
  for (int64_t c = 0; c < n; c += kV)
#pragma omp simd
    for (int64_t j = 0; j < kV; ++j) {
      const float e = fast_exp(x[c + j] - mx);
      x[c + j] = c + j < n ? e : 0.0f;
      part[j] += x[c + j];
    }
  return fold_sum(part);
}

#if defined(DPT_FLASH_DPBF16)
// The same row reductions with the lanes in a register and the folds as
// shuffles (through memory, fold_max and fold_sum were a sixth of the bf16
// forward at T 128, perf): the same operations in the same order as the
// functions above, so the same bits. vmaxps(a, b) is a > b ? a : b, so
// std::max(x, y) is vmaxps(y, x), NaN and signed zeros included.
DPT_DP_INLINE float fold_max16(__m512 p) {
  const __m256 lo = _mm512_maskz_extractf32x8_ps(0xff, p, 0), hi = _mm512_maskz_extractf32x8_ps(0xff, p, 1);
  const __m256 a = _mm256_max_ps(hi, lo);
  const __m128 b = _mm_max_ps(_mm256_extractf128_ps(a, 1), _mm256_castps256_ps128(a));
  const __m128 c = _mm_max_ps(_mm_movehl_ps(b, b), b);
  return _mm_cvtss_f32(_mm_max_ss(_mm_movehdup_ps(c), c));
}
DPT_DP_INLINE float fold_sum16(__m512 p) {
  const __m256 lo = _mm512_maskz_extractf32x8_ps(0xff, p, 0), hi = _mm512_maskz_extractf32x8_ps(0xff, p, 1);
  const __m256 a = _mm256_add_ps(lo, hi);
  const __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  return _mm_cvtss_f32(_mm_add_ss(c, _mm_movehdup_ps(c)));
}
// fast_exp, 16 lanes: the same operations. (Here and above, zero-masked
// forms of intrinsics as in widened16.)
DPT_DP_INLINE __m512 fast_exp16(__m512 x) {
  const __m512 top = _mm512_set1_ps(80.0f), bottom = _mm512_set1_ps(-80.0f);
  x = _mm512_mask_mov_ps(x, _mm512_cmp_ps_mask(x, top, _CMP_GT_OQ), top);
  x = _mm512_mask_mov_ps(x, _mm512_cmp_ps_mask(x, bottom, _CMP_LT_OQ), bottom);
  const __m512 n = _mm512_maskz_roundscale_ps(0xffff, _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-0.693145751953125f), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(-1.428606765330187045e-06f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
  for (const float c : {1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f, 1.0f})
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
  const __m512i e = _mm512_add_epi32(_mm512_maskz_cvttps_epi32(0xffff, n), _mm512_set1_epi32(127));
  return _mm512_mul_ps(p, _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xffff, e, 23)));
}
DPT_DP_INLINE float max_in_lanes_dp(const float* x, int64_t n, float init) {
  __m512 part = _mm512_set1_ps(init);
  const __m512 none = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t c = 0; c < n; c += kV)
    part = _mm512_maskz_max_ps(0xffff, _mm512_mask_mov_ps(none, lanes_below(n, c), _mm512_loadu_ps(x + c)), part);
  return fold_max16(part);
}
DPT_DP_INLINE float exp_sum_in_lanes_dp(float* x, int64_t n, float mx) {
  __m512 part = _mm512_setzero_ps();
  for (int64_t c = 0; c < n; c += kV) {
    const __m512 e = _mm512_maskz_mov_ps(lanes_below(n, c),
                                         fast_exp16(_mm512_sub_ps(_mm512_loadu_ps(x + c), _mm512_set1_ps(mx))));
    _mm512_storeu_ps(x + c, e);
    part = _mm512_add_ps(part, e);
  }
  return fold_sum16(part);
}
#endif

// The query tile's rows [0, ni) from O / l into out and lse; merge as
// forward_tile_as's.
__attribute__((always_inline)) inline void finish_rows(const FlashBlock& s, float* out, float* lse, int64_t i0,
                                                       int64_t ni, bool merge, ForwardScratch& w) {
  const int64_t hd = s.hd, hdp = hd_padded(s);
  const float* O = w.o.data();
  for (int64_t r = 0; r < ni; ++r) {
    prefetch_ahead<1>(out + i0 * s.out_ld, s.out_ld, r, ni, hd);
    if (w.l[r] == 0.0f) continue;  // saw no key
    float* o = out + (i0 + r) * s.out_ld;
    const float inv = 1.0f / w.l[r], blk_lse = w.m[r] + std::log(w.l[r]);
    const float old = merge ? lse[i0 + r] : -std::numeric_limits<float>::infinity();  // written, not read, unmerged
    if (old == -std::numeric_limits<float>::infinity()) {
      for (int64_t d = 0; d < hd; ++d) o[d] = O[r * hdp + d] * inv;
      lse[i0 + r] = blk_lse;
      continue;
    }
    // L = log(e^old + e^blk), each part weighted by its share e^(part - L).
    const float hi = std::max(old, blk_lse), L = hi + std::log1p(std::exp(std::min(old, blk_lse) - hi));
    const float w_old = std::exp(old - L), w_blk = std::exp(blk_lse - L) * inv;
    for (int64_t d = 0; d < hd; ++d) o[d] = o[d] * w_old + O[r * hdp + d] * w_blk;
    lse[i0 + r] = L;
  }
}


struct BackScratch {
  std::vector<float> q, dout, dq, D, L;  // the head's, [Tp][hdp] and [Tp]
  std::vector<float> kt, vt, k, dk, dv;  // the key tile's
  std::vector<float> p, ds;              // the tile pair's
  // bf16 products: the head's Q (scaled) and dO row-major and in pairs of
  // rows; the key tile's K^T and V^T in pairs of channels, K in pairs of
  // rows; the tile pair's P and dS in pairs of rows, dS row-major too; each
  // query row's sum of dS's rounding (E) and key_bias_correction's sum.
  std::vector<uint16_t> qb, dob, dsb;
  std::vector<uint32_t> q2, do2, kt2, vt2, k2, pt2, dst2;
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
    for (auto* b : {&qb, &dob}) b->resize(static_cast<size_t>(Tp * hdp));
    for (auto* b : {&q2, &do2}) b->resize(static_cast<size_t>(Tp / 2 * hdp));
    for (auto* b : {&kt2, &vt2, &k2}) b->resize(static_cast<size_t>(kTile / 2 * hdp));
    for (auto* b : {&pt2, &dst2}) b->resize(static_cast<size_t>(kTile / 2 * kTile));
    dsb.resize(static_cast<size_t>(kTile * kTile));
    E.resize(static_cast<size_t>(Tp * kV));
    corr.resize(static_cast<size_t>(hdp));
  }
};

// Element i of the head's packed dO as the products read it (bf16 paths).
template <Mode M>
__attribute__((always_inline)) inline float dout_read(const BackScratch& w, int64_t i) {
  if constexpr (M == Mode::Widen)
    return w.dout[static_cast<size_t>(i)];
  else
    return bf16_value(w.dob[static_cast<size_t>(i)]);
}

// dst[0, n) = (add ? dst : 0) + src * scale (the bits of 0 + x: a -0
// becomes +0), the choice made once a row so that the loop vectorizes.
__attribute__((always_inline)) inline void add_row(float* __restrict dst, const float* __restrict src, int64_t n,
                                                   bool add, float scale = 1.0f) {
  if (add) {
#pragma omp simd
    for (int64_t d = 0; d < n; ++d) dst[d] += src[d] * scale;
  } else {
#pragma omp simd
    for (int64_t d = 0; d < n; ++d) dst[d] = 0.0f + src[d] * scale;
  }
}

// Key tile j0's dK and dV (w.dk, w.dv) into dk and dv: added (add) or
// written.
__attribute__((always_inline)) inline void write_key_tile(const FlashBlock& s, float* dk, float* dv, int64_t j0,
                                                          int64_t nj, bool add, BackScratch& w) {
  const int64_t hd = s.hd, hdp = hd_padded(s);
  for (int64_t c = 0; c < nj; ++c) {
    prefetch_ahead<1>(dk + j0 * s.kv_ld, s.kv_ld, c, nj, hd);
    prefetch_ahead<1>(dv + j0 * s.kv_ld, s.kv_ld, c, nj, hd);
    add_row(dk + (j0 + c) * s.kv_ld, w.dk.data() + c * hdp, hd, add);
    add_row(dv + (j0 + c) * s.kv_ld, w.dv.data() + c * hdp, hd, add);
  }
}

// dK's share of dS's bf16 rounding, taken back out. A softmax ignores a
// constant added to every score, so rowsum(dS) = 0 and the keys' gradients
// sum to zero in the key bias's direction: in fp32 that sum is rounding
// (about 1e-9 of the value bias's gradient), but rounding dS to bf16 leaves
// each row a residual E_r = rowsum(bf16(dS) - dS) and the keys' sum
// sum_r E_r q_r, bf16 noise (3e-6 of the value bias's gradient, measured)
// that AdamW would turn into lr-sized steps of the key bias
// (docs/precision.md). Each row's residual is spread evenly over the n_r
// keys of this block it sees: key c loses sum over the rows r that see it
// of E_r q_r / n_r (a suffix sum over the rows), which takes the whole
// sum_r E_r q_r back out and moves each key by bf16-rounding-sized amounts.
// w.qb (Widen: w.q) holds the head's (scaled, rounded) Q, w.E its rows'
// residuals.
template <Mode M>
__attribute__((always_inline)) inline void key_bias_correction(const FlashBlock& s, BackScratch& w, float* dk) {
  const int64_t Tq = s.Tq, Tk = s.Tk, delta = s.delta, hd = s.hd, hdp = hd_padded(s);
  float* acc = w.corr.data();
  std::fill(acc, acc + hd, 0.0f);
  int64_t r = Tq - 1;
  for (int64_t c = std::min(Tk, Tq + delta) - 1; c >= 0; --c) {
    for (; r >= 0 && r + delta >= c; --r) {  // the rows that see key c and not key c + 1
      const float e = fold_sum(w.E.data() + r * kV) / static_cast<float>(std::min(Tk, r + delta + 1));
      if constexpr (M == Mode::Widen) {
        const float* qr = w.q.data() + r * hdp;
#pragma omp simd
        for (int64_t d = 0; d < hd; ++d) acc[d] += e * qr[d];
      } else {
        const uint16_t* qr = w.qb.data() + r * hdp;
#pragma omp simd
        for (int64_t d = 0; d < hd; ++d) acc[d] += e * bf16_value(qr[d]);
      }
    }
    float* dkr = dk + c * s.kv_ld;
    for (int64_t d = 0; d < hd; ++d) dkr[d] -= acc[d];
  }
}

// The tile kernels: for the build's targets, and for AVX-512 BF16.
namespace tiles {
#include "nn/flash_tiles.h"
}  // namespace tiles
#if defined(DPT_FLASH_DPBF16)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512cd,avx512bf16,avx2,fma,bmi,bmi2,f16c,lzcnt,movbe")
namespace tiles_dp {
#include "nn/flash_tiles.h"
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
  return has && bf16_dot_products_pay() && !force_narrow.load(std::memory_order_relaxed) &&
         !force_no_dpbf16.load(std::memory_order_relaxed);
#else
  return false;
#endif
}

Mode mode_of(const FlashBlock& s) {
  if (s.products == FlashProducts::F32) return Mode::F32;
  return has_dpbf16() ? Mode::Dp : Mode::Widen;
}

// The rows [i0, i0 + ni) of one head's output (hd values each, ld apart)
// into its bf16 copy, while the tile has them in cache.
void copy_rows_bf16(bf16* out16, const float* out, int64_t i0, int64_t ni, int64_t hd, int64_t ld) {
  for (int64_t r = i0; r < i0 + ni; ++r) {
    prefetch_ahead<1>(out16 + i0 * ld, ld, r - i0, ni, hd);
    const float* o = out + r * ld;
    bf16* o16 = out16 + r * ld;
#pragma omp simd
    for (int64_t d = 0; d < hd; ++d) o16[d] = to_bf16(o[d]);
  }
}

// Forward over (sequence, head, query tile); merge as forward_tile's.
// out16 (never with merge; null: none): out's bf16 copy, each tile's rows
// converted as soon as the tile has written them.
void run_forward(const FlashBlock& s, float* out, bf16* out16, float* lse, bool merge) {
  check(s);
  DPT_CHECK(!(merge && out16), "flash attention writes a bf16 copy of its output only where it does not merge");
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
          bf16* o16 = out16 ? out16 + b * s.out_batch + h * s.hd : nullptr;
          const int64_t ni = std::min(kTile, s.Tq - i0);
          if (mode == Mode::F32)
            forward_tile(s, q, k, v, o, l, i0, ni, scale, wide, merge, w);
#if defined(DPT_FLASH_DPBF16)
          else if (mode == Mode::Dp)
            forward_tile_dp(s, q, k, v, o, l, i0, ni, scale, merge, w);
#endif
          else
            forward_tile_widen(s, q, k, v, o, l, i0, ni, scale, wide, merge, w);
          if (o16) copy_rows_bf16(o16, o, i0, ni, s.hd, s.out_ld);
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
                             int64_t hd, FlashProducts products, bf16* out16) {
  run_forward(whole_sequence(qkv, B, T, NH, NKV, hd, products), out, out16, lse, false);
}

void flash_attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                              int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t hd, FlashProducts products) {
  run_backward(whole_sequence(qkv, B, T, NH, NKV, hd, products), out, dout, lse, dqkv, dqkv + NH * hd,
               dqkv + (NH + NKV) * hd, false);
}

void flash_block_forward(const FlashBlock& blk, float* out, float* lse) { run_forward(blk, out, nullptr, lse, true); }

void flash_block_backward(const FlashBlock& blk, const float* out, const float* dout, const float* lse, float* dq,
                          float* dk, float* dv) {
  run_backward(blk, out, dout, lse, dq, dk, dv, true);
}

}  // namespace dpt
