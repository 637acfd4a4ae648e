// The decoder's attention kernels, and what context parallelism changes
// around them: which rows of a batch this rank computes, and at which
// positions (docs/context_parallel.md).
#include <fmt/format.h>

#include "core/error.h"
#include "models/decoder.h"
#include "nn/rope.h"

namespace dpt {

void Decoder::set_context_parallel(int size, int rank, ContextRing* ring) {
  if (size < 1 || rank < 0 || rank >= size)
    throw InputError(fmt::format("context-parallel rank {} of {} does not exist", rank, size));
  cp_size_ = size;
  cp_rank_ = rank;
  ring_ = ring;
  batch_ = seq_ = 0;  // the arena is laid out again for the local rows
}

void Decoder::check_context_parallel(int64_t T) const {
  if (cp_size_ == 1) return;
  if (T % (2 * cp_size_) != 0)
    throw InputError(fmt::format("a sequence of {} tokens does not split into the 2 x --cp {} = {} equal chunks "
                                 "context parallelism needs",
                                 T, cp_size_, 2 * cp_size_));
  if (!fused_attention_ || device_ != Device::CPU)
    throw InputError("--cp runs the fused attention on the CPU (not yet with --device cuda or --attention unfused)");
  DPT_CHECK(ring_ != nullptr, "a context-parallel decoder computes without its CP group's ring");
}

void Decoder::attend_forward(float* out, bf16* out16, float* att, const float* qkv, int64_t B, int64_t T) {
  const Widths& w = w_;
  if (cp_size_ == 1 && fused_attention_) {
    if (bf16_attention_products_)
      k().flash_attention_bf16_forward(out, out16, att, qkv, B, T, w.heads, w.kv, w.hd);
    else
      k().flash_attention_forward(out, out16, att, qkv, B, T, w.heads, w.kv, w.hd);
    return;
  }
  // A ring's blocks merge into out one by one: its bf16 copy comes after.
  if (cp_size_ > 1)
    ring_attention_forward(out, att, qkv, ring_shape(B, T), *ring_, act_.ring);
  else if (config_.grouped())
    k().gqa_attention_forward(out, att, qkv, B, T, w.heads, w.kv, w.hd);
  else
    k().attention_forward(out, att, qkv, B, T, w.att, w.heads);
  if (out16) k().convert(out16, out, static_cast<size_t>(B * T * w.att));
}

void Decoder::attend_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* att,
                              int64_t B, int64_t T) {
  const Widths& w = w_;
  if (cp_size_ > 1)
    ring_attention_backward(dqkv, dout, qkv, out, att, ring_shape(B, T), *ring_, act_.ring);
  else if (fused_attention_ && bf16_attention_products_)
    k().flash_attention_bf16_backward(dqkv, dout, qkv, out, att, B, T, w.heads, w.kv, w.hd);
  else if (fused_attention_)
    k().flash_attention_backward(dqkv, dout, qkv, out, att, B, T, w.heads, w.kv, w.hd);
  else if (config_.grouped())
    k().gqa_attention_backward(dqkv, dout, qkv, att, B, T, w.heads, w.kv, w.hd);
  else
    k().attention_backward(dqkv, dout, qkv, att, B, T, w.att, w.heads);
}

void Decoder::keep_local_rows(const Batch& batch, int64_t T) {
  const int64_t Tw = batch.T;  // whole sequences
  for (int64_t b = 0; b < batch.B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const size_t from = static_cast<size_t>(b * Tw + position(t, T)), to = static_cast<size_t>(b * T + t);
      tokens_[to] = batch.tokens[from];
      targets_[to] = batch.targets[from];
    }
}

template <typename CT>
void Decoder::positions_forward(int64_t B, int64_t T) {
  const int64_t C = config_.width;
  if (cp_size_ == 1) {
    k().position_embedding_forward(act_.encoded, weight<CT>(wpe_), B, T, C);
    return;
  }
  // Each local chunk is a run of consecutive positions.
  const int64_t half = T / 2;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < 2; ++h)
      k().position_embedding_forward(act_.encoded + (b * T + h * half) * C, weight<CT>(wpe_) + position(h * half, T) * C,
                                     1, half, C);
}
template void Decoder::positions_forward<float>(int64_t, int64_t);
template void Decoder::positions_forward<bf16>(int64_t, int64_t);

void Decoder::positions_backward(int64_t B, int64_t T) {
  const int64_t C = config_.width;
  if (cp_size_ == 1) {
    k().position_embedding_backward(grad(wpe_), act_.dres, B, T, C);
    return;
  }
  const int64_t half = T / 2;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < 2; ++h)
      k().position_embedding_backward(grad(wpe_) + position(h * half, T) * C, act_.dres + (b * T + h * half) * C, 1,
                                      half, C);
}

void Decoder::fill_rope_tables(int64_t T) {
  // The tables of every position of the sequence, then this rank's rows.
  const int64_t Tw = T * cp_size_, half_hd = w_.hd / 2;
  std::vector<float> cos(static_cast<size_t>(Tw * half_hd)), sin(cos.size());
  rope_cache(cos.data(), sin.data(), inv_freq_.data(), Tw, w_.hd);
  if (cp_size_ > 1) {
    std::vector<float> c(static_cast<size_t>(T * half_hd)), s(c.size());
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < half_hd; ++i) {
        c[static_cast<size_t>(t * half_hd + i)] = cos[static_cast<size_t>(position(t, T) * half_hd + i)];
        s[static_cast<size_t>(t * half_hd + i)] = sin[static_cast<size_t>(position(t, T) * half_hd + i)];
      }
    cos.swap(c);
    sin.swap(s);
  }
  k().upload(act_.rope_cos, cos.data(), cos.size() * sizeof(float));
  k().upload(act_.rope_sin, sin.data(), sin.size() * sizeof(float));
}

}  // namespace dpt
