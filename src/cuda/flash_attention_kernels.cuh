// The device code of cuda/flash_attention.cu (its header comment describes
// the kernels), apart from the launches so that a host test can run the
// same source on the CPU (tests/simt_emulator.h): it needs only what that
// emulator provides (thread and block indices, __syncthreads, __syncwarp,
// the warp shuffles, float4 and load4, dynamic shared memory through
// DPT_DYNAMIC_SHARED) and the C math functions.
#pragma once

#include <math.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#ifdef __CUDACC__
#define DPT_UNROLL _Pragma("unroll")
#define DPT_DYNAMIC_SHARED(name) extern __shared__ float name[]
#endif

namespace dpt::cuda::flash {

constexpr int kWarps = 4;   // warps per block
constexpr int kLanes = 32;  // rows of a lane tile: one per lane
constexpr int kPad = 33;    // row stride of a lane tile (transposed: [channel][lane])
constexpr unsigned kAll = 0xffffffffu;

// Rows a warp owns for DV channels per lane: R * DV <= 16 accumulators per
// output tensor (dK and dV: 32 registers), so none spills.
template <int DV>
__host__ __device__ constexpr int rows_per_warp() {
  return DV <= 2 ? 8 : DV <= 4 ? 4 : 2;
}
// Channels rounded up to whole float4s: the row stride of a warp tile.
__host__ __device__ inline int quad(int hd) { return (hd + 3) & ~3; }

__device__ __forceinline__ int64_t lmin(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ int64_t lmax(int64_t a, int64_t b) { return a > b ? a : b; }

#ifdef __CUDACC__
__device__ __forceinline__ float4 load4(const float* p) { return *reinterpret_cast<const float4*>(p); }
#endif

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kAll, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kAll, v, o);
  return v;
}
// acc += a . b over four channels, in channel order.
__device__ __forceinline__ float dot4(float acc, float4 a, float b0, float b1, float b2, float b3) {
  acc += a.x * b0;
  acc += a.y * b1;
  acc += a.z * b2;
  acc += a.w * b3;
  return acc;
}

// A warp tile: rows [row0, row0 + rows) of a head's slice (hd floats at
// stride ld) times scale into dst[r][hdq] (hdq = quad(hd)); channels past
// hd and rows at or past T zero. Every thread of the block takes part.
__device__ inline void load_rows(float* dst, const float* src, int64_t ld, int64_t row0, int rows, int64_t T, int hd,
                                 float scale) {
  const int hdq = quad(hd);
  for (int e = threadIdx.x; e < rows * hdq; e += blockDim.x) {
    const int r = e / hdq, d = e % hdq;
    const int64_t t = row0 + r;
    dst[e] = t < T && d < hd ? src[t * ld + d] * scale : 0.0f;
  }
}
// A lane tile: rows [row0, row0 + 32) transposed into dst[d][kPad] for d <
// hdq, the same zeros. Threads take consecutive channels of a row (the
// global reads coalesce) and store at banks d + r (none shared).
__device__ inline void load_cols(float* dst, const float* src, int64_t ld, int64_t row0, int64_t T, int hd,
                                 float scale) {
  const int hdq = quad(hd);
  for (int e = threadIdx.x; e < kLanes * hdq; e += blockDim.x) {
    const int r = e / hdq, d = e % hdq;
    const int64_t t = row0 + r;
    dst[d * kPad + r] = t < T && d < hd ? src[t * ld + d] * scale : 0.0f;
  }
}
// R values of row j of a warp's [32][R] scratch (float4s where R allows).
template <int R>
__device__ __forceinline__ void load_row(float* out, const float* p) {
  if constexpr (R % 4 == 0) {
    DPT_UNROLL
    for (int r = 0; r < R; r += 4) {
      const float4 v = load4(p + r);
      out[r] = v.x, out[r + 1] = v.y, out[r + 2] = v.z, out[r + 3] = v.w;
    }
  } else {
    DPT_UNROLL
    for (int r = 0; r < R; ++r) out[r] = p[r];
  }
}

// Shared floats of each kernel (the launches' dynamic shared bytes / 4).
// Float4-read arrays first, each a multiple of 4 floats long.
template <int DV>
__host__ __device__ inline int forward_floats(int hd) {
  constexpr int R = rows_per_warp<DV>();
  return kWarps * R * quad(hd) + kLanes * quad(hd) + kWarps * kLanes * R + quad(hd) * kPad;
}
template <int DV>
__host__ __device__ inline int dq_floats(int hd) {
  constexpr int R = rows_per_warp<DV>();
  return 2 * kWarps * R * quad(hd) + kWarps * kLanes * R + 2 * quad(hd) * kPad;
}
template <int DV>
__host__ __device__ inline int dkdv_floats(int hd) {
  constexpr int R = rows_per_warp<DV>();
  return 2 * kWarps * R * quad(hd) + 2 * kWarps * kLanes * R + 2 * quad(hd) * kPad + 2 * kLanes;
}

// ------------------------------------------------------- pieces of a warp
// s[r] (+)= the warp's row r (Aw[r][hdq], float4 broadcasts) . the lane's
// column of Bt ([hdq][kPad]), over all hdq channels (4 a step).
template <int R>
__device__ __forceinline__ void add_scores(float (&s)[R], const float* Aw, const float* Bt, int hdq, int lane) {
  for (int d = 0; d < hdq; d += 4) {
    const float b0 = Bt[d * kPad + lane], b1 = Bt[(d + 1) * kPad + lane], b2 = Bt[(d + 2) * kPad + lane],
                b3 = Bt[(d + 3) * kPad + lane];
    DPT_UNROLL
    for (int r = 0; r < R; ++r) s[r] = dot4(s[r], load4(Aw + r * hdq + d), b0, b1, b2, b3);
  }
}

// acc[r][i] += sum over j in [j0, j1) of P[j][r] * B(j, d) for the lane's
// channels d = lane + 32 i < hd, where P is the warp's [32][R] scratch and
// B(j, d) = B[j * row + d * col] (a row tile: row hdq, col 1; a lane tile:
// row 1, col kPad).
template <int R, int DV>
__device__ __forceinline__ void add_products(float (&acc)[R][DV], const float* P, const float* B, int row, int col,
                                             int j0, int j1, int lane, int hd) {
  for (int j = j0; j < j1; ++j) {
    float p[R], bj[DV];
    load_row<R>(p, P + j * R);
    DPT_UNROLL
    for (int i = 0; i < DV; ++i) {
      const int d = lane + 32 * i;
      bj[i] = d < hd ? B[j * row + d * col] : 0.0f;
    }
    DPT_UNROLL
    for (int r = 0; r < R; ++r)
      DPT_UNROLL
      for (int i = 0; i < DV; ++i) acc[r][i] += p[r] * bj[i];
  }
}

// Rows [row0, row0 + R) of acc times `factor` into dst (row stride ld), the
// rows before T.
template <int R, int DV>
__device__ __forceinline__ void store_rows(float* dst, int64_t ld, const float (&acc)[R][DV], int64_t row0, int64_t T,
                                           int lane, int hd, float factor) {
  DPT_UNROLL
  for (int r = 0; r < R; ++r) {
    if (row0 + r >= T) continue;
    DPT_UNROLL
    for (int i = 0; i < DV; ++i) {
      const int d = lane + 32 * i;
      if (d < hd) dst[(row0 + r) * ld + d] = acc[r][i] * factor;
    }
  }
}

// The online softmax over one key tile for the warp's rows (row r0 + r sees
// this lane's key c when c <= row < T): m and l (this lane's part of the
// sum) updated, o rescaled to the new maximum, s replaced by P.
template <int R, int DV>
__device__ __forceinline__ void online_softmax(float (&s)[R], float (&m)[R], float (&l)[R], float (&o)[R][DV],
                                               int64_t r0, int64_t c, int64_t T) {
  DPT_UNROLL
  for (int r = 0; r < R; ++r) {
    const int64_t row = r0 + r;
    const bool live = row < T && c <= row;
    const float sv = live ? s[r] : -INFINITY;
    const float mn = fmaxf(m[r], warp_max(sv));  // the same in every lane
    if (mn == -INFINITY) {  // the row has seen no key yet
      s[r] = 0.0f;
      continue;
    }
    const float keep = expf(m[r] - mn);  // 0 on the row's first tile (m = -inf)
    const float p = live ? expf(sv - mn) : 0.0f;
    l[r] = l[r] * keep + p;
    DPT_UNROLL
    for (int i = 0; i < DV; ++i) o[r][i] *= keep;
    m[r] = mn;
    s[r] = p;
  }
}

// ------------------------------------------------------------------ forward
template <int DV>
__global__ void __launch_bounds__(kWarps * 32)
    flash_forward_kernel(float* out, float* lse, const float* qkv, int64_t T, int NH, int NKV, int hd, float scale) {
  constexpr int R = rows_per_warp<DV>(), BR = kWarps * R;
  DPT_DYNAMIC_SHARED(smem);
  const int hdq = quad(hd);
  float* Qs = smem;                      // [BR][hdq], scaled: the warps' rows
  float* Vs = Qs + BR * hdq;             // [32][hdq]: read along channels
  float* Ps = Vs + kLanes * hdq;         // [kWarps][32][R]: each warp's P, key-major
  float* Kt = Ps + kWarps * kLanes * R;  // [hdq][kPad]: a key per lane
  // The last query tiles see the most keys: they start first.
  const int64_t i0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * BR;
  const int h = static_cast<int>(blockIdx.y), g = h / (NH / NKV);
  const int64_t b = blockIdx.z, ld = static_cast<int64_t>(NH + 2 * NKV) * hd;
  const float* base = qkv + b * T * ld;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t r0 = i0 + warp * R;  // this warp's first row
  float* Pw = Ps + warp * kLanes * R;
  load_rows(Qs, base + static_cast<int64_t>(h) * hd, ld, i0, BR, T, hd, scale);

  float o[R][DV] = {}, m[R], l[R] = {};  // l: this lane's part of each row's sum
  DPT_UNROLL
  for (int r = 0; r < R; ++r) m[r] = -INFINITY;
  const int64_t key_end = lmin(T, i0 + BR);  // keys past the block's last row are never seen
  for (int64_t j0 = 0; j0 < key_end; j0 += kLanes) {
    __syncthreads();  // every warp is done with the previous tile (and Qs is loaded)
    load_cols(Kt, base + static_cast<int64_t>(NH + g) * hd, ld, j0, T, hd, 1.0f);
    load_rows(Vs, base + static_cast<int64_t>(NH + NKV + g) * hd, ld, j0, kLanes, T, hd, 1.0f);
    __syncthreads();
    if (r0 >= T || j0 > r0 + R - 1) continue;  // no row of this warp sees a key of the tile
    float s[R] = {};
    add_scores<R>(s, Qs + warp * R * hdq, Kt, hdq, lane);
    online_softmax<R, DV>(s, m, l, o, r0, j0 + lane, T);
    DPT_UNROLL
    for (int r = 0; r < R; ++r) Pw[lane * R + r] = s[r];
    __syncwarp();
    // O += P V over the keys some row of this warp sees.
    add_products<R, DV>(o, Pw, Vs, hdq, 1, 0, static_cast<int>(lmin(kLanes, lmin(T, r0 + R) - j0)), lane, hd);
  }
  float inv[R];
  DPT_UNROLL
  for (int r = 0; r < R; ++r) {
    const float sum = warp_sum(l[r]);  // > 0 for a row < T: it saw key 0
    inv[r] = sum > 0.0f ? 1.0f / sum : 0.0f;  // 0: a row past T (not stored)
    if (lane == 0 && r0 + r < T) lse[(b * NH + h) * T + r0 + r] = m[r] + logf(sum);
    DPT_UNROLL
    for (int i = 0; i < DV; ++i) o[r][i] *= inv[r];
  }
  store_rows<R, DV>(out + b * T * NH * hd + static_cast<int64_t>(h) * hd, static_cast<int64_t>(NH) * hd, o, r0, T,
                    lane, hd, 1.0f);
}

// ----------------------------------------------------------------- backward
// D[b, h, t] = sum over channels of dO * O, a warp per (b, t, h) row.
__global__ void flash_rowdot_kernel(float* D, const float* dout, const float* out, int64_t rows, int64_t T, int NH,
                                    int hd) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  if (row >= rows) return;  // the whole warp
  const float* a = dout + row * hd;
  const float* o = out + row * hd;
  float s = 0.0f;
  for (int d = lane; d < hd; d += 32) s += a[d] * o[d];
  s = warp_sum(s);
  if (lane == 0) {
    const int64_t h = row % NH, bt = row / NH;
    D[(bt / T * NH + h) * T + bt % T] = s;
  }
}

// The shared memory of a dK/dV block (dkdv_floats), carved up.
struct DkdvTiles {
  float *Ks, *Vs;   // [BC][hdq]: the warps' keys and values
  float *Ps, *dSs;  // [kWarps][32][R]: each warp's P and dS, query-major
  float *Qt, *dOt;  // [hdq][kPad], Q scaled: a query per lane
  float *Ls, *Ds;   // [32]: the query tile's lse and D
};

// One query tile [i0, i0 + 32) of head h against the warp's R keys from c0:
// dV += P^T dO, dK += dS^T (scale Q). Every thread of the block calls it
// (it loads the tile); warps none of whose keys the tile sees skip the rest.
template <int R, int DV>
__device__ __forceinline__ void dkdv_query_tile(const DkdvTiles& t, float (&dk)[R][DV], float (&dv)[R][DV],
                                                const float* q, int64_t ld, const float* dO, int64_t ldo,
                                                const float* L, const float* Dh, int64_t i0, int64_t c0, int64_t T,
                                                int hd, float scale) {
  const int hdq = quad(hd), warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  __syncthreads();  // every warp is done with the previous query tile (and K, V are loaded)
  load_cols(t.Qt, q, ld, i0, T, hd, scale);
  load_cols(t.dOt, dO, ldo, i0, T, hd, 1.0f);
  if (threadIdx.x < kLanes) {
    const int64_t row = i0 + threadIdx.x;
    t.Ls[threadIdx.x] = row < T ? L[row] : 0.0f;
    t.Ds[threadIdx.x] = row < T ? Dh[row] : 0.0f;
  }
  __syncthreads();
  if (c0 >= T || c0 > i0 + kLanes - 1) return;  // no query of the tile sees a key of this warp
  // This lane's query against the warp's keys: S = (scale q) k^T, dP = dO v^T.
  float s[R] = {}, dp[R] = {};
  add_scores<R>(s, t.Ks + warp * R * hdq, t.Qt, hdq, lane);
  add_scores<R>(dp, t.Vs + warp * R * hdq, t.dOt, hdq, lane);
  float* Pw = t.Ps + warp * kLanes * R;
  float* dSw = t.dSs + warp * kLanes * R;
  const int64_t row = i0 + lane;
  DPT_UNROLL
  for (int r = 0; r < R; ++r) {  // P = e^(S - lse); dS = P (dP - D)
    const float p = row < T && c0 + r <= row ? expf(s[r] - t.Ls[lane]) : 0.0f;
    Pw[lane * R + r] = p;
    dSw[lane * R + r] = p * (dp[r] - t.Ds[lane]);
  }
  __syncwarp();
  // Over the queries that see a key of this warp (none before its first).
  const int q_first = static_cast<int>(lmax(0, c0 - i0)), q_end = static_cast<int>(lmin(kLanes, T - i0));
  add_products<R, DV>(dv, Pw, t.dOt, 1, kPad, q_first, q_end, lane, hd);
  add_products<R, DV>(dk, dSw, t.Qt, 1, kPad, q_first, q_end, lane, hd);
}

// dK and dV of one key tile of BC rows (kWarps * R), key/value head g and
// sequence b: its group's query heads in order, each over the query tiles
// of 32 rows from the one holding the tile's first key.
template <int DV>
__global__ void __launch_bounds__(kWarps * 32)
    flash_dkdv_kernel(float* dqkv, const float* dout, const float* qkv, const float* lse, const float* D, int64_t T,
                      int NH, int NKV, int hd, float scale) {
  constexpr int R = rows_per_warp<DV>(), BC = kWarps * R;
  DPT_DYNAMIC_SHARED(smem);
  const int hdq = quad(hd);
  DkdvTiles t;
  t.Ks = smem;
  t.Vs = t.Ks + BC * hdq;
  t.Ps = t.Vs + BC * hdq;
  t.dSs = t.Ps + kWarps * kLanes * R;
  t.Qt = t.dSs + kWarps * kLanes * R;
  t.dOt = t.Qt + hdq * kPad;
  t.Ls = t.dOt + hdq * kPad;
  t.Ds = t.Ls + kLanes;
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * BC;  // the first key tiles are seen most: they start first
  const int g = static_cast<int>(blockIdx.y), group = NH / NKV;
  const int64_t b = blockIdx.z, ld = static_cast<int64_t>(NH + 2 * NKV) * hd, ldo = static_cast<int64_t>(NH) * hd;
  const float* base = qkv + b * T * ld;
  load_rows(t.Ks, base + static_cast<int64_t>(NH + g) * hd, ld, j0, BC, T, hd, 1.0f);
  load_rows(t.Vs, base + static_cast<int64_t>(NH + NKV + g) * hd, ld, j0, BC, T, hd, 1.0f);
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t c0 = j0 + static_cast<int>(threadIdx.x) / 32 * R;  // this warp's first key

  float dk[R][DV] = {}, dv[R][DV] = {};
  for (int h = g * group; h < (g + 1) * group; ++h)
    for (int64_t i0 = j0 / kLanes * kLanes; i0 < T; i0 += kLanes)
      dkdv_query_tile<R, DV>(t, dk, dv, base + static_cast<int64_t>(h) * hd, ld,
                             dout + b * T * ldo + static_cast<int64_t>(h) * hd, ldo, lse + (b * NH + h) * T,
                             D + (b * NH + h) * T, i0, c0, T, hd, scale);
  store_rows<R, DV>(dqkv + b * T * ld + static_cast<int64_t>(NH + g) * hd, ld, dk, c0, T, lane, hd, 1.0f);
  store_rows<R, DV>(dqkv + b * T * ld + static_cast<int64_t>(NH + NKV + g) * hd, ld, dv, c0, T, lane, hd, 1.0f);
}

// dQ of one query tile of BR rows (kWarps * R), head h and sequence b, over
// the key tiles of 32 rows it sees.
template <int DV>
__global__ void __launch_bounds__(kWarps * 32)
    flash_dq_kernel(float* dqkv, const float* dout, const float* qkv, const float* lse, const float* D, int64_t T,
                    int NH, int NKV, int hd, float scale) {
  constexpr int R = rows_per_warp<DV>(), BR = kWarps * R;
  DPT_DYNAMIC_SHARED(smem);
  const int hdq = quad(hd);
  float* Qs = smem;                       // [BR][hdq], scaled: the warps' rows
  float* dOs = Qs + BR * hdq;             // [BR][hdq]
  float* dSs = dOs + BR * hdq;            // [kWarps][32][R]: each warp's dS, key-major
  float* Kt = dSs + kWarps * kLanes * R;  // [hdq][kPad]: a key per lane
  float* Vt = Kt + hdq * kPad;            // [hdq][kPad]
  const int64_t i0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * BR;  // the heaviest first
  const int h = static_cast<int>(blockIdx.y), g = h / (NH / NKV);
  const int64_t b = blockIdx.z, ld = static_cast<int64_t>(NH + 2 * NKV) * hd, ldo = static_cast<int64_t>(NH) * hd;
  const float* base = qkv + b * T * ld;
  load_rows(Qs, base + static_cast<int64_t>(h) * hd, ld, i0, BR, T, hd, scale);
  load_rows(dOs, dout + b * T * ldo + static_cast<int64_t>(h) * hd, ldo, i0, BR, T, hd, 1.0f);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t r0 = i0 + warp * R;
  float* dSw = dSs + warp * kLanes * R;
  float Lr[R], Dr[R], dq[R][DV] = {};
  DPT_UNROLL
  for (int r = 0; r < R; ++r) {
    Lr[r] = r0 + r < T ? lse[(b * NH + h) * T + r0 + r] : 0.0f;
    Dr[r] = r0 + r < T ? D[(b * NH + h) * T + r0 + r] : 0.0f;
  }
  const int64_t key_end = lmin(T, i0 + BR);
  for (int64_t j0 = 0; j0 < key_end; j0 += kLanes) {
    __syncthreads();  // every warp is done with the previous key tile (and Q, dO are loaded)
    load_cols(Kt, base + static_cast<int64_t>(NH + g) * hd, ld, j0, T, hd, 1.0f);
    load_cols(Vt, base + static_cast<int64_t>(NH + NKV + g) * hd, ld, j0, T, hd, 1.0f);
    __syncthreads();
    if (r0 >= T || j0 > r0 + R - 1) continue;  // no row of this warp sees a key of the tile
    float s[R] = {}, dp[R] = {};
    add_scores<R>(s, Qs + warp * R * hdq, Kt, hdq, lane);
    add_scores<R>(dp, dOs + warp * R * hdq, Vt, hdq, lane);
    const int64_t c = j0 + lane;
    DPT_UNROLL
    for (int r = 0; r < R; ++r)  // dS = P (dP - D), P = e^(S - lse)
      dSw[lane * R + r] = r0 + r < T && c <= r0 + r ? expf(s[r] - Lr[r]) * (dp[r] - Dr[r]) : 0.0f;
    __syncwarp();
    // dQ += dS K over the keys some row of this warp sees.
    add_products<R, DV>(dq, dSw, Kt, 1, kPad, 0, static_cast<int>(lmin(kLanes, lmin(T, r0 + R) - j0)), lane, hd);
  }
  store_rows<R, DV>(dqkv + b * T * ld + static_cast<int64_t>(h) * hd, ld, dq, r0, T, lane, hd, scale);
}

// ------------------------------------------------------------------ launches
// What each op launches, in order, with its grid (x, y, z), threads and
// dynamic shared bytes, through `launch(kernel, grid, threads, bytes,
// args...)`: the CUDA side queues each on its stream, the host test runs
// each on the emulator. Every launch has kWarps * 32 threads but D's.
struct Grid {
  unsigned x, y, z;
};
struct Shape {
  int64_t B, T;
  int NH, NKV, hd;
  float scale;  // 1 / sqrt(hd)
};

// Calls f(std::integral_constant<int, DV>) for the head size's DV =
// ceil(hd / 32), 1 to 8 (hd up to 256).
template <typename F>
void with_lanes(int hd, F&& f) {
  switch ((hd + 31) / 32) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 5: f(std::integral_constant<int, 5>{}); break;
    case 6: f(std::integral_constant<int, 6>{}); break;
    case 7: f(std::integral_constant<int, 7>{}); break;
    default: f(std::integral_constant<int, 8>{}); break;
  }
}

// Rows of a block's tile (query rows in forward and dQ, key rows in dK/dV).
template <int DV>
constexpr int tile_rows() {
  return kWarps * rows_per_warp<DV>();
}
inline unsigned tiles_of(int64_t T, int rows) { return static_cast<unsigned>((T + rows - 1) / rows); }

// out and lse of B, T >= 1 rows.
template <typename L>
void forward_launches(L&& launch, float* out, float* lse, const float* qkv, const Shape& s) {
  with_lanes(s.hd, [&](auto dv) {
    constexpr int DV = decltype(dv)::value, BR = tile_rows<DV>();
    const size_t bytes = sizeof(float) * static_cast<size_t>(forward_floats<DV>(s.hd));
    launch(flash_forward_kernel<DV>, Grid{tiles_of(s.T, BR), static_cast<unsigned>(s.NH), static_cast<unsigned>(s.B)},
           kWarps * 32, bytes, out, lse, qkv, s.T, s.NH, s.NKV, s.hd, s.scale);
  });
}

// dqkv (whole) of B, T >= 1 rows; D: B NH T floats of scratch.
template <typename L>
void backward_launches(L&& launch, float* dqkv, const float* dout, const float* qkv, const float* out,
                       const float* lse, float* D, const Shape& s) {
  constexpr int kRowWarps = 8;  // D: a warp per row
  const int64_t rows = s.B * s.T * s.NH;
  launch(flash_rowdot_kernel, Grid{static_cast<unsigned>((rows + kRowWarps - 1) / kRowWarps), 1, 1}, kRowWarps * 32,
         size_t{0}, D, dout, out, rows, s.T, s.NH, s.hd);
  with_lanes(s.hd, [&](auto dv) {
    constexpr int DV = decltype(dv)::value, BT = tile_rows<DV>();
    const size_t kv_bytes = sizeof(float) * static_cast<size_t>(dkdv_floats<DV>(s.hd));
    const size_t q_bytes = sizeof(float) * static_cast<size_t>(dq_floats<DV>(s.hd));
    const unsigned tiles = tiles_of(s.T, BT), B = static_cast<unsigned>(s.B);
    launch(flash_dkdv_kernel<DV>, Grid{tiles, static_cast<unsigned>(s.NKV), B}, kWarps * 32, kv_bytes, dqkv, dout, qkv,
           lse, static_cast<const float*>(D), s.T, s.NH, s.NKV, s.hd, s.scale);
    launch(flash_dq_kernel<DV>, Grid{tiles, static_cast<unsigned>(s.NH), B}, kWarps * 32, q_bytes, dqkv, dout, qkv,
           lse, static_cast<const float*>(D), s.T, s.NH, s.NKV, s.hd, s.scale);
  });
}

}  // namespace dpt::cuda::flash
