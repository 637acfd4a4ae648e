// Kernels that pass every op to another device's Kernels, for tests that
// watch what a model calls (override the ops to watch; Model::use_kernels).
#pragma once

#include <algorithm>

#include "device/kernels.h"

namespace dpt::test {

class ForwardingKernels : public Kernels {
 public:
  explicit ForwardingKernels(const Kernels& inner) : inner_(inner) {}

  Device device() const override { return inner_.device(); }
  void* alloc(size_t bytes) const override { return inner_.alloc(bytes); }
  void free(void* p) const override { inner_.free(p); }
  void zero(void* p, size_t bytes) const override { inner_.zero(p, bytes); }
  void copy(void* dst, const void* src, size_t bytes) const override { inner_.copy(dst, src, bytes); }
  void upload(void* dst, const void* host_src, size_t bytes) const override { inner_.upload(dst, host_src, bytes); }
  void download(void* host_dst, const void* src, size_t bytes) const override { inner_.download(host_dst, src, bytes); }
  void synchronize() const override { inner_.synchronize(); }
  void* pinned_alloc(size_t bytes) const override { return inner_.pinned_alloc(bytes); }
  void pinned_free(void* p) const override { inner_.pinned_free(p); }
  void convert(bf16* out, const float* in, size_t n) const override { inner_.convert(out, in, n); }
  void convert(float* out, const bf16* in, size_t n) const override { inner_.convert(out, in, n); }
  void linear_forward(float* out, const float* inp, const float* weight, const float* bias, int64_t N, int64_t C,
                      int64_t OC) const override {
    inner_.linear_forward(out, inp, weight, bias, N, C, OC);
  }
  void linear_forward(float* out, const bf16* inp, const bf16* weight, const float* bias, int64_t N, int64_t C,
                      int64_t OC) const override {
    inner_.linear_forward(out, inp, weight, bias, N, C, OC);
  }
  void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                       const float* weight, int64_t N, int64_t C, int64_t OC, const float* dout_bias) const override {
    inner_.linear_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC, dout_bias);
  }
  void linear_backward(float* dinp, float* dweight, float* dbias, const bf16* dout, const bf16* inp, const bf16* weight,
                       int64_t N, int64_t C, int64_t OC, const float* dout_bias) const override {
    inner_.linear_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC, dout_bias);
  }
  void output_grad_bf16(bf16* dout16, float* dbias, const float* dout, int64_t N, int64_t OC) const override {
    inner_.output_grad_bf16(dout16, dbias, dout, N, OC);
  }
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                         int64_t N, int64_t C) const override {
    inner_.layernorm_forward(out, mean, rstd, inp, weight, bias, N, C);
  }
  void layernorm_forward(bf16* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                         int64_t N, int64_t C) const override {
    inner_.layernorm_forward(out, mean, rstd, inp, weight, bias, N, C);
  }
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                          const float* weight, const float* mean, const float* rstd, int64_t N,
                          int64_t C) const override {
    inner_.layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
  }
  void relu_forward(float* out, const float* inp, int64_t n) const override { inner_.relu_forward(out, inp, n); }
  void relu_backward(float* dinp, const float* dout, const float* out, int64_t n) const override {
    inner_.relu_backward(dinp, dout, out, n);
  }
  void gelu_forward(float* out, const float* inp, int64_t n) const override { inner_.gelu_forward(out, inp, n); }
  void gelu_forward(bf16* out, const float* inp, int64_t n) const override { inner_.gelu_forward(out, inp, n); }
  void gelu_backward(float* dinp, const float* dout, const float* inp, int64_t n) const override {
    inner_.gelu_backward(dinp, dout, inp, n);
  }
  void gelu_backward(float* dinp, bf16* dinp16, float* dbias, const float* dout, const float* inp, int64_t N,
                     int64_t OC) const override {
    inner_.gelu_backward(dinp, dinp16, dbias, dout, inp, N, OC);
  }
  void attention_forward(float* out, float* att, const float* qkv, int64_t B, int64_t T, int64_t C,
                         int64_t NH) const override {
    inner_.attention_forward(out, att, qkv, B, T, C, NH);
  }
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int64_t B, int64_t T,
                          int64_t C, int64_t NH) const override {
    inner_.attention_backward(dqkv, dout, qkv, att, B, T, C, NH);
  }
  void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int64_t N, int64_t C,
                       float eps) const override {
    inner_.rmsnorm_forward(out, rstd, inp, weight, N, C, eps);
  }
  void rmsnorm_forward(bf16* out, float* rstd, const float* inp, const float* weight, int64_t N, int64_t C,
                       float eps) const override {
    inner_.rmsnorm_forward(out, rstd, inp, weight, N, C, eps);
  }
  void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                        const float* rstd, int64_t N, int64_t C) const override {
    inner_.rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, C);
  }
  void rope_forward(float* out, const float* inp, const float* cos, const float* sin, int64_t B, int64_t T, int64_t H,
                    int64_t hd, int64_t ld) const override {
    inner_.rope_forward(out, inp, cos, sin, B, T, H, hd, ld);
  }
  void rope_backward(float* dinp, const float* dout, const float* cos, const float* sin, int64_t B, int64_t T,
                     int64_t H, int64_t hd, int64_t ld) const override {
    inner_.rope_backward(dinp, dout, cos, sin, B, T, H, hd, ld);
  }
  void rope_backward(float* dinp, bf16* dinp16, const float* cos, const float* sin, int64_t B, int64_t T, int64_t H,
                     int64_t hd, int64_t ld) const override {
    inner_.rope_backward(dinp, dinp16, cos, sin, B, T, H, hd, ld);
  }
  void swiglu_forward(float* out, const float* gu, int64_t N, int64_t I) const override {
    inner_.swiglu_forward(out, gu, N, I);
  }
  void swiglu_forward(bf16* out, const float* gu, int64_t N, int64_t I) const override {
    inner_.swiglu_forward(out, gu, N, I);
  }
  void swiglu_backward(float* dgu, bf16* dgu16, const float* dout, const float* gu, int64_t N,
                       int64_t I) const override {
    inner_.swiglu_backward(dgu, dgu16, dout, gu, N, I);
  }
  void gqa_attention_forward(float* out, float* att, const float* qkv, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                             int64_t hd) const override {
    inner_.gqa_attention_forward(out, att, qkv, B, T, NH, NKV, hd);
  }
  void gqa_attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int64_t B, int64_t T,
                              int64_t NH, int64_t NKV, int64_t hd) const override {
    inner_.gqa_attention_backward(dqkv, dout, qkv, att, B, T, NH, NKV, hd);
  }
  void flash_attention_forward(float* out, bf16* out16, float* lse, const float* qkv, int64_t B, int64_t T,
                               int64_t NH, int64_t NKV, int64_t hd) const override {
    inner_.flash_attention_forward(out, out16, lse, qkv, B, T, NH, NKV, hd);
  }
  void flash_attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                                int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t hd) const override {
    inner_.flash_attention_backward(dqkv, dout, qkv, out, lse, B, T, NH, NKV, hd);
  }
  void flash_attention_bf16_forward(float* out, bf16* out16, float* lse, const float* qkv, int64_t B, int64_t T,
                                    int64_t NH, int64_t NKV, int64_t hd) const override {
    inner_.flash_attention_bf16_forward(out, out16, lse, qkv, B, T, NH, NKV, hd);
  }
  void flash_attention_bf16_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                                     const float* lse, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                                     int64_t hd) const override {
    inner_.flash_attention_bf16_backward(dqkv, dout, qkv, out, lse, B, T, NH, NKV, hd);
  }
  void embedding_forward(float* out, const int32_t* ids, const float* table, int64_t N, int64_t C) const override {
    inner_.embedding_forward(out, ids, table, N, C);
  }
  void embedding_forward(float* out, const int32_t* ids, const bf16* table, int64_t N, int64_t C) const override {
    inner_.embedding_forward(out, ids, table, N, C);
  }
  void embedding_backward(float* dtable, const float* dout, const int32_t* ids, int64_t N, int64_t C) const override {
    inner_.embedding_backward(dtable, dout, ids, N, C);
  }
  void position_embedding_forward(float* out, const float* pos, int64_t B, int64_t T, int64_t C) const override {
    inner_.position_embedding_forward(out, pos, B, T, C);
  }
  void position_embedding_forward(float* out, const bf16* pos, int64_t B, int64_t T, int64_t C) const override {
    inner_.position_embedding_forward(out, pos, B, T, C);
  }
  void position_embedding_backward(float* dpos, const float* dout, int64_t B, int64_t T, int64_t C) const override {
    inner_.position_embedding_backward(dpos, dout, B, T, C);
  }
  float cross_entropy_forward(float* probs, const float* logits, const int32_t* targets, int64_t N, int64_t V,
                              int64_t* correct) const override {
    return inner_.cross_entropy_forward(probs, logits, targets, N, V, correct);
  }
  void cross_entropy_backward(float* dlogits, const float* probs, const int32_t* targets, int64_t N, int64_t V,
                              float scale) const override {
    inner_.cross_entropy_backward(dlogits, probs, targets, N, V, scale);
  }
  void cross_entropy_backward(float* dlogits, bf16* dlogits16, int64_t ld16, const float* probs,
                              const int32_t* targets, int64_t N, int64_t V, float scale) const override {
    inner_.cross_entropy_backward(dlogits, dlogits16, ld16, probs, targets, N, V, scale);
  }
  void residual_forward(float* out, const float* a, const float* b, int64_t n) const override {
    inner_.residual_forward(out, a, b, n);
  }
  void pack_rows(float* x, int64_t N, int64_t width, int64_t padded) const override {
    inner_.pack_rows(x, N, width, padded);
  }
  void unpack_rows(float* x, int64_t N, int64_t width, int64_t padded) const override {
    inner_.unpack_rows(x, N, width, padded);
  }
  void sgd_update(float* p, float* g, float* buf, size_t n, float lr, float momentum, float decay, bool first,
                  bool consume, bf16* p16) const override {
    inner_.sgd_update(p, g, buf, n, lr, momentum, decay, first, consume, p16);
  }
  void adamw_update(float* p, float* g, float* m, float* v, size_t n, float b1, float b2, float eps, float keep,
                    float step_size, float rc2, bool consume, bf16* p16) const override {
    inner_.adamw_update(p, g, m, v, n, b1, b2, eps, keep, step_size, rc2, consume, p16);
  }
  double sum_of_squares(const float* x, size_t n) const override { return inner_.sum_of_squares(x, n); }
  void scale(float* x, size_t n, float factor) const override { inner_.scale(x, n, factor); }

 protected:
  const Kernels& inner_;
};

// Forwarding kernels that count the bytes copied between host and device
// and the pinned host buffers taken and given back (checkpoints' and the
// host update's copies; tests/test_checkpoint_device.cpp, test_host_update.cpp).
class CopySpy : public ForwardingKernels {
 public:
  using ForwardingKernels::ForwardingKernels;
  void upload(void* dst, const void* src, size_t bytes) const override {
    uploaded += bytes;
    ForwardingKernels::upload(dst, src, bytes);
  }
  void download(void* dst, const void* src, size_t bytes) const override {
    downloaded += bytes;
    largest_download = std::max(largest_download, bytes);
    ForwardingKernels::download(dst, src, bytes);
  }
  void* pinned_alloc(size_t bytes) const override {
    ++pinned;
    pinned_bytes += bytes;
    return ForwardingKernels::pinned_alloc(bytes);
  }
  void pinned_free(void* p) const override {
    if (p) ++pinned_freed;
    ForwardingKernels::pinned_free(p);
  }
  mutable size_t uploaded = 0, downloaded = 0, largest_download = 0, pinned_bytes = 0;
  mutable int pinned = 0, pinned_freed = 0;
};

}  // namespace dpt::test
