// Generation (docs/generate.md): the decoder's key/value cache path
// (Decoder::prefill, Decoder::step) against its full forward
// (Decoder::logits) at every position, for a GPT-2 configuration, a Llama
// family one built here and each Hugging Face fixture (tests/fixtures/hf),
// and its refusals.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "compare.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/threads.h"
#include "models/decoder.h"
#include "models/weights.h"

namespace dpt {
namespace {

std::string fixture(const std::string& name) { return DPT_SOURCE_DIR "/tests/fixtures/hf/" + name; }

Decoder& decoder(Model& m) { return dynamic_cast<Decoder&>(m); }

// T token ids below V, seeded.
std::vector<int32_t> some_tokens(int64_t T, int64_t V, uint64_t seed) {
  std::vector<int32_t> t(static_cast<size_t>(T));
  for (int64_t i = 0; i < T; ++i) t[static_cast<size_t>(i)] = static_cast<int32_t>(counter_bits(seed, i) % V);
  return t;
}

// Weights far from GPT-2's tiny initial ones, so attention is far from
// uniform and the logits are O(1): matrices N(0, 0.1), norm weights
// 1 + 0.1 N(0, 1), biases 0.1 N(0, 1) (as the Hugging Face fixtures'). The
// pad rows of a padded vocabulary stay zero.
void spread_weights(Decoder& m, uint64_t seed) {
  m.init_params(seed);
  float* p = m.params();
  const int64_t live = m.config().vocab * m.config().width;
  for (const Slot& s : m.layout().slots()) {
    const bool norm_weight = s.name.ends_with(".weight") && s.shape.size() == 1;
    const bool vocab = Decoder::vocab_matrix(s.name);
    for (size_t i = 0; i < s.numel; ++i) {
      if (vocab && static_cast<int64_t>(i) >= live) continue;
      const float r = counter_normal(seed + 1, s.offset + i);
      p[s.offset + i] = norm_weight ? 1.0f + 0.1f * r : 0.1f * r;
    }
  }
}

// The worst max|diff| / max|want| over the rows checked, for the log.
struct Worst {
  double rel = 0;
  void print(const std::string& what) const {
    std::printf("[ measure  ] %s: cache path vs full forward, max|diff|/max|want| %.1e\n", what.c_str(), rel);
  }
};

// Position t's logits from the cache equal row t of the full forward's
// within rtol x max|row|.
void expect_row(const std::vector<float>& got, const std::vector<float>& full, int64_t t, int64_t V, double rtol,
                Worst& worst, const std::string& what) {
  ASSERT_EQ(static_cast<int64_t>(got.size()), V) << what;
  const float* want = full.data() + t * V;
  const test::Diff d = test::diff(got.data(), want, static_cast<size_t>(V));
  worst.rel = std::max(worst.rel, d.peak > 0 ? d.max_abs / d.peak : d.max_abs);
  EXPECT_TRUE(test::all_close(got.data(), want, static_cast<size_t>(V), 0, rtol)) << what << " position " << t;
}

// For prompts of 1 token, half the sequence and all of it: prefill, then a
// step per remaining token; every position's logits against the full
// forward's.
void expect_cache_matches_full(Decoder& m, const std::vector<int32_t>& tokens, double rtol, const std::string& what) {
  const auto T = static_cast<int64_t>(tokens.size());
  const int64_t V = m.config().vocab;
  Batch b;
  b.B = 1;
  b.T = T;
  b.tokens = tokens;
  const std::vector<float> full = m.logits(b);
  Worst worst;
  for (int64_t prompt : {int64_t{1}, T / 2, T}) {
    const std::vector<int32_t> head(tokens.begin(), tokens.begin() + prompt);
    expect_row(m.prefill(head), full, prompt - 1, V, rtol, worst, what + " prefill");
    EXPECT_EQ(m.cached(), prompt);
    for (int64_t t = prompt; t < T; ++t)
      expect_row(m.step(tokens[static_cast<size_t>(t)]), full, t, V, rtol, worst, what + " step");
    EXPECT_EQ(m.cached(), T);
  }
  worst.print(what);
}

class KvCache : public ::testing::Test {
 protected:
  void SetUp() override { set_threads(2); }
};

TEST_F(KvCache, GptConfigMatchesTheFullForwardAtEveryPosition) {
  // GPT-2's architecture: learned positions, multi-head attention, biases,
  // the tied head, a padded vocabulary; a context past one prefill chunk,
  // so the full prompt is prefilled in two chunks.
  DecoderConfig c{70, 2, 4, 32, Decoder::kPrefillChunk + 44, 128};
  Decoder m(c);
  spread_weights(m, 7);
  expect_cache_matches_full(m, some_tokens(c.context, c.vocab, 11), 1e-5, "gpt");
}

TEST_F(KvCache, LlamaFamilyConfigMatchesTheFullForwardAtEveryPosition) {
  // Multi-query attention (one key/value head), a head size that is not
  // width / heads, biases on q/k/v and o, an untied head, a padded
  // vocabulary, Llama 3's rope scaling.
  DecoderConfig c = DecoderConfig::llama();
  c.vocab = 50;
  c.padded_vocab = 64;
  c.layers = 2;
  c.heads = 4;
  c.kv_heads = 1;
  c.head_size = 6;
  c.width = 20;
  c.intermediate = 36;
  c.context = 40;
  c.qkv_bias = c.o_bias = true;
  c.rope_scaling = RopeLlama3Scaling{4.0f, 1.0f, 4.0f, 16};
  Decoder m(c);
  spread_weights(m, 9);
  expect_cache_matches_full(m, some_tokens(c.context, c.vocab, 13), 1e-5, "llama (mqa, biases)");
}

// Each Hugging Face fixture over its whole context.
void check_fixture(const std::string& name) {
  auto model = model_from_file(fixture(name), {});
  Decoder& m = decoder(*model);
  expect_cache_matches_full(m, some_tokens(m.config().context, m.config().vocab, 17), 1e-5, name);
}

TEST_F(KvCache, LlamaGqaFixtureMatchesTheFullForward) { check_fixture("llama_gqa"); }
TEST_F(KvCache, LlamaRopeScaledFixtureMatchesTheFullForward) { check_fixture("llama_rope_scaled"); }
TEST_F(KvCache, Qwen2FixtureMatchesTheFullForward) { check_fixture("qwen2"); }

TEST_F(KvCache, Bf16CachePathFollowsTheBf16FullForward) {
  // The bf16 compute copies: the same GEMM operands rounded to bf16 on both
  // paths, so the two differ by the rounding of different fp32 sums only.
  auto model = model_from_file(fixture("qwen2"), {});
  Decoder& m = decoder(*model);
  const std::vector<int32_t> tokens = some_tokens(m.config().context, m.config().vocab, 19);
  const std::vector<float> fp32 = m.prefill(tokens);
  m.set_precision(DType::BF16);
  expect_cache_matches_full(m, tokens, 2e-2, "qwen2 bf16");
  // bf16 was in effect: the last position's logits moved.
  EXPECT_FALSE(test::all_close(m.prefill(tokens).data(), fp32.data(), fp32.size(), 0, 1e-4));
}

TEST_F(KvCache, StepsPastTheContextAndBadTokensAreRefused) {
  DecoderConfig c{50, 1, 2, 16, 8};
  Decoder m(c);
  m.init_params(1);
  EXPECT_THROW(m.prefill(some_tokens(9, 50, 1)), InputError);
  EXPECT_THROW(m.prefill({}), InputError);
  EXPECT_THROW(m.prefill({3, 50}), InputError);
  m.prefill(some_tokens(8, 50, 1));
  EXPECT_THROW(m.step(4), InputError);
  m.prefill({1});
  EXPECT_THROW(m.step(-1), InputError);
  EXPECT_EQ(m.cached(), 1);
  EXPECT_EQ(m.step(2).size(), 50u);
}

TEST_F(KvCache, ASliceOfTheModelIsRefused) {
  DecoderConfig c{50, 2, 2, 16, 8};
  Decoder tp(c, {}, DecoderTp{2, 0});
  tp.init_params(1);
  EXPECT_THROW(tp.prefill({1, 2}), InputError);
  Decoder stage(c, DecoderStage{0, 1, true, false});
  stage.init_params(1);
  EXPECT_THROW(stage.prefill({1, 2}), InputError);
}

}  // namespace
}  // namespace dpt
