// The device code of cuda/flash_attention.cu (its header comment describes
// the kernels), apart from the launches so that a host test can run the
// same source on the CPU (tests/simt_emulator.h): it needs only what that
// emulator provides (thread and block indices, __syncthreads, the warp
// shuffles, dynamic shared memory through DPT_DYNAMIC_SHARED) and the C
// math functions.
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

constexpr int kWarps = 4;     // warps per block
constexpr int kLanes = 32;    // rows of a lane tile: one per lane
constexpr unsigned kAll = 0xffffffffu;

// Rows a warp owns for DV channels per lane: R * DV <= 16 accumulators per
// output tensor (dK and dV: 32 registers), so no size spills.
template <int DV>
__host__ __device__ constexpr int rows_per_warp() {
  return DV <= 2 ? 8 : DV <= 4 ? 4 : 2;
}
// The row stride of a lane tile: odd (see above).
__host__ __device__ inline int lane_stride(int hd) { return hd | 1; }

__device__ __forceinline__ int64_t lmin(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ int64_t lmax(int64_t a, int64_t b) { return a > b ? a : b; }

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kAll, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kAll, v, o);
  return v;
}

// Rows [row0, row0 + rows) of a head's slice (hd floats at stride ld) times
// scale into dst at row stride `stride`; rows at or past T zero. Every
// thread of the block takes part.
__device__ inline void load_tile(float* dst, int stride, const float* src, int64_t ld, int64_t row0, int rows, int64_t T,
                          int hd, float scale) {
  for (int e = threadIdx.x; e < rows * hd; e += blockDim.x) {
    const int r = e / hd, d = e % hd;
    const int64_t t = row0 + r;
    dst[r * stride + d] = t < T ? src[t * ld + d] * scale : 0.0f;
  }
}

// ------------------------------------------------------------------ forward
template <int DV>
__global__ void __launch_bounds__(kWarps * 32)
    flash_forward_kernel(float* out, float* lse, const float* qkv, int64_t T, int NH, int NKV, int hd, float scale) {
  constexpr int R = rows_per_warp<DV>(), BR = kWarps * R;
  DPT_DYNAMIC_SHARED(smem);
  const int ks = lane_stride(hd);
  float* Qs = smem;             // [BR][hd], scaled: read by broadcast
  float* Ks = Qs + BR * hd;     // [32][ks]: a key per lane
  float* Vs = Ks + kLanes * ks;  // [32][hd]: read along channels
  // The last query tiles see the most keys: they start first.
  const int64_t i0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * BR;
  const int h = static_cast<int>(blockIdx.y), g = h / (NH / NKV);
  const int64_t b = blockIdx.z, ld = static_cast<int64_t>(NH + 2 * NKV) * hd;
  const float* base = qkv + b * T * ld;
  const float* k = base + static_cast<int64_t>(NH + g) * hd;
  const float* v = base + static_cast<int64_t>(NH + NKV + g) * hd;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t r0 = i0 + warp * R;  // this warp's first row
  const float* Qw = Qs + warp * R * hd;
  load_tile(Qs, hd, base + static_cast<int64_t>(h) * hd, ld, i0, BR, T, hd, scale);

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
    load_tile(Ks, ks, k, ld, j0, kLanes, T, hd, 1.0f);
    load_tile(Vs, hd, v, ld, j0, kLanes, T, hd, 1.0f);
    __syncthreads();
    if (r0 >= T || j0 > r0 + R - 1) continue;  // no row of this warp sees a key of the tile
    float s[R];
DPT_UNROLL
    for (int r = 0; r < R; ++r) s[r] = 0.0f;
    const float* kr = Ks + lane * ks;
    for (int d = 0; d < hd; ++d) {
      const float kd = kr[d];
DPT_UNROLL
      for (int r = 0; r < R; ++r) s[r] += Qw[r * hd + d] * kd;
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
    // O += P V over the keys some row of this warp sees.
    const int nj = static_cast<int>(lmin(kLanes, lmin(T, r0 + R) - j0));
    for (int j = 0; j < nj; ++j) {
      float vj[DV];
DPT_UNROLL
      for (int i = 0; i < DV; ++i) {
        const int d = lane + 32 * i;
        vj[i] = d < hd ? Vs[j * hd + d] : 0.0f;
      }
DPT_UNROLL
      for (int r = 0; r < R; ++r) {
        const float p = __shfl_sync(kAll, s[r], j);
DPT_UNROLL
        for (int i = 0; i < DV; ++i) o[r][i] += p * vj[i];
      }
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
  const int ks = lane_stride(hd);
  float* Ks = smem;               // [BC][hd]: read by broadcast
  float* Vs = Ks + BC * hd;       // [BC][hd]
  float* Qs = Vs + BC * hd;       // [32][ks], scaled: a query per lane
  float* dOs = Qs + kLanes * ks;  // [32][ks]
  float* Ls = dOs + kLanes * ks;  // [32] the tile's lse
  float* Ds = Ls + kLanes;        // [32] and D
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * BC;  // the first key tiles are seen most: they start first
  const int g = static_cast<int>(blockIdx.y), group = NH / NKV;
  const int64_t b = blockIdx.z, ld = static_cast<int64_t>(NH + 2 * NKV) * hd, ldo = static_cast<int64_t>(NH) * hd;
  const float* base = qkv + b * T * ld;
  load_tile(Ks, hd, base + static_cast<int64_t>(NH + g) * hd, ld, j0, BC, T, hd, 1.0f);
  load_tile(Vs, hd, base + static_cast<int64_t>(NH + NKV + g) * hd, ld, j0, BC, T, hd, 1.0f);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t c0 = j0 + warp * R;  // this warp's first key
  const float* Kw = Ks + warp * R * hd;
  const float* Vw = Vs + warp * R * hd;

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
      load_tile(Qs, ks, q, ld, i0, kLanes, T, hd, scale);
      load_tile(dOs, ks, dO, ldo, i0, kLanes, T, hd, 1.0f);
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
      const float* qr = Qs + lane * ks;
      const float* dr = dOs + lane * ks;
      for (int d = 0; d < hd; ++d) {
        const float qd = qr[d], od = dr[d];
DPT_UNROLL
        for (int r = 0; r < R; ++r) {
          s[r] += qd * Kw[r * hd + d];
          dp[r] += od * Vw[r * hd + d];
        }
      }
      const int64_t t = i0 + lane;
      const float Lt = Ls[lane], Dt = Ds[lane];
DPT_UNROLL
      for (int r = 0; r < R; ++r) {  // P = e^(S - lse); dS = P (dP - D)
        const bool live = t < T && c0 + r <= t;
        const float p = live ? expf(s[r] - Lt) : 0.0f;
        s[r] = p;
        dp[r] = p * (dp[r] - Dt);
      }
      // dV += P^T dO and dK += dS^T (scale Q) over the queries that see a
      // key of this warp (none before its first key).
      const int q_first = static_cast<int>(lmax(0, c0 - i0));
      const int q_end = static_cast<int>(lmin(kLanes, T - i0));
      for (int j = q_first; j < q_end; ++j) {
        float qv[DV], ov[DV];
DPT_UNROLL
        for (int i = 0; i < DV; ++i) {
          const int d = lane + 32 * i;
          qv[i] = d < hd ? Qs[j * ks + d] : 0.0f;
          ov[i] = d < hd ? dOs[j * ks + d] : 0.0f;
        }
DPT_UNROLL
        for (int r = 0; r < R; ++r) {
          const float p = __shfl_sync(kAll, s[r], j), ds = __shfl_sync(kAll, dp[r], j);
DPT_UNROLL
          for (int i = 0; i < DV; ++i) {
            dv[r][i] += p * ov[i];
            dk[r][i] += ds * qv[i];
          }
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
  const int ks = lane_stride(hd);
  float* Qs = smem;               // [BR][hd], scaled: read by broadcast
  float* dOs = Qs + BR * hd;      // [BR][hd]
  float* Ks = dOs + BR * hd;      // [32][ks]: a key per lane
  float* Vs = Ks + kLanes * ks;   // [32][ks]
  const int64_t i0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * BR;  // the heaviest first
  const int h = static_cast<int>(blockIdx.y), g = h / (NH / NKV);
  const int64_t b = blockIdx.z, ld = static_cast<int64_t>(NH + 2 * NKV) * hd, ldo = static_cast<int64_t>(NH) * hd;
  const float* base = qkv + b * T * ld;
  const float* k = base + static_cast<int64_t>(NH + g) * hd;
  const float* v = base + static_cast<int64_t>(NH + NKV + g) * hd;
  load_tile(Qs, hd, base + static_cast<int64_t>(h) * hd, ld, i0, BR, T, hd, scale);
  load_tile(dOs, hd, dout + b * T * ldo + static_cast<int64_t>(h) * hd, ldo, i0, BR, T, hd, 1.0f);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t r0 = i0 + warp * R;
  const float* Qw = Qs + warp * R * hd;
  const float* dOw = dOs + warp * R * hd;
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
    load_tile(Ks, ks, k, ld, j0, kLanes, T, hd, 1.0f);
    load_tile(Vs, ks, v, ld, j0, kLanes, T, hd, 1.0f);
    __syncthreads();
    if (r0 >= T || j0 > r0 + R - 1) continue;  // no row of this warp sees a key of the tile
    float s[R], dp[R];
DPT_UNROLL
    for (int r = 0; r < R; ++r) s[r] = dp[r] = 0.0f;
    const float* kr = Ks + lane * ks;
    const float* vr = Vs + lane * ks;
    for (int d = 0; d < hd; ++d) {
      const float kd = kr[d], vd = vr[d];
DPT_UNROLL
      for (int r = 0; r < R; ++r) {
        s[r] += Qw[r * hd + d] * kd;
        dp[r] += dOw[r * hd + d] * vd;
      }
    }
    const int64_t c = j0 + lane;
DPT_UNROLL
    for (int r = 0; r < R; ++r) {  // dS = P (dP - D), P = e^(S - lse)
      const int64_t row = r0 + r;
      const bool live = row < T && c <= row;
      s[r] = live ? expf(s[r] - Lr[r]) * (dp[r] - Dr[r]) : 0.0f;
    }
    // dQ += dS K over the keys some row of this warp sees.
    const int nj = static_cast<int>(lmin(kLanes, lmin(T, r0 + R) - j0));
    for (int j = 0; j < nj; ++j) {
      float kv[DV];
DPT_UNROLL
      for (int i = 0; i < DV; ++i) {
        const int d = lane + 32 * i;
        kv[i] = d < hd ? Ks[j * ks + d] : 0.0f;
      }
DPT_UNROLL
      for (int r = 0; r < R; ++r) {
        const float ds = __shfl_sync(kAll, s[r], j);
DPT_UNROLL
        for (int i = 0; i < DV; ++i) dq[r][i] += ds * kv[i];
      }
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
    const size_t bytes = sizeof(float) * static_cast<size_t>(BR * s.hd + kLanes * lane_stride(s.hd) + kLanes * s.hd);
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
    const int ks = lane_stride(s.hd);
    const size_t kv_bytes = sizeof(float) * static_cast<size_t>(2 * BT * s.hd + 2 * kLanes * ks + 2 * kLanes);
    const size_t q_bytes = sizeof(float) * static_cast<size_t>(2 * BT * s.hd + 2 * kLanes * ks);
    const unsigned tiles = tiles_of(s.T, BT), B = static_cast<unsigned>(s.B);
    launch(flash_dkdv_kernel<DV>, Grid{tiles, static_cast<unsigned>(s.NKV), B}, kWarps * 32, kv_bytes, dqkv, dout, qkv,
           lse, static_cast<const float*>(D), s.T, s.NH, s.NKV, s.hd, s.scale);
    launch(flash_dq_kernel<DV>, Grid{tiles, static_cast<unsigned>(s.NH), B}, kWarps * 32, q_bytes, dqkv, dout, qkv,
           lse, static_cast<const float*>(D), s.T, s.NH, s.NKV, s.hd, s.scale);
  });
}

}  // namespace dpt::cuda::flash
