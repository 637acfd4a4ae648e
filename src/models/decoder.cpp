#include "models/decoder.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "core/error.h"
#include "core/rng.h"

namespace dpt {

namespace {

// Where a decoder's parameters are split across tensor-parallel ranks (the
// decoder's tensor-parallel plan; docs/tensor_parallel.md).
enum class Split {
  Whole,   // every rank holds all of it
  Column,  // rows split: each of `groups` stacked parts [R, ...] keeps rows [r, r+1) x R/P
  Row,     // columns split: [R, K] keeps columns [r, r+1) x K/P
};

// Adds one model's slots to a layout: the whole model's (for init_range's
// offsets) or one pipeline stage's slice of one TP rank's share.
struct Builder {
  Layout& layout;
  const DecoderConfig& c;
  const DecoderStage& st;
  const DecoderTp& tp;
  int64_t rows;  // embedding rows

  int add(const std::string& name, std::vector<int64_t> whole, bool decay, Split split = Split::Whole,
          int64_t groups = 1) const {
    const int64_t P = tp.size, r = tp.rank;
    if (split == Split::Whole || P == 1) return layout.add(name, std::move(whole), decay);
    std::vector<int64_t> shape = whole;
    int64_t inner_elems = 1;
    for (size_t i = 1; i < whole.size(); ++i) inner_elems *= whole[i];
    TensorSlice slice;
    if (split == Split::Column) {
      shape[0] = whole[0] / P;
      slice = TensorSlice{groups, P, r, whole[0] / groups / P * inner_elems};
    } else {
      shape[1] = whole[1] / P;
      slice = TensorSlice{whole[0], P, r, whole[1] / P};
    }
    return layout.add(name, std::move(shape), decay, slice, std::move(whole));
  }
  // The embedding, or an untied head: vocabulary rows, split under a
  // vocabulary-parallel TP.
  int add_vocab(const std::string& name) const {
    return add(name, {rows, c.width}, true, tp.vocab ? Split::Column : Split::Whole);
  }
  Decoder::BlockSlots gpt_block(int64_t l) const;
  Decoder::BlockSlots llama_block(int64_t l) const;
};

Decoder::BlockSlots Builder::gpt_block(int64_t l) const {
  const int64_t C = c.width, F = c.ffn();
  const std::string p = "transformer.h." + std::to_string(l);
  layout.begin_unit(p);
  Decoder::BlockSlots b;
  b.ln1_w = add(p + ".ln_1.weight", {C}, false);
  b.ln1_b = add(p + ".ln_1.bias", {C}, false);
  // q, k and v of every head stacked: each a third, split by heads.
  b.qkv_w = add(p + ".attn.c_attn.weight", {3 * C, C}, true, Split::Column, 3);
  b.qkv_b = b.qkv_end = add(p + ".attn.c_attn.bias", {3 * C}, false, Split::Column, 3);
  b.proj_w = add(p + ".attn.c_proj.weight", {C, C}, true, Split::Row);
  b.proj_b = add(p + ".attn.c_proj.bias", {C}, false);
  b.ln2_w = add(p + ".ln_2.weight", {C}, false);
  b.ln2_b = add(p + ".ln_2.bias", {C}, false);
  b.fc_w = add(p + ".mlp.c_fc.weight", {F, C}, true, Split::Column);
  b.fc_b = b.fc_end = add(p + ".mlp.c_fc.bias", {F}, false, Split::Column);
  b.fcproj_w = add(p + ".mlp.c_proj.weight", {C, F}, true, Split::Row);
  b.fcproj_b = add(p + ".mlp.c_proj.bias", {C}, false);
  return b;
}

Decoder::BlockSlots Builder::llama_block(int64_t l) const {
  const int64_t C = c.width, F = c.ffn(), Q = c.heads * c.head_dim(), KV = c.kv() * c.head_dim();
  const std::string p = "model.layers." + std::to_string(l);
  layout.begin_unit(p);
  Decoder::BlockSlots b;
  b.ln1_w = add(p + ".input_layernorm.weight", {C}, false);
  // q, k, v consecutive: one fused [(H + 2 KV) hd, C] matrix (and bias).
  b.qkv_w = add(p + ".self_attn.q_proj.weight", {Q, C}, true, Split::Column);
  add(p + ".self_attn.k_proj.weight", {KV, C}, true, Split::Column);
  b.qkv_end = add(p + ".self_attn.v_proj.weight", {KV, C}, true, Split::Column);
  if (c.qkv_bias) {
    b.qkv_b = add(p + ".self_attn.q_proj.bias", {Q}, false, Split::Column);
    add(p + ".self_attn.k_proj.bias", {KV}, false, Split::Column);
    b.qkv_end = add(p + ".self_attn.v_proj.bias", {KV}, false, Split::Column);
  }
  b.proj_w = add(p + ".self_attn.o_proj.weight", {C, Q}, true, Split::Row);
  if (c.o_bias) b.proj_b = add(p + ".self_attn.o_proj.bias", {C}, false);
  b.ln2_w = add(p + ".post_attention_layernorm.weight", {C}, false);
  // gate then up: one fused [2 I, C] matrix.
  b.fc_w = add(p + ".mlp.gate_proj.weight", {F, C}, true, Split::Column);
  b.fc_end = add(p + ".mlp.up_proj.weight", {F, C}, true, Split::Column);
  b.fcproj_w = add(p + ".mlp.down_proj.weight", {C, F}, true, Split::Row);
  return b;
}

struct EdgeSlots {
  int wte = -1, wpe = -1, lnf_w = -1, lnf_b = -1, head = -1;
};

// The whole layout of one stage of one TP rank, in forward's order.
EdgeSlots build(const Builder& b, std::vector<Decoder::BlockSlots>* blocks) {
  const bool gpt = b.c.family == "gpt";
  const int64_t C = b.c.width;
  EdgeSlots e;
  if (b.st.embed) {
    b.layout.begin_unit(gpt ? "transformer.embed" : "model.embed_tokens");
    e.wte = b.add_vocab(gpt ? "transformer.wte.weight" : "model.embed_tokens.weight");
    if (!b.c.rotary) e.wpe = b.add("transformer.wpe.weight", {b.c.context, C}, true);
  }
  for (const BlockRange& r : b.st.chunks)
    for (int64_t l = r.first; l < (r.last < 0 ? b.c.layers : r.last); ++l) {
      const Decoder::BlockSlots s = gpt ? b.gpt_block(l) : b.llama_block(l);
      if (blocks) blocks->push_back(s);
    }
  if (b.st.head) {
    b.layout.begin_unit(gpt ? "transformer.ln_f" : "model.norm");
    e.lnf_w = b.add(gpt ? "transformer.ln_f.weight" : "model.norm.weight", {C}, false);
    if (b.c.norm == NormKind::LayerNorm) e.lnf_b = b.add("transformer.ln_f.bias", {C}, false);
    if (!b.c.tied) e.head = b.add_vocab("lm_head.weight");
  }
  return e;
}

void check_split(const DecoderConfig& c, const DecoderTp& tp) {
  if (tp.size < 1 || tp.rank < 0 || tp.rank >= tp.size)
    throw InputError(fmt::format("tensor-parallel rank {} of {} does not exist", tp.rank, tp.size));
  // Whole heads per rank make every split width divide too (C = heads x
  // head size under GPT-2).
  if (c.heads % tp.size != 0)
    throw InputError(fmt::format("--tp {} does not divide the model's {} attention heads", tp.size, c.heads));
  if (c.kv() % tp.size != 0)
    throw InputError(fmt::format("--tp {} does not divide the model's {} key/value heads", tp.size, c.kv()));
  if (c.ffn() % tp.size != 0)
    throw InputError(fmt::format("--tp {} does not divide the model's MLP width {}", tp.size, c.ffn()));
}

}  // namespace

Decoder::Decoder(DecoderConfig config, DecoderStage stage, DecoderTp tp) : config_(config), stage_(stage), tp_(tp) {
  if (config_.rows() < config_.vocab)
    throw InputError(fmt::format("padded vocabulary {} is smaller than the vocabulary {}", config_.rows(),
                                 config_.vocab));
  if (stage_.chunks.empty()) throw InputError("a pipeline stage holds one chunk of blocks at least");
  int64_t after = 0;  // chunks in increasing block order, not overlapping
  for (BlockRange& r : stage_.chunks) {
    if (r.last < 0) r.last = config_.layers;
    if (r.first < after || r.first > r.last || r.last > config_.layers)
      throw InputError(fmt::format("stage of blocks [{}, {}) is outside the model's {} blocks or overlaps another "
                                   "chunk",
                                   r.first, r.last, config_.layers));
    if (stage_.chunks.size() > 1 && r.first == r.last)
      throw InputError(fmt::format("chunk of blocks [{}, {}) holds no block (each chunk needs one at least)", r.first,
                                   r.last));
    after = r.last;
  }
  check_split(config_, tp_);
  // Initial values are drawn at each element's place in the model as
  // configured (`config`), so padding the embedding's rows below moves
  // nothing else.
  const int64_t drawn_rows = config_.rows();
  // A vocabulary-parallel embedding: rows padded up to a multiple of tp
  // (each rank holds as many), the pad rows zero and out of the loss.
  if (vocab_parallel()) config_.padded_vocab = (config_.rows() + tp_.size - 1) / tp_.size * tp_.size;
  const EdgeSlots mine = build(Builder{layout_, config_, stage_, tp_, config_.rows()}, &blocks_);
  wte_ = mine.wte;
  wpe_ = mine.wpe;
  lnf_w_ = mine.lnf_w;
  lnf_b_ = mine.lnf_b;
  head_ = mine.head;
  embed_unit_ = stage_.embed ? 0 : -1;
  block_unit0_ = stage_.embed ? 1 : 0;
  lnf_unit_ = stage_.head ? block_unit0_ + static_cast<int>(blocks_.size()) : -1;
  chunk_first_ = {0};
  for (const BlockRange& r : stage_.chunks) chunk_first_.push_back(chunk_first_.back() + static_cast<size_t>(r.last - r.first));
  Layout whole;
  const DecoderStage all;
  const DecoderTp one;
  build(Builder{whole, config_, all, one, drawn_rows}, nullptr);
  for (const Slot& s : layout_.slots()) whole_offset_.push_back(whole.slot(whole.find(s.name)).offset);
  const int64_t P = tp_.size, hd = config_.head_dim();
  w_ = Widths{config_.heads / P, config_.kv() / P, hd, 0, 0, config_.ffn() / P, 0};
  w_.qkv = (w_.heads + 2 * w_.kv) * hd;
  w_.att = w_.heads * hd;
  w_.fc = config_.mlp == MlpKind::SwiGlu ? 2 * w_.inner : w_.inner;
  if (config_.rotary) {
    inv_freq_.resize(static_cast<size_t>(hd / 2));
    rope_inv_freq(inv_freq_.data(), hd, config_.rope_theta,
                  config_.rope_scaling ? &*config_.rope_scaling : nullptr);
  }
}

void Decoder::set_tied_head(const void* wte, float* tied_grad) {
  DPT_CHECK(stage_.head && (!stage_.embed || chunks() > 1),
            "a tied head copy is for a head whose chunk has no embedding");
  if (device_ != Device::CPU) throw InputError("a pipeline's tied head is built for the CPU only");
  tied_w_ = wte;
  tied_dtype_ = precision_;
  tied_g_ = tied_grad;
}

void Decoder::use_slot(int slot, int chunk) {
  DPT_CHECK(slot >= 0 && chunk >= 0 && chunk < chunks(), "slot {} of chunk {} is outside the stage's {} chunks", slot,
            chunk, chunks());
  chunk_ = chunk;
  const int index = slot * chunks() + chunk;
  if (index == slot_) return;
  if (static_cast<size_t>(index) >= arenas_.size()) arenas_.resize(static_cast<size_t>(index) + 1);
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
    std::swap(planned_fused_, a.planned_fused);
    std::swap(planned_split_, a.planned_split);
  };
  swap_with(arenas_[static_cast<size_t>(slot_)]);
  swap_with(arenas_[static_cast<size_t>(index)]);
  slot_ = index;
}

const float* Decoder::stage_output_of(int slot, int chunk) const {
  const int index = slot * chunks() + chunk;
  const Acts& a = index == slot_ ? act_ : arenas_.at(static_cast<size_t>(index)).act;
  DPT_CHECK(!a.blocks.empty(), "slot {} of chunk {} holds no activations", slot, chunk);
  return a.blocks.back().res3;
}

float* Decoder::output_grad_of(int slot, int chunk) {
  const int index = slot * chunks() + chunk;
  float* g = index == slot_ ? act_.dres : arenas_.at(static_cast<size_t>(index)).act.dres;
  DPT_CHECK(g != nullptr, "slot {} of chunk {} holds no activations", slot, chunk);
  return g;
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

std::map<std::string, std::string> Decoder::metadata() const { return config_.metadata(); }

bool Decoder::vocab_matrix(const std::string& name) {
  return name == "transformer.wte.weight" || name == "model.embed_tokens.weight" || name == "lm_head.weight";
}

void Decoder::init_range(uint64_t seed, size_t begin, size_t n, float* out) const {
  // GPT-2: N(0, 0.02) for matrices and embeddings, the residual projections
  // scaled by 1/sqrt(2 * layers); zero biases; norm weights 1, biases 0.
  // The Llama family: N(0, 0.02) for every matrix (transformers'
  // initializer_range), zero biases, norm weights 1.
  const float std_proj = config_.family == "gpt" ? 0.02f / std::sqrt(2.0f * static_cast<float>(config_.layers))
                                                 : 0.02f;
  const size_t end = begin + n;
  for (size_t k = 0; k < layout_.slots().size(); ++k) {
    const Slot& s = layout_.slots()[k];
    // Drawn at the element's place in the whole model: a stage or a
    // tensor-parallel slice starts from the whole model's values.
    const size_t whole = whole_offset_[k];
    const size_t lo = std::max(begin, s.offset), hi = std::min(end, s.offset + s.numel);
    if (lo >= hi) continue;
    float* p = out + (lo - begin);
    const bool norm_weight = s.name.ends_with(".weight") && s.shape.size() == 1;
    if (norm_weight) {
      std::fill(p, p + (hi - lo), 1.0f);
    } else if (s.shape.size() == 2) {
      const float sd = s.name.ends_with("c_proj.weight") ? std_proj : 0.02f;
      // The vocabulary's pad rows (from row vocab on) start at zero and are
      // never trained.
      const size_t live = vocab_matrix(s.name) ? static_cast<size_t>(config_.vocab * config_.width)
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


// Buffers handed out of an arena in order (or only counted, without a base).
struct Decoder::Cursor {
  float* base;
  int64_t N, stat_rows;
  bool b16, layer_norm;
  int64_t used = 0;
  float* take(int64_t n) {
    float* r = base ? base + used : nullptr;
    used += n;
    return r;
  }
  // A GEMM operand of n elements: fp32, or bf16 in half as many floats
  // (rounded up to 64 bytes, so the buffers after it stay aligned).
  void* take_operand(int64_t n) { return take(b16 ? (n + 31) / 32 * 16 : n); }
  // A norm's saved statistics: LayerNorm's mean and rstd, RMSNorm's rstd,
  // for stat_rows rows.
  void take_stats(float*& mean, float*& rstd) {
    mean = layer_norm ? take(stat_rows) : nullptr;
    rstd = take(stat_rows);
  }
};

void Decoder::lay_out_keep(BlockActs& b, Cursor& c, int64_t att_floats) const {
  const int64_t C = config_.width, N = c.N;
  const Widths& w = w_;
  if (checkpoint_) {
    // The block's forward buffers but res3 are the scratch block's, which
    // the next block's recomputation refills: W's operands are the block's
    // own (its forward writes them, B's recomputation rewrites the same
    // values), and so are three of its output gradients.
    b.ln1 = b.w_ln1 = c.take_operand(N * C);
    b.atty = b.w_atty = c.take_operand(N * w.att);
    b.ln2 = b.w_ln2 = c.take_operand(N * C);
    b.fch_gelu = b.w_fch_gelu = c.take_operand(N * w.inner);
    b.w_d4C = c.take(N * w.fc);
    b.w_dy1 = c.take(N * C);
    b.w_d3C = c.take(N * w.qkv);
  } else {
    // After B, W reads neither q/k/v, nor the MLP's pre-activation, nor the
    // residual stream after the attention (the second norm's input: B did
    // the norms): their buffers take the gradients of exactly their shapes
    // (q/k/v's gradient is written while the attention's backward still
    // reads qkv: lay_out gives block l the next block's qkv, dead by then,
    // and the last block the arena's scratch d3C.)
    b.w_ln1 = b.ln1, b.w_atty = b.atty, b.w_ln2 = b.ln2, b.w_fch_gelu = b.fch_gelu;
    b.w_d4C = b.fch;
    b.w_dy1 = b.res2;
  }
  // The block's output is dead once B reaches the block (the next block's
  // B, and the head's, read it before): it takes the gradient arriving there.
  b.w_dy2 = b.res3;
  // The norms' parameter gradients, C floats per weight (and bias): each
  // over a dead buffer with room for it (the norms' statistics, stat_rows
  // floats each; the attention's saved softmax state, att_floats), in that
  // order, else the block's own. (With checkpointing those are the scratch
  // block's.)
  const int vectors = c.layer_norm ? 4 : 2;
  struct Region {
    float* p;
    int64_t floats;
  };
  const int64_t means = c.layer_norm ? c.stat_rows : 0;  // (RMSNorm keeps none)
  const Region dead[] = {{b.ln1_mean, means}, {b.ln1_rstd, c.stat_rows}, {b.ln2_mean, means},
                         {b.ln2_rstd, c.stat_rows}, {b.att, att_floats}};
  int placed = 0;
  if (!checkpoint_)
    for (const Region& r : dead)
      for (int64_t at = 0; at + C <= r.floats && placed < vectors; at += C)
        b.w_norm[placed++] = r.p ? r.p + at : nullptr;  // (null: only counting)
  while (placed < vectors) b.w_norm[placed++] = c.take(C);
}

int64_t Decoder::lay_out(int64_t B, int64_t T, float* base, Acts& a, int chunk) const {
  const int64_t C = config_.width, N = B * T;
  const Widths& w = w_;  // this rank's widths
  const bool b16 = precision_ == DType::BF16;
  // Sequence parallelism: the residual stream (res2, res3) and the norms'
  // statistics hold this rank's R = N / tp rows; the norms' outputs stay
  // [N, C] (gathered for the GEMMs), as does the embedding's output.
  const int64_t R = sequence_parallel(N) ? N / tp_.size : N;
  Cursor cur{base, N, R, b16, config_.norm == NormKind::LayerNorm};
  // The attention's saved softmax state per block (below).
  const int64_t att_floats = B * w.heads * (fused_attention_ ? T : T * T) + (fused_attention_ && b16 ? N * w.att : 0);
  auto take = [&](int64_t n) { return cur.take(n); };
  auto take_operand = [&](int64_t n) { return cur.take_operand(n); };
  auto take_stats = [&](float*& mean, float*& rstd) { cur.take_stats(mean, rstd); };
  const bool head = stage_.head && chunk + 1 == chunks();
  a.encoded = take(N * C);
  a.blocks.assign(chunk_blocks(chunk), BlockActs{});
  // A block's activations but its output (res3).
  // A block's activations but its output (res3); without `operands`, but
  // the linears' inputs too (ln1, atty, ln2, fch_gelu).
  auto lay_out_block = [&](BlockActs& b, bool operands) {
    b.ln1 = operands ? take_operand(N * C) : nullptr;
    take_stats(b.ln1_mean, b.ln1_rstd);
    b.qkv = take(N * w.qkv);
    b.atty = operands ? take_operand(N * w.att) : nullptr;
    // Fused: the log-sum-exps; in bf16 also the fp32 output, which the
    // backward's D = rowsum(dO O) reads: from the bf16 copy each row of dS
    // would sum to rounding (2^-9) instead of zero, and the key biases'
    // gradient (exactly zero) would become the noise docs/precision.md warns of.
    b.att = take(att_floats);
    b.res2 = take(R * C);
    b.ln2 = operands ? take_operand(N * C) : nullptr;
    take_stats(b.ln2_mean, b.ln2_rstd);
    b.fch = take(N * w.fc);
    b.fch_gelu = operands ? take_operand(N * w.inner) : nullptr;
  };
  if (checkpoint_) {
    // Each block keeps its output (the next block's input); everything else
    // lives in one scratch block that all blocks share (but, under a split
    // backward, the linears' inputs, which W reads: lay_out_keep).
    BlockActs scratch{};
    if (!a.blocks.empty()) lay_out_block(scratch, !split_backward_);
    for (auto& b : a.blocks) {
      b = scratch;
      b.res3 = take(R * C);
    }
  } else {
    for (auto& b : a.blocks) {
      lay_out_block(b, true);
      b.res3 = take(R * C);
    }
  }
  // What a split backward keeps for W (mostly over dead forward buffers).
  if (split_backward_)
    for (auto& b : a.blocks) lay_out_keep(b, cur, att_floats);
  // Only the last chunk has the head; a chunk without it keeps its output
  // in its last block's res3.
  if (head) {
    a.lnf = take_operand(N * C);
    take_stats(a.lnf_mean, a.lnf_rstd);
    a.logits = take(N * wte_rows());
    a.ce = vocab_parallel() ? take(3 * N) : nullptr;
  }
  a.dres = take(N * C);
  a.dC = take(N * std::max(C, w.att));
  a.d3C = take(N * w.qkv);
  if (split_backward_ && !checkpoint_)
    for (size_t l = 0; l < a.blocks.size(); ++l) a.blocks[l].w_d3C = l + 1 < a.blocks.size() ? a.blocks[l + 1].qkv : a.d3C;
  // (A split backward's B also computes the norms' parameter gradients
  // there, all of a block's: 4 C floats, at most, which N fc is but at a
  // few rows.)
  a.d4C = take(split_backward_ ? std::max(N * w.fc, 4 * C) : N * w.fc);
  a.atty32 = b16 && !fused_attention_ ? take(N * w.att) : nullptr;  // fused keeps its own (above)
  a.dout16 = b16 ? take_operand(N * std::max({C, w.qkv, w.fc, head ? wte_rows() : 0})) : nullptr;
  a.dI = config_.mlp == MlpKind::SwiGlu ? take(N * w.inner) : nullptr;
  a.rope_cos = config_.rotary ? take(T * w.hd / 2) : nullptr;
  a.rope_sin = config_.rotary ? take(T * w.hd / 2) : nullptr;
  a.ring = cp_size_ > 1 ? take(static_cast<int64_t>(ring_shape(B, T).scratch())) : nullptr;
  return cur.used;
}

size_t Decoder::activation_bytes_for(int64_t B) const {
  // One micro-batch through every chunk: an arena each.
  size_t bytes = 0;
  for (int c = 0; c < chunks(); ++c) bytes += activation_bytes_for(B, c);
  return bytes;
}

size_t Decoder::activation_bytes_for(int64_t B, int chunk) const {
  Acts counted;
  return static_cast<size_t>(lay_out(B, local_rows(config_.context), nullptr, counted, chunk)) * sizeof(float);
}

void Decoder::plan_activations(int64_t B, int64_t T) {
  if (B == batch_ && T == seq_ && checkpoint_ == planned_checkpoint_ && precision_ == planned_precision_ &&
      fused_attention_ == planned_fused_ && split_backward_ == planned_split_)
    return;
  Acts counted;
  const int64_t total = lay_out(B, T, nullptr, counted, chunk_);
  acts_.reserve(static_cast<size_t>(total));
  lay_out(B, T, acts_.f32(), act_, chunk_);
  const int64_t N = B * T;
  tokens_.resize(static_cast<size_t>(N));
  targets_.resize(static_cast<size_t>(N));
  if (device_ != Device::CPU) ids_.reserve(static_cast<size_t>(2 * N));  // int32 tokens, then targets
  if (config_.rotary) fill_rope_tables(T);
  batch_ = B;
  seq_ = T;
  planned_checkpoint_ = checkpoint_;
  planned_precision_ = precision_;
  planned_fused_ = fused_attention_;
  planned_split_ = split_backward_;
}

double Decoder::train_flops(int64_t B) const {
  // PaLM's estimate: 6 FLOPs per parameter per token for the GEMMs (the
  // output projection counts as V*C; position embeddings are lookups) plus
  // 12 * layers * T * (heads x head size) per token for attention's two
  // products (GPT-2: 12 C^2 GEMM parameters per block).
  const double C = static_cast<double>(config_.width), T = static_cast<double>(config_.context);
  const double att = static_cast<double>(config_.heads * config_.head_dim());
  // A pipeline stage counts its own blocks, and the head if it has it.
  // A TP rank computes 1/tp of each block.
  const double L = static_cast<double>(blocks_.size()) / tp_.size;
  // The head is 1/tp of it too with a vocabulary-parallel embedding.
  const double V = stage_.head ? static_cast<double>(config_.vocab) / (vocab_parallel() ? tp_.size : 1) : 0.0;
  const double gemm_params = L * config_.block_gemm_params() + V * C;
  // A CP rank computes 1/cp of the tokens and, its chunks balanced, of
  // attention's causal work.
  const double tokens = static_cast<double>(B) * T / cp_size_;
  return tokens * (6.0 * gemm_params + 12.0 * L * T * att);
}

double Decoder::recompute_flops(int64_t B) const {
  // Every block's forward once more (a third of its forward + backward:
  // 2 of the 6 FLOPs per parameter per token, 4 of attention's 12); the
  // head is not recomputed.
  if (!checkpoint_) return 0.0;
  const double T = static_cast<double>(config_.context);
  const double att = static_cast<double>(config_.heads * config_.head_dim());
  const double L = static_cast<double>(blocks_.size()) / tp_.size;
  return static_cast<double>(B) * T / cp_size_ * (2.0 * L * config_.block_gemm_params() + 4.0 * L * T * att);
}

double Decoder::non_gemm_flops(int64_t B) const {
  // The fused (and ring) attention's products: 12 L T att per token in
  // train_flops, 4 more with checkpointing (as counted there).
  if (!fused_attention_) return 0.0;
  const double T = static_cast<double>(config_.context);
  const double att = static_cast<double>(config_.heads * config_.head_dim());
  const double L = static_cast<double>(blocks_.size()) / tp_.size;
  return static_cast<double>(B) * T / cp_size_ * (checkpoint_ ? 16.0 : 12.0) * L * T * att;
}

void Decoder::tensor_sum(float* x, size_t n, TpReduce op) const {
  if (tp_.size == 1) return;
  DPT_CHECK(tp_reduce_ != nullptr, "a tensor-parallel decoder computes without its TP group's sum");
  tp_reduce_(x, n, op);
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
  // forward(): the token embedding, the blocks, ln_f (with an untied head,
  // which is ln_f's unit), the tied projection (the embedding's unit opened
  // again). A stage opens only its own units (a last stage's head copy is
  // no unit).
  std::vector<int> order;
  if (stage_.embed) order.push_back(embed_unit_);
  for (size_t l = 0; l < blocks_.size(); ++l) order.push_back(block_unit0_ + static_cast<int>(l));
  if (stage_.head) order.push_back(lnf_unit_);
  if (stage_.head && stage_.embed && config_.tied && chunks() == 1) order.push_back(embed_unit_);
  return order;
}

}  // namespace dpt
