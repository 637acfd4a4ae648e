// The decoder's backward split in two (models/decoder.h, docs/pipeline.md):
// B, the gradient of a chunk's input, on the pipeline's critical path, and
// W, the gradient of its blocks' parameters, which a zero-bubble schedule
// runs later, in what would be idle time. W runs the kernels backward()
// runs for the parameter gradients, on the same operands (B keeps each
// linear's and each norm's output gradient; the linears' inputs are in the
// forward's arena), adding into the same buffers: a split step's gradients
// are bitwise those of an unsplit one. B computes the norms' input
// gradients with their parameter gradients sent to a scratch (the kernel
// computes both in one pass); W runs the norm's kernel again for the
// parameter gradients, its input gradient sent to a scratch.
#include <type_traits>

#include "core/error.h"
#include "models/decoder.h"
#include "models/decoder_pass_util.h"
#include "nn/flash_attention.h"

namespace dpt {

using decoder_pass::as;
using decoder_pass::last_of;

void Decoder::backward_input(float loss_scale) {
  DPT_CHECK(split_backward_ && planned_split_, "a split backward needs set_split_backward before the forward");
  if (precision_ == DType::BF16)
    backward_input_as<bf16>(loss_scale);
  else
    backward_input_as<float>(loss_scale);
}

void Decoder::backward_weights() {
  DPT_CHECK(split_backward_ && planned_split_, "a split backward needs set_split_backward before the forward");
  if (precision_ == DType::BF16)
    backward_weights_as<bf16>();
  else
    backward_weights_as<float>();
}

template <typename CT>
void Decoder::backward_input_as(float loss_scale) {
  const int64_t B = batch_, T = seq_, N = B * T, C = config_.width;
  const Acts& a = act_;
  begin(Pass::Backward, part());
  if (heads()) head_backward<CT>(loss_scale);
  for (size_t l = a.blocks.size(); l-- > 0;) {
    const BlockActs& b = a.blocks[l];
    const float* x = l > 0 ? a.blocks[l - 1].res3 : a.encoded;
    open(unit_of(l));
    // Checkpointing: the scratch block refilled from the block's input (as
    // backward() does), and what W reads copied out of it.
    if (checkpoint_) {
      block_forward<CT>(l, x, B, T);
      const size_t op = sizeof(CT), f = sizeof(float);
      k().copy(b.w_ln1, b.ln1, static_cast<size_t>(N * C) * op);
      k().copy(b.w_atty, b.atty, static_cast<size_t>(N * w_.att) * op);
      k().copy(b.w_ln2, b.ln2, static_cast<size_t>(N * C) * op);
      k().copy(b.w_fch_gelu, b.fch_gelu, static_cast<size_t>(N * w_.inner) * op);
      k().copy(b.w_res2, b.res2, static_cast<size_t>(N * C) * f);
      if (b.ln1_mean) k().copy(b.w_ln1_mean, b.ln1_mean, static_cast<size_t>(N) * f);
      if (b.ln2_mean) k().copy(b.w_ln2_mean, b.ln2_mean, static_cast<size_t>(N) * f);
      k().copy(b.w_ln1_rstd, b.ln1_rstd, static_cast<size_t>(N) * f);
      k().copy(b.w_ln2_rstd, b.ln2_rstd, static_cast<size_t>(N) * f);
    }
    block_backward_input<CT>(l, x, B, T);
    close(unit_of(l));
  }
  if (embeds()) embed_backward(B, T);
}

template <typename CT>
void Decoder::backward_weights_as() {
  const int64_t N = batch_ * seq_;
  const Acts& a = act_;
  begin(Pass::Backward, part(true));
  for (size_t l = a.blocks.size(); l-- > 0;) {
    open(unit_of(l));
    block_backward_weights<CT>(l, l > 0 ? a.blocks[l - 1].res3 : a.encoded, N);
    close(unit_of(l));
  }
}

template <typename CT>
void Decoder::block_backward_input(size_t l, const float* x, int64_t B, int64_t T) {
  const int64_t C = config_.width, N = B * T;
  const size_t NC = static_cast<size_t>(N * C) * sizeof(float);
  const BlockSlots& s = slots_of(l);
  const BlockActs& b = act_.blocks[l];
  const Acts& a = act_;
  const Widths& w = w_;
  norm_sink_.resize(static_cast<size_t>(2 * C));
  float *sink_w = norm_sink_.data(), *sink_b = sink_w + C;
  // The norm's input gradient into dres (its parameters' into the sink).
  auto norm_input = [&](const float* dout, const float* in, int wt, const float* mean, const float* rstd) {
    if (config_.norm == NormKind::LayerNorm)
      k().layernorm_backward(a.dres, sink_w, sink_b, dout, in, param(wt), mean, rstd, N, C);
    else
      k().rmsnorm_backward(a.dres, sink_w, dout, in, param(wt), rstd, N, C);
  };
  // The MLP, as mlp_backward without the parameter gradients.
  k().copy(b.w_dy2, a.dres, NC);
  bf16* d4C16 = std::is_same_v<CT, bf16> ? static_cast<bf16*>(a.dout16) : nullptr;
  const CT* dres_op = operand<CT>(k(), a.dres, N * C, a.dout16);
  if (config_.mlp == MlpKind::SwiGlu) {
    k().linear_backward(a.dI, nullptr, nullptr, dres_op, as<CT>(b.fch_gelu), weight<CT>(s.fcproj_w), N, w.inner, C,
                        nullptr);
    k().swiglu_backward(b.w_d4C, d4C16, a.dI, b.fch, N, w.inner);
  } else {
    k().linear_backward(a.d4C, nullptr, nullptr, dres_op, as<CT>(b.fch_gelu), weight<CT>(s.fcproj_w), N, w.inner, C,
                        nullptr);
    k().gelu_backward(b.w_d4C, d4C16, nullptr, a.d4C, b.fch, N, w.fc);
  }
  const CT* d4C_op;
  if constexpr (std::is_same_v<CT, bf16>)
    d4C_op = d4C16;
  else
    d4C_op = b.w_d4C;
  // The norms' output gradients and q/k/v's are written where W reads them.
  k().linear_backward(b.w_dC2, nullptr, nullptr, d4C_op, as<CT>(b.ln2), weight<CT>(s.fc_w), N, C, w.fc, nullptr);
  tensor_sum(b.w_dC2, static_cast<size_t>(N * C));
  norm_input(b.w_dC2, b.res2, s.ln2_w, b.ln2_mean, b.ln2_rstd);
  // The attention, as attention_backward without the parameter gradients.
  k().copy(b.w_dy1, a.dres, NC);
  k().linear_backward(a.dC, nullptr, nullptr, operand<CT>(k(), a.dres, N * C, a.dout16), as<CT>(b.atty),
                      weight<CT>(s.proj_w), N, w.att, C, nullptr);
  float* d3C = b.w_d3C;
  attend_backward(d3C, a.dC, b.qkv, fused_out<CT>(b, B, T), b.att, B, T);
  if (config_.rotary) k().rope_backward(d3C, d3C, a.rope_cos, a.rope_sin, B, T, w.heads + w.kv, w.hd, w.qkv);
  k().linear_backward(b.w_dC1, nullptr, nullptr, operand<CT>(k(), d3C, N * w.qkv, a.dout16), as<CT>(b.ln1),
                      weight<CT>(s.qkv_w), N, C, w.qkv, nullptr);
  tensor_sum(b.w_dC1, static_cast<size_t>(N * C));
  norm_input(b.w_dC1, x, s.ln1_w, b.ln1_mean, b.ln1_rstd);
}

template <typename CT>
void Decoder::block_backward_weights(size_t l, const float* x, int64_t N) {
  const int64_t C = config_.width;
  const BlockSlots& s = slots_of(l);
  const BlockActs& b = act_.blocks[l];
  const Acts& a = act_;
  const Widths& w = w_;
  // The norm's parameter gradients (its input gradient into dC, unused).
  auto norm_weights = [&](const float* dout, const float* in, int wt, int bs, const float* mean, const float* rstd) {
    if (config_.norm == NormKind::LayerNorm)
      k().layernorm_backward(a.dC, grad(wt), grad(bs), dout, in, param(wt), mean, rstd, N, C);
    else
      k().rmsnorm_backward(a.dC, grad(wt), dout, in, param(wt), rstd, N, C);
    slots_ready(wt, last_of(wt, bs));
  };
  // In backward()'s order: the MLP's projection, its first linear (GELU's
  // bias summed from the same gradient gelu_backward sums it from), the
  // second norm, the attention's projection, q/k/v, the first norm.
  k().linear_backward(nullptr, grad(s.fcproj_w), grad_or_null(s.fcproj_b), operand<CT>(k(), b.w_dy2, N * C, a.dout16),
                      as<CT>(b.w_fch_gelu), weight<CT>(s.fcproj_w), N, w.inner, C, b.w_dy2);
  slots_ready(s.fcproj_w, last_of(s.fcproj_w, s.fcproj_b));
  k().linear_backward(nullptr, grad(s.fc_w), grad_or_null(s.fc_b), operand<CT>(k(), b.w_d4C, N * w.fc, a.dout16),
                      as<CT>(b.w_ln2), weight<CT>(s.fc_w), N, C, w.fc, b.w_d4C);
  slots_ready(s.fc_w, s.fc_end);
  norm_weights(b.w_dC2, b.w_res2, s.ln2_w, s.ln2_b, b.w_ln2_mean, b.w_ln2_rstd);
  k().linear_backward(nullptr, grad(s.proj_w), grad_or_null(s.proj_b), operand<CT>(k(), b.w_dy1, N * C, a.dout16),
                      as<CT>(b.w_atty), weight<CT>(s.proj_w), N, w.att, C, b.w_dy1);
  slots_ready(s.proj_w, last_of(s.proj_w, s.proj_b));
  k().linear_backward(nullptr, grad(s.qkv_w), grad_or_null(s.qkv_b), operand<CT>(k(), b.w_d3C, N * w.qkv, a.dout16),
                      as<CT>(b.w_ln1), weight<CT>(s.qkv_w), N, C, w.qkv, b.w_d3C);
  slots_ready(s.qkv_w, s.qkv_end);
  norm_weights(b.w_dC1, x, s.ln1_w, s.ln1_b, b.w_ln1_mean, b.w_ln1_rstd);
}

}  // namespace dpt
