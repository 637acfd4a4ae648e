// One training step of a Decoder in a test: a seeded batch of random
// tokens and targets, and every parameter's gradient after one forward and
// backward from zero. Shared by the fused-attention tests (CPU, emulated
// CUDA kernels, GPU).
#pragma once

#include <cstdint>
#include <vector>

#include "core/rng.h"
#include "models/decoder.h"

namespace dpt::test {

// B sequences of T tokens and targets below `vocab`, from `seed`.
inline Batch random_batch(int64_t B, int64_t T, int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  Batch batch;
  batch.B = B;
  batch.T = T;
  for (int64_t i = 0; i < B * T; ++i) {
    batch.tokens.push_back(static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab))));
    batch.targets.push_back(static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab))));
  }
  return batch;
}

// Two-block decoders of vocabulary 64 and 4 query heads for the attention
// tests: Llama (2 key/value heads, rotary, SwiGLU of 1.5 x width) and
// GPT-2 (plain heads, biases), at `width` and `context`.
inline std::vector<DecoderConfig> small_llama_and_gpt(int64_t width, int64_t context) {
  DecoderConfig llama = DecoderConfig::llama();
  llama.vocab = 64, llama.layers = 2, llama.heads = 4, llama.kv_heads = 2, llama.width = width;
  llama.context = context, llama.intermediate = width * 3 / 2;
  return {llama, DecoderConfig{64, 2, 4, width, context}};
}

// d's gradients after one forward and backward of `batch` from zero, on the
// host (downloaded from a device).
inline std::vector<float> one_step_grads(Decoder& d, const Batch& batch) {
  d.zero_grads();
  d.forward(batch);
  d.backward(1.0f);
  std::vector<float> g(d.param_count());
  d.k().download(g.data(), d.grads(), g.size() * sizeof(float));
  return g;
}

}  // namespace dpt::test
