// Generation's incremental decoding (models/decoder.h: prefill, step): the
// decoder's forward over a chunk of new tokens, reading and extending a
// key/value cache. The same kernels as the full pass (decoder_passes.cpp)
// on n rows instead of B x T, but for attention, which reads the cache
// (nn/cached_attention.h); the head runs on the chunk's last row only.
#include <algorithm>
#include <initializer_list>
#include <utility>
#include <type_traits>

#include "core/error.h"
#include "models/decoder.h"
#include "nn/cached_attention.h"

namespace dpt {

namespace {

// A buffer of float storage as the compute type's.
template <typename CT>
CT* as_ct(std::vector<float>& b) {
  return reinterpret_cast<CT*>(b.data());
}

}  // namespace

void Decoder::check_generation() const {
  if (!whole() || tp_.size > 1) throw InputError("generation runs the whole model on one rank (no --tp, no --pp)");
  if (device_ != Device::CPU) throw InputError("generation runs on the CPU only (--device cpu)");
}

std::vector<float> Decoder::prefill(const std::vector<int32_t>& tokens) {
  check_generation();
  const auto P = static_cast<int64_t>(tokens.size());
  if (P == 0) throw InputError("the prompt has no tokens");
  if (P > config_.context)
    throw InputError(fmt::format("the prompt's {} tokens do not fit the model's context of {} positions", P,
                                 config_.context));
  infer_.pos = 0;
  std::vector<float> logits;
  for (int64_t i = 0; i < P; i += kPrefillChunk) logits = extend(tokens.data() + i, std::min(kPrefillChunk, P - i));
  return logits;
}

std::vector<float> Decoder::step(int32_t token) {
  check_generation();
  return extend(&token, 1);
}

void Decoder::size_infer(int64_t n) {
  Infer& s = infer_;
  const auto T = static_cast<size_t>(config_.context), kvw = static_cast<size_t>(w_.kv * w_.hd);
  if (s.k.empty()) {
    s.k.assign(blocks_.size() * T * kvw, 0.0f);
    s.v.assign(blocks_.size() * T * kvw, 0.0f);
    if (config_.rotary) {
      s.rope_cos.resize(T * static_cast<size_t>(w_.hd / 2));
      s.rope_sin.resize(s.rope_cos.size());
      rope_cache(s.rope_cos.data(), s.rope_sin.data(), inv_freq_.data(), config_.context, w_.hd);
    }
    s.logits.resize(static_cast<size_t>(wte_rows()));
  }
  if (n <= s.n) return;
  const int64_t C = config_.width;
  using Rows = std::pair<std::vector<float>*, int64_t>;  // a buffer and its floats per row
  const std::initializer_list<Rows> buffers = {{&s.x, C},       {&s.ln, C},          {&s.mean, 1},  {&s.rstd, 1},
                                               {&s.qkv, w_.qkv}, {&s.atty, w_.att},  {&s.atty16, w_.att},
                                               {&s.res, C},      {&s.fch, w_.fc},    {&s.act, w_.inner}};
  for (const auto& [b, width] : buffers) b->resize(static_cast<size_t>(n * width));
  s.n = n;
}

size_t Decoder::generation_bytes(int64_t rows) const {
  const int64_t n = std::min(std::max<int64_t>(rows, 1), kPrefillChunk), C = config_.width, T = config_.context;
  int64_t floats = 2 * static_cast<int64_t>(blocks_.size()) * T * w_.kv * w_.hd + wte_rows();
  if (config_.rotary) floats += T * (w_.hd / 2) * 2;
  floats += n * (3 * C + 2 + w_.qkv + 2 * w_.att + w_.fc + w_.inner);  // as size_infer lays them out
  return static_cast<size_t>(floats) * sizeof(float);
}

std::vector<float> Decoder::extend(const int32_t* tokens, int64_t n) {
  if (infer_.pos + n > config_.context)
    throw InputError(fmt::format("generation ran past the model's context of {} positions", config_.context));
  for (int64_t i = 0; i < n; ++i)
    if (tokens[i] < 0 || tokens[i] >= config_.vocab)
      throw InputError(fmt::format("token {} is outside the model's vocabulary 0..{}", tokens[i], config_.vocab - 1));
  size_infer(n);
  if (precision_ == DType::BF16)
    extend_as<bf16>(tokens, n);
  else
    extend_as<float>(tokens, n);
  infer_.pos += n;
  return std::vector<float>(infer_.logits.begin(), infer_.logits.begin() + config_.vocab);
}

template <typename CT>
void Decoder::extend_as(const int32_t* tokens, int64_t n) {
  Infer& s = infer_;
  const int64_t C = config_.width;
  begin(Pass::Forward);
  open(embed_unit_);
  k().embedding_forward(s.x.data(), tokens, weight<CT>(wte_), n, C);
  // Learned positions: rows pos .. pos + n - 1 of wpe.
  if (wpe_ >= 0) k().position_embedding_forward(s.x.data(), weight<CT>(wpe_) + s.pos * C, 1, n, C);
  close(embed_unit_);
  for (size_t l = 0; l < blocks_.size(); ++l) {
    open(block_unit0_ + static_cast<int>(l));
    infer_block<CT>(l, n);
    close(block_unit0_ + static_cast<int>(l));
  }
  infer_head<CT>(n);
}

template <typename CT>
void Decoder::infer_attention(size_t l, int64_t n) {
  Infer& s = infer_;
  const BlockSlots& b = blocks_[l];
  const int64_t C = config_.width, hd = w_.hd, kvw = w_.kv * hd, p0 = s.pos;
  float* qkv = s.qkv.data();
  k().linear_forward(qkv, as_ct<CT>(s.ln), weight<CT>(b.qkv_w), param_or_null(b.qkv_b), n, C, w_.qkv);
  // Rotary: the new rows at their positions p0 .. p0 + n - 1.
  if (config_.rotary)
    k().rope_forward(qkv, qkv, s.rope_cos.data() + p0 * (hd / 2), s.rope_sin.data() + p0 * (hd / 2), 1, n,
                     w_.heads + w_.kv, hd, w_.qkv);
  // The new keys and values (each row: query heads, key heads, value heads)
  // into the cache's rows p0 .. p0 + n - 1.
  float* kc = s.k.data() + static_cast<int64_t>(l) * config_.context * kvw;
  float* vc = s.v.data() + static_cast<int64_t>(l) * config_.context * kvw;
  for (int64_t t = 0; t < n; ++t) {
    const float* row = qkv + t * w_.qkv + w_.att;
    std::copy(row, row + kvw, kc + (p0 + t) * kvw);
    std::copy(row + kvw, row + 2 * kvw, vc + (p0 + t) * kvw);
  }
  cached_attention_forward(s.atty.data(), qkv, w_.qkv, kc, vc, n, p0, w_.heads, w_.kv, hd);
  const CT* atty;
  if constexpr (std::is_same_v<CT, bf16>) {
    k().convert(as_ct<bf16>(s.atty16), s.atty.data(), static_cast<size_t>(n * w_.att));
    atty = as_ct<bf16>(s.atty16);
  } else {
    atty = s.atty.data();
  }
  k().linear_forward(s.res.data(), atty, weight<CT>(b.proj_w), param_or_null(b.proj_b), n, w_.att, C);
}

template <typename CT>
void Decoder::infer_block(size_t l, int64_t n) {
  Infer& s = infer_;
  const BlockSlots& b = blocks_[l];
  const int64_t C = config_.width;
  float* x = s.x.data();
  CT* ln = as_ct<CT>(s.ln);
  norm_forward(ln, s.mean.data(), s.rstd.data(), x, b.ln1_w, b.ln1_b, n);
  infer_attention<CT>(l, n);
  k().residual_forward(x, x, s.res.data(), n * C);
  norm_forward(ln, s.mean.data(), s.rstd.data(), x, b.ln2_w, b.ln2_b, n);
  k().linear_forward(s.fch.data(), ln, weight<CT>(b.fc_w), param_or_null(b.fc_b), n, C, w_.fc);
  CT* act = as_ct<CT>(s.act);
  if (config_.mlp == MlpKind::SwiGlu)
    k().swiglu_forward(act, s.fch.data(), n, w_.inner);
  else
    k().gelu_forward(act, s.fch.data(), n * w_.fc);
  k().linear_forward(s.res.data(), act, weight<CT>(b.fcproj_w), param_or_null(b.fcproj_b), n, w_.inner, C);
  k().residual_forward(x, x, s.res.data(), n * C);
}

template <typename CT>
void Decoder::infer_head(int64_t n) {
  Infer& s = infer_;
  const int64_t C = config_.width, Vp = wte_rows();
  const float* last = s.x.data() + (n - 1) * C;
  CT* lnf = as_ct<CT>(s.ln);
  open(lnf_unit_);
  norm_forward(lnf, s.mean.data(), s.rstd.data(), last, lnf_w_, lnf_b_, 1);
  if (!config_.tied) k().linear_forward(s.logits.data(), lnf, weight<CT>(head_), nullptr, 1, C, Vp);
  close(lnf_unit_);
  if (config_.tied) {
    open(embed_unit_);
    k().linear_forward(s.logits.data(), lnf, weight<CT>(wte_), nullptr, 1, C, Vp);
    close(embed_unit_);
  }
}

}  // namespace dpt
