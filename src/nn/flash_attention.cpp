#include "nn/flash_attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/cpu_level.h"
#include "core/error.h"
#include "nn/fast_exp.h"

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
};

// One query tile [i0, i0 + ni) of one head (q, out: the head's slices of
// one sequence; k, v: its key/value head's) against every key tile it sees,
// into out's rows and lse's (lse: the head's row 0). merge: (out, lse) hold
// an earlier partial result (lse -inf: none) and get the union; else they
// are written. A row that sees no key is left as it was.
DPT_CPU_CLONES void forward_tile(const FlashBlock& s, const float* q, const float* k, const float* v, float* out,
                                 float* lse, int64_t i0, int64_t ni, float scale, bool wide, bool merge,
                                 ForwardScratch& w) {
  const int64_t hd = s.hd, hdp = hd_padded(s), nv = hdp / kV, delta = s.delta;
  w.q.resize(static_cast<size_t>(kTile * hdp));
  w.kt.resize(static_cast<size_t>(hd * kTile));
  w.v.resize(static_cast<size_t>(kTile * hdp));
  w.s.resize(static_cast<size_t>(kTile * kTile));
  w.o.assign(static_cast<size_t>(kTile * hdp), 0.0f);
  w.m.assign(static_cast<size_t>(kTile), -std::numeric_limits<float>::infinity());
  w.l.assign(static_cast<size_t>(kTile), 0.0f);
  float *Q = w.q.data(), *Kt = w.kt.data(), *V = w.v.data(), *S = w.s.data(), *O = w.o.data();
  pack_rows(Q, q + i0 * s.q_ld, s.q_ld, ni, kTile, hd, hdp, scale);
  const int64_t nip = round_up(ni, kMR), key_end = std::min(s.Tk, i0 + ni + delta);
  for (int64_t j0 = 0; j0 < key_end; j0 += kTile) {
    const int64_t nj = std::min(kTile, s.Tk - j0);
    pack_transposed(Kt, k + j0 * s.kv_ld, s.kv_ld, nj, hd);
    pack_rows(V, v + j0 * s.kv_ld, s.kv_ld, nj, kTile, hd, hdp, 1.0f);
    for (int64_t r0 = 0; r0 < nip; r0 += kMR)  // S = (scale Q) K^T, the live columns of each row block
      block_cols(wide, round_up(live_keys(i0, r0, delta, j0, nj), kV) / kV, S + r0 * kTile, kTile, Q + r0 * hdp,
                 hdp, 1, Kt, kTile, 0, hd, false);
    for (int64_t r = 0; r < ni; ++r) {  // the online softmax: P = e^(S - m), O and l rescaled to the new m
      float* row = S + r * kTile;
      const int64_t live = live_row(i0 + r, delta, j0, nj);
      if (live == 0) {  // a row before this tile's first key (its block's P V reads the row: zeros)
        std::fill(row, row + kTile, 0.0f);
        continue;
      }
      float mx = w.m[r];
#pragma omp simd reduction(max : mx)
      for (int64_t c = 0; c < live; ++c) mx = std::max(mx, row[c]);
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int64_t c = 0; c < live; ++c) {
        row[c] = fast_exp(row[c] - mx);
        sum += row[c];
      }
      std::fill(row + live, row + kTile, 0.0f);
      const float keep = fast_exp(w.m[r] - mx);  // 0 (e^-80) on a row's first live tile, where O and l are 0
      float* orow = O + r * hdp;
#pragma omp simd
      for (int64_t d = 0; d < hdp; ++d) orow[d] *= keep;
      w.l[r] = w.l[r] * keep + sum;
      w.m[r] = mx;
    }
    for (int64_t r0 = 0; r0 < nip; r0 += kMR)  // O += P V
      block_cols(wide, nv, O + r0 * hdp, hdp, S + r0 * kTile, kTile, 1, V, hdp, 0,
                 live_keys(i0, r0, delta, j0, nj), true);
  }
  for (int64_t r = 0; r < ni; ++r) {
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
  // Sized for Tp padded positions of hd (padded: hdp) channels; grows once.
  void size(int64_t Tp, int64_t hd, int64_t hdp) {
    for (auto* b : {&q, &dout, &dq}) b->resize(static_cast<size_t>(Tp * hdp));
    for (auto* b : {&D, &L}) b->resize(static_cast<size_t>(Tp));
    for (auto* b : {&kt, &vt}) b->resize(static_cast<size_t>(hd * kTile));
    for (auto* b : {&k, &dk, &dv}) b->resize(static_cast<size_t>(kTile * hdp));
    for (auto* b : {&p, &ds}) b->resize(static_cast<size_t>(kTile * kTile));
  }
};

// Every query head of key/value head g of one sequence (every pointer: that
// sequence's row 0, head 0): each key tile's dK and dV summed over the
// query tiles that see it (FlashAttention-2's order), dQ over the head's key
// tiles. accumulate: every gradient added to what dq, dk and dv hold; else
// dq written, and the group's first head writes dk and dv, the others add.
DPT_CPU_CLONES void backward_group(const FlashBlock& s, const float* q, const float* k, const float* v,
                                   const float* dout, const float* out, const float* lse, float* dq, float* dk,
                                   float* dv, int64_t g, float scale, bool wide, bool accumulate, BackScratch& w) {
  const int64_t Tq = s.Tq, Tk = s.Tk, delta = s.delta, hd = s.hd, hdp = hd_padded(s), nv = hdp / kV;
  const int64_t Tp = round_up(Tq, kTile), ldo = s.out_ld;
  w.size(Tp, hd, hdp);
  float *Q = w.q.data(), *dO = w.dout.data(), *dQ = w.dq.data(), *Kt = w.kt.data(), *Vt = w.vt.data();
  float *K = w.k.data(), *dK = w.dk.data(), *dV = w.dv.data(), *P = w.p.data(), *dS = w.ds.data();
  k += g * hd, v += g * hd, dk += g * hd, dv += g * hd;
  // Key tiles past the last query row's sight get nothing.
  const int64_t key_end = std::min(Tk, Tq + delta);
  for (int64_t h = g * group_of(s); h < (g + 1) * group_of(s); ++h) {
    const bool add = accumulate || h != g * group_of(s);
    pack_rows(Q, q + h * hd, s.q_ld, Tq, Tp, hd, hdp, scale);
    pack_rows(dO, dout + h * hd, ldo, Tq, Tp, hd, hdp, 1.0f);
    std::fill(w.dq.begin(), w.dq.end(), 0.0f);
    for (int64_t t = 0; t < Tq; ++t) {  // D = rowsum(dO * O)
      const float* o = out + t * ldo + h * hd;
      float d = 0.0f;
      for (int64_t c = 0; c < hd; ++c) d += dO[t * hdp + c] * o[c];
      w.D[static_cast<size_t>(t)] = d;
      w.L[static_cast<size_t>(t)] = lse[h * s.lse_T + t];
    }
    for (int64_t j0 = 0; j0 < (accumulate ? key_end : Tk); j0 += kTile) {
      const int64_t nj = std::min(kTile, Tk - j0);
      pack_transposed(Kt, k + j0 * s.kv_ld, s.kv_ld, nj, hd);
      pack_transposed(Vt, v + j0 * s.kv_ld, s.kv_ld, nj, hd);
      pack_rows(K, k + j0 * s.kv_ld, s.kv_ld, nj, kTile, hd, hdp, 1.0f);
      std::fill(w.dk.begin(), w.dk.end(), 0.0f);
      std::fill(w.dv.begin(), w.dv.end(), 0.0f);
      // The first query tile with a row that sees key j0 (row j0 - delta).
      for (int64_t i0 = std::max<int64_t>(0, j0 - delta) / kTile * kTile; i0 < Tq; i0 += kTile) {
        const int64_t ni = std::min(kTile, Tq - i0), nip = round_up(ni, kMR);
        const float* Qi = Q + i0 * hdp;
        const float* dOi = dO + i0 * hdp;
        for (int64_t r0 = 0; r0 < nip; r0 += kMR) {  // S = (scale Q) K^T and dP = dO V^T, live columns
          const int64_t cols = round_up(live_keys(i0, r0, delta, j0, nj), kV) / kV;
          block_cols(wide, cols, P + r0 * kTile, kTile, Qi + r0 * hdp, hdp, 1, Kt, kTile, 0, hd, false);
          block_cols(wide, cols, dS + r0 * kTile, kTile, dOi + r0 * hdp, hdp, 1, Vt, kTile, 0, hd, false);
        }
        for (int64_t r = 0; r < nip; ++r) {  // P = e^(S - lse); dS = P (dP - D)
          float *p = P + r * kTile, *ds = dS + r * kTile;
          const int64_t live = r < ni ? live_row(i0 + r, delta, j0, nj) : 0;
          const float lr = w.L[static_cast<size_t>(i0 + r)], Dr = w.D[static_cast<size_t>(i0 + r)];
#pragma omp simd
          for (int64_t c = 0; c < live; ++c) {
            p[c] = fast_exp(p[c] - lr);
            ds[c] = p[c] * (ds[c] - Dr);
          }
          std::fill(p + live, p + kTile, 0.0f);
          std::fill(ds + live, ds + kTile, 0.0f);
        }
        // dV += P^T dO and dK += dS^T (scale Q) over the rows that see each
        // block of keys (row r sees key c when i0 + r + delta >= j0 + c).
        for (int64_t c0 = 0; c0 < nj; c0 += kMR) {
          const int64_t r_first = std::clamp<int64_t>(j0 + c0 - delta - i0, 0, ni);
          block_cols(wide, nv, dV + c0 * hdp, hdp, P + c0, 1, kTile, dOi, hdp, r_first, ni, true);
          block_cols(wide, nv, dK + c0 * hdp, hdp, dS + c0, 1, kTile, Qi, hdp, r_first, ni, true);
        }
        for (int64_t r0 = 0; r0 < nip; r0 += kMR)  // dQ += dS K (its scale applied once, at the end)
          block_cols(wide, nv, dQ + (i0 + r0) * hdp, hdp, dS + r0 * kTile, kTile, 1, K, hdp, 0,
                     live_keys(i0, r0, delta, j0, nj), true);
      }
      for (int64_t c = 0; c < nj; ++c) {
        float* dkr = dk + (j0 + c) * s.kv_ld;
        float* dvr = dv + (j0 + c) * s.kv_ld;
        for (int64_t d = 0; d < hd; ++d) {
          dkr[d] = (add ? dkr[d] : 0.0f) + dK[c * hdp + d];
          dvr[d] = (add ? dvr[d] : 0.0f) + dV[c * hdp + d];
        }
      }
    }
    for (int64_t t = 0; t < Tq; ++t) {
      float* dqr = dq + t * s.q_ld + h * hd;
      for (int64_t d = 0; d < hd; ++d) dqr[d] = (accumulate ? dqr[d] : 0.0f) + dQ[t * hdp + d] * scale;
    }
  }
}

// The whole-sequence layout of flash_attention_*: qkv rows, delta 0.
FlashBlock whole_sequence(const float* qkv, int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t hd) {
  const int64_t ld = (NH + 2 * NKV) * hd;
  FlashBlock s{};
  s.B = B, s.NH = NH, s.NKV = NKV, s.hd = hd, s.Tq = T, s.Tk = T, s.delta = 0;
  s.q = qkv, s.q_ld = ld, s.q_batch = T * ld;
  s.k = qkv + NH * hd, s.v = qkv + (NH + NKV) * hd, s.kv_ld = ld, s.kv_batch = T * ld;
  s.out_ld = NH * hd, s.out_batch = T * NH * hd, s.lse_T = T;
  return s;
}

void check(const FlashBlock& s) {
  DPT_CHECK(s.B >= 0 && s.Tq >= 0 && s.Tk >= 0 && s.hd > 0 && s.NKV > 0 && s.NH % s.NKV == 0 && s.delta >= 0,
            "flash attention needs a positive head size, query heads a multiple of the key/value heads and a "
            "delta >= 0 (got hd {}, {} / {} heads, delta {})",
            s.hd, s.NH, s.NKV, s.delta);
}

// Forward over (sequence, head, query tile); merge as forward_tile's.
void run_forward(const FlashBlock& s, float* out, float* lse, bool merge) {
  check(s);
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.hd));
  const bool wide = wide_vectors();
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
          forward_tile(s, s.q + b * s.q_batch + h * s.hd, s.k + kv, s.v + kv, out + b * s.out_batch + h * s.hd,
                       lse + (b * s.NH + h) * s.lse_T, i0, std::min(kTile, s.Tq - i0), scale, wide, merge, w);
        }
  }
}

// Backward over (sequence, key/value head); accumulate as backward_group's.
void run_backward(const FlashBlock& s, const float* out, const float* dout, const float* lse, float* dq, float* dk,
                  float* dv, bool accumulate) {
  check(s);
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.hd));
  const bool wide = wide_vectors();
#pragma omp parallel
  {
    static thread_local BackScratch w;
#pragma omp for collapse(2) schedule(static)
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t g = 0; g < s.NKV; ++g) {
        const int64_t qb = b * s.q_batch, kvb = b * s.kv_batch, ob = b * s.out_batch;
        backward_group(s, s.q + qb, s.k + kvb, s.v + kvb, dout + ob, out + ob, lse + b * s.NH * s.lse_T, dq + qb,
                       dk + kvb, dv + kvb, g, scale, wide, accumulate, w);
      }
  }
}

}  // namespace

void set_flash_attention_narrow_for_testing(bool on) { force_narrow.store(on); }

void flash_attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                             int64_t hd) {
  run_forward(whole_sequence(qkv, B, T, NH, NKV, hd), out, lse, false);
}

void flash_attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                              int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t hd) {
  run_backward(whole_sequence(qkv, B, T, NH, NKV, hd), out, dout, lse, dqkv, dqkv + NH * hd,
               dqkv + (NH + NKV) * hd, false);
}

void flash_block_forward(const FlashBlock& blk, float* out, float* lse) { run_forward(blk, out, lse, true); }

void flash_block_backward(const FlashBlock& blk, const float* out, const float* dout, const float* lse, float* dq,
                          float* dk, float* dv) {
  run_backward(blk, out, dout, lse, dq, dk, dv, true);
}

}  // namespace dpt
