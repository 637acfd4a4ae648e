// The decoder's backward split in two (models/decoder.h, docs/pipeline.md):
// B, the gradient of a chunk's input, on the pipeline's critical path, and
// W, the gradient of its blocks' linears' parameters, which a zero-bubble
// schedule runs later, in what would be idle time.
//
// B runs the norms' backward whole, as backward() does: the kernel computes
// the input's and the parameters' gradients in one pass. Their parameter
// gradients go to the keep, not the gradient buffer (a strategy that
// reduces per micro-batch may still hold an earlier micro-batch's buffer
// there, whose W has not run), and W adds them in where backward() has the
// kernel add them: the kernels add their whole sum over the rows to the
// gradient in one addition (nn/layernorm.h), so gradient + (0 + sum) is
// bitwise gradient + sum. W runs the kernels backward() runs for the
// linears' parameter gradients, on the same operands (B keeps each
// linear's output gradient; the linears' inputs are in the forward's
// arena), adding into the same buffers, and reports every slot ready where
// backward() does: a split step's gradients are bitwise those of an
// unsplit one.
#include <type_traits>

#include "core/error.h"
#include "models/decoder.h"
#include "models/decoder_pass_util.h"

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
  const int64_t B = batch_, T = seq_, N = B * T;
  const Acts& a = act_;
  DPT_CHECK(!sequence_parallel(N), "a split backward does not run under sequence parallelism");
  begin(Pass::Backward, part());
  if (heads()) head_backward<CT>(loss_scale);
  for (size_t l = a.blocks.size(); l-- > 0;) {
    const float* x = l > 0 ? a.blocks[l - 1].res3 : a.encoded;
    open(unit_of(l));
    // Checkpointing: the scratch block refilled from the block's input (as
    // backward() does; the linears' inputs, which W reads, are the block's own).
    if (checkpoint_) block_forward<CT>(l, x, B, T);
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
    block_backward_weights<CT>(l, N);
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
  // A norm's backward (its input gradient added into dres), its parameter
  // gradients from zero into the scratch d4C (free by then: lay_out sizes
  // it for all of them), ln2's weight (and bias) first, then ln1's; copied
  // into the keep once the block's B is done (the keep may lie over the
  // statistics the kernel reads, or the attention's state).
  const bool ln = config_.norm == NormKind::LayerNorm;
  const int vectors = ln ? 4 : 2;
  const size_t CB = static_cast<size_t>(C) * sizeof(float);
  auto norm = [&](const float* dout, const float* in, int wt, const float* mean, const float* rstd, int first) {
    float* dw = a.d4C + first * C;
    k().zero(dw, (ln ? 2 : 1) * CB);
    if (ln)
      k().layernorm_backward(a.dres, dw, dw + C, dout, in, param(wt), mean, rstd, N, C);
    else
      k().rmsnorm_backward(a.dres, dw, dout, in, param(wt), rstd, N, C);
  };
  // The MLP, as mlp_backward without the parameter gradients. Its output's
  // gradient is kept over the block's output (read by the next block's B
  // and the head's, both done).
  k().copy(b.w_dy2, a.dres, NC);
  bf16* d4C16 = std::is_same_v<CT, bf16> ? static_cast<bf16*>(a.dout16) : nullptr;
  const CT* dres_op = operand<CT>(k(), a.dres, N * C, a.dout16);
  // The activation's backward reads its input (fch) and writes its input's
  // gradient, element by element, in place over it (without
  // checkpointing, w_d4C is fch: nn/activations.h, nn/swiglu.h).
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
  k().linear_backward(a.dC, nullptr, nullptr, d4C_op, as<CT>(b.ln2), weight<CT>(s.fc_w), N, C, w.fc, nullptr);
  tensor_sum(a.dC, static_cast<size_t>(N * C));
  norm(a.dC, b.res2, s.ln2_w, b.ln2_mean, b.ln2_rstd, 0);
  // The attention, as attention_backward without the parameter gradients;
  // the residual stream's gradient here kept over res2 (the second norm,
  // its only reader, is done).
  k().copy(b.w_dy1, a.dres, NC);
  k().linear_backward(a.dC, nullptr, nullptr, operand<CT>(k(), a.dres, N * C, a.dout16), as<CT>(b.atty),
                      weight<CT>(s.proj_w), N, w.att, C, nullptr);
  // q/k/v's gradient straight into the keep (the next block's qkv, dead,
  // or the arena's scratch: lay_out).
  float* d3C = b.w_d3C;
  attend_backward(d3C, a.dC, b.qkv, fused_out<CT>(b, B, T), b.att, B, T);
  // (In place: rotary turns q's and k's columns only, v's stay as they are.)
  qkv_backward(a.dC, nullptr, nullptr, d3C, as<CT>(b.ln1), weight<CT>(s.qkv_w), B, T);
  tensor_sum(a.dC, static_cast<size_t>(N * C));
  norm(a.dC, x, s.ln1_w, b.ln1_mean, b.ln1_rstd, vectors / 2);
  for (int i = 0; i < vectors; ++i) k().copy(b.w_norm[i], a.d4C + i * C, CB);
}

template <typename CT>
void Decoder::block_backward_weights(size_t l, int64_t N) {
  const int64_t C = config_.width;
  const BlockSlots& s = slots_of(l);
  const BlockActs& b = act_.blocks[l];
  const Acts& a = act_;
  const Widths& w = w_;
  // A norm's parameter gradients, B's, added in (the kernel's one addition):
  // the keep's vectors from `first` (ln2's weight and bias, then ln1's).
  auto norm = [&](int wt, int bs, int first) {
    k().residual_forward(grad(wt), grad(wt), b.w_norm[first], static_cast<size_t>(C));
    if (bs >= 0) k().residual_forward(grad(bs), grad(bs), b.w_norm[first + 1], static_cast<size_t>(C));
    slots_ready(wt, last_of(wt, bs));
  };
  // In backward()'s order: the MLP's projection, its first linear (GELU's
  // bias summed from the same gradient gelu_backward sums it from), the
  // second norm, the attention's projection, q/k/v, the first norm.
  linear_backward_from(k(), nullptr, grad(s.fcproj_w), grad_or_null(s.fcproj_b), b.w_dy2, a.dout16,
                       as<CT>(b.w_fch_gelu), weight<CT>(s.fcproj_w), N, w.inner, C);
  slots_ready(s.fcproj_w, last_of(s.fcproj_w, s.fcproj_b));
  linear_backward_from(k(), nullptr, grad(s.fc_w), grad_or_null(s.fc_b), b.w_d4C, a.dout16, as<CT>(b.w_ln2),
                       weight<CT>(s.fc_w), N, C, w.fc);
  slots_ready(s.fc_w, s.fc_end);
  norm(s.ln2_w, s.ln2_b, 0);
  linear_backward_from(k(), nullptr, grad(s.proj_w), grad_or_null(s.proj_b), b.w_dy1, a.dout16, as<CT>(b.w_atty),
                       weight<CT>(s.proj_w), N, w.att, C);
  slots_ready(s.proj_w, last_of(s.proj_w, s.proj_b));
  linear_backward_from(k(), nullptr, grad(s.qkv_w), grad_or_null(s.qkv_b), b.w_d3C, a.dout16, as<CT>(b.w_ln1),
                       weight<CT>(s.qkv_w), N, C, w.qkv);
  slots_ready(s.qkv_w, s.qkv_end);
  norm(s.ln1_w, s.ln1_b, config_.norm == NormKind::LayerNorm ? 2 : 1);
}

}  // namespace dpt
