// The CPU side of device/kernels.h: each op is the nn/*.h function of the same
// name, so CPU runs compute exactly what they computed before the interface.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>

#include "core/error.h"
#include "core/host_alloc.h"
#include "device/kernels.h"
#include "nn/activations.h"
#include "nn/attention.h"
#include "nn/cross_entropy.h"
#include "nn/embedding.h"
#include "nn/flash_attention.h"
#include "nn/gqa_attention.h"
#include "nn/layernorm.h"
#include "nn/linear.h"
#include "nn/residual.h"
#include "nn/rmsnorm.h"
#include "nn/rope.h"
#include "nn/swiglu.h"
#include "nn/update.h"


namespace dpt {

namespace {

class CpuKernels final : public Kernels {
 public:
  Device device() const override { return Device::CPU; }

  void* alloc(size_t bytes) const override {
    return host_alloc(bytes);
  }
  void free(void* p) const override { host_free(p); }
  void zero(void* p, size_t bytes) const override {
    if (bytes) std::memset(p, 0, bytes);
  }
  void copy(void* dst, const void* src, size_t bytes) const override {
    if (bytes) std::memmove(dst, src, bytes);
  }
  void upload(void* dst, const void* src, size_t bytes) const override { copy(dst, src, bytes); }
  void download(void* dst, const void* src, size_t bytes) const override { copy(dst, src, bytes); }
  void synchronize() const override {}
  void* pinned_alloc(size_t bytes) const override { return host_alloc(bytes); }
  void pinned_free(void* p) const override { host_free(p); }

  void convert(bf16* out, const float* in, size_t n) const override { dpt::convert(out, in, n); }
  void convert(float* out, const bf16* in, size_t n) const override { dpt::convert(out, in, n); }

  void linear_forward(float* out, const float* inp, const float* w, const float* b, int64_t N, int64_t C,
                      int64_t OC) const override {
    dpt::linear_forward(out, inp, w, b, N, C, OC);
  }
  void linear_forward(float* out, const bf16* inp, const bf16* w, const float* b, int64_t N, int64_t C,
                      int64_t OC) const override {
    dpt::linear_forward(out, inp, w, b, N, C, OC);
  }
  void linear_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                       int64_t N, int64_t C, int64_t OC, const float* dout_bias) const override {
    dpt::linear_backward(dinp, dw, db, dout, inp, w, N, C, OC, dout_bias);
  }
  void linear_backward(float* dinp, float* dw, float* db, const bf16* dout, const bf16* inp, const bf16* w,
                       int64_t N, int64_t C, int64_t OC, const float* dout_bias) const override {
    dpt::linear_backward(dinp, dw, db, dout, inp, w, N, C, OC, dout_bias);
  }
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                         int64_t N, int64_t C) const override {
    dpt::layernorm_forward(out, mean, rstd, inp, w, b, N, C);
  }
  void layernorm_forward(bf16* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                         int64_t N, int64_t C) const override {
    dpt::layernorm_forward(out, mean, rstd, inp, w, b, N, C);
  }
  void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                          const float* mean, const float* rstd, int64_t N, int64_t C) const override {
    dpt::layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
  }
  void relu_forward(float* out, const float* inp, int64_t n) const override { dpt::relu_forward(out, inp, n); }
  void relu_backward(float* dinp, const float* dout, const float* out, int64_t n) const override {
    dpt::relu_backward(dinp, dout, out, n);
  }
  void gelu_forward(float* out, const float* inp, int64_t n) const override { dpt::gelu_forward(out, inp, n); }
  void gelu_forward(bf16* out, const float* inp, int64_t n) const override { dpt::gelu_forward(out, inp, n); }
  void output_grad_bf16(bf16* dout16, float* dbias, const float* dout, int64_t N, int64_t OC) const override {
    if (dbias)
      dpt::linear_backward_bias_bf16(dbias, dout16, dout, N, OC);
    else
      dpt::convert(dout16, dout, static_cast<size_t>(N * OC));
  }
  void gelu_backward(float* dinp, const float* dout, const float* inp, int64_t n) const override {
    dpt::gelu_backward(dinp, dout, inp, n);
  }
  void gelu_backward(float* dinp, bf16* dinp16, float* dbias, const float* dout, const float* inp, int64_t N,
                     int64_t OC) const override {
    dpt::gelu_backward(dinp, dinp16, dbias, dout, inp, N, OC);
  }
  void attention_forward(float* out, float* att, const float* qkv, int64_t B, int64_t T, int64_t C,
                         int64_t NH) const override {
    dpt::attention_forward(out, att, qkv, B, T, C, NH);
  }
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int64_t B, int64_t T,
                          int64_t C, int64_t NH) const override {
    dpt::attention_backward(dqkv, dout, qkv, att, B, T, C, NH);
  }
  void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int64_t N, int64_t C,
                       float eps) const override {
    dpt::rmsnorm_forward(out, rstd, inp, w, N, C, eps);
  }
  void rmsnorm_forward(bf16* out, float* rstd, const float* inp, const float* w, int64_t N, int64_t C,
                       float eps) const override {
    dpt::rmsnorm_forward(out, rstd, inp, w, N, C, eps);
  }
  void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w, const float* rstd,
                        int64_t N, int64_t C) const override {
    dpt::rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C);
  }
  void rope_forward(float* out, const float* inp, const float* cos, const float* sin, int64_t B, int64_t T, int64_t H,
                    int64_t hd, int64_t ld) const override {
    dpt::rope_forward(out, inp, cos, sin, B, T, H, hd, ld);
  }
  void rope_backward(float* dinp, const float* dout, const float* cos, const float* sin, int64_t B, int64_t T,
                     int64_t H, int64_t hd, int64_t ld) const override {
    dpt::rope_backward(dinp, dout, cos, sin, B, T, H, hd, ld);
  }
  void rope_backward(float* dinp, bf16* dinp16, const float* cos, const float* sin, int64_t B, int64_t T, int64_t H,
                     int64_t hd, int64_t ld) const override {
    dpt::rope_backward_bf16(dinp, dinp16, dinp, cos, sin, B, T, H, hd, ld);
  }
  void swiglu_forward(float* out, const float* gu, int64_t N, int64_t I) const override {
    dpt::swiglu_forward(out, gu, N, I);
  }
  void swiglu_forward(bf16* out, const float* gu, int64_t N, int64_t I) const override {
    dpt::swiglu_forward(out, gu, N, I);
  }
  void swiglu_backward(float* dgu, bf16* dgu16, const float* dout, const float* gu, int64_t N,
                       int64_t I) const override {
    dpt::swiglu_backward(dgu, dgu16, dout, gu, N, I);
  }
  void gqa_attention_forward(float* out, float* att, const float* qkv, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                             int64_t hd) const override {
    dpt::gqa_attention_forward(out, att, qkv, B, T, NH, NKV, hd);
  }
  void gqa_attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int64_t B, int64_t T,
                              int64_t NH, int64_t NKV, int64_t hd) const override {
    dpt::gqa_attention_backward(dqkv, dout, qkv, att, B, T, NH, NKV, hd);
  }
  void flash_attention_forward(float* out, bf16* out16, float* lse, const float* qkv, int64_t B, int64_t T,
                               int64_t NH, int64_t NKV, int64_t hd) const override {
    dpt::flash_attention_forward(out, lse, qkv, B, T, NH, NKV, hd, FlashProducts::F32, out16);
  }
  void flash_attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                                int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t hd) const override {
    dpt::flash_attention_backward(dqkv, dout, qkv, out, lse, B, T, NH, NKV, hd);
  }
  void flash_attention_bf16_forward(float* out, bf16* out16, float* lse, const float* qkv, int64_t B, int64_t T,
                                    int64_t NH, int64_t NKV, int64_t hd) const override {
    dpt::flash_attention_forward(out, lse, qkv, B, T, NH, NKV, hd, FlashProducts::BF16, out16);
  }
  void flash_attention_bf16_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                                     const float* lse, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                                     int64_t hd) const override {
    dpt::flash_attention_backward(dqkv, dout, qkv, out, lse, B, T, NH, NKV, hd, FlashProducts::BF16);
  }
  void embedding_forward(float* out, const int32_t* ids, const float* table, int64_t N, int64_t C) const override {
    dpt::embedding_forward(out, ids, table, N, C);
  }
  void embedding_forward(float* out, const int32_t* ids, const bf16* table, int64_t N, int64_t C) const override {
    dpt::embedding_forward(out, ids, table, N, C);
  }
  void embedding_backward(float* dtable, const float* dout, const int32_t* ids, int64_t N,
                          int64_t C) const override {
    dpt::embedding_backward(dtable, dout, ids, N, C);
  }
  void position_embedding_forward(float* out, const float* pos, int64_t B, int64_t T, int64_t C) const override {
    dpt::position_embedding_forward(out, pos, B, T, C);
  }
  void position_embedding_forward(float* out, const bf16* pos, int64_t B, int64_t T, int64_t C) const override {
    dpt::position_embedding_forward(out, pos, B, T, C);
  }
  void position_embedding_backward(float* dpos, const float* dout, int64_t B, int64_t T,
                                   int64_t C) const override {
    dpt::position_embedding_backward(dpos, dout, B, T, C);
  }
  float cross_entropy_forward(float* probs, const float* logits, const int32_t* targets, int64_t N, int64_t V,
                              int64_t* correct) const override {
    return dpt::cross_entropy_forward(probs, logits, targets, N, V, correct);
  }
  void cross_entropy_backward(float* dlogits, const float* probs, const int32_t* targets, int64_t N, int64_t V,
                              float scale) const override {
    dpt::cross_entropy_backward(dlogits, probs, targets, N, V, scale);
  }
  void cross_entropy_backward(float* dlogits, bf16* dlogits16, int64_t ld16, const float* probs,
                              const int32_t* targets, int64_t N, int64_t V, float scale) const override {
    dpt::cross_entropy_backward_bf16(dlogits, dlogits16, ld16, probs, targets, N, V, scale);
  }
  void residual_forward(float* out, const float* a, const float* b, int64_t n) const override {
    dpt::residual_forward(out, a, b, n);
  }
  void pack_rows(float* x, int64_t N, int64_t width, int64_t padded) const override {
    // Rows move down (row n from n*padded to n*width), so in increasing n no
    // row is overwritten before it has moved.
    for (int64_t n = 1; n < N; ++n) std::memmove(x + n * width, x + n * padded, sizeof(float) * width);
  }
  void unpack_rows(float* x, int64_t N, int64_t width, int64_t padded) const override {
    for (int64_t n = N; n-- > 0;) {
      std::memmove(x + n * padded, x + n * width, sizeof(float) * width);
      std::fill(x + n * padded + width, x + (n + 1) * padded, 0.0f);
    }
  }

  void sgd_update(float* p, float* g, float* buf, size_t n, float lr, float momentum, float decay, bool first,
                  bool consume, bf16* p16) const override {
    dpt::sgd_update(p, g, buf, n, lr, momentum, decay, first, consume, p16);
  }
  void adamw_update(float* p, float* g, float* m, float* v, size_t n, float b1, float b2, float eps, float keep,
                    float step_size, float rc2, bool consume, bf16* p16) const override {
    dpt::adamw_update(p, g, m, v, n, b1, b2, eps, keep, step_size, rc2, consume, p16);
  }
  double sum_of_squares(const float* x, size_t n) const override { return dpt::sum_of_squares(x, n); }
  void scale(float* x, size_t n, float factor) const override { dpt::scale(x, n, factor); }
};

}  // namespace

const Kernels& cpu_kernels() {
  static const CpuKernels k;
  return k;
}

}  // namespace dpt
