// The compute a model and an optimizer need, behind one interface per
// device, so the model code is written once: Decoder and Mlp call kernels(dev).op
// with pointers into their flat buffers, and those buffers live on the same
// device (tensor/flat_buffer.h). The CPU kernels are the functions of nn/*.h
// (their headers define what each op computes; the overloads here are the
// fp32 and bf16 instances of their templates); the CUDA kernels
// (src/cuda/) compute the same things on the GPU.
//
// Every pointer an op takes is a device pointer of its Kernels, except where
// a name says host. Ops are asynchronous on the GPU (one compute stream, in
// issue order); the few that return a value to the host (cross-entropy's
// loss, sum_of_squares) wait for it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "core/dtype.h"
#include "device/device.h"

namespace dpt {

// The largest head size the GPU's fused attention takes (a lane of a warp
// holds hd / 32 channels of a row in registers; cuda/flash_attention.cu).
inline constexpr int64_t kGpuFlashMaxHead = 256;

class Kernels {
 public:
  virtual ~Kernels() = default;
  virtual Device device() const = 0;

  // Memory. alloc returns zero-filled memory aligned to 256 bytes (nullptr
  // for 0 bytes) and throws std::bad_alloc when the device has no room;
  // copy moves bytes within the device, upload/download between the host
  // and the device. Downloads and synchronize wait for all queued work.
  virtual void* alloc(size_t bytes) const = 0;
  virtual void free(void* p) const = 0;
  virtual void zero(void* p, size_t bytes) const = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) const = 0;
  virtual void upload(void* dst, const void* host_src, size_t bytes) const = 0;
  virtual void download(void* host_dst, const void* src, size_t bytes) const = 0;
  virtual void synchronize() const = 0;
  // Host memory the device copies to and from directly (not zeroed;
  // throws std::bad_alloc): page-locked on a GPU, where a download into it
  // is one DMA instead of a trip through the driver's bounce buffer
  // (device/host_staging.h); ordinary aligned memory on the CPU.
  virtual void* pinned_alloc(size_t bytes) const = 0;
  virtual void pinned_free(void* p) const = 0;

  // Rounding to bf16 (round to nearest even) and widening (exact).
  virtual void convert(bf16* out, const float* in, size_t n) const = 0;
  virtual void convert(float* out, const bf16* in, size_t n) const = 0;

  // nn/linear.h
  virtual void linear_forward(float* out, const float* inp, const float* weight, const float* bias, int64_t N,
                              int64_t C, int64_t OC) const = 0;
  virtual void linear_forward(float* out, const bf16* inp, const bf16* weight, const float* bias, int64_t N,
                              int64_t C, int64_t OC) const = 0;
  virtual void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                               const float* weight, int64_t N, int64_t C, int64_t OC,
                               const float* dout_bias) const = 0;
  virtual void linear_backward(float* dinp, float* dweight, float* dbias, const bf16* dout, const bf16* inp,
                               const bf16* weight, int64_t N, int64_t C, int64_t OC,
                               const float* dout_bias) const = 0;
  // A bf16 linear backward's GEMM operand from its fp32 output gradient:
  // dout16 = dout in bf16 and, when dbias is given, dbias += its column
  // sums (linear_backward_bias's, bit for bit), the CPU's in one pass.
  virtual void output_grad_bf16(bf16* dout16, float* dbias, const float* dout, int64_t N, int64_t OC) const = 0;
  // nn/layernorm.h
  virtual void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                                 const float* bias, int64_t N, int64_t C) const = 0;
  virtual void layernorm_forward(bf16* out, float* mean, float* rstd, const float* inp, const float* weight,
                                 const float* bias, int64_t N, int64_t C) const = 0;
  virtual void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                                  const float* weight, const float* mean, const float* rstd, int64_t N,
                                  int64_t C) const = 0;
  // nn/activations.h
  virtual void relu_forward(float* out, const float* inp, int64_t n) const = 0;
  virtual void relu_backward(float* dinp, const float* dout, const float* out, int64_t n) const = 0;
  virtual void gelu_forward(float* out, const float* inp, int64_t n) const = 0;
  virtual void gelu_forward(bf16* out, const float* inp, int64_t n) const = 0;
  virtual void gelu_backward(float* dinp, const float* dout, const float* inp, int64_t n) const = 0;
  // The fused form; on the CPU dinp may be null when dinp16 is given (only
  // the bf16 copy is written; so swiglu_backward's dgu); CUDA's writes both.
  virtual void gelu_backward(float* dinp, bf16* dinp16, float* dbias, const float* dout, const float* inp, int64_t N,
                             int64_t OC) const = 0;
  // nn/attention.h
  virtual void attention_forward(float* out, float* att, const float* qkv, int64_t B, int64_t T, int64_t C,
                                 int64_t NH) const = 0;
  virtual void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int64_t B,
                                  int64_t T, int64_t C, int64_t NH) const = 0;
  // The Llama family's layers (nn/rmsnorm.h, nn/rope.h, nn/swiglu.h,
  // nn/gqa_attention.h; the layouts are stated there). RoPE's cos and sin
  // tables [T, hd/2] are device buffers, made on the host by rope_inv_freq
  // and rope_cache and uploaded once.
  virtual void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int64_t N, int64_t C,
                               float eps) const = 0;
  virtual void rmsnorm_forward(bf16* out, float* rstd, const float* inp, const float* weight, int64_t N, int64_t C,
                               float eps) const = 0;
  virtual void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                                const float* rstd, int64_t N, int64_t C) const = 0;
  virtual void rope_forward(float* out, const float* inp, const float* cos, const float* sin, int64_t B, int64_t T,
                            int64_t H, int64_t hd, int64_t ld) const = 0;
  virtual void rope_backward(float* dinp, const float* dout, const float* cos, const float* sin, int64_t B, int64_t T,
                             int64_t H, int64_t hd, int64_t ld) const = 0;
  // The same, in place (dinp == dout), and the whole rows in bf16 into
  // dinp16 (nn/rope.h's rope_backward_bf16: the CPU's in one pass).
  virtual void rope_backward(float* dinp, bf16* dinp16, const float* cos, const float* sin, int64_t B, int64_t T,
                             int64_t H, int64_t hd, int64_t ld) const = 0;
  virtual void swiglu_forward(float* out, const float* gu, int64_t N, int64_t I) const = 0;
  virtual void swiglu_forward(bf16* out, const float* gu, int64_t N, int64_t I) const = 0;
  virtual void swiglu_backward(float* dgu, bf16* dgu16, const float* dout, const float* gu, int64_t N,
                               int64_t I) const = 0;
  virtual void gqa_attention_forward(float* out, float* att, const float* qkv, int64_t B, int64_t T, int64_t NH,
                                     int64_t NKV, int64_t hd) const = 0;
  virtual void gqa_attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int64_t B,
                                      int64_t T, int64_t NH, int64_t NKV, int64_t hd) const = 0;
  // nn/flash_attention.h: the same causal attention without the T x T
  // probabilities (its layouts as gqa_attention's), keeping lse [B, NH, T]
  // (each row's log-sum-exp) for backward; dqkv written whole. fp32. The
  // GPU's takes head sizes up to kGpuFlashMaxHead (InputError past that).
  // out16 (null: none): out's bf16 copy, the output projection's operand in
  // a bf16 run (the CPU's kernel writes it with out; the GPU converts after).
  virtual void flash_attention_forward(float* out, bf16* out16, float* lse, const float* qkv, int64_t B, int64_t T,
                                       int64_t NH, int64_t NKV, int64_t hd) const = 0;
  virtual void flash_attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                                        const float* lse, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                                        int64_t hd) const = 0;
  // The same for a bf16 run: the products read bf16 copies of their inputs
  // and accumulate in fp32 (nn/flash_attention.h, FlashProducts::BF16);
  // inputs, outputs and lse fp32 as above. A backend without such products
  // (the GPU's) computes them in fp32.
  virtual void flash_attention_bf16_forward(float* out, bf16* out16, float* lse, const float* qkv, int64_t B,
                                            int64_t T, int64_t NH, int64_t NKV, int64_t hd) const {
    flash_attention_forward(out, out16, lse, qkv, B, T, NH, NKV, hd);
  }
  virtual void flash_attention_bf16_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                                             const float* lse, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                                             int64_t hd) const {
    flash_attention_backward(dqkv, dout, qkv, out, lse, B, T, NH, NKV, hd);
  }
  // nn/embedding.h (ids are device int32s)
  virtual void embedding_forward(float* out, const int32_t* ids, const float* table, int64_t N,
                                 int64_t C) const = 0;
  virtual void embedding_forward(float* out, const int32_t* ids, const bf16* table, int64_t N,
                                 int64_t C) const = 0;
  virtual void embedding_backward(float* dtable, const float* dout, const int32_t* ids, int64_t N,
                                  int64_t C) const = 0;
  virtual void position_embedding_forward(float* out, const float* pos, int64_t B, int64_t T,
                                          int64_t C) const = 0;
  virtual void position_embedding_forward(float* out, const bf16* pos, int64_t B, int64_t T,
                                          int64_t C) const = 0;
  virtual void position_embedding_backward(float* dpos, const float* dout, int64_t B, int64_t T,
                                           int64_t C) const = 0;
  // nn/cross_entropy.h. The loss and the count of correct argmaxes come
  // back to the host (the GPU version waits for them).
  virtual float cross_entropy_forward(float* probs, const float* logits, const int32_t* targets, int64_t N,
                                      int64_t V, int64_t* correct) const = 0;
  virtual void cross_entropy_backward(float* dlogits, const float* probs, const int32_t* targets, int64_t N,
                                      int64_t V, float scale) const = 0;
  // The same, and dlogits in bf16 into dlogits16, rows ld16 apart (>= V;
  // the columns past V zero: a padded vocabulary's layout), in one pass;
  // dlogits may be null (the copy alone).
  virtual void cross_entropy_backward(float* dlogits, bf16* dlogits16, int64_t ld16, const float* probs,
                                      const int32_t* targets, int64_t N, int64_t V, float scale) const = 0;
  // nn/residual.h
  virtual void residual_forward(float* out, const float* a, const float* b, int64_t n) const = 0;
  // Rows of a padded matrix in place: pack_rows moves N rows of `padded`
  // floats to rows of `width` (dropping the tail of each), unpack_rows the
  // reverse, zero-filling the tails.
  virtual void pack_rows(float* x, int64_t N, int64_t width, int64_t padded) const = 0;
  virtual void unpack_rows(float* x, int64_t N, int64_t width, int64_t padded) const = 0;

  // Optimizers (optim/optimizer.h), over n elements of one segment.
  // With `consume` each also sets g to zero once it has read it: the next
  // step's backward then accumulates from zero without a pass of its own
  // (the update already streams g; a separate memset streams it again).
  // SGD: g' = g + decay * p; with momentum (buf != nullptr)
  // buf = first ? g' : momentum * buf + g', g' = buf; then p -= lr * g'.
  // With p16 (a bf16 run's compute copy of p) each also writes p rounded to
  // bf16 as it writes p: the copy costs no pass of its own.
  virtual void sgd_update(float* p, float* g, float* buf, size_t n, float lr, float momentum, float decay,
                          bool first, bool consume, bf16* p16) const = 0;
  // AdamW in PyTorch's arithmetic order: m = b1 m + (1 - b1) g,
  // v = b2 v + (1 - b2) g^2, p = p * keep - step_size * m / (sqrt(v) * rc2 + eps)
  // with keep = 1 - lr * weight_decay, step_size = lr / (1 - b1^t),
  // rc2 = 1 / sqrt(1 - b2^t).
  virtual void adamw_update(float* p, float* g, float* m, float* v, size_t n, float b1, float b2, float eps,
                            float keep, float step_size, float rc2, bool consume, bf16* p16) const = 0;
  // Sum of x^2 in double (returned to the host); x *= factor.
  virtual double sum_of_squares(const float* x, size_t n) const = 0;
  virtual void scale(float* x, size_t n, float factor) const = 0;
};

// An fp32 buffer of n elements as a GEMM operand of type T: the buffer
// itself (float), or its conversion into `scratch` (bf16) by k.
template <typename T>
const T* operand(const Kernels& k, const float* src, int64_t n, void* scratch) {
  if constexpr (std::is_same_v<T, float>) {
    return src;
  } else {
    k.convert(static_cast<bf16*>(scratch), src, static_cast<size_t>(n));
    return static_cast<const bf16*>(scratch);
  }
}

// linear_backward from the fp32 gradient of the layer's output, dout: the
// GEMMs read it as it is (float), or (bf16) its copy in `scratch`, made in
// the pass that sums the bias's gradient (output_grad_bf16), not in a
// conversion pass of its own.
template <typename T>
void linear_backward_from(const Kernels& k, float* dinp, float* dweight, float* dbias, const float* dout,
                          void* scratch, const T* inp, const T* weight, int64_t N, int64_t C, int64_t OC) {
  if constexpr (std::is_same_v<T, float>) {
    k.linear_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC, dout);
  } else {
    auto* dout16 = static_cast<bf16*>(scratch);
    k.output_grad_bf16(dout16, dbias, dout, N, OC);
    k.linear_backward(dinp, dweight, nullptr, dout16, inp, weight, N, C, OC, nullptr);
  }
}

// The kernels of a device. kernels(Device::CUDA) in a build without CUDA,
// or on a machine without a usable GPU, throws InputError saying so.
const Kernels& kernels(Device d);
const Kernels& cpu_kernels();

}  // namespace dpt
