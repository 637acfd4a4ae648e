// FlashAttention's kernels (Dao et al. 2022; FlashAttention-2's backward
// order), fp32 on CUDA cores: what nn/flash_attention.cpp computes on the
// CPU, for cuda/flash_attention.h.
//
// Layout of the work (device code: cuda/flash_attention_kernels.cuh). A
// block is kWarps warps; a warp owns R rows of the block's tile (query rows
// in forward and dQ, key rows in dK/dV), holding its output rows in
// registers: lane l owns channels l, l + 32, ... (DV = ceil(hd / 32) of
// them), so R * DV accumulators per output tensor. The warp's rows sit in
// shared memory padded to whole float4s and are read as float4 broadcasts
// (every lane the same address). The other side of each product goes
// across the lanes, one row per lane, in a tile of 32 rows stored
// transposed ([channel][33]: the stores of consecutive channels and the
// reads of consecutive lanes both hit 32 different banks). A score is then
// one lane's dot product over hd, 4 channels a step; the products back into
// the warp's rows read the scores from a per-warp scratch in shared memory
// (written once per tile, __syncwarp, read as float4 broadcasts).
//
// - Forward, one block per (query tile of kWarps * R rows, head, sequence):
//   key/value tiles of 32 rows in turn, the running maximum m and sum l of
//   each row (the online softmax) in registers, tiles above the diagonal
//   never loaded (the block stops at its last row) and a warp whose rows
//   all precede a tile skips it. Writes out = O / l and lse = m + log l.
// - Backward, three launches: D = rowsum(dO * O) (a warp per row); dK and
//   dV, one block per (key tile, key/value head, sequence), over the query
//   tiles that see the key tile and over the group's query heads in order
//   (FlashAttention-2's order: each key row's gradients are summed in
//   registers and written once, so dK/dV need no atomics and no zeroing);
//   dQ, one block per (query tile, head, sequence), over the key tiles the
//   tile sees. dQ by a pass of its own rather than by atomicAdd from the
//   dK/dV blocks: it recomputes the scores and dP (two more hd-long dot
//   products per pair), but its bits do not depend on the order blocks run
//   in (every other op of the backend but the embedding gradient is
//   deterministic), dqkv is written whole without a memset of its query
//   columns first, and no key tile's block contends for the same dQ rows.
// - Scores use q scaled by 1/sqrt(hd) (as the CPU kernel packs it), so dK
//   = dS^T (scale Q) directly and dQ = scale (dS K).
#include "cuda/flash_attention.h"

#include <cuda_runtime.h>

#include <cmath>

#include <fmt/format.h>

#include "core/error.h"
#include "cuda/flash_attention_kernels.cuh"

namespace dpt::cuda {

namespace {

using namespace flash;

constexpr size_t kDefaultShared = 48 * 1024;  // more needs cudaFuncSetAttribute

// Queues a kernel on `stream`, first letting it take more than 48 KiB of
// dynamic shared memory where it needs to (an H100 gives a block up to 227
// KiB; past 48 KiB a kernel must ask).
struct Launcher {
  cudaStream_t stream;
  template <typename... P, typename... A>
  void operator()(void (*kernel)(P...), Grid g, int threads, size_t bytes, A... args) const {
    if (bytes > kDefaultShared) {
      const cudaError_t e =
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
      if (e != cudaSuccess)
        throw InternalError(fmt::format("flash attention needs {} bytes of shared memory per block: {}", bytes,
                                        cudaGetErrorString(e)));
    }
    kernel<<<dim3(g.x, g.y, g.z), threads, bytes, stream>>>(args...);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) throw InternalError(fmt::format("flash attention launch failed: {}", cudaGetErrorString(e)));
  }
};

Shape check_shape(int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t hd) {
  if (hd < 1 || hd > kFlashMaxHead)
    throw InputError(fmt::format("the GPU's fused attention takes head sizes 1 to {} (got {}); --attention unfused "
                                 "takes any",
                                 kFlashMaxHead, hd));
  // (No DPT_CHECK here: its fail_check is dpt_lib's, which this library does not link.)
  if (B < 0 || T < 0 || NKV < 1 || NH % NKV != 0 || NH > 65535 || B > 65535)
    throw InternalError(fmt::format("flash attention needs B and NH at most 65,535 (grid dimensions) and query "
                                    "heads a multiple of the key/value heads (got B {}, T {}, {} / {} heads)",
                                    B, T, NH, NKV));
  return Shape{B, T, static_cast<int>(NH), static_cast<int>(NKV), static_cast<int>(hd),
               1.0f / std::sqrt(static_cast<float>(hd))};
}

}  // namespace

void flash_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                   int64_t hd, cudaStream_t stream) {
  const Shape s = check_shape(B, T, NH, NKV, hd);
  if (s.B == 0 || s.T == 0 || s.NH == 0) return;
  forward_launches(Launcher{stream}, out, lse, qkv, s);
}

void flash_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse, float* D,
                    int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t hd, cudaStream_t stream) {
  const Shape s = check_shape(B, T, NH, NKV, hd);
  if (s.B == 0 || s.T == 0 || s.NH == 0) return;
  backward_launches(Launcher{stream}, dqkv, dout, qkv, out, lse, D, s);
}

}  // namespace dpt::cuda
