// Generation (docs/generate.md): the decoder's key/value cache path
// (Decoder::prefill, Decoder::step) against its full forward
// (Decoder::logits) at every position, for a GPT-2 configuration, a Llama
// family one built here and each Hugging Face fixture (tests/fixtures/hf),
// and its refusals; greedy generation against transformers' generate on
// the fixtures (generate.safetensors, scripts/make_generate_fixtures.py);
// the end-of-sequence ids of config.json and generation_config.json; UTF-8
// held across tokens; `dpt generate`.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "cli_run.h"
#include "compare.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/threads.h"
#include "data/bpe_tokenizer.h"
#include "train/sample.h"
#include "data/utf8.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "models/decoder.h"
#include "models/generate.h"
#include "models/hf_config.h"
#include "models/mlp.h"
#include "models/sampling.h"
#include "models/weights.h"

namespace dpt {
namespace {

namespace fs = std::filesystem;

std::string fixture(const std::string& name) { return DPT_SOURCE_DIR "/tests/fixtures/hf/" + name; }
constexpr const char* kTokenizer = DPT_SOURCE_DIR "/tests/fixtures/tokenizer/gpt2_style.json";  // 2,000 tokens

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

// One thread: ctest -j2 runs two tests at once on CI's 2 cores, and a
// 2-thread test's OpenMP barriers (a few per generated token) then wait on
// a preempted thread: a 0.3 s test took 77 s in CI that way.
class KvCache : public ::testing::Test {
 protected:
  void SetUp() override { set_threads(1); }
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
  Decoder stage(c, DecoderStage{{{0, 1}}, true, false});
  stage.init_params(1);
  EXPECT_THROW(stage.prefill({1, 2}), InputError);
}

// ---- Greedy generation against transformers ----

struct Reference {
  std::vector<int32_t> prompt, generated;
  std::vector<float> logits;  // [64, V]: the logits each generated id was the argmax of
};

// <model>/generate.safetensors: ids stored as F32.
Reference reference(const std::string& name) {
  const SafetensorsFile f = load_safetensors(fixture(name + "/generate.safetensors"));
  Reference r;
  for (float v : f.find("prompt")->data) r.prompt.push_back(static_cast<int32_t>(v));
  for (float v : f.find("generated")->data) r.generated.push_back(static_cast<int32_t>(v));
  r.logits = f.find("logits")->data;
  return r;
}

SamplingOptions greedy_options() {
  SamplingOptions o;
  o.greedy = true;
  return o;
}

// The Llama fixtures' config.json says 64 positions; the prompt and 64 new
// tokens take 72 (transformers' rotary embedding has no limit there).
const std::map<std::string, std::string> kLongerContext = {{"block_size", "128"}};

// The generation loop's ids equal transformers' greedy ones; and feeding
// transformers' ids through prefill and step, every step's logits are
// within 1e-5 (of the row's largest) of the logits transformers' cache
// path gave at that position.
void check_greedy(const std::string& name, const std::map<std::string, std::string>& overrides) {
  const Reference ref = reference(name);
  ASSERT_EQ(ref.generated.size(), 64u);
  auto model = model_from_file(fixture(name), overrides);
  Decoder& m = decoder(*model);
  TokenSampler sampler(greedy_options(), 0);
  const Generation g = generate(m, ref.prompt, 64, sampler);
  EXPECT_EQ(g.tokens, ref.generated) << name;
  EXPECT_EQ(g.stop, "");
  const int64_t V = m.config().vocab;
  ASSERT_EQ(static_cast<int64_t>(ref.logits.size()), 64 * V);
  Worst worst;
  std::vector<float> logits = m.prefill(ref.prompt);
  for (int64_t i = 0; i < 64; ++i) {
    expect_row(logits, ref.logits, i, V, 1e-5, worst, name + " generated token " + std::to_string(i));
    if (i < 63) logits = m.step(ref.generated[static_cast<size_t>(i)]);
  }
  std::printf("[ measure  ] %s: cache path vs transformers' generate logits, max|diff|/max|want| %.1e\n",
              name.c_str(), worst.rel);
}

class HfGenerate : public ::testing::Test {
 protected:
  void SetUp() override { set_threads(1); }
};

TEST_F(HfGenerate, Gpt2GreedyMatchesTransformersTokenForToken) { check_greedy("gpt2", {}); }
TEST_F(HfGenerate, LlamaGqaGreedyMatchesTransformersTokenForToken) { check_greedy("llama_gqa", kLongerContext); }
TEST_F(HfGenerate, Qwen2GreedyMatchesTransformersTokenForToken) { check_greedy("qwen2", kLongerContext); }

TEST_F(HfGenerate, GenerationStopsAtTheContextAndAtAnEndOfSequenceToken) {
  const Reference ref = reference("qwen2");
  auto model = model_from_file(fixture("qwen2"), {});  // 64 positions
  TokenSampler a(greedy_options(), 0);
  // 8 prompt positions, then 56 steps fill the cache: 57 tokens.
  const Generation full = generate(decoder(*model), ref.prompt, 64, a);
  EXPECT_EQ(full.tokens, std::vector<int32_t>(ref.generated.begin(), ref.generated.begin() + 57));
  EXPECT_EQ(full.stop, "at the model's context of 64 positions");
  // Ends on (and includes) the first of the end-of-sequence ids it meets.
  const int32_t eos = ref.generated[20];
  const auto first = std::find(ref.generated.begin(), ref.generated.end(), eos);
  TokenSampler b(greedy_options(), 0);
  std::vector<std::pair<int32_t, bool>> seen;
  const Generation g = generate(decoder(*model), ref.prompt, 64, b, {1000, eos},
                                [&](int32_t t, bool end) { seen.emplace_back(t, end); });
  EXPECT_EQ(g.tokens, std::vector<int32_t>(ref.generated.begin(), first + 1));
  EXPECT_EQ(g.stop, fmt::format("at end-of-sequence token {}", eos));
  // The callback saw each token, only the last as the end.
  ASSERT_EQ(seen.size(), g.tokens.size());
  for (size_t i = 0; i < seen.size(); ++i) {
    EXPECT_EQ(seen[i].first, g.tokens[i]);
    EXPECT_EQ(seen[i].second, i + 1 == seen.size());
  }
}

// ---- End-of-sequence ids ----

fs::path scratch(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / fmt::format("dpt_generate_{}_{}", name, ::getpid());
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void put(const fs::path& p, const std::string& text) {
  AtomicFile f(p.string());
  f.write(text);
  f.commit();
}

TEST(EosIds, FromGenerationConfigElseConfigOneIdOrAList) {
  const fs::path d = scratch("eos");
  EXPECT_EQ(hf_eos_token_ids((d / "model.safetensors").string()), std::vector<int32_t>{});  // neither file
  put(d / "config.json", R"({"eos_token_id": 2})");
  EXPECT_EQ(hf_eos_token_ids((d / "model.safetensors").string()), std::vector<int32_t>{2});
  EXPECT_EQ(hf_eos_token_ids(d.string()), std::vector<int32_t>{2});  // the directory itself
  put(d / "config.json", R"({"eos_token_id": [128001, 128009]})");
  EXPECT_EQ(hf_eos_token_ids(d.string()), (std::vector<int32_t>{128001, 128009}));
  put(d / "config.json", R"({"eos_token_id": null})");
  EXPECT_EQ(hf_eos_token_ids(d.string()), std::vector<int32_t>{});
  // generation_config.json wins, its absent key meaning none.
  put(d / "config.json", R"({"eos_token_id": 2})");
  put(d / "generation_config.json", R"({"eos_token_id": [7, 8]})");
  EXPECT_EQ(hf_eos_token_ids(d.string()), (std::vector<int32_t>{7, 8}));
  put(d / "generation_config.json", R"({"do_sample": true})");
  EXPECT_EQ(hf_eos_token_ids(d.string()), std::vector<int32_t>{});
  for (const char* bad : {R"({"eos_token_id": "2"})", R"({"eos_token_id": [1, -3]})", R"({"eos_token_id": 2.5})",
                          "{not json"}) {
    put(d / "generation_config.json", bad);
    EXPECT_THROW(hf_eos_token_ids(d.string()), InputError) << bad;
  }
  fs::remove_all(d);
}

// ---- UTF-8 across tokens ----

TEST(Utf8Stream, AnIncompleteSequenceIsHeldAndNothingElse) {
  EXPECT_EQ(utf8::complete_prefix(""), 0u);
  EXPECT_EQ(utf8::complete_prefix("abc"), 3u);
  EXPECT_EQ(utf8::complete_prefix("a\xE2\x82"), 1u);       // the euro sign's first two bytes
  EXPECT_EQ(utf8::complete_prefix("a\xE2\x82\xAC"), 4u);   // all of it
  EXPECT_EQ(utf8::complete_prefix("a\xF0\x9F\x98"), 1u);   // three of an emoji's four
  EXPECT_EQ(utf8::complete_prefix("\xC3"), 0u);
  EXPECT_EQ(utf8::complete_prefix("\xFF" "a"), 2u);        // invalid bytes are not held
  EXPECT_EQ(utf8::complete_prefix("\xE2(\xC3"), 2u);       // a lead byte cut short, then a held one
  EXPECT_EQ(utf8::complete_prefix("x\x80"), 2u);           // a stray continuation byte
}

// ---- dpt generate ----

class GenerateCli : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = scratch(::testing::UnitTest::GetInstance()->current_test_info()->name()); }
  void TearDown() override { fs::remove_all(dir_); }
  test::RunResult dpt(const std::string& args) const {
    return test::run_shell(fmt::format("{}/dpt generate --threads 1 {}", DPT_BINARY_DIR, args), dir_, 120);
  }
  static std::string ids_text(const std::vector<int32_t>& ids) {
    std::string s;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i) s += ' ';
      s += std::to_string(ids[i]);
    }
    return s;
  }
  fs::path dir_;
};

TEST_F(GenerateCli, ByteModelStreamsTransformersGreedyBytes) {
  // gpt2 is byte-level (vocabulary 256): the prompt's text is its bytes and
  // the output the generated bytes, exactly (a pipe: no newline added).
  const Reference ref = reference("gpt2");
  const std::string prompt(ref.prompt.begin(), ref.prompt.end());
  const test::RunResult r =
      dpt(fmt::format("--weights {} --prompt {} --greedy --max-new-tokens 64", test::q(fixture("gpt2")),
                      test::q(prompt)));
  ASSERT_EQ(r.code, 0) << r.all();
  EXPECT_EQ(r.out, std::string(ref.generated.begin(), ref.generated.end()));
  EXPECT_NE(r.err.find("prompt: 16 tokens in"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("generated: 64 tokens in"), std::string::npos) << r.err;
}

TEST_F(GenerateCli, LlamaGqaIdsMatchTransformersAndStopAtConfigEos) {
  // llama_gqa's config.json says eos_token_id 2: generation ends on the
  // first 2 transformers wrote (which it wrote on past, eos off), unless
  // --ignore-eos.
  const Reference ref = reference("llama_gqa");
  const std::string args = fmt::format("--weights {} --prompt-ids {} --output ids --greedy --context 128",
                                       test::q(fixture("llama_gqa")), test::q(ids_text(ref.prompt)));
  const test::RunResult all = dpt(args + " --ignore-eos --max-new-tokens 64");
  ASSERT_EQ(all.code, 0) << all.all();
  EXPECT_EQ(all.out, ids_text(ref.generated) + "\n");
  const test::RunResult stopped = dpt(args + " --max-new-tokens 64");
  ASSERT_EQ(stopped.code, 0) << stopped.all();
  const auto two = std::find(ref.generated.begin(), ref.generated.end(), 2);
  EXPECT_EQ(stopped.out, ids_text({ref.generated.begin(), two == ref.generated.end() ? two : two + 1}) + "\n");
  if (two != ref.generated.end()) {
    EXPECT_NE(stopped.err.find("stopped at end-of-sequence token 2"), std::string::npos) << stopped.err;
  }
}

TEST_F(GenerateCli, GenerationConfigEosListEndsGeneration) {
  // A copy of gpt2 whose generation_config.json lists two ids: the run ends
  // at the first generated token that is one of them.
  const Reference ref = reference("gpt2");
  for (const char* f : {"config.json", "model.safetensors"}) fs::copy_file(fixture(std::string("gpt2/") + f), dir_ / f);
  const int32_t eos = ref.generated[30];
  put(dir_ / "generation_config.json", fmt::format(R"({{"eos_token_id": [300, {}]}})", eos));
  const test::RunResult r = dpt(fmt::format("--weights {} --prompt-ids {} --output ids --greedy", test::q(dir_),
                                            test::q(ids_text(ref.prompt))));
  ASSERT_EQ(r.code, 0) << r.all();
  const auto first = std::find(ref.generated.begin(), ref.generated.end(), eos);
  EXPECT_EQ(r.out, ids_text({ref.generated.begin(), first + 1}) + "\n");
}

TEST_F(GenerateCli, NoCacheGivesTheSameTokens) {
  // A full forward per token instead of the cache: the same greedy ids as
  // transformers', and the same sampled ones for a seed.
  const Reference ref = reference("gpt2");
  const std::string args = fmt::format("--weights {} --prompt-ids {} --output ids --max-new-tokens 64",
                                       test::q(fixture("gpt2")), test::q(ids_text(ref.prompt)));
  const test::RunResult greedy = dpt(args + " --greedy --no-cache");
  ASSERT_EQ(greedy.code, 0) << greedy.all();
  EXPECT_EQ(greedy.out, ids_text(ref.generated) + "\n");
  const test::RunResult cached = dpt(args + " --seed 3"), full = dpt(args + " --seed 3 --no-cache");
  ASSERT_EQ(full.code, 0) << full.all();
  EXPECT_EQ(cached.out, full.out);
}

TEST_F(GenerateCli, TheSameSeedGivesTheSameTextAndAnotherSeedOther) {
  const std::string args = fmt::format("--weights {} --prompt 'Once upon' --max-new-tokens 40 --top-k 50 --top-p 0.95",
                                       test::q(fixture("gpt2")));
  const test::RunResult a = dpt(args + " --seed 5"), b = dpt(args + " --seed 5"), c = dpt(args + " --seed 6");
  ASSERT_EQ(a.code, 0) << a.all();
  EXPECT_EQ(a.out, b.out);
  EXPECT_NE(a.out, c.out);
  EXPECT_EQ(a.out.size(), 40u);
}

TEST_F(GenerateCli, TextThroughATokenizerIsTheDecodingOfTheIds) {
  // A random model over a tokenizer's vocabulary: the streamed text (each
  // token's bytes, split UTF-8 held) is the tokenizer's decoding of the ids
  // the same seed gives, and the prompt is its encoding.
  const std::string tok_path = DPT_SOURCE_DIR "/tests/fixtures/tokenizer/gpt2_style.json";
  const BpeTokenizer tok = BpeTokenizer::load(tok_path);
  DecoderConfig c{static_cast<int64_t>(tok.vocab_size()), 1, 2, 16, 64};
  Decoder m(c);
  m.init_params(3);
  const fs::path w = dir_ / "model.safetensors";
  save_weights(m, w.string());
  const std::string args = fmt::format("--weights {} --tokenizer {} --prompt 'Hello world' --max-new-tokens 30 "
                                       "--temperature 1.5 --seed 2", test::q(w), test::q(tok_path));
  const test::RunResult text = dpt(args), ids = dpt(args + " --output ids");
  ASSERT_EQ(text.code, 0) << text.all();
  ASSERT_EQ(ids.code, 0) << ids.all();
  std::vector<uint32_t> got;
  std::istringstream in(ids.out);
  for (uint32_t id; in >> id;) got.push_back(id);
  ASSERT_EQ(got.size(), 30u);
  EXPECT_EQ(text.out, tok.decode(got));
  EXPECT_NE(text.err.find(fmt::format("prompt: {} tokens", tok.encode("Hello world").size())), std::string::npos)
      << text.err;
}

TEST_F(GenerateCli, BadInputIsOneSentence) {
  const std::string gpt2 = "--weights " + test::q(fixture("gpt2"));
  const std::string qwen2 = "--weights " + test::q(fixture("qwen2"));
  const std::vector<std::pair<std::string, std::string>> cases = {
      {gpt2, "give the prompt once"},
      {gpt2 + " --prompt a --prompt-ids 1", "give the prompt once"},
      {gpt2 + " --prompt " + test::q(std::string(97, 'x')), "do not fit the model's context of 96 positions"},
      {gpt2 + " --prompt ''", "the prompt has no tokens"},
      {gpt2 + " --prompt-ids 1,x", "'x' is not a token id"},
      {gpt2 + " --prompt-ids 1,300", "token 300 is outside the model's vocabulary"},
      {gpt2 + " --prompt-file " + test::q(fs::path("/nonexistent/p.txt")), "cannot open the prompt file"},
      {gpt2 + " --prompt a --top-p 0", "(0, 1]"},
      {qwen2 + " --prompt hi", "needs --tokenizer"},
      {qwen2 + " --prompt-ids 1,2", "needs --tokenizer"},  // text output
  };
  for (const auto& [args, want] : cases) {
    const test::RunResult r = dpt(args);
    EXPECT_EQ(r.code, 1) << args << "\n" << r.all();
    EXPECT_NE(r.err.find(want), std::string::npos) << args << "\n" << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << "\n" << r.err;
  }
}

// "1,,2" and "1,2," read as 1,2: an id missing from a list went unnoticed.
TEST_F(GenerateCli, PromptIdsWithACommaMissingAnIdAreRefused) {
  const std::string gpt2 = "--weights " + test::q(fixture("gpt2")) + " --output ids --greedy --max-new-tokens 1";
  for (const auto& [ids, want] : std::vector<std::pair<std::string, std::string>>{
           {"1,,2", "--prompt-ids '1,,2': a comma with no id before it"},
           {"1, ,2", "--prompt-ids '1, ,2': a comma with no id before it"},
           {",1", "--prompt-ids ',1': a comma with no id before it"},
           {"1,2,", "--prompt-ids '1,2,': a comma with no id after it"}}) {
    const test::RunResult r = dpt(gpt2 + " --prompt-ids " + test::q(ids));
    EXPECT_EQ(r.code, 1) << ids << "\n" << r.all();
    EXPECT_EQ(r.err, "dpt: error: " + want + "\n") << ids;
  }
  EXPECT_EQ(dpt(gpt2 + " --prompt-ids '1, 2 3'").code, 0);  // commas and/or spaces
}

// A directory opened as a stream and threw std::ios_base::failure when read:
// exit 2, "internal error: basic_filebuf::underflow error reading the file".
TEST_F(GenerateCli, APromptFileThatIsADirectoryIsRefused) {
  const test::RunResult r = dpt(fmt::format("--weights {} --prompt-file {}", test::q(fixture("gpt2")), test::q(dir_)));
  EXPECT_EQ(r.code, 1) << r.all();
  EXPECT_EQ(r.err, fmt::format("dpt: error: {}: a directory, not a prompt file\n", dir_.string()));
}

TEST_F(GenerateCli, AnMlpIsRefused) {
  Mlp mlp(MlpConfig{{784, 16, 10}});
  mlp.init_params(1);
  const fs::path w = dir_ / "mlp.safetensors";
  save_weights(mlp, w.string());
  const test::RunResult r = dpt(fmt::format("--weights {} --prompt-ids 1 --output ids", test::q(w)));
  EXPECT_EQ(r.code, 1) << r.all();
  EXPECT_NE(r.err.find("needs a gpt or llama one"), std::string::npos) << r.err;
}

// ---- dpt train --sample-every ----

TEST_F(GenerateCli, TrainPrintsSamplesAtThoseStepsTheSameForASeed) {
  const std::string train = fmt::format("{}/dpt train --model gpt --synthetic --steps 4 --layers 1 --width 32 --heads 2 "
                                        "--context 32 --batch 2 --threads 1 --sample-every 2 --sample-tokens 16",
                                        DPT_BINARY_DIR);
  const test::RunResult a = test::run_shell(train, dir_, 120), b = test::run_shell(train, dir_, 120);
  ASSERT_EQ(a.code, 0) << a.all();
  for (const char* step : {"sample after step 2: ", "sample after step 4: "})
    EXPECT_NE(a.out.find(step), std::string::npos) << a.out;
  EXPECT_EQ(a.out.find("sample after step 1: "), std::string::npos) << a.out;
  EXPECT_EQ(a.out.find("sample after step 3: "), std::string::npos) << a.out;
  // The same seed, the same samples (the lines, timing apart).
  const auto samples = [](const std::string& out) {
    std::string lines;
    for (size_t at = out.find("sample after"); at != std::string::npos; at = out.find("sample after", at + 1))
      lines += out.substr(at, out.find('\n', at) - at) + "\n";
    return lines;
  };
  EXPECT_EQ(samples(a.out), samples(b.out));
  EXPECT_FALSE(samples(a.out).empty());
}

TEST_F(GenerateCli, TrainSamplesRefuseInOneSentence) {
  const std::string train = fmt::format("{}/dpt train --synthetic --steps 2 --threads 1 --sample-every 1 ", DPT_BINARY_DIR);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--model mlp", "samples a gpt or llama model's text"},
      {"--model gpt --vocab 300", "--sample-every needs --tokenizer for a model of 300 tokens"},
      {fmt::format("--model gpt --vocab 1000 --tokenizer {}", test::q(kTokenizer)),
       "'s 2000 tokens do not fit the model's vocabulary of 1000"},
      {"--model gpt --vocab 2000 --tokenizer /nonexistent/tokenizer.json", "/nonexistent/tokenizer.json"},
      {"--model gpt --sample-prompt ''", "--sample-prompt is empty"},
      {"--model gpt --context 8 --sample-prompt 12345678", "do not fit below the model's context of 8"},
  };
  for (const auto& [args, want] : cases) {
    const test::RunResult r = test::run_shell(train + args, dir_, 120);
    EXPECT_EQ(r.code, 1) << args << "\n" << r.all();
    EXPECT_NE(r.err.find(want), std::string::npos) << args << "\n" << r.err;
  }
  // The samples' flags without --sample-every.
  const std::string alone = fmt::format("{}/dpt train --model gpt --synthetic --steps 2 --threads 1 ", DPT_BINARY_DIR);
  for (const std::string& flag : {fmt::format("--tokenizer {}", test::q(kTokenizer)), std::string("--sample-prompt hi"),
                                 std::string("--sample-tokens 3")}) {
    const test::RunResult r = test::run_shell(alone + flag, dir_, 120);
    EXPECT_EQ(r.code, 1) << flag << "\n" << r.all();
    EXPECT_NE(r.err.find("sets the samples of --sample-every, which is not given"), std::string::npos) << r.err;
  }
}

// Training's memory check counts the model rank 0 holds for samples
// (train/sample.h's sample_bytes: its parameters, their bf16 copies in a
// bf16 run, the cache and a prompt chunk's activations): the estimate it
// refuses with grows by that much, to its 0.1 MiB rounding.
TEST_F(GenerateCli, TrainsMemoryCheckCountsTheSampleModel) {
  const std::string train = fmt::format("{}/dpt train --model gpt --layers 2 --width 256 --heads 4 --context 256 "
                                        "--synthetic --steps 1 --batch 1 --threads 1 --memory-budget-mb 1 ",
                                        DPT_BINARY_DIR);
  const auto estimate = [&](const std::string& args) {
    const test::RunResult r = test::run_shell(train + args, dir_, 120);
    EXPECT_EQ(r.code, 1) << r.all();
    const std::string says = "needs about ";
    const size_t at = r.err.find(says);
    EXPECT_NE(at, std::string::npos) << r.err;
    EXPECT_NE(r.err.find(" MiB per rank", at), std::string::npos) << r.err;
    return at == std::string::npos ? 0.0 : std::stod(r.err.substr(at + says.size()));
  };
  const DecoderConfig c{256, 2, 4, 256, 256};
  for (const DType p : {DType::F32, DType::BF16}) {
    const std::string precision = p == DType::BF16 ? "--precision bf16 " : "";
    const double grown = estimate(precision + "--sample-every 1") - estimate(precision);
    const double mib = static_cast<double>(sample_bytes(c, p)) / (1 << 20);
    EXPECT_GT(mib, 7.0);  // 1.7 M parameters
    EXPECT_NEAR(grown, mib, 0.11) << precision;
  }
}

}  // namespace
}  // namespace dpt
