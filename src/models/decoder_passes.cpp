// The decoder's forward and backward passes (models/decoder.h), on compute
// type CT: float, or bf16 in a bf16 run (GEMM operands in bf16, everything
// else fp32). Each step names the kernel it runs; the architecture picks
// LayerNorm or RMSNorm, learned or rotary positions, GPT-2's attention or
// grouped-query attention, a GELU or a SwiGLU MLP.
#include <algorithm>
#include <type_traits>

#include "core/error.h"
#include "models/decoder.h"
#include "models/decoder_pass_util.h"
#include "nn/flash_attention.h"
#include "nn/vocab_parallel.h"

namespace dpt {

using decoder_pass::as;
using decoder_pass::last_of;

template <typename CT>
void Decoder::norm_forward(CT* out, float* mean, float* rstd, const float* x, int w, int b, int64_t N) {
  if (config_.norm == NormKind::LayerNorm)
    k().layernorm_forward(out, mean, rstd, x, param(w), param(b), N, config_.width);
  else
    k().rmsnorm_forward(out, rstd, x, param(w), N, config_.width, config_.norm_eps);
}

// Generation's pass (decoder_infer.cpp) calls it too.
template void Decoder::norm_forward<float>(float*, float*, float*, const float*, int, int, int64_t);
template void Decoder::norm_forward<bf16>(bf16*, float*, float*, const float*, int, int, int64_t);

void Decoder::norm_backward(float* dres, const float* dout, const float* x, int w, int b, const float* mean,
                            const float* rstd, int64_t N, bool sequence) {
  const auto C = static_cast<size_t>(config_.width);
  const size_t parts = b >= 0 ? 2 : 1;
  float* g[2] = {grad(w), b >= 0 ? grad(b) : nullptr};
  // Sequence parallelism: this rank's rows give part of the weight
  // gradients. The TP group sums the new part only (what earlier
  // micro-batches accumulated is the same on every rank already), so it is
  // set aside, the kernel accumulates into zeros, and it is added back to
  // the sum. (CPU only: --sequence-parallel is refused on a GPU.)
  float *old = nullptr, *fresh = nullptr;
  if (sequence) {
    sp_grads_.resize(2 * parts * C);
    old = sp_grads_.data();
    fresh = old + parts * C;
    for (size_t p = 0; p < parts; ++p) {
      std::copy(g[p], g[p] + C, old + p * C);
      std::fill(g[p], g[p] + C, 0.0f);
    }
  }
  // dres is the gradient of the residual stream; every norm's backward
  // adds its input gradient into it, which is how the skip connections'
  // identity backward is carried (see nn/residual.h).
  if (config_.norm == NormKind::LayerNorm)
    k().layernorm_backward(dres, g[0], g[1], dout, x, param(w), mean, rstd, N, config_.width);
  else
    k().rmsnorm_backward(dres, g[0], dout, x, param(w), rstd, N, config_.width);
  if (sequence) {
    for (size_t p = 0; p < parts; ++p) std::copy(g[p], g[p] + C, fresh + p * C);
    tensor_sum(fresh, parts * C);  // one all-reduce of the weight's (and bias's) C floats
    for (size_t p = 0; p < parts; ++p)
      for (size_t i = 0; i < C; ++i) g[p][i] = old[p * C + i] + fresh[p * C + i];
  }
  slots_ready(w, last_of(w, b));
}

template <typename CT>
void Decoder::attention_forward(const BlockSlots& s, const BlockActs& a, int64_t B, int64_t T) {
  const int64_t C = config_.width, N = B * T;
  const Widths& w = w_;
  k().linear_forward(a.qkv, as<CT>(a.ln1), weight<CT>(s.qkv_w), param_or_null(s.qkv_b), N, C, w.qkv);
  // Rotary positions turn q and k in place; the attention (and its
  // backward) reads them turned.
  if (config_.rotary)
    k().rope_forward(a.qkv, a.qkv, act_.rope_cos, act_.rope_sin, B, T, w.heads + w.kv, w.hd, w.qkv);
  // Attention computes in fp32 (its softmax needs the range); a bf16 run
  // has the bf16 copy of its output made for the output projection.
  float* out = std::is_same_v<CT, float> || fused_attention_ ? fused_out<CT>(a, B, T) : act_.atty32;
  bf16* out16 = nullptr;
  if constexpr (std::is_same_v<CT, bf16>) out16 = as<CT>(a.atty);
  attend_forward(out, out16, a.att, a.qkv, B, T);
  // A row-parallel projection's output is the sum of every TP rank's
  // partial product; its bias is added once, by TP rank 0, inside that sum.
  // Under sequence parallelism the partial products go to the scratch dC,
  // and a reduce-scatter leaves this rank's rows of their sum at their place
  // in it (block_forward adds the residual to them).
  const float* bias = tp_.rank == 0 ? param_or_null(s.proj_b) : nullptr;
  const bool sp = sequence_parallel(N);
  float* out_proj = sp ? act_.dC : a.res2;
  k().linear_forward(out_proj, as<CT>(a.atty), weight<CT>(s.proj_w), bias, N, w.att, C);
  tensor_sum(out_proj, static_cast<size_t>(N * C), sp ? TpReduce::ReduceScatter : TpReduce::Sum);
}

template <typename CT>
void Decoder::mlp_forward(const BlockSlots& s, const BlockActs& a, int64_t N) {
  const int64_t C = config_.width;
  const Widths& w = w_;
  k().linear_forward(a.fch, as<CT>(a.ln2), weight<CT>(s.fc_w), param_or_null(s.fc_b), N, C, w.fc);
  if (config_.mlp == MlpKind::SwiGlu)
    k().swiglu_forward(as<CT>(a.fch_gelu), a.fch, N, w.inner);
  else
    k().gelu_forward(as<CT>(a.fch_gelu), a.fch, N * w.fc);
  const float* bias = tp_.rank == 0 ? param_or_null(s.fcproj_b) : nullptr;
  const bool sp = sequence_parallel(N);  // as attention_forward
  float* out_proj = sp ? act_.dC : a.res3;
  k().linear_forward(out_proj, as<CT>(a.fch_gelu), weight<CT>(s.fcproj_w), bias, N, w.inner, C);
  tensor_sum(out_proj, static_cast<size_t>(N * C), sp ? TpReduce::ReduceScatter : TpReduce::Sum);
}

template <typename CT>
void Decoder::block_forward(size_t l, const float* x, int64_t B, int64_t T) {
  const int64_t N = B * T, C = config_.width;
  const BlockSlots& s = slots_of(l);
  const BlockActs& a = act_.blocks[l];
  // Sequence parallelism: x, res2 and res3 are this rank's n rows; each
  // norm writes its rows at their place in its [N, C] output, and the TP
  // group all-gathers the rest before the column-parallel GEMM.
  const bool sp = sequence_parallel(N);
  const int64_t n = sp ? N / tp_.size : N, off = sp ? tp_.rank * n * C : 0;
  norm_forward(as<CT>(a.ln1) + off, a.ln1_mean, a.ln1_rstd, x, s.ln1_w, s.ln1_b, n);
  if (sp) gather_operand<CT>(a.ln1, N);
  attention_forward<CT>(s, a, B, T);
  k().residual_forward(a.res2, sp ? act_.dC + off : a.res2, x, n * C);
  norm_forward(as<CT>(a.ln2) + off, a.ln2_mean, a.ln2_rstd, a.res2, s.ln2_w, s.ln2_b, n);
  if (sp) gather_operand<CT>(a.ln2, N);
  mlp_forward<CT>(s, a, N);
  k().residual_forward(a.res3, sp ? act_.dC + off : a.res3, a.res2, n * C);
}

ForwardStats Decoder::forward(const Batch& batch) {
  const int64_t B = batch.B, V = config_.vocab;
  if (batch.T < 1 || batch.T > config_.context)
    throw InputError(fmt::format("sequence length {} is outside the model's 1..{}", batch.T, config_.context));
  if (static_cast<int64_t>(batch.tokens.size()) < B * batch.T || static_cast<int64_t>(batch.targets.size()) < B * batch.T)
    throw InputError(fmt::format("a batch of {}x{} needs {} tokens and targets", B, batch.T, B * batch.T));
  check_context_parallel(batch.T);
  // Under context parallelism this rank's rows of the sequences.
  const int64_t T = local_rows(batch.T), N = B * T;
  if (fused_attention_ && device_ != Device::CPU && w_.hd > kGpuFlashMaxHead)
    throw InputError(fmt::format("--attention fused on the GPU takes head sizes up to {}, and this model's is {}; "
                                 "--attention unfused takes any",
                                 kGpuFlashMaxHead, w_.hd));
  if (sequence_parallel(N) && (device_ != Device::CPU || !whole()))
    throw InputError(
        "--sequence-parallel runs on the CPU without --pp (not yet with --device cuda or pipeline stages)");
  if (split_backward_ && sequence_parallel(N))  // (B's keep lies over full-height buffers: models/decoder.h)
    throw InputError("a split backward (--pp-schedule zb-h1 or zb-v) does not run under --sequence-parallel");
  plan_activations(B, T);
  if (cp_size_ > 1) {
    keep_local_rows(batch, T);
  } else {
    std::copy(batch.tokens.begin(), batch.tokens.begin() + N, tokens_.begin());
    std::copy(batch.targets.begin(), batch.targets.begin() + N, targets_.begin());
  }
  for (int64_t i = 0; i < N; ++i)
    if (tokens_[i] < 0 || tokens_[i] >= V || targets_[i] < 0 || targets_[i] >= V)
      throw InputError(fmt::format("token {} is outside the model's vocabulary 0..{}", tokens_[i], V - 1));
  if (device_ != Device::CPU) {
    k().upload(ids_.f32(), tokens_.data(), sizeof(int32_t) * static_cast<size_t>(N));
    k().upload(ids_.f32() + N, targets_.data(), sizeof(int32_t) * static_cast<size_t>(N));
  }
  return precision_ == DType::BF16 ? forward_as<bf16>(B, T) : forward_as<float>(B, T);
}

std::vector<float> Decoder::logits(const Batch& batch) {
  if (!whole() || tp_.size > 1)
    throw InputError("logits are computed by the whole model on one rank (no --tp, no --pp)");
  Batch b = batch;
  b.targets.assign(b.tokens.size(), 0);  // not read: the forward stops before the loss
  stop_at_logits_ = true;
  try {
    forward(b);
  } catch (...) {
    stop_at_logits_ = false;
    throw;
  }
  stop_at_logits_ = false;
  std::vector<float> out(static_cast<size_t>(b.B * b.T * config_.vocab));
  k().download(out.data(), act_.logits, out.size() * sizeof(float));
  return out;
}

template <typename CT>
void Decoder::embed_forward(int64_t B, int64_t T) {
  const int64_t C = config_.width, N = B * T;
  open(embed_unit_);
  if (vocab_parallel()) {
    // Each rank looks up the tokens it holds rows for; the sum has them all.
    vocab_embedding_forward(act_.encoded, tok(), weight<CT>(wte_), wte_first_row(), wte_rows(), N, C);
    tensor_sum(act_.encoded, static_cast<size_t>(N * C));
  } else {
    k().embedding_forward(act_.encoded, tok(), weight<CT>(wte_), N, C);
  }
  if (wpe_ >= 0) positions_forward<CT>(B, T);
  close(embed_unit_);
}

template <typename CT>
ForwardStats Decoder::forward_as(int64_t B, int64_t T) {
  const int64_t C = config_.width, V = config_.vocab, Vp = wte_rows(), N = B * T;
  // Sequence parallelism: every rank computes the whole embedding and takes
  // its n rows of it into the blocks (a slice: no communication).
  const bool sp = sequence_parallel(N);
  const int64_t n = sp ? N / tp_.size : N, off = sp ? tp_.rank * n * C : 0;
  begin(Pass::Forward, part());
  // A chunk without the embedding finds its input in encoded (stage_input).
  if (embeds()) embed_forward<CT>(B, T);
  const float* x = act_.encoded + off;  // the residual stream entering each block
  for (size_t l = 0; l < act_.blocks.size(); ++l) {
    open(unit_of(l));
    block_forward<CT>(l, x, B, T);
    close(unit_of(l));
    x = act_.blocks[l].res3;
  }
  if (!heads()) return {};
  CT* lnf = as<CT>(act_.lnf);
  open(lnf_unit_);
  // Sequence parallelism: ln_f on this rank's rows, all-gathered for the head.
  norm_forward(lnf + off, act_.lnf_mean, act_.lnf_rstd, x, lnf_w_, lnf_b_, n);
  if (sp) gather_operand<CT>(act_.lnf, N);
  if (!config_.tied) k().linear_forward(act_.logits, lnf, weight<CT>(head_), nullptr, N, C, Vp);
  close(lnf_unit_);
  // A tied output projection: logits = lnf @ wte^T. The embedding's unit
  // is opened a second time for it; a head without the embedding in its
  // chunk computes with the pipeline's copy of wte.
  if (config_.tied && !tied_w_) {
    open(embed_unit_);
    k().linear_forward(act_.logits, lnf, weight<CT>(wte_), nullptr, N, C, Vp);
    close(embed_unit_);
  } else if (config_.tied) {
    k().linear_forward(act_.logits, lnf, tied_weight<CT>(), nullptr, N, C, Vp);
  }
  ForwardStats st;
  st.count = N;
  if (vocab_parallel()) {
    st.loss = vocab_parallel_loss(N, &st.correct);
    return st;
  }
  pack_logits(N);
  if (stop_at_logits_) return st;
  st.loss = k().cross_entropy_forward(act_.logits, act_.logits, tgt(), N, V, &st.correct);
  return st;
}

void Decoder::backward(float loss_scale) {
  if (precision_ == DType::BF16)
    backward_as<bf16>(loss_scale);
  else
    backward_as<float>(loss_scale);
}

template <typename CT>
void Decoder::mlp_backward(const BlockSlots& s, const BlockActs& b, int64_t N) {
  const int64_t C = config_.width;
  const Widths& w = w_;
  const Acts& a = act_;
  // The MLP's output gradient is the residual stream's gradient (the same
  // on every TP rank, so is the replicated bias's gradient). Sequence
  // parallelism: each rank holds its rows of it; all-gathered in place.
  const bool sp = sequence_parallel(N);
  if (sp) tensor_sum(a.dres, static_cast<size_t>(N * C), TpReduce::AllGather);
  bf16* d4C16 = std::is_same_v<CT, bf16> ? static_cast<bf16*>(a.dout16) : nullptr;
  // A bf16 run's GEMMs read only the bf16 copy, and the activation's
  // backward sums the bias gradient itself: on the CPU the fp32 gradient
  // is not written at all (nn/activations.h, nn/swiglu.h).
  float* d4C32 = d4C16 && device_ == Device::CPU ? nullptr : a.d4C;
  const CT* d4C_op;
  if constexpr (std::is_same_v<CT, bf16>)
    d4C_op = d4C16;
  else
    d4C_op = a.d4C;
  if (config_.mlp == MlpKind::SwiGlu) {
    linear_backward_from(k(), a.dI, grad(s.fcproj_w), grad_or_null(s.fcproj_b), a.dres, a.dout16,
                         as<CT>(b.fch_gelu), weight<CT>(s.fcproj_w), N, w.inner, C);
    slots_ready(s.fcproj_w, last_of(s.fcproj_w, s.fcproj_b));
    // SwiGLU's backward writes gate|up's gradient, and in a bf16 run the
    // GEMMs' bf16 operand, in one pass.
    k().swiglu_backward(d4C32, d4C16, a.dI, b.fch, N, w.inner);
    k().linear_backward(a.dC, grad(s.fc_w), nullptr, d4C_op, as<CT>(b.ln2), weight<CT>(s.fc_w), N, C, w.fc, nullptr);
  } else {
    linear_backward_from(k(), a.d4C, grad(s.fcproj_w), grad(s.fcproj_b), a.dres, a.dout16, as<CT>(b.fch_gelu),
                         weight<CT>(s.fcproj_w), N, w.inner, C);
    slots_ready(s.fcproj_w, s.fcproj_b);
    // GELU's backward also sums c_fc's bias gradient and, in a bf16 run,
    // writes the GEMMs' bf16 operand: one pass over the N x 4C gradient
    // instead of three (nn/activations.h).
    k().gelu_backward(d4C32, d4C16, grad(s.fc_b), a.d4C, b.fch, N, w.fc);
    k().linear_backward(a.dC, grad(s.fc_w), nullptr, d4C_op, as<CT>(b.ln2), weight<CT>(s.fc_w), N, C, w.fc, nullptr);
  }
  slots_ready(s.fc_w, s.fc_end);
  // Each TP rank's columns give part of the norm's output gradient
  // (sequence parallelism: summed into this rank's rows only).
  tensor_sum(a.dC, static_cast<size_t>(N * C), sp ? TpReduce::ReduceScatter : TpReduce::Sum);
}

template <typename CT>
void Decoder::attention_backward(const BlockSlots& s, const BlockActs& b, int64_t B, int64_t T) {
  const int64_t C = config_.width, N = B * T;
  const Widths& w = w_;
  const Acts& a = act_;
  const bool sp = sequence_parallel(N);  // as mlp_backward
  if (sp) tensor_sum(a.dres, static_cast<size_t>(N * C), TpReduce::AllGather);
  linear_backward_from(k(), a.dC, grad(s.proj_w), grad_or_null(s.proj_b), a.dres, a.dout16, as<CT>(b.atty),
                       weight<CT>(s.proj_w), N, w.att, C);
  slots_ready(s.proj_w, last_of(s.proj_w, s.proj_b));
  attend_backward(a.d3C, a.dC, b.qkv, fused_out<CT>(b, B, T), b.att, B, T);
  qkv_backward(a.dC, grad(s.qkv_w), grad_or_null(s.qkv_b), a.d3C, as<CT>(b.ln1), weight<CT>(s.qkv_w), B, T);
  slots_ready(s.qkv_w, s.qkv_end);
  // The first norm's output gradient, as the second's.
  tensor_sum(a.dC, static_cast<size_t>(N * C), sp ? TpReduce::ReduceScatter : TpReduce::Sum);
}

template <typename CT>
void Decoder::qkv_backward(float* dinp, float* dweight, float* dbias, float* d3C, const CT* inp, const CT* weight,
                           int64_t B, int64_t T) {
  const Widths& w = w_;
  const Acts& a = act_;
  const int64_t N = B * T, C = config_.width;
  // A bf16 run without a bias to sum takes the GEMMs' operand from
  // rotary's own pass over the gradient (with a bias, from the bias sums'
  // pass: linear_backward_from), not from a conversion pass of its own.
  if constexpr (std::is_same_v<CT, bf16>) {
    if (config_.rotary && !dbias) {
      auto* d16 = static_cast<bf16*>(a.dout16);
      k().rope_backward(d3C, d16, a.rope_cos, a.rope_sin, B, T, w.heads + w.kv, w.hd, w.qkv);
      k().linear_backward(dinp, dweight, nullptr, d16, inp, weight, N, C, w.qkv, nullptr);
      return;
    }
  }
  // From the turned q and k's gradient to the projection's.
  if (config_.rotary) k().rope_backward(d3C, d3C, a.rope_cos, a.rope_sin, B, T, w.heads + w.kv, w.hd, w.qkv);
  linear_backward_from(k(), dinp, dweight, dbias, d3C, a.dout16, inp, weight, N, C, w.qkv);
}
// (Also a split backward's, decoder_split.cpp.)
template void Decoder::qkv_backward<float>(float*, float*, float*, float*, const float*, const float*, int64_t,
                                           int64_t);
template void Decoder::qkv_backward<bf16>(float*, float*, float*, float*, const bf16*, const bf16*, int64_t, int64_t);

template <typename CT>
void Decoder::backward_as(float loss_scale) {
  const int64_t B = batch_, T = seq_, N = B * T, C = config_.width;
  const Acts& a = act_;
  // Sequence parallelism: the blocks' residual gradient is this rank's rows
  // of dres, their norms' output gradients its rows of dC.
  const bool sp = sequence_parallel(N);
  const int64_t n = sp ? N / tp_.size : N, off = sp ? tp_.rank * n * C : 0;
  begin(Pass::Backward, part());
  if (heads()) head_backward<CT>(loss_scale);
  // Without the head, dres holds the output's gradient (output_grad).
  for (size_t l = a.blocks.size(); l-- > 0;) {
    const BlockSlots& s = slots_of(l);
    const BlockActs& b = a.blocks[l];
    open(unit_of(l));
    const float* x = l > 0 ? a.blocks[l - 1].res3 : a.encoded + off;
    // Checkpointing: refill the scratch block from the block's saved input,
    // inside the same open as its backward, so a sharded strategy gathers
    // the unit once for both (as FSDP's recompute uses the parameters its
    // backward gathers). It rewrites res3 with the very same values.
    if (checkpoint_) block_forward<CT>(l, x, B, T);
    // Each layer's parameters are reported final as soon as its backward is
    // done: backward visits them in exactly the reverse of the layout's order.
    mlp_backward<CT>(s, b, N);
    norm_backward(a.dres + off, a.dC + off, b.res2, s.ln2_w, s.ln2_b, b.ln2_mean, b.ln2_rstd, n, sp);
    attention_backward<CT>(s, b, B, T);
    norm_backward(a.dres + off, a.dC + off, x, s.ln1_w, s.ln1_b, b.ln1_mean, b.ln1_rstd, n, sp);
    close(unit_of(l));
  }
  // Without the embedding, dres is the input's gradient (input_grad).
  // Sequence parallelism: every rank's rows of it, gathered for the
  // embedding's backward (which every rank then runs whole).
  if (sp && embeds()) tensor_sum(a.dres, static_cast<size_t>(N * C), TpReduce::AllGather);
  if (embeds()) embed_backward(B, T);
}

void Decoder::embed_backward(int64_t B, int64_t T) {
  const int64_t C = config_.width, N = B * T;
  open(embed_unit_);
  // The head's part of the tied weight's gradient from the last stage goes
  // in first, as one process has it there before the tokens' part.
  if (tied_in_) k().residual_forward(grad(wte_), grad(wte_), tied_in_, static_cast<size_t>(wte_rows() * C));
  if (wpe_ >= 0) positions_backward(B, T);
  // (Vocabulary-parallel: dres is the same on every TP rank, and each adds
  // it into the rows it holds; no communication.)
  if (vocab_parallel())
    vocab_embedding_backward(grad(wte_), act_.dres, tok(), wte_first_row(), wte_rows(), N, C);
  else
    k().embedding_backward(grad(wte_), act_.dres, tok(), N, C);
  slots_ready(wte_, last_of(wte_, wpe_));
  close(embed_unit_);
}

template <typename CT>
void Decoder::head_backward(float loss_scale) {
  const int64_t N = batch_ * seq_, C = config_.width, V = config_.vocab, Vp = wte_rows();
  const Acts& a = act_;
  const float scale = loss_scale / static_cast<float>(N);
  // In a bf16 run the head's GEMMs read a bf16 copy of the logits'
  // gradient: written by the cross-entropy's backward, alone (the fp32
  // gradient is not written: the probabilities' lines are not written
  // back), straight into the GEMMs' rows (a padded vocabulary's pad
  // columns zero, no unpacking); where the vocabulary is split, converted
  // in a pass of its own (operand).
  const CT* dlogits = nullptr;
  if (vocab_parallel()) {
    vocab_ce_backward(a.logits, tgt(), wte_first_row(), N, Vp, vocab_live(), scale);
  } else if (std::is_same_v<CT, bf16>) {
    k().cross_entropy_backward(nullptr, static_cast<bf16*>(a.dout16), Vp, a.logits, tgt(), N, V, scale);
    dlogits = static_cast<const CT*>(a.dout16);
  } else {
    k().cross_entropy_backward(a.logits, a.logits, tgt(), N, V, scale);
    unpack_logit_grads(N);
  }
  if (!dlogits) dlogits = operand<CT>(k(), a.logits, N * Vp, a.dout16);
  // A tied weight gets the output projection's gradient here and the
  // embedding's at the very end, so its unit is ready last: both
  // contributions are summed in the unit's gradients before any reduction.
  if (config_.tied && !tied_w_) {
    open(embed_unit_);
    k().linear_backward(a.dC, grad(wte_), nullptr, dlogits, as<CT>(a.lnf), weight<CT>(wte_), N, C, Vp, nullptr);
    close(embed_unit_);
  } else if (config_.tied) {
    k().linear_backward(a.dC, tied_g_, nullptr, dlogits, as<CT>(a.lnf), tied_weight<CT>(), N, C, Vp, nullptr);
  }
  if (!config_.tied) {
    open(lnf_unit_);
    k().linear_backward(a.dC, grad(head_), nullptr, dlogits, as<CT>(a.lnf), weight<CT>(head_), N, C, Vp, nullptr);
    slots_ready(head_, head_);
  }
  // Vocabulary-parallel: each rank's columns give part of the final norm's
  // output gradient.
  if (vocab_parallel()) tensor_sum(a.dC, static_cast<size_t>(N * C));
  if (config_.tied) open(lnf_unit_);
  k().zero(a.dres, sizeof(float) * static_cast<size_t>(N * C));
  // Sequence parallelism: dC is whole (the same on every rank); ln_f ran on
  // this rank's rows, so its backward runs on them too.
  const bool sp = sequence_parallel(N);
  const int64_t n = sp ? N / tp_.size : N, off = sp ? tp_.rank * n * C : 0;
  const float* last = a.blocks.empty() ? a.encoded + off : a.blocks.back().res3;
  norm_backward(a.dres + off, a.dC + off, last, lnf_w_, lnf_b_, a.lnf_mean, a.lnf_rstd, n, sp);
  close(lnf_unit_);
}

template <typename CT>
const CT* Decoder::tied_weight() const {
  DPT_CHECK(tied_w_ != nullptr, "a last stage without the embedding has no tied head copy");
  DPT_CHECK(tied_dtype_ == (std::is_same_v<CT, float> ? DType::F32 : DType::BF16),
            "the tied head copy is {}, the head computes in another type", dtype_name(tied_dtype_));
  return static_cast<const CT*>(tied_w_);
}

void Decoder::pack_logits(int64_t N) {
  if (config_.rows() != config_.vocab) k().pack_rows(act_.logits, N, config_.vocab, config_.rows());
}

void Decoder::unpack_logit_grads(int64_t N) {
  // The pad logits took no part in the loss, so their gradients are zero.
  if (config_.rows() != config_.vocab) k().unpack_rows(act_.logits, N, config_.vocab, config_.rows());
}

float Decoder::vocab_parallel_loss(int64_t N, int64_t* correct) {
  DPT_CHECK(device_ == Device::CPU, "the vocabulary-parallel cross-entropy runs on the CPU only");
  // This rank's columns of the vocabulary: [first, first + live), the rest
  // of its wte_rows() pad (only the last rank has any).
  const int64_t W = wte_rows(), first = wte_first_row(), live = vocab_live();
  float *zmax = act_.ce, *sums = act_.ce + N;
  vocab_ce_max(zmax, act_.logits, N, W, live);
  tensor_sum(zmax, static_cast<size_t>(N), TpReduce::Max);
  vocab_ce_exp(act_.logits, sums, zmax, tgt(), first, N, W, live);
  tensor_sum(sums, static_cast<size_t>(2 * N));
  return vocab_ce_loss(act_.logits, sums, zmax, N, W, live, correct);
}

}  // namespace dpt
