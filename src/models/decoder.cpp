#include "models/decoder.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "core/error.h"
#include "core/rng.h"
#include "nn/activations.h"
#include "nn/attention.h"
#include "nn/cross_entropy.h"
#include "nn/embedding.h"
#include "nn/layernorm.h"
#include "nn/linear.h"
#include "nn/residual.h"
#include "nn/vocab_parallel.h"

namespace dpt {

DecoderConfig DecoderConfig::from(const std::map<std::string, std::string>& hparams) {
  DecoderConfig c;
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

namespace {

struct Slots {
  int wte = -1, wpe = -1, lnf_w = -1, lnf_b = -1;
};

}  // namespace

Decoder::Decoder(DecoderConfig config, DecoderStage stage, DecoderTp tp) : config_(config), stage_(stage), tp_(tp) {
  if (config_.rows() < config_.vocab)
    throw InputError(fmt::format("GPT padded vocabulary {} is smaller than the vocabulary {}", config_.rows(),
                                 config_.vocab));
  if (stage_.last < 0) stage_.last = config_.layers;
  if (stage_.first < 0 || stage_.first > stage_.last || stage_.last > config_.layers)
    throw InputError(fmt::format("GPT stage of blocks [{}, {}) is outside the model's {} blocks", stage_.first,
                                 stage_.last, config_.layers));
  if (tp_.size < 1 || tp_.rank < 0 || tp_.rank >= tp_.size)
    throw InputError(fmt::format("GPT tensor-parallel rank {} of {} does not exist", tp_.rank, tp_.size));
  // C = heads x head size, so heads divisible by tp makes C and 4C so too.
  if (config_.heads % tp_.size != 0)
    throw InputError(fmt::format("--tp {} does not divide the GPT's {} attention heads", tp_.size, config_.heads));
  // Initial values are drawn at each element's place in the model as
  // configured (`config`), so padding wte's rows below moves nothing else.
  const int64_t drawn_rows = config_.rows();
  // A vocabulary-parallel wte: rows padded up to a multiple of tp (each
  // rank holds as many), the pad rows zero and out of the loss.
  if (vocab_parallel()) config_.padded_vocab = (config_.rows() + tp_.size - 1) / tp_.size * tp_.size;
  const int64_t C = config_.width, T = config_.context;
  // Matrices (embeddings included) get weight decay; biases and LayerNorm
  // parameters do not, as in GPT-2 / nanoGPT training. The whole model's
  // layout is built too, for the offsets init_range draws from.
  auto build = [&](Layout& layout, const DecoderStage& st, const DecoderTp& tp, int64_t V, std::vector<BlockSlots>* blocks,
                   Slots& sl) {
    const int64_t P = tp.size, r = tp.rank, Ct = C / P, Ft = 4 * C / P;
    // A slot held whole, or (outer > 0) part r of the whole tensor seen as
    // [outer, P, inner].
    auto add = [&](const std::string& name, std::vector<int64_t> shape, bool decay, int64_t outer = 0,
                   int64_t inner = 0, std::vector<int64_t> whole = {}) {
      if (outer == 0 || P == 1) return layout.add(name, std::move(shape), decay);
      return layout.add(name, std::move(shape), decay, TensorSlice{outer, P, r, inner}, std::move(whole));
    };
    if (st.embed) {
      layout.begin_unit("transformer.embed");
      sl.wte = tp.vocab ? add("transformer.wte.weight", {V / P, C}, true, 1, V / P * C, {V, C})
                        : add("transformer.wte.weight", {V, C}, true);
      sl.wpe = add("transformer.wpe.weight", {T, C}, true);
    }
    for (int64_t l = st.first; l < st.last; ++l) {
      std::string p = "transformer.h." + std::to_string(l);
      layout.begin_unit(p);
      BlockSlots b;
      b.ln1_w = add(p + ".ln_1.weight", {C}, false);
      b.ln1_b = add(p + ".ln_1.bias", {C}, false);
      // This rank's heads' rows of each of q, k and v.
      b.qkv_w = add(p + ".attn.c_attn.weight", {3 * Ct, C}, true, 3, Ct * C, {3 * C, C});
      b.qkv_b = add(p + ".attn.c_attn.bias", {3 * Ct}, false, 3, Ct, {3 * C});
      b.proj_w = add(p + ".attn.c_proj.weight", {C, Ct}, true, C, Ct, {C, C});
      b.proj_b = add(p + ".attn.c_proj.bias", {C}, false);
      b.ln2_w = add(p + ".ln_2.weight", {C}, false);
      b.ln2_b = add(p + ".ln_2.bias", {C}, false);
      b.fc_w = add(p + ".mlp.c_fc.weight", {Ft, C}, true, 1, Ft * C, {4 * C, C});
      b.fc_b = add(p + ".mlp.c_fc.bias", {Ft}, false, 1, Ft, {4 * C});
      b.fcproj_w = add(p + ".mlp.c_proj.weight", {C, Ft}, true, C, Ft, {C, 4 * C});
      b.fcproj_b = add(p + ".mlp.c_proj.bias", {C}, false);
      if (blocks) blocks->push_back(b);
    }
    if (st.head) {
      layout.begin_unit("transformer.ln_f");
      sl.lnf_w = add("transformer.ln_f.weight", {C}, false);
      sl.lnf_b = add("transformer.ln_f.bias", {C}, false);
    }
  };
  Slots mine;
  build(layout_, stage_, tp_, config_.rows(), &blocks_, mine);
  wte_ = mine.wte;
  wpe_ = mine.wpe;
  lnf_w_ = mine.lnf_w;
  lnf_b_ = mine.lnf_b;
  embed_unit_ = stage_.embed ? 0 : -1;
  block_unit0_ = stage_.embed ? 1 : 0;
  lnf_unit_ = stage_.head ? block_unit0_ + static_cast<int>(blocks_.size()) : -1;
  Layout whole;
  Slots unused;
  build(whole, DecoderStage{0, config_.layers, true, true}, DecoderTp{}, drawn_rows, nullptr, unused);
  for (const Slot& s : layout_.slots()) whole_offset_.push_back(whole.slot(whole.find(s.name)).offset);
}

void Decoder::set_tied_head(const void* wte, float* tied_grad) {
  DPT_CHECK(stage_.head && !stage_.embed, "a tied head copy is for a last stage without the embedding");
  if (device_ != Device::CPU) throw InputError("a pipeline's tied head is built for the CPU only");
  tied_w_ = wte;
  tied_dtype_ = precision_;
  tied_g_ = tied_grad;
}

void Decoder::use_slot(int slot) {
  DPT_CHECK(slot >= 0, "slot {} is negative", slot);
  if (slot == slot_) return;
  if (static_cast<size_t>(slot) >= arenas_.size()) arenas_.resize(static_cast<size_t>(slot) + 1);
  // Park the current arena in its slot, then take the new one out of its.
  auto swap_with = [&](Arena& a) {
    std::swap(acts_, a.acts);
    std::swap(ids_, a.ids);
    std::swap(act_, a.act);
    std::swap(tokens_, a.tokens);
    std::swap(targets_, a.targets);
    std::swap(batch_, a.batch);
    std::swap(seq_, a.seq);
    std::swap(planned_checkpoint_, a.planned_checkpoint);
    std::swap(planned_precision_, a.planned_precision);
  };
  swap_with(arenas_[static_cast<size_t>(slot_)]);
  swap_with(arenas_[static_cast<size_t>(slot)]);
  slot_ = slot;
}

int Decoder::arenas_held() const {
  int n = acts_.bytes() > 0 ? 1 : 0;
  for (size_t i = 0; i < arenas_.size(); ++i)
    if (static_cast<int>(i) != slot_ && arenas_[i].acts.bytes() > 0) ++n;
  return n;
}

size_t Decoder::arena_bytes_held() const {
  size_t total = acts_.bytes();
  for (size_t i = 0; i < arenas_.size(); ++i)
    if (static_cast<int>(i) != slot_) total += arenas_[i].acts.bytes();
  return total;
}

std::map<std::string, std::string> Decoder::metadata() const {
  std::map<std::string, std::string> m = {{"dpt.model", "gpt"},
          {"vocab_size", std::to_string(config_.vocab)},
          {"n_layer", std::to_string(config_.layers)},
          {"n_head", std::to_string(config_.heads)},
          {"n_embd", std::to_string(config_.width)},
          {"block_size", std::to_string(config_.context)}};
  if (config_.rows() != config_.vocab) m["padded_vocab_size"] = std::to_string(config_.rows());
  return m;
}

void Decoder::init_range(uint64_t seed, size_t begin, size_t n, float* out) const {
  // GPT-2: N(0, 0.02) for matrices and embeddings, the residual projections
  // scaled by 1/sqrt(2 * layers); zero biases; LayerNorm weight 1, bias 0.
  const float std_proj = 0.02f / std::sqrt(2.0f * static_cast<float>(config_.layers));
  const size_t end = begin + n;
  for (size_t k = 0; k < layout_.slots().size(); ++k) {
    const Slot& s = layout_.slots()[k];
    // Drawn at the element's place in the whole model: a stage or a
    // tensor-parallel slice starts from the whole model's values.
    const size_t whole = whole_offset_[k];
    const size_t lo = std::max(begin, s.offset), hi = std::min(end, s.offset + s.numel);
    if (lo >= hi) continue;
    float* p = out + (lo - begin);
    const bool is_ln_weight = s.name.find("ln_") != std::string::npos && s.name.ends_with(".weight");
    if (is_ln_weight) {
      std::fill(p, p + (hi - lo), 1.0f);
    } else if (s.shape.size() == 2) {
      const float sd = s.name.ends_with("c_proj.weight") ? std_proj : 0.02f;
      // wte's pad rows (from row vocab on) start at zero and are never trained.
      const size_t live = s.name == "transformer.wte.weight" ? static_cast<size_t>(config_.vocab * config_.width)
                                                             : s.numel * static_cast<size_t>(s.slice.parts);
      for (size_t i = lo; i < hi; ++i) {
        const size_t e = s.slice.whole_index(i - s.offset);
        p[i - lo] = e < live ? sd * counter_normal(seed, whole + e) : 0.0f;
      }
    } else {
      std::fill(p, p + (hi - lo), 0.0f);
    }
  }
}

namespace {
// An arena pointer as the compute type's buffer.
template <typename CT>
CT* as(void* p) {
  return static_cast<CT*>(p);
}

}  // namespace

int64_t Decoder::lay_out(int64_t B, int64_t T, float* base, Acts& a) const {
  const int64_t C = config_.width, N = B * T;
  // This rank's heads and their channels, and its MLP columns.
  const int64_t Ct = C / tp_.size, NHt = config_.heads / tp_.size, Ft = 4 * C / tp_.size;
  const bool b16 = precision_ == DType::BF16;
  int64_t used = 0;
  auto take = [&](int64_t n) {
    float* r = base ? base + used : nullptr;
    used += n;
    return r;
  };
  // A GEMM operand of n elements: fp32, or bf16 in half as many floats
  // (rounded up to 64 bytes, so the buffers after it stay aligned).
  auto take_operand = [&](int64_t n) -> void* { return take(b16 ? (n + 31) / 32 * 16 : n); };
  a.encoded = take(N * C);
  a.blocks.assign(blocks_.size(), BlockActs{});
  // A block's activations but its output (res3).
  auto lay_out_block = [&](BlockActs& b) {
    b.ln1 = take_operand(N * C);
    b.ln1_mean = take(N);
    b.ln1_rstd = take(N);
    b.qkv = take(N * 3 * Ct);
    b.atty = take_operand(N * Ct);
    b.att = take(B * NHt * T * T);
    b.res2 = take(N * C);
    b.ln2 = take_operand(N * C);
    b.ln2_mean = take(N);
    b.ln2_rstd = take(N);
    b.fch = take(N * Ft);
    b.fch_gelu = take_operand(N * Ft);
  };
  if (checkpoint_) {
    // Each block keeps its output (the next block's input); everything else
    // lives in one scratch block that all blocks share.
    BlockActs scratch{};
    if (!a.blocks.empty()) lay_out_block(scratch);
    for (auto& b : a.blocks) {
      b = scratch;
      b.res3 = take(N * C);
    }
  } else {
    for (auto& b : a.blocks) {
      lay_out_block(b);
      b.res3 = take(N * C);
    }
  }
  // Only the last stage has the head; a stage without it keeps its output
  // in its last block's res3.
  if (stage_.head) {
    a.lnf = take_operand(N * C);
    a.lnf_mean = take(N);
    a.lnf_rstd = take(N);
    a.logits = take(N * wte_rows());
    a.ce = vocab_parallel() ? take(3 * N) : nullptr;
  }
  a.dres = take(N * C);
  a.dC = take(N * C);
  a.d3C = take(N * 3 * Ct);
  a.d4C = take(N * Ft);
  a.atty32 = b16 ? take(N * Ct) : nullptr;
  a.dout16 = b16 ? take_operand(N * std::max({C, Ft, stage_.head ? wte_rows() : 0})) : nullptr;
  return used;
}

size_t Decoder::activation_bytes_for(int64_t B) const {
  Acts counted;
  return static_cast<size_t>(lay_out(B, config_.context, nullptr, counted)) * sizeof(float);
}

void Decoder::plan_activations(int64_t B, int64_t T) {
  if (B == batch_ && T == seq_ && checkpoint_ == planned_checkpoint_ && precision_ == planned_precision_) return;
  Acts counted;
  const int64_t total = lay_out(B, T, nullptr, counted);
  acts_.reserve(static_cast<size_t>(total));
  lay_out(B, T, acts_.f32(), act_);
  const int64_t N = B * T;
  tokens_.resize(static_cast<size_t>(N));
  targets_.resize(static_cast<size_t>(N));
  if (device_ != Device::CPU) ids_.reserve(static_cast<size_t>(2 * N));  // int32 tokens, then targets
  batch_ = B;
  seq_ = T;
  planned_checkpoint_ = checkpoint_;
  planned_precision_ = precision_;
}

template <typename CT>
void Decoder::block_forward(size_t l, const float* x, int64_t B, int64_t T) {
  const int64_t C = config_.width, N = B * T;
  const int64_t Ct = C / tp_.size, NHt = config_.heads / tp_.size, Ft = 4 * C / tp_.size;
  const BlockSlots& s = blocks_[l];
  const BlockActs& a = act_.blocks[l];
  // A row-parallel projection's output is the sum of every TP rank's
  // partial product; its bias is added once, by TP rank 0, inside that sum.
  const bool row_bias = tp_.rank == 0;
  CT *ln1 = as<CT>(a.ln1), *atty = as<CT>(a.atty), *ln2 = as<CT>(a.ln2), *fch_gelu = as<CT>(a.fch_gelu);
  k().layernorm_forward(ln1, a.ln1_mean, a.ln1_rstd, x, param(s.ln1_w), param(s.ln1_b), N, C);
  k().linear_forward(a.qkv, ln1, weight<CT>(s.qkv_w), param(s.qkv_b), N, C, 3 * Ct);
  // Attention computes in fp32 (its softmax needs the range); a bf16 run
  // converts its output for c_proj.
  if constexpr (std::is_same_v<CT, float>) {
    k().attention_forward(atty, a.att, a.qkv, B, T, Ct, NHt);
  } else {
    k().attention_forward(act_.atty32, a.att, a.qkv, B, T, Ct, NHt);
    k().convert(atty, act_.atty32, static_cast<size_t>(N * Ct));
  }
  k().linear_forward(a.res2, atty, weight<CT>(s.proj_w), row_bias ? param(s.proj_b) : nullptr, N, Ct, C);
  tensor_sum(a.res2, static_cast<size_t>(N * C));
  k().residual_forward(a.res2, a.res2, x, N * C);
  k().layernorm_forward(ln2, a.ln2_mean, a.ln2_rstd, a.res2, param(s.ln2_w), param(s.ln2_b), N, C);
  k().linear_forward(a.fch, ln2, weight<CT>(s.fc_w), param(s.fc_b), N, C, Ft);
  k().gelu_forward(fch_gelu, a.fch, N * Ft);
  k().linear_forward(a.res3, fch_gelu, weight<CT>(s.fcproj_w), row_bias ? param(s.fcproj_b) : nullptr, N, Ft, C);
  tensor_sum(a.res3, static_cast<size_t>(N * C));
  k().residual_forward(a.res3, a.res3, a.res2, N * C);
}

ForwardStats Decoder::forward(const Batch& batch) {
  const int64_t B = batch.B, T = batch.T, V = config_.vocab;
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
  if (device_ != Device::CPU) {
    k().upload(ids_.f32(), tokens_.data(), sizeof(int32_t) * static_cast<size_t>(N));
    k().upload(ids_.f32() + N, targets_.data(), sizeof(int32_t) * static_cast<size_t>(N));
  }
  return precision_ == DType::BF16 ? forward_as<bf16>(B, T) : forward_as<float>(B, T);
}

template <typename CT>
ForwardStats Decoder::forward_as(int64_t B, int64_t T) {
  const int64_t C = config_.width, V = config_.vocab, Vp = wte_rows(), N = B * T;
  begin(Pass::Forward);
  // A stage without the embedding finds its input in encoded (stage_input).
  if (stage_.embed) {
    open(embed_unit_);
    if (vocab_parallel()) {
      // Each rank looks up the tokens it holds rows for; the sum has them all.
      vocab_embedding_forward(act_.encoded, tok(), weight<CT>(wte_), wte_first_row(), wte_rows(), N, C);
      tensor_sum(act_.encoded, static_cast<size_t>(N * C));
    } else {
      k().embedding_forward(act_.encoded, tok(), weight<CT>(wte_), N, C);
    }
    k().position_embedding_forward(act_.encoded, weight<CT>(wpe_), B, T, C);
    close(embed_unit_);
  }
  const float* x = act_.encoded;  // the residual stream entering each block
  for (size_t l = 0; l < blocks_.size(); ++l) {
    open(block_unit0_ + static_cast<int>(l));
    block_forward<CT>(l, x, B, T);
    close(block_unit0_ + static_cast<int>(l));
    x = act_.blocks[l].res3;
  }
  if (!stage_.head) return {};
  CT* lnf = as<CT>(act_.lnf);
  open(lnf_unit_);
  k().layernorm_forward(lnf, act_.lnf_mean, act_.lnf_rstd, x, param(lnf_w_), param(lnf_b_), N, C);
  close(lnf_unit_);
  // Output projection tied to the token embedding: logits = lnf @ wte^T.
  // The embedding's unit is opened a second time for it; a last stage
  // without the embedding computes with the pipeline's copy of wte.
  if (stage_.embed) {
    open(embed_unit_);
    k().linear_forward(act_.logits, lnf, weight<CT>(wte_), nullptr, N, C, Vp);
    close(embed_unit_);
  } else {
    k().linear_forward(act_.logits, lnf, tied_weight<CT>(), nullptr, N, C, Vp);
  }
  ForwardStats st;
  st.count = N;
  if (vocab_parallel()) {
    st.loss = vocab_parallel_loss(N, &st.correct);
    return st;
  }
  pack_logits(N);
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
void Decoder::backward_as(float loss_scale) {
  const int64_t B = batch_, T = seq_, C = config_.width;
  const int64_t Ct = C / tp_.size, NHt = config_.heads / tp_.size, Ft = 4 * C / tp_.size;
  const int64_t Vp = wte_rows();
  const int64_t N = B * T;
  const Acts& a = act_;
  begin(Pass::Backward);
  if (stage_.head) head_backward<CT>(loss_scale);
  // Without the head, dres holds the output's gradient (output_grad).
  for (size_t l = blocks_.size(); l-- > 0;) {
    const BlockSlots& s = blocks_[l];
    const BlockActs& b = a.blocks[l];
    open(block_unit0_ + static_cast<int>(l));
    const float* x = l > 0 ? a.blocks[l - 1].res3 : a.encoded;
    // Checkpointing: refill the scratch block from the block's saved input,
    // inside the same open as its backward, so a sharded strategy gathers
    // the unit once for both (as FSDP's recompute uses the parameters its
    // backward gathers). It rewrites res3 with the very same values.
    if (checkpoint_) block_forward<CT>(l, x, B, T);
    // Each layer's parameters are reported final as soon as its backward is
    // done: backward visits them in exactly the reverse of the layout's order
    // (ln_1, c_attn, attn.c_proj, ln_2, c_fc, mlp.c_proj).
    // MLP branch: its output gradient is the residual stream's gradient
    // (the same on every TP rank, so is the replicated bias's gradient).
    k().linear_backward(a.d4C, grad(s.fcproj_w), grad(s.fcproj_b), operand<CT>(k(), a.dres, N * C, a.dout16),
                    as<CT>(b.fch_gelu), weight<CT>(s.fcproj_w), N, Ft, C, a.dres);
    slots_ready(s.fcproj_w, s.fcproj_b);
    // GELU's backward also sums c_fc's bias gradient and, in a bf16 run,
    // writes the GEMMs' bf16 operand: one pass over the N x 4C gradient
    // instead of three (nn/activations.h).
    bf16* d4C16 = std::is_same_v<CT, bf16> ? static_cast<bf16*>(a.dout16) : nullptr;
    k().gelu_backward(a.d4C, d4C16, grad(s.fc_b), a.d4C, b.fch, N, Ft);
    const CT* d4C_op;
    if constexpr (std::is_same_v<CT, bf16>)
      d4C_op = d4C16;
    else
      d4C_op = a.d4C;
    k().linear_backward(a.dC, grad(s.fc_w), nullptr, d4C_op, as<CT>(b.ln2), weight<CT>(s.fc_w), N, C, Ft, nullptr);
    slots_ready(s.fc_w, s.fc_b);
    // Each TP rank's columns give part of ln_2's output gradient.
    tensor_sum(a.dC, static_cast<size_t>(N * C));
    k().layernorm_backward(a.dres, grad(s.ln2_w), grad(s.ln2_b), a.dC, b.res2, param(s.ln2_w), b.ln2_mean,
                       b.ln2_rstd, N, C);
    slots_ready(s.ln2_w, s.ln2_b);
    // Attention branch.
    k().linear_backward(a.dC, grad(s.proj_w), grad(s.proj_b), operand<CT>(k(), a.dres, N * C, a.dout16), as<CT>(b.atty),
                    weight<CT>(s.proj_w), N, Ct, C, a.dres);
    slots_ready(s.proj_w, s.proj_b);
    k().attention_backward(a.d3C, a.dC, b.qkv, b.att, B, T, Ct, NHt);
    k().linear_backward(a.dC, grad(s.qkv_w), grad(s.qkv_b), operand<CT>(k(), a.d3C, N * 3 * Ct, a.dout16), as<CT>(b.ln1),
                    weight<CT>(s.qkv_w), N, C, 3 * Ct, a.d3C);
    slots_ready(s.qkv_w, s.qkv_b);
    tensor_sum(a.dC, static_cast<size_t>(N * C));  // ln_1's output gradient, as ln_2's
    k().layernorm_backward(a.dres, grad(s.ln1_w), grad(s.ln1_b), a.dC, x, param(s.ln1_w), b.ln1_mean, b.ln1_rstd, N,
                       C);
    slots_ready(s.ln1_w, s.ln1_b);
    close(block_unit0_ + static_cast<int>(l));
  }
  // Without the embedding, dres is the input's gradient (input_grad).
  if (!stage_.embed) return;
  open(embed_unit_);
  // The head's part of the tied weight's gradient from the last stage goes
  // in first, as one process has it there before the tokens' part.
  if (tied_in_) k().residual_forward(grad(wte_), grad(wte_), tied_in_, static_cast<size_t>(Vp * C));
  k().position_embedding_backward(grad(wpe_), a.dres, B, T, C);
  // (Vocabulary-parallel: dres is the same on every TP rank, and each adds
  // it into the rows it holds; no communication.)
  if (vocab_parallel())
    vocab_embedding_backward(grad(wte_), a.dres, tok(), wte_first_row(), wte_rows(), N, C);
  else
    k().embedding_backward(grad(wte_), a.dres, tok(), N, C);
  slots_ready(wte_, wpe_);
  close(embed_unit_);
}

template <typename CT>
void Decoder::head_backward(float loss_scale) {
  const int64_t N = batch_ * seq_, C = config_.width, V = config_.vocab, Vp = wte_rows();
  const Acts& a = act_;
  const float scale = loss_scale / static_cast<float>(N);
  if (vocab_parallel()) {
    vocab_ce_backward(a.logits, tgt(), wte_first_row(), N, Vp, vocab_live(), scale);
  } else {
    k().cross_entropy_backward(a.logits, a.logits, tgt(), N, V, scale);
    unpack_logit_grads(N);
  }
  // The tied weight gets the output projection's gradient here and the
  // embedding's at the very end, so its unit is ready last: both
  // contributions are summed in the unit's gradients before any reduction.
  // In a bf16 run each output gradient is converted once for its GEMMs
  // (operand); the bias gradients are summed from the fp32 gradient.
  if (stage_.embed) {
    open(embed_unit_);
    k().linear_backward(a.dC, grad(wte_), nullptr, operand<CT>(k(), a.logits, N * Vp, a.dout16), as<CT>(a.lnf),
                        weight<CT>(wte_), N, C, Vp, nullptr);
    close(embed_unit_);
  } else {
    k().linear_backward(a.dC, tied_g_, nullptr, operand<CT>(k(), a.logits, N * Vp, a.dout16), as<CT>(a.lnf),
                        tied_weight<CT>(), N, C, Vp, nullptr);
  }
  // Vocabulary-parallel: each rank's columns give part of ln_f's output
  // gradient.
  if (vocab_parallel()) tensor_sum(a.dC, static_cast<size_t>(N * C));
  open(lnf_unit_);
  // dres is the gradient of the residual stream; every LayerNorm backward
  // adds its input gradient into it, which is how the skip connections'
  // identity backward is carried (see nn/residual.h).
  k().zero(a.dres, sizeof(float) * static_cast<size_t>(N * C));
  const float* last = blocks_.empty() ? a.encoded : a.blocks.back().res3;
  k().layernorm_backward(a.dres, grad(lnf_w_), grad(lnf_b_), a.dC, last, param(lnf_w_), a.lnf_mean, a.lnf_rstd, N, C);
  slots_ready(lnf_w_, lnf_b_);
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

double Decoder::train_flops(int64_t B) const {
  // PaLM's estimate: 6 FLOPs per parameter per token for the GEMMs (the
  // tied output projection counts as V*C; position embeddings are lookups)
  // plus 12 * layers * T * C per token for attention's two products.
  const double C = static_cast<double>(config_.width), T = static_cast<double>(config_.context);
  // A pipeline stage counts its own blocks, and the head if it has it.
  // A TP rank computes 1/tp of each block.
  const double L = static_cast<double>(blocks_.size()) / tp_.size;
  // The head is 1/tp of it too with a vocabulary-parallel wte.
  const double V = stage_.head ? static_cast<double>(config_.vocab) / (vocab_parallel() ? tp_.size : 1) : 0.0;
  const double gemm_params = L * 12.0 * C * C + V * C;
  const double tokens = static_cast<double>(B) * T;
  return tokens * (6.0 * gemm_params + 12.0 * L * T * C);
}

double Decoder::recompute_flops(int64_t B) const {
  // Every block's forward once more (a third of its forward + backward:
  // 2 of the 6 FLOPs per parameter per token, 4 of attention's 12); the
  // head is not recomputed.
  if (!checkpoint_) return 0.0;
  const double C = static_cast<double>(config_.width), T = static_cast<double>(config_.context);
  const double L = static_cast<double>(blocks_.size()) / tp_.size;
  return static_cast<double>(B) * T * (2.0 * L * 12.0 * C * C + 4.0 * L * T * C);
}

void Decoder::tensor_sum(float* x, size_t n, TpReduce op) const {
  if (tp_.size == 1) return;
  DPT_CHECK(tp_reduce_ != nullptr, "a tensor-parallel GPT computes without its TP group's sum");
  tp_reduce_(x, n, op);
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

double Decoder::grad_squares(const float* g, size_t begin, size_t n) const {
  if (tp_.size == 1) return Model::grad_squares(g, begin, n);
  double sum = 0.0;
  for (size_t i = 0; i < layout_.slots().size(); ++i) {
    const Slot& s = layout_.slots()[i];
    const size_t lo = std::max(begin, s.offset), hi = std::min(begin + n, s.offset + s.numel);
    if (lo >= hi) continue;
    const double share = s.slice.parts > 1 ? 1.0 : 1.0 / tp_.size;
    sum += share * k().sum_of_squares(g + (lo - begin), hi - lo);
  }
  return sum;
}

std::vector<int> Decoder::unit_order() const {
  // forward(): the token embedding, the blocks, ln_f, the tied projection.
  // A stage opens only its own units (a last stage's head copy is no unit).
  std::vector<int> order;
  if (stage_.embed) order.push_back(embed_unit_);
  for (size_t l = 0; l < blocks_.size(); ++l) order.push_back(block_unit0_ + static_cast<int>(l));
  if (stage_.head) order.push_back(lnf_unit_);
  if (stage_.head && stage_.embed) order.push_back(embed_unit_);
  return order;
}

}  // namespace dpt
