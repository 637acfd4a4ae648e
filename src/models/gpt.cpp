#include "models/gpt.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/rng.h"
#include "nn/activations.h"
#include "nn/attention.h"
#include "nn/cross_entropy.h"
#include "nn/embedding.h"
#include "nn/layernorm.h"
#include "nn/linear.h"
#include "nn/residual.h"

namespace dpt {

GptConfig GptConfig::from(const std::map<std::string, std::string>& hparams) {
  GptConfig c;
  c.vocab = hparam_int(hparams, "vocab_size", c.vocab);
  c.layers = hparam_int(hparams, "n_layer", c.layers);
  c.heads = hparam_int(hparams, "n_head", c.heads);
  c.width = hparam_int(hparams, "n_embd", c.width);
  c.context = hparam_int(hparams, "block_size", c.context);
  c.padded_vocab = hparam_int(hparams, "padded_vocab_size", c.vocab);
  if (c.padded_vocab < c.vocab)
    throw InputError(fmt::format("GPT padded vocabulary {} is smaller than the vocabulary {}", c.padded_vocab,
                                 c.vocab));
  if (c.width % c.heads != 0)
    throw InputError(fmt::format("GPT width {} is not divisible by {} heads", c.width, c.heads));
  return c;
}

Gpt::Gpt(GptConfig config) : config_(config) {
  if (config_.rows() < config_.vocab)
    throw InputError(fmt::format("GPT padded vocabulary {} is smaller than the vocabulary {}", config_.rows(),
                                 config_.vocab));
  const int64_t C = config_.width, V = config_.rows(), T = config_.context;
  // Matrices (embeddings included) get weight decay; biases and LayerNorm
  // parameters do not, as in GPT-2 / nanoGPT training.
  layout_.begin_unit("transformer.embed");
  wte_ = layout_.add("transformer.wte.weight", {V, C}, true);
  wpe_ = layout_.add("transformer.wpe.weight", {T, C}, true);
  for (int64_t l = 0; l < config_.layers; ++l) {
    std::string p = "transformer.h." + std::to_string(l);
    layout_.begin_unit(p);
    BlockSlots b;
    b.ln1_w = layout_.add(p + ".ln_1.weight", {C}, false);
    b.ln1_b = layout_.add(p + ".ln_1.bias", {C}, false);
    b.qkv_w = layout_.add(p + ".attn.c_attn.weight", {3 * C, C}, true);
    b.qkv_b = layout_.add(p + ".attn.c_attn.bias", {3 * C}, false);
    b.proj_w = layout_.add(p + ".attn.c_proj.weight", {C, C}, true);
    b.proj_b = layout_.add(p + ".attn.c_proj.bias", {C}, false);
    b.ln2_w = layout_.add(p + ".ln_2.weight", {C}, false);
    b.ln2_b = layout_.add(p + ".ln_2.bias", {C}, false);
    b.fc_w = layout_.add(p + ".mlp.c_fc.weight", {4 * C, C}, true);
    b.fc_b = layout_.add(p + ".mlp.c_fc.bias", {4 * C}, false);
    b.fcproj_w = layout_.add(p + ".mlp.c_proj.weight", {C, 4 * C}, true);
    b.fcproj_b = layout_.add(p + ".mlp.c_proj.bias", {C}, false);
    blocks_.push_back(b);
  }
  layout_.begin_unit("transformer.ln_f");
  lnf_w_ = layout_.add("transformer.ln_f.weight", {C}, false);
  lnf_b_ = layout_.add("transformer.ln_f.bias", {C}, false);
  lnf_unit_ = static_cast<int>(config_.layers) + 1;
}

std::map<std::string, std::string> Gpt::metadata() const {
  std::map<std::string, std::string> m = {{"dpt.model", "gpt"},
          {"vocab_size", std::to_string(config_.vocab)},
          {"n_layer", std::to_string(config_.layers)},
          {"n_head", std::to_string(config_.heads)},
          {"n_embd", std::to_string(config_.width)},
          {"block_size", std::to_string(config_.context)}};
  if (config_.rows() != config_.vocab) m["padded_vocab_size"] = std::to_string(config_.rows());
  return m;
}

void Gpt::init_range(uint64_t seed, size_t begin, size_t n, float* out) const {
  // GPT-2: N(0, 0.02) for matrices and embeddings, the residual projections
  // scaled by 1/sqrt(2 * layers); zero biases; LayerNorm weight 1, bias 0.
  const float std_proj = 0.02f / std::sqrt(2.0f * static_cast<float>(config_.layers));
  const size_t end = begin + n;
  for (const Slot& s : layout_.slots()) {
    const size_t lo = std::max(begin, s.offset), hi = std::min(end, s.offset + s.numel);
    if (lo >= hi) continue;
    float* p = out + (lo - begin);
    const bool is_ln_weight = s.name.find("ln_") != std::string::npos && s.name.ends_with(".weight");
    if (is_ln_weight) {
      std::fill(p, p + (hi - lo), 1.0f);
    } else if (s.shape.size() == 2) {
      const float sd = s.name.ends_with("c_proj.weight") ? std_proj : 0.02f;
      // wte's pad rows (from row vocab on) start at zero and are never trained.
      const size_t live = s.offset + (s.name == "transformer.wte.weight"
                                          ? static_cast<size_t>(config_.vocab * config_.width)
                                          : s.numel);
      for (size_t i = lo; i < hi; ++i) p[i - lo] = i < live ? sd * counter_normal(seed, i) : 0.0f;
    } else {
      std::fill(p, p + (hi - lo), 0.0f);
    }
  }
}

int64_t Gpt::activation_floats(int64_t B, int64_t T) const {
  const int64_t C = config_.width, V = config_.rows(), NH = config_.heads, N = B * T;
  const int64_t per_block = N * (16 * C + 4) + B * NH * T * T;
  // Checkpointing keeps each block's output (N * C) plus one block's worth
  // of the rest, the scratch its forward is recomputed into.
  const int64_t blocks = checkpoint_ ? config_.layers * N * C + (config_.layers > 0 ? per_block - N * C : 0)
                                     : config_.layers * per_block;
  return N * C + blocks + N * (C + 2) + N * V + N * (C + C + 3 * C + 4 * C);
}

size_t Gpt::activation_bytes_for(int64_t B) const {
  return static_cast<size_t>(activation_floats(B, config_.context)) * sizeof(float);
}

void Gpt::plan_activations(int64_t B, int64_t T) {
  if (B == batch_ && T == seq_ && checkpoint_ == planned_checkpoint_) return;
  const int64_t C = config_.width, NH = config_.heads, N = B * T, V = config_.rows();
  const int64_t total = activation_floats(B, T);
  acts_.reserve(static_cast<size_t>(total));
  float* p = acts_.f32();
  auto take = [&p](int64_t n) {
    float* r = p;
    p += n;
    return r;
  };
  encoded_ = take(N * C);
  acts_of_.assign(static_cast<size_t>(config_.layers), BlockActs{});
  // A block's activations but its output (res3), laid out from the arena.
  auto lay_out = [&](BlockActs& a) {
    a.ln1 = take(N * C);
    a.ln1_mean = take(N);
    a.ln1_rstd = take(N);
    a.qkv = take(N * 3 * C);
    a.atty = take(N * C);
    a.att = take(B * NH * T * T);
    a.res2 = take(N * C);
    a.ln2 = take(N * C);
    a.ln2_mean = take(N);
    a.ln2_rstd = take(N);
    a.fch = take(N * 4 * C);
    a.fch_gelu = take(N * 4 * C);
  };
  if (checkpoint_) {
    // Each block keeps its output (the next block's input); everything else
    // lives in one scratch block that all blocks share.
    BlockActs scratch{};
    if (!acts_of_.empty()) lay_out(scratch);
    for (auto& a : acts_of_) {
      a = scratch;
      a.res3 = take(N * C);
    }
  } else {
    for (auto& a : acts_of_) {
      lay_out(a);
      a.res3 = take(N * C);
    }
  }
  lnf_ = take(N * C);
  lnf_mean_ = take(N);
  lnf_rstd_ = take(N);
  logits_ = take(N * V);
  dres_ = take(N * C);
  dC_ = take(N * C);
  d3C_ = take(N * 3 * C);
  d4C_ = take(N * 4 * C);
  DPT_CHECK(p - acts_.f32() == total, "activation plan is {} floats, arena {}", p - acts_.f32(), total);
  tokens_.resize(static_cast<size_t>(N));
  targets_.resize(static_cast<size_t>(N));
  batch_ = B;
  seq_ = T;
  planned_checkpoint_ = checkpoint_;
}

void Gpt::block_forward(size_t l, const float* x, int64_t B, int64_t T) {
  const int64_t C = config_.width, NH = config_.heads, N = B * T;
  const BlockSlots& s = blocks_[l];
  const BlockActs& a = acts_of_[l];
  layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, param(s.ln1_w), param(s.ln1_b), N, C);
  linear_forward(a.qkv, a.ln1, param(s.qkv_w), param(s.qkv_b), N, C, 3 * C);
  attention_forward(a.atty, a.att, a.qkv, B, T, C, NH);
  linear_forward(a.res2, a.atty, param(s.proj_w), param(s.proj_b), N, C, C);
  residual_forward(a.res2, a.res2, x, N * C);
  layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, param(s.ln2_w), param(s.ln2_b), N, C);
  linear_forward(a.fch, a.ln2, param(s.fc_w), param(s.fc_b), N, C, 4 * C);
  gelu_forward(a.fch_gelu, a.fch, N * 4 * C);
  linear_forward(a.res3, a.fch_gelu, param(s.fcproj_w), param(s.fcproj_b), N, 4 * C, C);
  residual_forward(a.res3, a.res3, a.res2, N * C);
}

ForwardStats Gpt::forward(const Batch& batch) {
  const int64_t B = batch.B, T = batch.T, C = config_.width, V = config_.vocab;
  const int64_t Vp = config_.rows();
  const int64_t N = B * T;
  if (T < 1 || T > config_.context)
    throw InputError(fmt::format("GPT sequence length {} is outside 1..{}", T, config_.context));
  if (static_cast<int64_t>(batch.tokens.size()) < N || static_cast<int64_t>(batch.targets.size()) < N)
    throw InputError(fmt::format("GPT batch of {}x{} needs {} tokens and targets", B, T, N));
  plan_activations(B, T);
  std::copy(batch.tokens.begin(), batch.tokens.begin() + N, tokens_.begin());
  std::copy(batch.targets.begin(), batch.targets.begin() + N, targets_.begin());
  for (int64_t i = 0; i < N; ++i)
    if (tokens_[i] < 0 || tokens_[i] >= V || targets_[i] < 0 || targets_[i] >= V)
      throw InputError(fmt::format("GPT token {} is outside the vocabulary 0..{}", tokens_[i], V - 1));

  begin(Pass::Forward);
  open(embed_unit_);
  embedding_forward(encoded_, tokens_.data(), param(wte_), N, C);
  position_embedding_forward(encoded_, param(wpe_), B, T, C);
  close(embed_unit_);
  const float* x = encoded_;  // the residual stream entering each block
  for (size_t l = 0; l < blocks_.size(); ++l) {
    open(static_cast<int>(l) + 1);
    block_forward(l, x, B, T);
    close(static_cast<int>(l) + 1);
    x = acts_of_[l].res3;
  }
  open(lnf_unit_);
  layernorm_forward(lnf_, lnf_mean_, lnf_rstd_, x, param(lnf_w_), param(lnf_b_), N, C);
  close(lnf_unit_);
  // Output projection tied to the token embedding: logits = lnf @ wte^T.
  // The embedding's unit is opened a second time for it.
  open(embed_unit_);
  linear_forward(logits_, lnf_, param(wte_), nullptr, N, C, Vp);
  close(embed_unit_);
  pack_logits(N);
  ForwardStats st;
  st.count = N;
  st.loss = cross_entropy_forward(logits_, logits_, targets_.data(), N, V, &st.correct);
  return st;
}

void Gpt::backward(float loss_scale) {
  const int64_t B = batch_, T = seq_, C = config_.width, V = config_.vocab, NH = config_.heads;
  const int64_t Vp = config_.rows();
  const int64_t N = B * T;
  cross_entropy_backward(logits_, logits_, targets_.data(), N, V, loss_scale / static_cast<float>(N));
  unpack_logit_grads(N);
  begin(Pass::Backward);
  // The tied weight gets the output projection's gradient here and the
  // embedding's at the very end, so its unit is ready last: both
  // contributions are summed in the unit's gradients before any reduction.
  open(embed_unit_);
  linear_backward(dC_, grad(wte_), nullptr, logits_, lnf_, param(wte_), N, C, Vp);
  close(embed_unit_);
  open(lnf_unit_);
  // dres_ is the gradient of the residual stream; every LayerNorm backward
  // adds its input gradient into it, which is how the skip connections'
  // identity backward is carried (see nn/residual.h).
  std::memset(dres_, 0, sizeof(float) * static_cast<size_t>(N * C));
  const float* last = blocks_.empty() ? encoded_ : acts_of_.back().res3;
  layernorm_backward(dres_, grad(lnf_w_), grad(lnf_b_), dC_, last, param(lnf_w_), lnf_mean_,
                     lnf_rstd_, N, C);
  slots_ready(lnf_w_, lnf_b_);
  close(lnf_unit_);
  for (size_t l = blocks_.size(); l-- > 0;) {
    const BlockSlots& s = blocks_[l];
    const BlockActs& a = acts_of_[l];
    open(static_cast<int>(l) + 1);
    const float* x = l > 0 ? acts_of_[l - 1].res3 : encoded_;
    // Checkpointing: refill the scratch block from the block's saved input,
    // inside the same open as its backward, so a sharded strategy gathers
    // the unit once for both (as FSDP's recompute uses the parameters its
    // backward gathers). It rewrites res3 with the very same values.
    if (checkpoint_) block_forward(l, x, B, T);
    // Each layer's parameters are reported final as soon as its backward is
    // done: backward visits them in exactly the reverse of the layout's order
    // (ln_1, c_attn, attn.c_proj, ln_2, c_fc, mlp.c_proj).
    // MLP branch: its output gradient is the residual stream's gradient.
    linear_backward(d4C_, grad(s.fcproj_w), grad(s.fcproj_b), dres_, a.fch_gelu, param(s.fcproj_w),
                    N, 4 * C, C);
    slots_ready(s.fcproj_w, s.fcproj_b);
    gelu_backward(d4C_, d4C_, a.fch, N * 4 * C);
    linear_backward(dC_, grad(s.fc_w), grad(s.fc_b), d4C_, a.ln2, param(s.fc_w), N, C, 4 * C);
    slots_ready(s.fc_w, s.fc_b);
    layernorm_backward(dres_, grad(s.ln2_w), grad(s.ln2_b), dC_, a.res2, param(s.ln2_w), a.ln2_mean,
                       a.ln2_rstd, N, C);
    slots_ready(s.ln2_w, s.ln2_b);
    // Attention branch.
    linear_backward(dC_, grad(s.proj_w), grad(s.proj_b), dres_, a.atty, param(s.proj_w), N, C, C);
    slots_ready(s.proj_w, s.proj_b);
    attention_backward(d3C_, dC_, a.qkv, a.att, B, T, C, NH);
    linear_backward(dC_, grad(s.qkv_w), grad(s.qkv_b), d3C_, a.ln1, param(s.qkv_w), N, C, 3 * C);
    slots_ready(s.qkv_w, s.qkv_b);
    layernorm_backward(dres_, grad(s.ln1_w), grad(s.ln1_b), dC_, x, param(s.ln1_w), a.ln1_mean,
                       a.ln1_rstd, N, C);
    slots_ready(s.ln1_w, s.ln1_b);
    close(static_cast<int>(l) + 1);
  }
  open(embed_unit_);
  position_embedding_backward(grad(wpe_), dres_, B, T, C);
  embedding_backward(grad(wte_), dres_, tokens_.data(), N, C);
  slots_ready(wte_, wpe_);
  close(embed_unit_);
}

void Gpt::pack_logits(int64_t N) {
  const int64_t V = config_.vocab, Vp = config_.rows();
  if (Vp == V) return;
  // Rows move down (row n from n*Vp to n*V), so in increasing n no row is
  // overwritten before it has moved.
  for (int64_t n = 1; n < N; ++n) std::memmove(logits_ + n * V, logits_ + n * Vp, sizeof(float) * V);
}

void Gpt::unpack_logit_grads(int64_t N) {
  const int64_t V = config_.vocab, Vp = config_.rows();
  if (Vp == V) return;
  // The reverse of pack_logits, last row first; the pad logits took no part
  // in the loss, so their gradients are zero.
  for (int64_t n = N; n-- > 0;) {
    std::memmove(logits_ + n * Vp, logits_ + n * V, sizeof(float) * V);
    std::fill(logits_ + n * Vp + V, logits_ + (n + 1) * Vp, 0.0f);
  }
}

double Gpt::train_flops(int64_t B) const {
  // PaLM's estimate: 6 FLOPs per parameter per token for the GEMMs (the
  // tied output projection counts as V*C; position embeddings are lookups)
  // plus 12 * layers * T * C per token for attention's two products.
  const double C = static_cast<double>(config_.width), T = static_cast<double>(config_.context);
  const double L = static_cast<double>(config_.layers), V = static_cast<double>(config_.vocab);
  const double gemm_params = L * 12.0 * C * C + V * C;
  const double tokens = static_cast<double>(B) * T;
  return tokens * (6.0 * gemm_params + 12.0 * L * T * C);
}

double Gpt::recompute_flops(int64_t B) const {
  // Every block's forward once more (a third of its forward + backward:
  // 2 of the 6 FLOPs per parameter per token, 4 of attention's 12); the
  // head is not recomputed.
  if (!checkpoint_) return 0.0;
  const double C = static_cast<double>(config_.width), T = static_cast<double>(config_.context);
  const double L = static_cast<double>(config_.layers);
  return static_cast<double>(B) * T * (2.0 * L * 12.0 * C * C + 4.0 * L * T * C);
}

std::vector<int> Gpt::unit_order() const {
  // forward(): the token embedding, the blocks, ln_f, the tied projection.
  std::vector<int> order{embed_unit_};
  for (size_t l = 0; l < blocks_.size(); ++l) order.push_back(static_cast<int>(l) + 1);
  order.push_back(lnf_unit_);
  order.push_back(embed_unit_);
  return order;
}

}  // namespace dpt
