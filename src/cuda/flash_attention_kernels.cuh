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

// ------------------------------------------------------------------ forward
template <int DV>
__global__ void __launch_bounds__(kWarps * 32)
    flash_forward_kernel(float* out, float* lse, const float* qkv, int64_t T, int NH, int NKV, int hd, float scale) {
  constexpr int R = rows_per_warp<DV>(), BR = kWarps * R;
  DPT_DYNAMIC_SHARED(smem);
  const int hdq = quad(hd);
  float* Qs = smem;                  // [BR][hdq], scaled: the warps' rows, read as float4 broadcasts
  float* Vs = Qs + BR * hdq;         // [32][hdq]: read along channels
  float* Ps = Vs + kLanes * hdq;     // [kWarps][32][R]: each warp's probabilities, key-major
  float* Kt = Ps + kWarps * kLanes * R;  // [hdq][kPad]: a key per lane
  // The last query tiles see the most keys: they start first.
  const int64_t i0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * BR;
  const int h = static_cast<int>(blockIdx.y), g = h / (NH / NKV);
  const int64_t b = blockIdx.z, ld = static_cast<int64_t>(NH + 2 * NKV) * hd;
  const float* base = qkv + b * T * ld;
  const float* k = base + static_cast<int64_t>(NH + g) * hd;
  const float* v = base + static_cast<int64_t>(NH + NKV + g) * hd;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t r0 = i0 + warp * R;  // this warp's first row
  const float* Qw = Qs + warp * R * hdq;
  float* Pw = Ps + warp * kLanes * R;
  load_rows(Qs, base + static_cast<int64_t>(h) * hd, ld, i0, BR, T, hd, scale);

  float o[R][DV], m[R], l[R];  // l: this lane's part of each row's sum
  DPT_UNROLL
  for (int r = 0; r < R; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
    DPT_UNROLL
    for (int i = 0; i < DV; ++i) o[r][i] = 0.0f;
  }
  const int64_t key_end = lmin(T, i0 + BR);  // keys past the block's last row are never seen
  for (int64_t j0 = 0; j0 < key_end; j0 += kLanes) {
    __syncthreads();  // every warp is done with the previous tile (and Qs is loaded)
    load_cols(Kt, k, ld, j0, T, hd, 1.0f);
    load_rows(Vs, v, ld, j0, kLanes, T, hd, 1.0f);
    __syncthreads();
    if (r0 >= T || j0 > r0 + R - 1) continue;  // no row of this warp sees a key of the tile
    float s[R];
    DPT_UNROLL
    for (int r = 0; r < R; ++r) s[r] = 0.0f;
    for (int d = 0; d < hdq; d += 4) {
      const float k0 = Kt[d * kPad + lane], k1 = Kt[(d + 1) * kPad + lane], k2 = Kt[(d + 2) * kPad + lane],
                  k3 = Kt[(d + 3) * kPad + lane];
      DPT_UNROLL
      for (int r = 0; r < R; ++r) s[r] = dot4(s[r], load4(Qw + r * hdq + d), k0, k1, k2, k3);
    }
    const int64_t c = j0 + lane;  // this lane's key
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
    DPT_UNROLL
    for (int r = 0; r < R; ++r) Pw[lane * R + r] = s[r];
    __syncwarp();
    // O += P V over the keys some row of this warp sees.
    const int nj = static_cast<int>(lmin(kLanes, lmin(T, r0 + R) - j0));
    for (int j = 0; j < nj; ++j) {
      float p[R], vj[DV];
      load_row<R>(p, Pw + j * R);
      DPT_UNROLL
      for (int i = 0; i < DV; ++i) {
        const int d = lane + 32 * i;
        vj[i] = d < hd ? Vs[j * hdq + d] : 0.0f;
      }
      DPT_UNROLL
      for (int r = 0; r < R; ++r)
        DPT_UNROLL
        for (int i = 0; i < DV; ++i) o[r][i] += p[r] * vj[i];
    }
  }
  const int64_t ldo = static_cast<int64_t>(NH) * hd;
  DPT_UNROLL
  for (int r = 0; r < R; ++r) {
    const float sum = warp_sum(l[r]);
    const int64_t row = r0 + r;
    if (row >= T) continue;  // every row < T saw key 0: sum > 0
    const float inv = 1.0f / sum;
    float* orow = out + (b * T + row) * ldo + static_cast<int64_t>(h) * hd;
    DPT_UNROLL
    for (int i = 0; i < DV; ++i) {
      const int d = lane + 32 * i;
      if (d < hd) orow[d] = o[r][i] * inv;
    }
    if (lane == 0) lse[(b * NH + h) * T + row] = m[r] + logf(sum);
  }
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
  float* Ks = smem;                     // [BC][hdq]: the warps' keys, read as float4 broadcasts
  float* Vs = Ks + BC * hdq;            // [BC][hdq]
  float* Ps = Vs + BC * hdq;            // [kWarps][32][R]: each warp's P, query-major
  float* dSs = Ps + kWarps * kLanes * R;  // [kWarps][32][R]: and dS
  float* Qt = dSs + kWarps * kLanes * R;  // [hdq][kPad], scaled: a query per lane
  float* dOt = Qt + hdq * kPad;         // [hdq][kPad]
  float* Ls = dOt + hdq * kPad;         // [32] the query tile's lse
  float* Ds = Ls + kLanes;              // [32] and D
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * BC;  // the first key tiles are seen most: they start first
  const int g = static_cast<int>(blockIdx.y), group = NH / NKV;
  const int64_t b = blockIdx.z, ld = static_cast<int64_t>(NH + 2 * NKV) * hd, ldo = static_cast<int64_t>(NH) * hd;
  const float* base = qkv + b * T * ld;
  load_rows(Ks, base + static_cast<int64_t>(NH + g) * hd, ld, j0, BC, T, hd, 1.0f);
  load_rows(Vs, base + static_cast<int64_t>(NH + NKV + g) * hd, ld, j0, BC, T, hd, 1.0f);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t c0 = j0 + warp * R;  // this warp's first key
  const float* Kw = Ks + warp * R * hdq;
  const float* Vw = Vs + warp * R * hdq;
  float* Pw = Ps + warp * kLanes * R;
  float* dSw = dSs + warp * kLanes * R;

  float dk[R][DV], dv[R][DV];
  DPT_UNROLL
  for (int r = 0; r < R; ++r)
    DPT_UNROLL
    for (int i = 0; i < DV; ++i) dk[r][i] = dv[r][i] = 0.0f;
  for (int hh = 0; hh < group; ++hh) {
    const int h = g * group + hh;
    const float* q = base + static_cast<int64_t>(h) * hd;
    const float* dO = dout + b * T * ldo + static_cast<int64_t>(h) * hd;
    const float* L = lse + (b * NH + h) * T;
    const float* Dh = D + (b * NH + h) * T;
    for (int64_t i0 = j0 / kLanes * kLanes; i0 < T; i0 += kLanes) {
      __syncthreads();  // every warp is done with the previous query tile (and K, V are loaded)
      load_cols(Qt, q, ld, i0, T, hd, scale);
      load_cols(dOt, dO, ldo, i0, T, hd, 1.0f);
      if (threadIdx.x < kLanes) {
        const int64_t t = i0 + threadIdx.x;
        Ls[threadIdx.x] = t < T ? L[t] : 0.0f;
        Ds[threadIdx.x] = t < T ? Dh[t] : 0.0f;
      }
      __syncthreads();
      if (c0 >= T || c0 > i0 + kLanes - 1) continue;  // no query of the tile sees a key of this warp
      // This lane's query against the warp's keys: S = (scale q) k^T, dP = dO v^T.
      float s[R], dp[R];
      DPT_UNROLL
      for (int r = 0; r < R; ++r) s[r] = dp[r] = 0.0f;
      for (int d = 0; d < hdq; d += 4) {
        const float q0 = Qt[d * kPad + lane], q1 = Qt[(d + 1) * kPad + lane], q2 = Qt[(d + 2) * kPad + lane],
                    q3 = Qt[(d + 3) * kPad + lane];
        const float o0 = dOt[d * kPad + lane], o1 = dOt[(d + 1) * kPad + lane], o2 = dOt[(d + 2) * kPad + lane],
                    o3 = dOt[(d + 3) * kPad + lane];
        DPT_UNROLL
        for (int r = 0; r < R; ++r) {
          s[r] = dot4(s[r], load4(Kw + r * hdq + d), q0, q1, q2, q3);
          dp[r] = dot4(dp[r], load4(Vw + r * hdq + d), o0, o1, o2, o3);
        }
      }
      const int64_t t = i0 + lane;
      const float Lt = Ls[lane], Dt = Ds[lane];
      DPT_UNROLL
      for (int r = 0; r < R; ++r) {  // P = e^(S - lse); dS = P (dP - D)
        const bool live = t < T && c0 + r <= t;
        const float p = live ? expf(s[r] - Lt) : 0.0f;
        Pw[lane * R + r] = p;
        dSw[lane * R + r] = p * (dp[r] - Dt);
      }
      __syncwarp();
      // dV += P^T dO and dK += dS^T (scale Q) over the queries that see a
      // key of this warp (none before its first key).
      const int q_first = static_cast<int>(lmax(0, c0 - i0));
      const int q_end = static_cast<int>(lmin(kLanes, T - i0));
      for (int j = q_first; j < q_end; ++j) {
        float p[R], ds[R], qv[DV], ov[DV];
        load_row<R>(p, Pw + j * R);
        load_row<R>(ds, dSw + j * R);
        DPT_UNROLL
        for (int i = 0; i < DV; ++i) {
          const int d = lane + 32 * i;
          qv[i] = d < hd ? Qt[d * kPad + j] : 0.0f;
          ov[i] = d < hd ? dOt[d * kPad + j] : 0.0f;
        }
        DPT_UNROLL
        for (int r = 0; r < R; ++r)
          DPT_UNROLL
          for (int i = 0; i < DV; ++i) {
            dv[r][i] += p[r] * ov[i];
            dk[r][i] += ds[r] * qv[i];
          }
      }
    }
  }
  float* dk_out = dqkv + b * T * ld + static_cast<int64_t>(NH + g) * hd;
  float* dv_out = dqkv + b * T * ld + static_cast<int64_t>(NH + NKV + g) * hd;
  DPT_UNROLL
  for (int r = 0; r < R; ++r) {
    const int64_t c = c0 + r;
    if (c >= T) continue;
    DPT_UNROLL
    for (int i = 0; i < DV; ++i) {
      const int d = lane + 32 * i;
      if (d < hd) {
        dk_out[c * ld + d] = dk[r][i];
        dv_out[c * ld + d] = dv[r][i];
      }
    }
  }
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
  float* Qs = smem;                     // [BR][hdq], scaled: the warps' rows, read as float4 broadcasts
  float* dOs = Qs + BR * hdq;           // [BR][hdq]
  float* dSs = dOs + BR * hdq;          // [kWarps][32][R]: each warp's dS, key-major
  float* Kt = dSs + kWarps * kLanes * R;  // [hdq][kPad]: a key per lane
  float* Vt = Kt + hdq * kPad;          // [hdq][kPad]
  const int64_t i0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * BR;  // the heaviest first
  const int h = static_cast<int>(blockIdx.y), g = h / (NH / NKV);
  const int64_t b = blockIdx.z, ld = static_cast<int64_t>(NH + 2 * NKV) * hd, ldo = static_cast<int64_t>(NH) * hd;
  const float* base = qkv + b * T * ld;
  const float* k = base + static_cast<int64_t>(NH + g) * hd;
  const float* v = base + static_cast<int64_t>(NH + NKV + g) * hd;
  load_rows(Qs, base + static_cast<int64_t>(h) * hd, ld, i0, BR, T, hd, scale);
  load_rows(dOs, dout + b * T * ldo + static_cast<int64_t>(h) * hd, ldo, i0, BR, T, hd, 1.0f);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t r0 = i0 + warp * R;
  const float* Qw = Qs + warp * R * hdq;
  const float* dOw = dOs + warp * R * hdq;
  float* dSw = dSs + warp * kLanes * R;
  float Lr[R], Dr[R], dq[R][DV];
  DPT_UNROLL
  for (int r = 0; r < R; ++r) {
    const int64_t row = r0 + r;
    Lr[r] = row < T ? lse[(b * NH + h) * T + row] : 0.0f;
    Dr[r] = row < T ? D[(b * NH + h) * T + row] : 0.0f;
    DPT_UNROLL
    for (int i = 0; i < DV; ++i) dq[r][i] = 0.0f;
  }
  const int64_t key_end = lmin(T, i0 + BR);
  for (int64_t j0 = 0; j0 < key_end; j0 += kLanes) {
    __syncthreads();  // every warp is done with the previous key tile (and Q, dO are loaded)
    load_cols(Kt, k, ld, j0, T, hd, 1.0f);
    load_cols(Vt, v, ld, j0, T, hd, 1.0f);
    __syncthreads();
    if (r0 >= T || j0 > r0 + R - 1) continue;  // no row of this warp sees a key of the tile
    float s[R], dp[R];
    DPT_UNROLL
    for (int r = 0; r < R; ++r) s[r] = dp[r] = 0.0f;
    for (int d = 0; d < hdq; d += 4) {
      const float k0 = Kt[d * kPad + lane], k1 = Kt[(d + 1) * kPad + lane], k2 = Kt[(d + 2) * kPad + lane],
                  k3 = Kt[(d + 3) * kPad + lane];
      const float v0 = Vt[d * kPad + lane], v1 = Vt[(d + 1) * kPad + lane], v2 = Vt[(d + 2) * kPad + lane],
                  v3 = Vt[(d + 3) * kPad + lane];
      DPT_UNROLL
      for (int r = 0; r < R; ++r) {
        s[r] = dot4(s[r], load4(Qw + r * hdq + d), k0, k1, k2, k3);
        dp[r] = dot4(dp[r], load4(dOw + r * hdq + d), v0, v1, v2, v3);
      }
    }
    const int64_t c = j0 + lane;
    DPT_UNROLL
    for (int r = 0; r < R; ++r) {  // dS = P (dP - D), P = e^(S - lse)
      const int64_t row = r0 + r;
      const bool live = row < T && c <= row;
      dSw[lane * R + r] = live ? expf(s[r] - Lr[r]) * (dp[r] - Dr[r]) : 0.0f;
    }
    __syncwarp();
    // dQ += dS K over the keys some row of this warp sees.
    const int nj = static_cast<int>(lmin(kLanes, lmin(T, r0 + R) - j0));
    for (int j = 0; j < nj; ++j) {
      float ds[R], kv[DV];
      load_row<R>(ds, dSw + j * R);
      DPT_UNROLL
      for (int i = 0; i < DV; ++i) {
        const int d = lane + 32 * i;
        kv[i] = d < hd ? Kt[d * kPad + j] : 0.0f;
      }
      DPT_UNROLL
      for (int r = 0; r < R; ++r)
        DPT_UNROLL
        for (int i = 0; i < DV; ++i) dq[r][i] += ds[r] * kv[i];
    }
  }
  DPT_UNROLL
  for (int r = 0; r < R; ++r) {
    const int64_t row = r0 + r;
    if (row >= T) continue;
    float* dqr = dqkv + (b * T + row) * ld + static_cast<int64_t>(h) * hd;
    DPT_UNROLL
    for (int i = 0; i < DV; ++i) {
      const int d = lane + 32 * i;
      if (d < hd) dqr[d] = dq[r][i] * scale;
    }
  }
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
