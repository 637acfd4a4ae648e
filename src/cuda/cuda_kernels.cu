// The CUDA side of device/kernels.h: every op a model or an optimizer needs, on
// this process's GPU, computing what the CPU op of the same name computes
// (src/nn/*.cpp), in the same arithmetic order where it matters.
//
// - One compute stream; every op is queued on it. Only the ops that return a
//   value to the host (cross-entropy's loss, sum_of_squares, download)
//   wait for it.
// - Linear layers: cuBLASLt matmuls in true fp32 (CUBLAS_COMPUTE_32F, no
//   TF32) for fp32 operands, and bf16 operands with fp32 output and fp32
//   accumulation for bf16 runs; plans (descriptors and the heuristic's
//   algorithm) cached per shape. Attention: strided-batched cuBLAS GEMMs per
//   sequence and a fused causal softmax (the T x T probabilities kept, as
//   the CPU's unfused layer keeps them); the fused attention that never
//   stores them is cuda/flash_attention.cu's (--attention fused).
// - Reductions over rows (bias, LayerNorm and position-embedding gradients,
//   sums of squares) are two-stage with a fixed order: deterministic. The
//   token-embedding gradient sorts the positions by token (CUB's stable
//   radix sort) and adds each token's rows in position order, the CPU's
//   order, so a run repeats to the bit (a checkpoint resumes bitwise).
// - Scratch (cuBLASLt workspace, reduction partials, attention's gradient
//   block, pack/unpack rows) is allocated once and grown only when a larger
//   size is first needed; nothing is allocated per step after the first.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cub/device/device_radix_sort.cuh>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "cuda/flash_attention.h"
#include "cuda/module.h"

namespace dpt::cuda {

namespace {

void check(cudaError_t e, const char* call) {
  if (e != cudaSuccess) throw InternalError(fmt::format("{} failed: {}", call, cudaGetErrorString(e)));
}
void check(cublasStatus_t s, const char* call) {
  if (s != CUBLAS_STATUS_SUCCESS) throw InternalError(fmt::format("{} failed: {}", call, cublasGetStatusString(s)));
}
#define CK(call) check((call), #call)
#define LAUNCHED() check(cudaGetLastError(), "kernel launch")

constexpr int kThreads = 256;
// Kernels with one warp per row have no grid-stride loop: their grids are
// never capped (a grid may have 2^31 - 1 blocks).
inline unsigned row_blocks(int64_t rows, int rows_per_block = kThreads / 32) {
  return static_cast<unsigned>(std::max<int64_t>(1, (rows + rows_per_block - 1) / rows_per_block));
}
inline unsigned blocks_for(int64_t n, int threads = kThreads) {
  int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65535 * 16 ? 65535 * 16 : b));
}

// ------------------------------------------------------------ element kernels

__device__ __forceinline__ uint16_t to_bf16_bits(float f) {
  // core/dtype.h's to_bf16: round to nearest even, NaN kept quiet.
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
__device__ __forceinline__ float from_bf16_bits(uint16_t b) { return __uint_as_float(static_cast<uint32_t>(b) << 16); }

template <typename T>
__device__ __forceinline__ T store_as(float x);
template <>
__device__ __forceinline__ float store_as<float>(float x) { return x; }
template <>
__device__ __forceinline__ bf16 store_as<bf16>(float x) { return bf16{to_bf16_bits(x)}; }
__device__ __forceinline__ float load(float x) { return x; }
__device__ __forceinline__ float load(bf16 x) { return from_bf16_bits(x.bits); }

#define GRID_LOOP(i, n) for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)

__global__ void to_bf16_kernel(bf16* out, const float* in, int64_t n) {
  GRID_LOOP(i, n) out[i] = bf16{to_bf16_bits(in[i])};
}
__global__ void to_f32_kernel(float* out, const bf16* in, int64_t n) {
  GRID_LOOP(i, n) out[i] = from_bf16_bits(in[i].bits);
}
__global__ void add_kernel(float* out, const float* a, const float* b, int64_t n) {
  GRID_LOOP(i, n) out[i] = a[i] + b[i];
}
__global__ void scale_kernel(float* x, int64_t n, float f) {
  GRID_LOOP(i, n) x[i] *= f;
}
__global__ void relu_kernel(float* out, const float* in, int64_t n) {
  GRID_LOOP(i, n) out[i] = in[i] > 0.0f ? in[i] : 0.0f;
}
__global__ void relu_backward_kernel(float* dinp, const float* dout, const float* out, int64_t n) {
  GRID_LOOP(i, n) dinp[i] = out[i] > 0.0f ? dout[i] : 0.0f;
}

constexpr float kGeluScale = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;
__device__ __forceinline__ float gelu_tanh(float u) {
  // nn/activations.cpp's tanh, through exp, clamped at |u| = 10.
  u = u > 10.0f ? 10.0f : (u < -10.0f ? -10.0f : u);
  return 1.0f - 2.0f / (expf(2.0f * u) + 1.0f);
}
template <typename T>
__global__ void gelu_kernel(T* out, const float* in, int64_t n) {
  GRID_LOOP(i, n) {
    const float x = in[i];
    const float u = kGeluScale * (x + kGeluCubic * x * x * x);
    out[i] = store_as<T>(0.5f * x * (1.0f + gelu_tanh(u)));
  }
}
__global__ void gelu_backward_kernel(float* dinp, const float* dout, const float* in, int64_t n) {
  GRID_LOOP(i, n) {
    const float x = in[i];
    const float u = kGeluScale * (x + kGeluCubic * x * x * x);
    const float t = gelu_tanh(u);
    const float sech2 = 1.0f - t * t;
    const float du = kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
    dinp[i] = dout[i] * (0.5f * (1.0f + t) + 0.5f * x * sech2 * du);
  }
}

__global__ void sgd_kernel(float* p, float* g, float* buf, int64_t n, float lr, float mu, float decay, bool first,
                           bool consume) {
  GRID_LOOP(i, n) {
    float gi = g[i] + decay * p[i];
    if (consume) g[i] = 0.0f;
    if (buf) {
      buf[i] = first ? gi : mu * buf[i] + gi;
      gi = buf[i];
    }
    p[i] -= lr * gi;
  }
}
__global__ void adamw_kernel(float* p, float* g, float* m, float* v, int64_t n, float b1, float b2, float eps,
                             float keep, float step_size, float rc2, bool consume) {
  GRID_LOOP(i, n) {
    const float gi = g[i];
    if (consume) g[i] = 0.0f;
    const float mi = b1 * m[i] + (1.0f - b1) * gi;
    const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * keep - step_size * mi / (sqrtf(vi) * rc2 + eps);
  }
}

__global__ void bias_rows_kernel(float* out, const float* bias, int64_t N, int64_t OC) {
  GRID_LOOP(i, N * OC) out[i] = bias[i % OC];
}

template <typename T>
__global__ void embedding_kernel(float* out, const int32_t* ids, const T* table, int64_t N, int64_t C) {
  GRID_LOOP(i, N * C) {
    const int64_t n = i / C, c = i % C;
    out[i] = load(table[static_cast<int64_t>(ids[n]) * C + c]);
  }
}
__global__ void iota_kernel(int32_t* out, int64_t n) {
  GRID_LOOP(i, n) out[i] = static_cast<int32_t>(i);
}
// sorted: the ids in order, positions: where each came from (ascending within
// one id: the sort is stable). The first entry of each id's run adds the run's
// rows to its table row, in position order, as nn/embedding.cpp does.
__global__ void embedding_backward_kernel(float* dtable, const float* dout, const int32_t* sorted,
                                          const int32_t* positions, int64_t N, int64_t C) {
  GRID_LOOP(i, N * C) {
    const int64_t j = i / C, c = i % C;
    const int32_t id = sorted[j];
    if (j > 0 && sorted[j - 1] == id) continue;
    float* d = dtable + static_cast<int64_t>(id) * C + c;
    float s = *d;
    for (int64_t k = j; k < N && sorted[k] == id; ++k) s += dout[static_cast<int64_t>(positions[k]) * C + c];
    *d = s;
  }
}
template <typename T>
__global__ void position_kernel(float* out, const T* pos, int64_t B, int64_t T_, int64_t C) {
  GRID_LOOP(i, B * T_ * C) {
    const int64_t tc = i % (T_ * C);
    out[i] += load(pos[tc]);
  }
}
__global__ void position_backward_kernel(float* dpos, const float* dout, int64_t B, int64_t T_, int64_t C) {
  GRID_LOOP(i, T_ * C) {
    float s = 0.0f;  // the CPU's order: b = 0, 1, ...
    for (int64_t b = 0; b < B; ++b) s += dout[b * T_ * C + i];
    dpos[i] += s;
  }
}

// Rows of a padded matrix, through scratch: rows moved in one pass each way.
__global__ void gather_rows_kernel(float* dst, const float* src, int64_t N, int64_t width, int64_t src_ld,
                                   int64_t dst_ld) {
  GRID_LOOP(i, N * dst_ld) {
    const int64_t n = i / dst_ld, c = i % dst_ld;
    dst[i] = c < width ? src[n * src_ld + c] : 0.0f;
  }
}

// ------------------------------------------------------------ row kernels (a warp per row)

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

template <typename T>
__global__ void layernorm_kernel(T* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                                 int64_t N, int64_t C) {
  const int64_t row = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const float* x = inp + row * C;
  float s = 0.0f;
  for (int64_t c = lane; c < C; c += 32) s += x[c];
  const float m = warp_sum(s) / static_cast<float>(C);
  float v = 0.0f;
  for (int64_t c = lane; c < C; c += 32) v += (x[c] - m) * (x[c] - m);
  const float r = 1.0f / sqrtf(warp_sum(v) / static_cast<float>(C) + 1e-5f);
  T* y = out + row * C;
  for (int64_t c = lane; c < C; c += 32) y[c] = store_as<T>((x[c] - m) * r * w[c] + b[c]);
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

// dinp += s * (dy w - mean(dy w) - xhat mean(dy w xhat)), a warp per row.
__global__ void layernorm_backward_dx_kernel(float* dinp, const float* dout, const float* inp, const float* w,
                                             const float* mean, const float* rstd, int64_t N, int64_t C) {
  const int64_t row = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const float* x = inp + row * C;
  const float* dy = dout + row * C;
  const float m = mean[row], s = rstd[row];
  float a = 0.0f, bb = 0.0f;
  for (int64_t c = lane; c < C; c += 32) {
    const float xhat = (x[c] - m) * s, dxhat = dy[c] * w[c];
    a += dxhat;
    bb += dxhat * xhat;
  }
  a = warp_sum(a) / static_cast<float>(C);
  bb = warp_sum(bb) / static_cast<float>(C);
  float* dx = dinp + row * C;
  for (int64_t c = lane; c < C; c += 32) {
    const float xhat = (x[c] - m) * s;
    dx[c] += s * (dy[c] * w[c] - a - xhat * bb);
  }
}

// Column sums in two fixed-order stages: partial[r][c] = sum over rows
// chunk r of f(n, c); then out[c] += sum_r partial[r][c].
constexpr int kColRows = 8;  // threadIdx.y
template <typename F>
__global__ void column_partial_kernel(float* partial, int64_t N, int64_t C, int64_t rows_per_chunk, F f) {
  __shared__ float acc[kColRows][32];
  const int64_t c = blockIdx.x * 32 + threadIdx.x;
  const int64_t r0 = blockIdx.y * rows_per_chunk, r1 = r0 + rows_per_chunk < N ? r0 + rows_per_chunk : N;
  float s = 0.0f;
  if (c < C)
    for (int64_t n = r0 + threadIdx.y; n < r1; n += kColRows) s += f(n, c);
  acc[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float t = 0.0f;
    for (int y = 0; y < kColRows; ++y) t += acc[y][threadIdx.x];
    partial[blockIdx.y * C + c] = t;
  }
}
__global__ void column_finish_kernel(float* out, const float* partial, int64_t chunks, int64_t C) {
  GRID_LOOP(c, C) {
    float t = 0.0f;
    for (int64_t r = 0; r < chunks; ++r) t += partial[r * C + c];
    out[c] += t;
  }
}
struct BiasTerm {
  const float* dout;
  int64_t OC;
  __device__ float operator()(int64_t n, int64_t c) const { return dout[n * OC + c]; }
};
struct LnWeightTerm {
  const float *dout, *inp, *mean, *rstd;
  int64_t C;
  __device__ float operator()(int64_t n, int64_t c) const {
    return dout[n * C + c] * ((inp[n * C + c] - mean[n]) * rstd[n]);
  }
};

struct RmsWeightTerm {
  const float *dout, *inp, *rstd;
  int64_t C;
  __device__ float operator()(int64_t n, int64_t c) const { return dout[n * C + c] * (inp[n * C + c] * rstd[n]); }
};

// Causal softmax in place over rows of length T (row t of each T x T block
// keeps columns 0..t), a warp per row; the scale is in the GEMM.
__global__ void causal_softmax_kernel(float* att, int64_t rows, int64_t T) {
  const int64_t row = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int64_t t = row % T;
  float* a = att + row * T;
  float m = -INFINITY;
  for (int64_t s = lane; s <= t; s += 32) m = fmaxf(m, a[s]);
  m = warp_max(m);
  float sum = 0.0f;
  for (int64_t s = lane; s <= t; s += 32) {
    const float e = expf(a[s] - m);
    a[s] = e;
    sum += e;
  }
  const float inv = 1.0f / warp_sum(sum);
  for (int64_t s = lane; s < T; s += 32) a[s] = s <= t ? a[s] * inv : 0.0f;
}
// d = att * (d - sum(att * d)) over each causal row; zero above the diagonal.
__global__ void causal_softmax_backward_kernel(float* d, const float* att, int64_t rows, int64_t T) {
  const int64_t row = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int64_t t = row % T;
  const float* a = att + row * T;
  float* dr = d + row * T;
  float dot = 0.0f;
  for (int64_t s = lane; s <= t; s += 32) dot += a[s] * dr[s];
  dot = warp_sum(dot);
  for (int64_t s = lane; s < T; s += 32) dr[s] = s <= t ? a[s] * (dr[s] - dot) : 0.0f;
}

// ------------------------------------------------- the Llama family's layers
// RMSNorm (nn/rmsnorm.h), a warp per row: out = w * (x * rstd).
template <typename T>
__global__ void rmsnorm_kernel(T* out, float* rstd, const float* inp, const float* w, int64_t N, int64_t C,
                               float eps) {
  const int64_t row = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const float* x = inp + row * C;
  float ss = 0.0f;
  for (int64_t c = lane; c < C; c += 32) ss += x[c] * x[c];
  const float r = 1.0f / sqrtf(warp_sum(ss) / static_cast<float>(C) + eps);
  T* y = out + row * C;
  for (int64_t c = lane; c < C; c += 32) y[c] = store_as<T>(w[c] * (x[c] * r));
  if (lane == 0) rstd[row] = r;
}
// dinp += s * (dy w - xhat mean(dy w xhat)), a warp per row.
__global__ void rmsnorm_backward_dx_kernel(float* dinp, const float* dout, const float* inp, const float* w,
                                           const float* rstd, int64_t N, int64_t C) {
  const int64_t row = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const float* x = inp + row * C;
  const float* dy = dout + row * C;
  const float s = rstd[row];
  float b = 0.0f;
  for (int64_t c = lane; c < C; c += 32) b += dy[c] * w[c] * (x[c] * s);
  b = warp_sum(b) / static_cast<float>(C);
  float* dx = dinp + row * C;
  for (int64_t c = lane; c < C; c += 32) dx[c] += s * (dy[c] * w[c] - x[c] * s * b);
}
// Rotary embedding (nn/rope.h), a thread per (row, head, channel pair);
// sign -1 rotates back (the backward). In place is safe: a thread reads
// its pair before it writes it.
__global__ void rope_kernel(float* out, const float* inp, const float* cos, const float* sin, int64_t B, int64_t T,
                            int64_t H, int64_t hd, int64_t ld, float sign) {
  const int64_t half = hd / 2;
  GRID_LOOP(idx, B * T * H * half) {
    const int64_t row = idx / (H * half), h = (idx / half) % H, i = idx % half;
    const int64_t t = row % T;
    const float c = cos[t * half + i], sn = sign * sin[t * half + i];
    const float* x = inp + row * ld + h * hd;
    float* y = out + row * ld + h * hd;
    const float x1 = x[i], x2 = x[i + half];
    y[i] = x1 * c - x2 * sn;
    y[i + half] = x2 * c + x1 * sn;
  }
}
// SwiGLU (nn/swiglu.h) on rows of gate | up.
template <typename T>
__global__ void swiglu_kernel(T* out, const float* gu, int64_t N, int64_t I) {
  GRID_LOOP(idx, N * I) {
    const int64_t n = idx / I, i = idx % I;
    const float g = gu[n * 2 * I + i], u = gu[n * 2 * I + I + i];
    out[idx] = store_as<T>(g * (1.0f / (1.0f + expf(-g))) * u);
  }
}
__global__ void swiglu_backward_kernel(float* dgu, bf16* dgu16, const float* dout, const float* gu, int64_t N,
                                       int64_t I) {
  GRID_LOOP(idx, N * I) {
    const int64_t n = idx / I, i = idx % I, gi = n * 2 * I + i, ui = gi + I;
    const float g = gu[gi], u = gu[ui], dy = dout[idx];
    const float s = 1.0f / (1.0f + expf(-g));
    const float dg = dy * u * (s * (1.0f + g * (1.0f - s))), du = dy * (g * s);
    dgu[gi] = dg;
    dgu[ui] = du;
    if (dgu16) {
      dgu16[gi] = store_as<bf16>(dg);
      dgu16[ui] = store_as<bf16>(du);
    }
  }
}

// Cross-entropy, a block per row: max (first index on ties), sum of exp,
// probabilities, and the row's loss log(sum) - (z_t - max).
constexpr int kCeThreads = 512;
__global__ void cross_entropy_kernel(float* probs, const float* logits, const int32_t* targets, int64_t V,
                                     float* row_loss, int* row_hit) {
  __shared__ float sm[kCeThreads / 32];
  __shared__ int si[kCeThreads / 32];
  const int64_t n = blockIdx.x;
  const float* z = logits + n * V;
  float* p = probs + n * V;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  float m = -INFINITY;
  int arg = 0x7fffffff;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x)
    if (z[v] > m) m = z[v], arg = static_cast<int>(v);
  for (int o = 16; o > 0; o >>= 1) {
    const float om = __shfl_xor_sync(0xffffffffu, m, o);
    const int oa = __shfl_xor_sync(0xffffffffu, arg, o);
    if (om > m || (om == m && oa < arg)) m = om, arg = oa;
  }
  if (lane == 0) sm[warp] = m, si[warp] = arg;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < warps; ++w)
      if (sm[w] > sm[0] || (sm[w] == sm[0] && si[w] < si[0])) sm[0] = sm[w], si[0] = si[w];
  }
  __syncthreads();
  const float zmax = sm[0];
  const int best = si[0];
  const int32_t t = targets[n];
  const float zt = z[t];
  __syncthreads();
  float s = 0.0f;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const float e = expf(z[v] - zmax);
    p[v] = e;
    s += e;
  }
  s = warp_sum(s);
  if (lane == 0) sm[warp] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    float tot = 0.0f;
    for (int w = 0; w < warps; ++w) tot += sm[w];
    sm[0] = tot;
  }
  __syncthreads();
  const float sum = sm[0], inv = 1.0f / sum;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) p[v] *= inv;
  if (threadIdx.x == 0) {
    row_loss[n] = logf(sum) - (zt - zmax);
    row_hit[n] = best == t;
  }
}
// Loss and hits summed in row order (a single thread: N is at most a few
// hundred thousand, and the result is deterministic), in double.
__global__ void sum_rows_kernel(const float* row_loss, const int* row_hit, int64_t N, double* out_loss,
                                long long* out_hits) {
  __shared__ double sl[kThreads];
  __shared__ long long sh[kThreads];
  double l = 0.0;
  long long h = 0;
  for (int64_t n = threadIdx.x; n < N; n += blockDim.x) l += row_loss[n], h += row_hit[n];
  sl[threadIdx.x] = l;
  sh[threadIdx.x] = h;
  __syncthreads();
  if (threadIdx.x == 0) {
    double tl = 0.0;
    long long th = 0;
    for (int i = 0; i < static_cast<int>(blockDim.x); ++i) tl += sl[i], th += sh[i];
    *out_loss = tl;
    *out_hits = th;
  }
}
__global__ void cross_entropy_backward_kernel(float* d, const float* p, const int32_t* targets, int64_t N, int64_t V,
                                              float scale) {
  GRID_LOOP(i, N * V) {
    const int64_t n = i / V, v = i % V;
    d[i] = p[i] * scale - (v == targets[n] ? scale : 0.0f);
  }
}

// The same gradient (into d where given, [N, V]) and its bf16 copy in rows
// ld16 apart, the columns past V zero. d may alias p: each element is read
// and written by one thread.
__global__ void cross_entropy_backward_bf16_kernel(float* d, bf16* d16, int64_t ld16, const float* p,
                                                   const int32_t* targets, int64_t N, int64_t V, float scale) {
  GRID_LOOP(i, N * ld16) {
    const int64_t n = i / ld16, v = i % ld16, j = n * V + v;
    if (v >= V) {
      d16[i] = bf16{0};
      continue;
    }
    const float x = p[j] * scale - (v == targets[n] ? scale : 0.0f);
    if (d) d[j] = x;
    d16[i] = bf16{to_bf16_bits(x)};
  }
}

// Sum of squares: per-block partials in double, then summed in block order.
constexpr int kSumBlocks = 1024;
__global__ void square_partial_kernel(const float* x, int64_t n, double* partial) {
  __shared__ double s[kThreads];
  double acc = 0.0;
  GRID_LOOP(i, n) acc += static_cast<double>(x[i]) * x[i];
  s[threadIdx.x] = acc;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w >>= 1) {
    if (static_cast<int>(threadIdx.x) < w) s[threadIdx.x] += s[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = s[0];
}
__global__ void square_finish_kernel(const double* partial, int blocks, double* out) {
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    double t = 0.0;
    for (int i = 0; i < blocks; ++i) t += partial[i];
    *out = t;
  }
}

// ------------------------------------------------------------ the context

struct PlanKey {
  bool ta, tb, bf;
  int64_t m, n, k, lda, ldb, ldc;
  bool accumulate;
  // The operands' alignments in bytes (at most 256): weights are slices of
  // the flat parameter buffer, so they are often less aligned than the 256
  // bytes cuBLASLt's heuristic assumes by default.
  int align_a, align_b, align_c;
  bool operator<(const PlanKey& o) const {
    return std::tie(ta, tb, bf, m, n, k, lda, ldb, ldc, accumulate, align_a, align_b, align_c) <
           std::tie(o.ta, o.tb, o.bf, o.m, o.n, o.k, o.lda, o.ldb, o.ldc, o.accumulate, o.align_a, o.align_b,
                    o.align_c);
  }
};

int alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  int b = 1;
  while (b < 256 && (a % (2 * b)) == 0) b *= 2;
  return b;
}
struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool has_algo = false;
};

class CudaKernels;

// A scratch buffer on the device, grown (never shrunk) on demand.
struct Scratch {
  void* p = nullptr;
  size_t bytes = 0;
  void* get(size_t need, const CudaKernels& k);
};

class CudaKernels final : public Kernels {
 public:
  CudaKernels() {
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0)
      throw InputError(fmt::format("no CUDA device: {}", e != cudaSuccess ? cudaGetErrorString(e) : "none visible"));
    int dev = 0;
    if (const char* v = std::getenv("DPT_CUDA_DEVICE"))
      dev = std::atoi(v);
    else if (const char* r = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK"))
      dev = std::atoi(r) % count;
    if (dev < 0 || dev >= count)
      throw InputError(fmt::format("DPT_CUDA_DEVICE={} is not one of the {} visible GPUs", dev, count));
    device_ = dev;
    CK(cudaSetDevice(dev));
    CK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
    CK(cublasLtCreate(&lt_));
    CK(cublasCreate(&blas_));
    CK(cublasSetStream(blas_, stream_));
    CK(cublasSetMathMode(blas_, CUBLAS_DEFAULT_MATH));  // no TF32
    CK(cudaMalloc(&workspace_, kWorkspace));
    CK(cudaMallocHost(&host_result_, 64));
  }

  Device device() const override { return Device::CUDA; }
  // Every thread that calls in works on this process's GPU.
  void bind() const { cudaSetDevice(device_); }

  void* alloc(size_t bytes) const override {
    if (bytes == 0) return nullptr;
    bind();
    void* p = nullptr;
    const size_t rounded = (bytes + 255) / 256 * 256;
    if (cudaMalloc(&p, rounded) != cudaSuccess) {
      cudaGetLastError();
      throw std::bad_alloc();
    }
    CK(cudaMemsetAsync(p, 0, rounded, stream_));
    std::lock_guard<std::mutex> lock(mu_);
    sizes_[p] = rounded;
    const size_t now = in_use_ += rounded;
    if (now > peak_) peak_ = now;
    return p;
  }
  void free(void* p) const override {
    if (!p) return;
    bind();
    cudaStreamSynchronize(stream_);  // no queued op may still use it
    cudaFree(p);
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sizes_.find(p);
    if (it != sizes_.end()) {
      in_use_ -= it->second;
      sizes_.erase(it);
    }
  }
  void zero(void* p, size_t bytes) const override {
    if (bytes) CK(cudaMemsetAsync(p, 0, bytes, stream_));
  }
  void copy(void* dst, const void* src, size_t bytes) const override {
    if (bytes) CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
  }
  void upload(void* dst, const void* src, size_t bytes) const override {
    if (!bytes) return;
    bind();
    // Pageable memory: the copy has left the caller's buffer when this returns.
    CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
    CK(cudaStreamSynchronize(stream_));
  }
  void download(void* dst, const void* src, size_t bytes) const override {
    if (!bytes) return;
    bind();
    CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    CK(cudaStreamSynchronize(stream_));
  }
  void synchronize() const override {
    bind();
    CK(cudaStreamSynchronize(stream_));
  }
  void* pinned_alloc(size_t bytes) const override {
    if (bytes == 0) return nullptr;
    bind();
    void* p = nullptr;
    if (cudaMallocHost(&p, bytes) != cudaSuccess) {
      cudaGetLastError();
      throw std::bad_alloc();
    }
    return p;
  }
  void pinned_free(void* p) const override {
    if (p) cudaFreeHost(p);
  }

  void convert(bf16* out, const float* in, size_t n) const override {
    if (!n) return;
    to_bf16_kernel<<<blocks_for(n), kThreads, 0, stream_>>>(out, in, static_cast<int64_t>(n));
    LAUNCHED();
  }
  void convert(float* out, const bf16* in, size_t n) const override {
    if (!n) return;
    to_f32_kernel<<<blocks_for(n), kThreads, 0, stream_>>>(out, in, static_cast<int64_t>(n));
    LAUNCHED();
  }

  void linear_forward(float* out, const float* inp, const float* w, const float* b, int64_t N, int64_t C,
                      int64_t OC) const override {
    linear_forward_as(out, inp, w, b, N, C, OC, false);
  }
  void linear_forward(float* out, const bf16* inp, const bf16* w, const float* b, int64_t N, int64_t C,
                      int64_t OC) const override {
    linear_forward_as(out, inp, w, b, N, C, OC, true);
  }
  void linear_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                       int64_t N, int64_t C, int64_t OC, const float* dout_bias) const override {
    linear_backward_as(dinp, dw, db, dout, inp, w, N, C, OC, dout_bias ? dout_bias : dout, false);
  }
  void linear_backward(float* dinp, float* dw, float* db, const bf16* dout, const bf16* inp, const bf16* w,
                       int64_t N, int64_t C, int64_t OC, const float* dout_bias) const override {
    if (db && !dout_bias) throw InternalError("a bf16 linear backward needs the fp32 output gradient for its bias");
    linear_backward_as(dinp, dw, db, dout, inp, w, N, C, OC, dout_bias, true);
  }

  // The two passes the CPU fuses, one kernel each.
  void output_grad_bf16(bf16* dout16, float* dbias, const float* dout, int64_t N, int64_t OC) const override {
    convert(dout16, dout, static_cast<size_t>(N * OC));
    if (dbias) column_sum(dbias, N, OC, BiasTerm{dout, OC});
  }

  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                         int64_t N, int64_t C) const override {
    layernorm_kernel<float><<<row_blocks(N), kThreads, 0, stream_>>>(out, mean, rstd, inp, w, b, N, C);
    LAUNCHED();
  }
  void layernorm_forward(bf16* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                         int64_t N, int64_t C) const override {
    layernorm_kernel<bf16><<<row_blocks(N), kThreads, 0, stream_>>>(out, mean, rstd, inp, w, b, N, C);
    LAUNCHED();
  }
  void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                          const float* mean, const float* rstd, int64_t N, int64_t C) const override {
    layernorm_backward_dx_kernel<<<row_blocks(N), kThreads, 0, stream_>>>(dinp, dout, inp, w, mean, rstd, N, C);
    LAUNCHED();
    column_sum(dw, N, C, LnWeightTerm{dout, inp, mean, rstd, C});
    column_sum(db, N, C, BiasTerm{dout, C});
  }

  void relu_forward(float* out, const float* inp, int64_t n) const override {
    relu_kernel<<<blocks_for(n), kThreads, 0, stream_>>>(out, inp, n);
    LAUNCHED();
  }
  void relu_backward(float* dinp, const float* dout, const float* out, int64_t n) const override {
    relu_backward_kernel<<<blocks_for(n), kThreads, 0, stream_>>>(dinp, dout, out, n);
    LAUNCHED();
  }
  void gelu_forward(float* out, const float* inp, int64_t n) const override {
    gelu_kernel<float><<<blocks_for(n), kThreads, 0, stream_>>>(out, inp, n);
    LAUNCHED();
  }
  void gelu_forward(bf16* out, const float* inp, int64_t n) const override {
    gelu_kernel<bf16><<<blocks_for(n), kThreads, 0, stream_>>>(out, inp, n);
    LAUNCHED();
  }
  void gelu_backward(float* dinp, const float* dout, const float* inp, int64_t n) const override {
    gelu_backward_kernel<<<blocks_for(n), kThreads, 0, stream_>>>(dinp, dout, inp, n);
    LAUNCHED();
  }
  // The three steps the CPU fuses, one kernel each: on a GPU they are
  // launches on one stream, and the bias's column sums are column_sum's.
  void gelu_backward(float* dinp, bf16* dinp16, float* dbias, const float* dout, const float* inp, int64_t N,
                     int64_t OC) const override {
    gelu_backward(dinp, dout, inp, N * OC);
    if (dbias) column_sum(dbias, N, OC, BiasTerm{dinp, OC});
    if (dinp16) convert(dinp16, dinp, static_cast<size_t>(N * OC));
  }

  void attention_forward(float* out, float* att, const float* qkv, int64_t B, int64_t T, int64_t C,
                         int64_t NH) const override {
    const int64_t hs = C / NH, C3 = 3 * C;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    for (int64_t b = 0; b < B; ++b) {
      const float* q = qkv + b * T * C3;
      float* a = att + b * NH * T * T;
      // pre[h] = scale q_h k_h^T  (row-major [T, T] per head)
      batched(false, true, T, T, hs, scale, q, C3, hs, q + C, C3, hs, 0.0f, a, T, T * T, NH);
      causal_softmax_kernel<<<row_blocks(NH * T), kThreads, 0, stream_>>>(a, NH * T, T);
      LAUNCHED();
      // y_h = att_h v_h
      batched(false, false, T, hs, T, 1.0f, a, T, T * T, q + 2 * C, C3, hs, 0.0f, out + b * T * C, C, hs, NH);
    }
  }
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int64_t B, int64_t T,
                          int64_t C, int64_t NH) const override {
    const int64_t hs = C / NH, C3 = 3 * C;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    float* d = static_cast<float*>(datt_.get(static_cast<size_t>(NH * T * T) * sizeof(float), *this));
    for (int64_t b = 0; b < B; ++b) {
      const float* q = qkv + b * T * C3;
      const float* a = att + b * NH * T * T;
      const float* dy = dout + b * T * C;
      float* dq = dqkv + b * T * C3;
      // datt = dy v^T ; dv = att^T dy
      batched(false, true, T, T, hs, 1.0f, dy, C, hs, q + 2 * C, C3, hs, 0.0f, d, T, T * T, NH);
      batched(true, false, T, hs, T, 1.0f, a, T, T * T, dy, C, hs, 0.0f, dq + 2 * C, C3, hs, NH);
      causal_softmax_backward_kernel<<<row_blocks(NH * T), kThreads, 0, stream_>>>(d, a, NH * T, T);
      LAUNCHED();
      // dq = scale dpre k ; dk = scale dpre^T q
      batched(false, false, T, hs, T, scale, d, T, T * T, q + C, C3, hs, 0.0f, dq, C3, hs, NH);
      batched(true, false, T, hs, T, scale, d, T, T * T, q, C3, hs, 0.0f, dq + C, C3, hs, NH);
    }
  }

  void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int64_t N, int64_t C,
                       float eps) const override {
    rmsnorm_kernel<float><<<row_blocks(N), kThreads, 0, stream_>>>(out, rstd, inp, w, N, C, eps);
    LAUNCHED();
  }
  void rmsnorm_forward(bf16* out, float* rstd, const float* inp, const float* w, int64_t N, int64_t C,
                       float eps) const override {
    rmsnorm_kernel<bf16><<<row_blocks(N), kThreads, 0, stream_>>>(out, rstd, inp, w, N, C, eps);
    LAUNCHED();
  }
  void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w, const float* rstd,
                        int64_t N, int64_t C) const override {
    rmsnorm_backward_dx_kernel<<<row_blocks(N), kThreads, 0, stream_>>>(dinp, dout, inp, w, rstd, N, C);
    LAUNCHED();
    column_sum(dw, N, C, RmsWeightTerm{dout, inp, rstd, C});
  }
  void rope_forward(float* out, const float* inp, const float* cos, const float* sin, int64_t B, int64_t T, int64_t H,
                    int64_t hd, int64_t ld) const override {
    rope_kernel<<<blocks_for(B * T * H * (hd / 2)), kThreads, 0, stream_>>>(out, inp, cos, sin, B, T, H, hd, ld, 1.0f);
    LAUNCHED();
  }
  void rope_backward(float* dinp, const float* dout, const float* cos, const float* sin, int64_t B, int64_t T,
                     int64_t H, int64_t hd, int64_t ld) const override {
    rope_kernel<<<blocks_for(B * T * H * (hd / 2)), kThreads, 0, stream_>>>(dinp, dout, cos, sin, B, T, H, hd, ld,
                                                                             -1.0f);
    LAUNCHED();
  }
  // The two passes the CPU fuses, one kernel each.
  void rope_backward(float* dinp, bf16* dinp16, const float* cos, const float* sin, int64_t B, int64_t T, int64_t H,
                     int64_t hd, int64_t ld) const override {
    rope_backward(dinp, dinp, cos, sin, B, T, H, hd, ld);
    convert(dinp16, dinp, static_cast<size_t>(B * T * ld));
  }
  void swiglu_forward(float* out, const float* gu, int64_t N, int64_t I) const override {
    swiglu_kernel<float><<<blocks_for(N * I), kThreads, 0, stream_>>>(out, gu, N, I);
    LAUNCHED();
  }
  void swiglu_forward(bf16* out, const float* gu, int64_t N, int64_t I) const override {
    swiglu_kernel<bf16><<<blocks_for(N * I), kThreads, 0, stream_>>>(out, gu, N, I);
    LAUNCHED();
  }
  void swiglu_backward(float* dgu, bf16* dgu16, const float* dout, const float* gu, int64_t N,
                       int64_t I) const override {
    swiglu_backward_kernel<<<blocks_for(N * I), kThreads, 0, stream_>>>(dgu, dgu16, dout, gu, N, I);
    LAUNCHED();
  }
  // Grouped-query attention per sequence: query head h = g * group + j reads
  // key/value head g, so for each j one strided batch over the NKV groups
  // (query heads group apart, key/value heads one apart).
  void gqa_attention_forward(float* out, float* att, const float* qkv, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                             int64_t hd) const override {
    const int64_t ld = (NH + 2 * NKV) * hd, ldo = NH * hd, group = NH / NKV, TT = T * T;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    for (int64_t b = 0; b < B; ++b) {
      const float* q = qkv + b * T * ld;
      const float* k = q + NH * hd;
      const float* v = k + NKV * hd;
      float* a = att + b * NH * TT;
      for (int64_t j = 0; j < group; ++j)
        batched(false, true, T, T, hd, scale, q + j * hd, ld, group * hd, k, ld, hd, 0.0f, a + j * TT, T, group * TT,
                NKV);
      causal_softmax_kernel<<<row_blocks(NH * T), kThreads, 0, stream_>>>(a, NH * T, T);
      LAUNCHED();
      for (int64_t j = 0; j < group; ++j)
        batched(false, false, T, hd, T, 1.0f, a + j * TT, T, group * TT, v, ld, hd, 0.0f, out + b * T * ldo + j * hd,
                ldo, group * hd, NKV);
    }
  }
  // A key/value head's gradient sums its query heads in order j = 0, 1, ...
  // (beta 0, then 1), as the CPU's.
  void gqa_attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int64_t B, int64_t T,
                              int64_t NH, int64_t NKV, int64_t hd) const override {
    const int64_t ld = (NH + 2 * NKV) * hd, ldo = NH * hd, group = NH / NKV, TT = T * T;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    float* d = static_cast<float*>(datt_.get(static_cast<size_t>(NH * TT) * sizeof(float), *this));
    for (int64_t b = 0; b < B; ++b) {
      const float *q = qkv + b * T * ld, *k = q + NH * hd, *v = k + NKV * hd;
      const float* a = att + b * NH * TT;
      const float* dy = dout + b * T * ldo;
      float *dq = dqkv + b * T * ld, *dk = dq + NH * hd, *dv = dk + NKV * hd;
      for (int64_t j = 0; j < group; ++j) {
        // datt = dy v^T ; dv (+)= att^T dy
        batched(false, true, T, T, hd, 1.0f, dy + j * hd, ldo, group * hd, v, ld, hd, 0.0f, d + j * TT, T, group * TT,
                NKV);
        batched(true, false, T, hd, T, 1.0f, a + j * TT, T, group * TT, dy + j * hd, ldo, group * hd, j ? 1.0f : 0.0f,
                dv, ld, hd, NKV);
      }
      causal_softmax_backward_kernel<<<row_blocks(NH * T), kThreads, 0, stream_>>>(d, a, NH * T, T);
      LAUNCHED();
      for (int64_t j = 0; j < group; ++j) {
        // dq = scale dpre k ; dk (+)= scale dpre^T q
        batched(false, false, T, hd, T, scale, d + j * TT, T, group * TT, k, ld, hd, 0.0f, dq + j * hd, ld, group * hd,
                NKV);
        batched(true, false, T, hd, T, scale, d + j * TT, T, group * TT, q + j * hd, ld, group * hd, j ? 1.0f : 0.0f,
                dk, ld, hd, NKV);
      }
    }
  }

  // cuda/flash_attention.cu; D (rowsum(dO * O)) in scratch of its own.
  void flash_attention_forward(float* out, bf16* out16, float* lse, const float* qkv, int64_t B, int64_t T,
                               int64_t NH, int64_t NKV, int64_t hd) const override {
    flash_forward(out, lse, qkv, B, T, NH, NKV, hd, stream_);
    if (out16) convert(out16, out, static_cast<size_t>(B * T * NH * hd));
  }
  void flash_attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                                int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t hd) const override {
    float* D = static_cast<float*>(flash_rows_.get(static_cast<size_t>(B * NH * T) * sizeof(float), *this));
    flash_backward(dqkv, dout, qkv, out, lse, D, B, T, NH, NKV, hd, stream_);
  }

  void embedding_forward(float* out, const int32_t* ids, const float* table, int64_t N, int64_t C) const override {
    embedding_kernel<float><<<blocks_for(N * C), kThreads, 0, stream_>>>(out, ids, table, N, C);
    LAUNCHED();
  }
  void embedding_forward(float* out, const int32_t* ids, const bf16* table, int64_t N, int64_t C) const override {
    embedding_kernel<bf16><<<blocks_for(N * C), kThreads, 0, stream_>>>(out, ids, table, N, C);
    LAUNCHED();
  }
  void embedding_backward(float* dtable, const float* dout, const int32_t* ids, int64_t N,
                          int64_t C) const override {
    if (N == 0) return;
    // Scratch: the sorted ids, the positions before and after the sort, CUB's temporary storage.
    const int n = static_cast<int>(N);
    size_t temp = 0;
    CK(cub::DeviceRadixSort::SortPairs(nullptr, temp, ids, static_cast<int32_t*>(nullptr), static_cast<int32_t*>(nullptr),
                                       static_cast<int32_t*>(nullptr), n, 0, 32, stream_));
    const size_t stride = (static_cast<size_t>(N) + 63) / 64 * 64;  // 256-byte aligned arrays
    auto* sorted = static_cast<int32_t*>(sorting_.get(3 * stride * sizeof(int32_t) + temp, *this));
    int32_t* before = sorted + stride;
    int32_t* after = sorted + 2 * stride;
    iota_kernel<<<blocks_for(N), kThreads, 0, stream_>>>(before, N);
    LAUNCHED();
    CK(cub::DeviceRadixSort::SortPairs(sorted + 3 * stride, temp, ids, sorted, before, after, n, 0, 32, stream_));
    embedding_backward_kernel<<<blocks_for(N * C), kThreads, 0, stream_>>>(dtable, dout, sorted, after, N, C);
    LAUNCHED();
  }
  void position_embedding_forward(float* out, const float* pos, int64_t B, int64_t T, int64_t C) const override {
    position_kernel<float><<<blocks_for(B * T * C), kThreads, 0, stream_>>>(out, pos, B, T, C);
    LAUNCHED();
  }
  void position_embedding_forward(float* out, const bf16* pos, int64_t B, int64_t T, int64_t C) const override {
    position_kernel<bf16><<<blocks_for(B * T * C), kThreads, 0, stream_>>>(out, pos, B, T, C);
    LAUNCHED();
  }
  void position_embedding_backward(float* dpos, const float* dout, int64_t B, int64_t T,
                                   int64_t C) const override {
    position_backward_kernel<<<blocks_for(T * C), kThreads, 0, stream_>>>(dpos, dout, B, T, C);
    LAUNCHED();
  }

  float cross_entropy_forward(float* probs, const float* logits, const int32_t* targets, int64_t N, int64_t V,
                              int64_t* correct) const override {
    if (N == 0) {
      if (correct) *correct = 0;
      return 0.0f;
    }
    bind();
    char* s = static_cast<char*>(rows_.get(static_cast<size_t>(N) * 8 + 64, *this));
    float* row_loss = reinterpret_cast<float*>(s + 64);
    int* row_hit = reinterpret_cast<int*>(s + 64 + 4 * N);
    cross_entropy_kernel<<<static_cast<unsigned>(N), kCeThreads, 0, stream_>>>(probs, logits, targets, V, row_loss,
                                                                               row_hit);
    LAUNCHED();
    sum_rows_kernel<<<1, kThreads, 0, stream_>>>(row_loss, row_hit, N, reinterpret_cast<double*>(s),
                                                 reinterpret_cast<long long*>(s + 8));
    LAUNCHED();
    std::lock_guard<std::mutex> lock(result_mu_);
    CK(cudaMemcpyAsync(host_result_, s, 16, cudaMemcpyDeviceToHost, stream_));
    CK(cudaStreamSynchronize(stream_));
    double loss;
    long long hits;
    std::memcpy(&loss, host_result_, 8);
    std::memcpy(&hits, static_cast<char*>(host_result_) + 8, 8);
    if (correct) *correct = hits;
    return static_cast<float>(loss / static_cast<double>(N));
  }
  void cross_entropy_backward(float* dlogits, const float* probs, const int32_t* targets, int64_t N, int64_t V,
                              float scale) const override {
    cross_entropy_backward_kernel<<<blocks_for(N * V), kThreads, 0, stream_>>>(dlogits, probs, targets, N, V, scale);
    LAUNCHED();
  }
  void cross_entropy_backward(float* dlogits, bf16* dlogits16, int64_t ld16, const float* probs,
                              const int32_t* targets, int64_t N, int64_t V, float scale) const override {
    cross_entropy_backward_bf16_kernel<<<blocks_for(N * ld16), kThreads, 0, stream_>>>(dlogits, dlogits16, ld16, probs,
                                                                                     targets, N, V, scale);
    LAUNCHED();
  }
  void residual_forward(float* out, const float* a, const float* b, int64_t n) const override {
    add_kernel<<<blocks_for(n), kThreads, 0, stream_>>>(out, a, b, n);
    LAUNCHED();
  }
  void pack_rows(float* x, int64_t N, int64_t width, int64_t padded) const override {
    move_rows(x, N, width, padded, width);
  }
  void unpack_rows(float* x, int64_t N, int64_t width, int64_t padded) const override {
    move_rows(x, N, width, width, padded);
  }

  // The bf16 copy (p16) by a conversion after the update: on the GPU a
  // launch that reads p back from device memory, not fused (yet).
  void sgd_update(float* p, float* g, float* buf, size_t n, float lr, float momentum, float decay, bool first,
                  bool consume, bf16* p16) const override {
    if (!n) return;
    sgd_kernel<<<blocks_for(n), kThreads, 0, stream_>>>(p, g, buf, static_cast<int64_t>(n), lr, momentum, decay,
                                                        first, consume);
    LAUNCHED();
    if (p16) convert(p16, p, n);
  }
  void adamw_update(float* p, float* g, float* m, float* v, size_t n, float b1, float b2, float eps, float keep,
                    float step_size, float rc2, bool consume, bf16* p16) const override {
    if (!n) return;
    adamw_kernel<<<blocks_for(n), kThreads, 0, stream_>>>(p, g, m, v, static_cast<int64_t>(n), b1, b2, eps, keep,
                                                          step_size, rc2, consume);
    LAUNCHED();
    if (p16) convert(p16, p, n);
  }
  double sum_of_squares(const float* x, size_t n) const override {
    if (!n) return 0.0;
    bind();
    double* part = static_cast<double*>(squares_.get((kSumBlocks + 1) * sizeof(double), *this));
    const unsigned blocks = std::min<unsigned>(kSumBlocks, blocks_for(static_cast<int64_t>(n)));
    square_partial_kernel<<<blocks, kThreads, 0, stream_>>>(x, static_cast<int64_t>(n), part);
    LAUNCHED();
    square_finish_kernel<<<1, 32, 0, stream_>>>(part, static_cast<int>(blocks), part + kSumBlocks);
    LAUNCHED();
    std::lock_guard<std::mutex> lock(result_mu_);
    CK(cudaMemcpyAsync(host_result_, part + kSumBlocks, sizeof(double), cudaMemcpyDeviceToHost, stream_));
    CK(cudaStreamSynchronize(stream_));
    double r;
    std::memcpy(&r, host_result_, sizeof r);
    return r;
  }
  void scale(float* x, size_t n, float factor) const override {
    if (!n) return;
    scale_kernel<<<blocks_for(n), kThreads, 0, stream_>>>(x, static_cast<int64_t>(n), factor);
    LAUNCHED();
  }

  // Events marking the compute stream for collectives (device/cuda_backend.h).
  void* record_ready() const {
    bind();
    cudaEvent_t e = nullptr;
    {
      std::lock_guard<std::mutex> lock(events_mu_);
      if (!events_.empty()) {
        e = events_.back();
        events_.pop_back();
      }
    }
    if (!e) CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    CK(cudaEventRecord(e, stream_));
    return e;
  }
  void release_ready(void* e) const {
    std::lock_guard<std::mutex> lock(events_mu_);
    events_.push_back(static_cast<cudaEvent_t>(e));
  }
  // Copies on their own stream, ordered after `ready` only: the compute
  // stream goes on with what was queued after it.
  void download_after(void* host, const void* dev, size_t bytes, void* ready) const {
    bind();
    if (ready) CK(cudaStreamWaitEvent(copy_stream_, static_cast<cudaEvent_t>(ready), 0));
    CK(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, copy_stream_));
    CK(cudaStreamSynchronize(copy_stream_));
  }
  void upload_copy(void* dev, const void* host, size_t bytes) const {
    bind();
    CK(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, copy_stream_));
    CK(cudaStreamSynchronize(copy_stream_));
  }

  size_t in_use() const {
    std::lock_guard<std::mutex> lock(mu_);
    return in_use_;
  }
  size_t peak() const {
    std::lock_guard<std::mutex> lock(mu_);
    return peak_;
  }
  // The scratch buffers' bytes (allocated through alloc, so inside in_use).
  size_t scratch_bytes() const {
    size_t n = 0;
    for (const Scratch* s : {&datt_, &rows_, &squares_, &columns_, &rows_moved_, &flash_rows_, &sorting_}) n += s->bytes;
    return n;
  }

 private:
  static constexpr size_t kWorkspace = 32u << 20;
  static constexpr int64_t kMoveRowsBytes = int64_t{64} << 20;  // move_rows' scratch at most

  template <typename T>
  void linear_forward_as(float* out, const T* inp, const T* w, const float* b, int64_t N, int64_t C, int64_t OC,
                         bool bf) const {
    // As the CPU: rows pre-filled with the bias, the GEMM adds into them.
    float beta = 0.0f;
    if (b) {
      bias_rows_kernel<<<blocks_for(N * OC), kThreads, 0, stream_>>>(out, b, N, OC);
      LAUNCHED();
      beta = 1.0f;
    }
    // out[N, OC] = inp[N, C] @ w[OC, C]^T
    gemm(false, true, N, OC, C, 1.0f, inp, C, w, C, beta, out, OC, bf);
  }
  template <typename T>
  void linear_backward_as(float* dinp, float* dw, float* db, const T* dout, const T* inp, const T* w, int64_t N,
                          int64_t C, int64_t OC, const float* dout_bias, bool bf) const {
    // dinp[N, C] = dout[N, OC] @ w[OC, C] ; dw[OC, C] += dout^T @ inp
    if (dinp) gemm(false, false, N, C, OC, 1.0f, dout, OC, w, C, 0.0f, dinp, C, bf);
    gemm(true, false, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dw, C, bf);
    if (db) column_sum(db, N, OC, BiasTerm{dout_bias, OC});
  }

  // Row-major C[M, N] = alpha op(A) op(B) + beta C through cuBLASLt: as
  // column-major, C^T = op(B)^T op(A)^T, so B comes first.
  void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void* A, int64_t lda,
            const void* B, int64_t ldb, float beta, float* C, int64_t ldc, bool bf) const {
    if (M == 0 || N == 0) return;
    const PlanKey key{tb, ta, bf, N, M, K, ldb, lda, ldc, beta != 0.0f, alignment(B), alignment(A), alignment(C)};
    Plan& p = plan(key);
    if (!p.has_algo) throw InternalError(fmt::format("cuBLASLt has no algorithm for a {}x{}x{} matmul", M, N, K));
    CK(cublasLtMatmul(lt_, p.op, &alpha, B, p.a, A, p.b, &beta, C, p.c, C, p.c, &p.algo, workspace_, kWorkspace,
                      stream_));
  }
  Plan& plan(const PlanKey& k) const {
    std::lock_guard<std::mutex> lock(plans_mu_);
    auto it = plans_.find(k);
    if (it != plans_.end()) return it->second;
    Plan p;
    CK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t opa = k.ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = k.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    CK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    CK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    const cudaDataType_t in = k.bf ? CUDA_R_16BF : CUDA_R_32F;
    // Column-major: A' is [m, k] (stored [k, m] when transposed), B' [k, n].
    CK(cublasLtMatrixLayoutCreate(&p.a, in, k.ta ? k.k : k.m, k.ta ? k.m : k.k, k.lda));
    CK(cublasLtMatrixLayoutCreate(&p.b, in, k.tb ? k.n : k.k, k.tb ? k.k : k.n, k.ldb));
    CK(cublasLtMatrixLayoutCreate(&p.c, CUDA_R_32F, k.m, k.n, k.ldc));
    cublasLtMatmulPreference_t pref;
    CK(cublasLtMatmulPreferenceCreate(&pref));
    const size_t ws = kWorkspace;
    CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    const uint32_t aa = static_cast<uint32_t>(k.align_a), ab = static_cast<uint32_t>(k.align_b),
                   ac = static_cast<uint32_t>(k.align_c);
    CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa, sizeof aa));
    CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab, sizeof ab));
    CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ac, sizeof ac));
    CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ac, sizeof ac));
    cublasLtMatmulHeuristicResult_t h{};
    int found = 0;
    cublasLtMatmulAlgoGetHeuristic(lt_, p.op, p.a, p.b, p.c, p.c, pref, 1, &h, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (found > 0) {
      p.algo = h.algo;
      p.has_algo = true;
    }
    return plans_.emplace(k, p).first->second;
  }
  // Strided-batched row-major GEMMs over the heads of one sequence (cuBLAS,
  // true fp32).
  void batched(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
               int64_t sa, const float* B, int64_t ldb, int64_t sb, float beta, float* C, int64_t ldc, int64_t sc,
               int64_t count) const {
    CK(cublasGemmStridedBatchedEx(blas_, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                  static_cast<int>(N), static_cast<int>(M), static_cast<int>(K), &alpha, B, CUDA_R_32F,
                                  static_cast<int>(ldb), sb, A, CUDA_R_32F, static_cast<int>(lda), sa, &beta, C,
                                  CUDA_R_32F, static_cast<int>(ldc), sc, static_cast<int>(count), CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT));
  }
  template <typename F>
  void column_sum(float* out, int64_t N, int64_t C, F f) const {
    if (!out || N == 0) return;
    const int64_t chunks = std::min<int64_t>(std::max<int64_t>(1, (N + 255) / 256), 256);
    const int64_t per = (N + chunks - 1) / chunks;
    float* partial = static_cast<float*>(columns_.get(static_cast<size_t>(chunks * C) * sizeof(float), *this));
    const dim3 grid(static_cast<unsigned>((C + 31) / 32), static_cast<unsigned>(chunks));
    column_partial_kernel<<<grid, dim3(32, kColRows), 0, stream_>>>(partial, N, C, per, f);
    LAUNCHED();
    column_finish_kernel<<<blocks_for(C), kThreads, 0, stream_>>>(out, partial, chunks, C);
    LAUNCHED();
  }
  // Rows of `width` values from a matrix of leading dimension src_ld to one
  // of dst_ld, in place (zeros past width), through at most kMoveRowsBytes
  // of scratch a block of rows at a time, not a copy of the whole matrix
  // (GPT-2's logits: 3 GiB at 16 x 1,024 tokens). Packing (dst_ld < src_ld)
  // goes up from row 0: a block's destination ends at or before the next
  // block's source. Unpacking goes down from the last row, the mirror case.
  void move_rows(float* x, int64_t N, int64_t width, int64_t src_ld, int64_t dst_ld) const {
    if (src_ld == dst_ld || N == 0) return;
    const int64_t row_bytes = src_ld * static_cast<int64_t>(sizeof(float));
    const int64_t rows = std::clamp<int64_t>(kMoveRowsBytes / row_bytes, 1, N);
    float* tmp = static_cast<float*>(rows_moved_.get(static_cast<size_t>(rows * row_bytes), *this));
    const bool up = dst_ld < src_ld;
    for (int64_t done = 0; done < N; done += rows) {
      const int64_t n = std::min(rows, N - done);
      const int64_t first = up ? done : N - done - n;
      copy(tmp, x + first * src_ld, static_cast<size_t>(n * row_bytes));
      gather_rows_kernel<<<blocks_for(n * dst_ld), kThreads, 0, stream_>>>(x + first * dst_ld, tmp, n, width, src_ld,
                                                                          dst_ld);
      LAUNCHED();
    }
  }

  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  cudaStream_t copy_stream_ = nullptr;  // host-staged collectives' copies
  mutable std::mutex events_mu_;
  mutable std::vector<cudaEvent_t> events_;  // free events for record_ready
  cublasLtHandle_t lt_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  void* workspace_ = nullptr;
  void* host_result_ = nullptr;  // pinned: values returned to the host
  mutable std::mutex result_mu_;
  mutable std::mutex plans_mu_;
  mutable std::map<PlanKey, Plan> plans_;
  mutable Scratch datt_, rows_, squares_, columns_, rows_moved_, flash_rows_, sorting_;
  mutable std::mutex mu_;
  mutable std::unordered_map<void*, size_t> sizes_;
  mutable size_t in_use_ = 0, peak_ = 0;
};

void* Scratch::get(size_t need, const CudaKernels& k) {
  if (need <= bytes) return p;
  k.free(p);
  p = k.alloc(need);
  bytes = need;
  return p;
}

CudaKernels& instance() {
  static CudaKernels k;
  return k;
}

}  // namespace

const Kernels& kernels() {
  CudaKernels& k = instance();
  k.bind();
  return k;
}

size_t allocated_bytes() { return instance().in_use(); }
void* record_ready() { return instance().record_ready(); }
void release_ready(void* ready) { instance().release_ready(ready); }
void download_after(void* host, const void* dev, size_t bytes, void* ready) {
  instance().download_after(host, dev, bytes, ready);
}
void upload_copy(void* dev, const void* host, size_t bytes) { instance().upload_copy(dev, host, bytes); }
size_t peak_allocated_bytes() { return instance().peak(); }
size_t scratch_bytes() { return instance().scratch_bytes(); }

}  // namespace dpt::cuda
