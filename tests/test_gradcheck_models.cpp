// Finite-difference gradient checks of whole models: every parameter slot of
// a small MLP, a small GPT and small Llama-family decoders, through the real
// forward and backward.
#include <cmath>
#include <vector>

#include "core/threads.h"
#include "data/batches.h"
#include "gradcheck.h"
#include "models/decoder.h"
#include "models/mlp.h"

namespace dpt {
namespace {

// Perturbs entries of each slot and compares d(loss)/d(param) from backward.
void check_model(Model& model, const Batch& batch) {
  model.zero_grads();
  model.forward(batch);
  model.backward(1.0f);
  const float* g = model.grads();
  for (const Slot& s : model.layout().slots()) {
    std::vector<float> values(model.params() + s.offset, model.params() + s.offset + s.numel);
    std::vector<float> analytic(g + s.offset, g + s.offset + s.numel);
    auto loss = [&] {
      std::copy(values.begin(), values.end(), model.params() + s.offset);
      return static_cast<double>(model.forward(batch).loss);
    };
    test::expect_gradient(s.name, values, analytic, loss, 1e-2, 1e-4, 3e-2, 12);
    std::copy(values.begin(), values.end(), model.params() + s.offset);
  }
}

// Adds noise larger than GPT-2's 0.02 init, so every path carries a
// measurable gradient and the residual stream is large against the finite
// difference step (LayerNorm of a tiny stream is too curved for it).
void roughen(Model& model) {
  Rng rng(9);
  for (const Slot& s : model.layout().slots())
    for (size_t i = 0; i < s.numel; ++i) model.params()[s.offset + i] += 0.3f * rng.normal();
}

TEST(ModelGrad, Mlp) {
  set_threads(1);
  Mlp model(MlpConfig{{12, 9, 7, 5}});
  // A seed whose ReLU inputs all sit farther from 0 than the finite
  // difference step moves them (many seeds put one within it, and the
  // difference then crosses the kink).
  model.init_params(17);
  Batch batch;
  fill_synthetic(model, 6, 11, batch);
  check_model(model, batch);
}

TEST(ModelGrad, Decoder) {
  set_threads(2);
  DecoderConfig c;
  c.vocab = 11;
  c.layers = 2;
  c.heads = 2;
  c.width = 8;
  c.context = 5;
  Decoder model(c);
  model.init_params(5);
  roughen(model);
  Batch batch;
  fill_synthetic(model, 3, 13, batch);
  check_model(model, batch);
}

TEST(ModelGrad, GptShorterSequenceThanContext) {
  // A batch with T below the context length uses only the first T position
  // embeddings; the rest get no gradient.
  set_threads(1);
  DecoderConfig c{11, 1, 2, 8, 6};
  Decoder model(c);
  model.init_params(1);
  roughen(model);
  Batch batch;
  fill_synthetic(model, 2, 3, batch);
  batch.T = 4;
  batch.tokens.resize(8);
  batch.targets.resize(8);
  check_model(model, batch);
  const Slot& wpe = model.layout().slot(model.layout().find("transformer.wpe.weight"));
  for (size_t i = 4 * 8; i < wpe.numel; ++i) EXPECT_EQ(model.grads()[wpe.offset + i], 0.0f);
}

// The Llama family at tiny sizes (RMSNorm, rotary positions, SwiGLU): four
// query heads of size 4 over two key/value heads (GQA), a head size that is
// not width / heads, 5 positions.
DecoderConfig tiny_llama() {
  DecoderConfig c = DecoderConfig::llama();
  c.vocab = 11;
  c.layers = 2;
  c.heads = 4;
  c.kv_heads = 2;
  c.width = 8;
  c.head_size = 4;
  c.intermediate = 12;
  c.context = 5;
  return c;
}

void check_llama(const DecoderConfig& c, uint64_t seed) {
  set_threads(1);
  Decoder model(c);
  model.init_params(seed);
  roughen(model);
  Batch batch;
  fill_synthetic(model, 3, 13, batch);
  check_model(model, batch);
}

TEST(ModelGrad, LlamaGqaUntied) {
  DecoderConfig c = tiny_llama();
  ASSERT_FALSE(c.tied);
  check_llama(c, 5);
}

TEST(ModelGrad, LlamaTiedWithQkvBiasesAsQwen2) {
  DecoderConfig c = tiny_llama();
  c.tied = true;
  c.qkv_bias = true;
  c.o_bias = false;
  c.rope_theta = 1e6f;
  check_llama(c, 6);
}

TEST(ModelGrad, LlamaWithLlama3RopeScaling) {
  // Head size 8 and theta 100: four frequencies, wavelengths 6.3, 19.9,
  // 62.8 and 199 positions; with an original context of 32 (wavelengths 8
  // and 32 the bounds) the first is kept, the second smoothed and the
  // others divided by the factor: every branch of the scaling.
  DecoderConfig c = tiny_llama();
  c.heads = 2;
  c.kv_heads = 1;
  c.head_size = 8;
  c.rope_theta = 100.0f;
  RopeLlama3Scaling s;
  s.factor = 8.0f;
  s.low_freq_factor = 1.0f;
  s.high_freq_factor = 4.0f;
  s.original_max_position_embeddings = 32;
  c.rope_scaling = s;
  check_llama(c, 7);
}

}  // namespace
}  // namespace dpt
