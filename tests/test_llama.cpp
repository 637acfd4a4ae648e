// The Llama family against Hugging Face's own code: tiny LlamaForCausalLM
// (grouped-query attention, an untied head; and one with Llama 3's rope
// scaling, tied) and Qwen2ForCausalLM (q/k/v biases, tied) models that
// transformers 4.45.2 made, saved sharded, ran and trained
// (tests/fixtures/hf/README.md says what each file holds). The engine loads
// each from its directory (config.json, the index, the shards) and must
// reproduce the logits, the step-0 gradients and the SGD and AdamW
// trajectories; then the Hugging Face layout round trip, the config.json
// `dpt train --save-format hf` writes, and `dpt eval --logits-out`.
//
// "Within r": per tensor, max|a - b| <= r * max|b|. Every check runs on one
// thread (the same for all of them). The measured differences are printed
// as "[ measure  ]" lines, per class of tensor.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "cli_run.h"
#include "compare.h"
#include "core/threads.h"
#include "data/batches.h"
#include "data/shard_writer.h"
#include "io/safetensors.h"
#include "io/safetensors_set.h"
#include "models/decoder.h"
#include "models/hf_config.h"
#include "models/mlp.h"
#include "models/weights.h"
#include "optim/optimizer.h"

namespace dpt {
namespace {

namespace fs = std::filesystem;

std::string fixture(const std::string& name) { return DPT_SOURCE_DIR "/tests/fixtures/hf/" + name; }

// The fixtures' ids are stored as F32 ([B, T]).
Batch batch_from(const SafetensorsFile& f) {
  Batch b;
  const NamedTensor& tok = *f.find("tokens");
  b.B = tok.shape[0];
  b.T = tok.shape[1];
  for (float v : tok.data) b.tokens.push_back(static_cast<int32_t>(v));
  if (const NamedTensor* t = f.find("targets"))
    for (float v : t->data) b.targets.push_back(static_cast<int32_t>(v));
  else
    b.targets.assign(b.tokens.size(), 0);
  return b;
}

Decoder& decoder(Model& m) { return dynamic_cast<Decoder&>(m); }

// The class of a parameter, for the measurements.
std::string tensor_class(const std::string& name) {
  for (const char* c : {"logits", "losses", "embed_tokens", "lm_head", "norm", "bias", "self_attn", "mlp"})
    if (name.find(c) != std::string::npos) return c;
  return "other";
}

// The worst max|a - b| / max|b| per class of tensor, printed at the end.
struct Measure {
  std::map<std::string, double> worst;
  void add(const std::string& name, const test::Diff& d) {
    double& w = worst[tensor_class(name)];
    w = std::max(w, d.peak > 0 ? d.max_abs / d.peak : d.max_abs);
  }
  void print(const std::string& what) const {
    std::string line;
    for (const auto& [c, w] : worst) line += fmt::format(" {} {:.1e}", c, w);
    std::printf("[ measure  ] %s: max|diff|/max|want| per class:%s\n", what.c_str(), line.c_str());
  }
};

// Every element of got within rtol * max|want| (+ atol) of want, measured.
void expect_within(const std::string& what, const float* got, const NamedTensor& want, double atol, double rtol,
                   Measure& m) {
  m.add(what, test::diff(got, want.data.data(), want.data.size()));
  EXPECT_TRUE(test::all_close(got, want.data.data(), want.data.size(), atol, rtol)) << what;
}

class Llama : public ::testing::Test {
 protected:
  void SetUp() override { set_threads(1); }
};

// The engine's logits of the fixture's tokens within 1e-5 of transformers'.
void check_logits(Model& model, const std::string& file, const std::string& what) {
  const SafetensorsFile ref = load_safetensors(file);
  const std::vector<float> got = decoder(model).logits(batch_from(ref));
  const NamedTensor& want = *ref.find("logits");
  ASSERT_EQ(got.size(), want.data.size());
  Measure m;
  expect_within("logits", got.data(), want, 0, 1e-5, m);
  m.print(what);
}

TEST_F(Llama, GqaLogitsMatchTransformers) {
  auto model = model_from_file(fixture("llama_gqa"), {});
  EXPECT_FALSE(decoder(*model).tied());
  check_logits(*model, fixture("llama_gqa/logits.safetensors"), "llama_gqa logits");
}

TEST_F(Llama, Qwen2LogitsMatchTransformers) {
  auto model = model_from_file(fixture("qwen2"), {});
  EXPECT_TRUE(decoder(*model).tied());
  EXPECT_TRUE(decoder(*model).config().qkv_bias);
  check_logits(*model, fixture("qwen2/logits.safetensors"), "qwen2 logits");
}

TEST_F(Llama, RopeScaledLogitsMatchTransformersWithAndWithoutTheScaling) {
  // The scaling must change the logits far more than the tolerance, or the
  // comparison could not tell a model that ignores it.
  const SafetensorsFile scaled = load_safetensors(fixture("llama_rope_scaled/logits.safetensors"));
  const SafetensorsFile unscaled = load_safetensors(fixture("llama_rope_scaled/logits_unscaled.safetensors"));
  const NamedTensor &a = *scaled.find("logits"), &b = *unscaled.find("logits");
  ASSERT_EQ(a.data.size(), b.data.size());
  const test::Diff d = test::diff(a.data.data(), b.data.data(), a.data.size());
  std::printf("[ measure  ] scaled vs unscaled logits: max|diff|/max|want| %.2e\n", d.max_abs / d.peak);
  EXPECT_GT(d.max_abs, 1000 * 1e-5 * d.peak) << d.describe();

  auto model = model_from_file(fixture("llama_rope_scaled"), {});
  ASSERT_TRUE(decoder(*model).config().rope_scaling.has_value());
  check_logits(*model, fixture("llama_rope_scaled/logits.safetensors"), "llama_rope_scaled logits");
  // The same weights with the scaling dropped from the hyper-parameters.
  auto plain = model_from_file(fixture("llama_rope_scaled"), {{"rope_scaling", "none"}});
  ASSERT_FALSE(decoder(*plain).config().rope_scaling.has_value());
  check_logits(*plain, fixture("llama_rope_scaled/logits_unscaled.safetensors"), "llama_rope_scaled unscaled logits");
}

// Step-0 loss and gradients, then 20 SGD steps (lr 0.1) on the same batch:
// the loss before each step and the final weights within 1e-5.
void check_sgd(const std::string& name) {
  SCOPED_TRACE(name);
  auto model = model_from_file(fixture(name), {});
  const SafetensorsFile ref = load_safetensors(fixture(name + "/trajectory.safetensors"));
  const Batch batch = batch_from(ref);
  model->zero_grads();
  model->forward(batch);
  model->backward(1.0f);
  Measure grads;
  for (const Slot& s : model->layout().slots()) {
    const NamedTensor* g = ref.find("grad." + s.name);
    ASSERT_NE(g, nullptr) << s.name;
    // test_parity's tolerance for gradients.
    expect_within("grad " + s.name, model->grads() + s.offset, *g, 1e-7, 1e-4, grads);
  }
  grads.print(name + " step-0 gradients");

  OptimizerConfig oc;
  oc.name = "sgd";
  oc.momentum = 0;
  auto opt = make_optimizer(oc, model->layout(), 0, model->param_count());
  const NamedTensor& losses = *ref.find("losses");
  std::vector<float> got;
  for (size_t step = 0; step < losses.data.size(); ++step) {
    model->zero_grads();
    got.push_back(model->forward(batch).loss);
    model->backward(1.0f);
    opt->step(model->params(), model->grads(), 0.1f);
  }
  Measure fin;
  expect_within("losses", got.data(), losses, 0, 1e-5, fin);
  for (const Slot& s : model->layout().slots())
    expect_within("final " + s.name, model->params() + s.offset, *ref.find("final." + s.name), 0, 1e-5, fin);
  fin.print(name + " 20 SGD steps (losses, final weights)");
}

TEST_F(Llama, GqaSgdTrajectoryMatchesTransformers) { check_sgd("llama_gqa"); }
TEST_F(Llama, RopeScaledSgdTrajectoryMatchesTransformers) { check_sgd("llama_rope_scaled"); }
TEST_F(Llama, Qwen2SgdTrajectoryMatchesTransformers) { check_sgd("qwen2"); }

// 6 AdamW steps (lr 1e-3, betas 0.9/0.95, eps 1e-8, weight decay 0.1 on
// the 2-D parameters only, as the engine's layout marks them): losses and
// final weights within 1e-4.
void check_adamw(const std::string& name) {
  SCOPED_TRACE(name);
  auto model = model_from_file(fixture(name), {});
  const SafetensorsFile ref = load_safetensors(fixture(name + "/trajectory_adamw.safetensors"));
  const Batch batch = batch_from(ref);
  for (const Slot& s : model->layout().slots()) EXPECT_EQ(s.decay, s.shape.size() == 2) << s.name;
  OptimizerConfig oc;
  oc.name = "adamw";
  oc.beta1 = 0.9f;
  oc.beta2 = 0.95f;
  oc.eps = 1e-8f;
  oc.weight_decay = 0.1f;
  auto opt = make_optimizer(oc, model->layout(), 0, model->param_count());
  const NamedTensor& losses = *ref.find("losses");
  std::vector<float> got;
  for (size_t step = 0; step < losses.data.size(); ++step) {
    model->zero_grads();
    got.push_back(model->forward(batch).loss);
    model->backward(1.0f);
    opt->step(model->params(), model->grads(), 1e-3f);
  }
  Measure fin;
  expect_within("losses", got.data(), losses, 0, 1e-4, fin);
  for (const Slot& s : model->layout().slots()) {
    const NamedTensor& want = *ref.find("final." + s.name);
    if (!s.name.ends_with("self_attn.k_proj.bias")) {
      expect_within("final " + s.name, model->params() + s.offset, want, 0, 1e-4, fin);
      continue;
    }
    // Qwen2's key bias. Without rotary embeddings (GPT-2's, test_parity) it
    // adds q.b_k to every score of a query's row, which the softmax
    // ignores: its gradient is rounding, which AdamW's normalised step turns
    // into steps of up to lr either way. With them it is rotated by the
    // key's position, so most of it has a real gradient (up to 1e-2 here,
    // compared in the gradient and SGD checks above); but the pair of
    // channels of lowest frequency (i and i + hd/2 for i = hd/2 - 1: theta
    // 1e6, hd 8, at most 11 x 1e6^(-3/4) = 3.5e-4 radians over the 12
    // positions) is all but unrotated, so ignored, and its gradient is
    // rounding (1e-6 at step 0): measured, AdamW moves it up to 1.2e-5 away
    // from transformers (6.5e-5 of the tensor's max). Those two channels of
    // each key head are left out; the rest are compared.
    const int64_t hd = decoder(*model).config().head_dim();
    std::vector<float> got, kept;
    for (size_t i = 0; i < s.numel; ++i) {
      if (static_cast<int64_t>(i) % (hd / 2) == hd / 2 - 1) continue;
      got.push_back(model->params()[s.offset + i]);
      kept.push_back(want.data[i]);
    }
    EXPECT_EQ(got.size(), s.numel - s.numel / (hd / 2));
    expect_within("final " + s.name + " (but the lowest-frequency channels)", got.data(),
                  NamedTensor{want.name, DType::F32, {static_cast<int64_t>(kept.size())}, kept}, 0, 1e-4, fin);
  }
  fin.print(name + " 6 AdamW steps (losses, final weights)");
}

TEST_F(Llama, GqaAdamWTrajectoryMatchesTransformers) { check_adamw("llama_gqa"); }
TEST_F(Llama, RopeScaledAdamWTrajectoryMatchesTransformers) { check_adamw("llama_rope_scaled"); }
TEST_F(Llama, Qwen2AdamWTrajectoryMatchesTransformers) { check_adamw("qwen2"); }

// A scratch directory per test.
fs::path scratch(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / fmt::format("dpt_llama_{}_{}", name, ::getpid());
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// Load a fixture, save it sharded in Hugging Face's layout with a small
// cap, load it again: bitwise the same parameters, and every tensor of the
// saved set bitwise the fixture's under the fixture's names (no others).
void check_round_trip(const std::string& name) {
  SCOPED_TRACE(name);
  const fs::path dir = scratch("roundtrip_" + name);
  auto model = model_from_file(fixture(name), {});
  save_weights(*model, (dir / "model.safetensors").string(), WeightFormat::Hf, 16 * 1024);
  const SafetensorsSet saved(dir.string());
  EXPECT_TRUE(saved.sharded());
  EXPECT_GE(saved.files().size(), 3u);  // 80 KB of weights under a 16 KiB cap
  EXPECT_EQ(saved.metadata().at("format"), "pt");  // what transformers' loader demands
  const SafetensorsSet original(fixture(name));
  ASSERT_EQ(saved.tensors().size(), original.tensors().size());
  for (const TensorSpec& t : original.tensors()) {
    const TensorSpec* s = saved.find(t.name);
    ASSERT_NE(s, nullptr) << t.name;
    EXPECT_EQ(s->shape, t.shape) << t.name;
    std::vector<float> a(t.numel()), b(t.numel());
    original.read(t.name, 0, a.size(), a.data());
    saved.read(t.name, 0, b.size(), b.data());
    EXPECT_TRUE(test::bitwise_equal(b.data(), a.data(), a.size())) << t.name;
  }
  EXPECT_EQ(saved.find("lm_head.weight") == nullptr, decoder(*model).tied());
  auto again = model_from_file(dir.string(), {});
  ASSERT_EQ(again->param_count(), model->param_count());
  EXPECT_EQ(again->metadata(), model->metadata());
  EXPECT_TRUE(test::bitwise_equal(again->params(), model->params(), model->param_count()));
  fs::remove_all(dir);
}

TEST_F(Llama, HfShardedRoundTripIsBitwiseUntied) { check_round_trip("llama_gqa"); }
TEST_F(Llama, HfShardedRoundTripIsBitwiseTiedWithoutLmHead) { check_round_trip("qwen2"); }
TEST_F(Llama, HfShardedRoundTripIsBitwiseRopeScaled) { check_round_trip("llama_rope_scaled"); }

// Training from scratch: a small Llama (GQA, untied) learns one batch.
TEST_F(Llama, LossFalls) {
  DecoderConfig c = DecoderConfig::llama();
  c.vocab = 32;
  c.layers = 2;
  c.heads = 4;
  c.kv_heads = 2;
  c.width = 32;
  c.head_size = 8;
  c.intermediate = 48;
  c.context = 16;
  Decoder model(c);
  model.init_params(3);
  Batch batch;
  fill_synthetic(model, 4, 7, batch);
  OptimizerConfig oc;
  oc.name = "adamw";
  auto opt = make_optimizer(oc, model.layout(), 0, model.param_count());
  float first = 0, last = 0;
  for (int step = 0; step < 40; ++step) {
    model.zero_grads();
    last = model.forward(batch).loss;
    if (step == 0) first = last;
    model.backward(1.0f);
    opt->step(model.params(), model.grads(), 1e-2f);
  }
  std::printf("[ measure  ] llama loss: %.4f -> %.4f in 40 AdamW steps\n", first, last);
  EXPECT_NEAR(first, std::log(32.0), 0.1);  // N(0, 0.02) weights: uniform predictions
  EXPECT_LT(last, 0.3f * first);
}

// The `dpt` command on the fixtures.
class LlamaCli : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = scratch(::testing::UnitTest::GetInstance()->current_test_info()->name()); }
  void TearDown() override { fs::remove_all(dir_); }
  test::RunResult dpt(const std::string& args) const {
    return test::run_shell(fmt::format("{}/dpt {}", DPT_BINARY_DIR, args), dir_, 120);
  }
  // An llm.c token shard of these tokens.
  std::string shard(const std::string& name, const std::vector<int32_t>& tokens) const {
    const std::vector<uint16_t> t(tokens.begin(), tokens.end());
    const fs::path p = dir_ / name;
    write_llmc_shard(p.string(), t.data(), static_cast<int64_t>(t.size()));
    return p.string();
  }
  fs::path dir_;
};

TEST_F(LlamaCli, EvalLogitsOutMatchesTransformers) {
  // Windows of --context 12 (+1 target) at multiples of 12: the fixture's two
  // sequences back to back, then one token for the last target.
  const SafetensorsFile ref = load_safetensors(fixture("qwen2/logits.safetensors"));
  std::vector<int32_t> tokens = batch_from(ref).tokens;
  tokens.push_back(0);
  const std::string data = shard("tokens.bin", tokens);
  const fs::path out = dir_ / "logits.safetensors";
  const test::RunResult r = dpt(fmt::format("eval --weights {} --data {} --context 12 --threads 1 --logits-out {}",
                                            test::q(fixture("qwen2")), test::q(data), test::q(out)));
  ASSERT_EQ(r.code, 0) << r.all();
  EXPECT_NE(r.out.find("(24 positions)"), std::string::npos) << r.out;
  const SafetensorsFile got = load_safetensors(out.string());
  const NamedTensor* logits = got.find("logits");
  ASSERT_NE(logits, nullptr);
  EXPECT_EQ(logits->shape, (std::vector<int64_t>{24, 96}));
  Measure m;
  expect_within("logits", logits->data.data(), *ref.find("logits"), 0, 1e-5, m);
  m.print("dpt eval --logits-out, qwen2");
}

TEST_F(LlamaCli, EvalLogitsOutIsRefusedForAnMlp) {
  Mlp mlp(MlpConfig{{784, 16, 10}});
  mlp.init_params(1);
  const fs::path weights = dir_ / "mlp.safetensors";
  save_weights(mlp, weights.string());
  const fs::path out = dir_ / "logits.safetensors";
  const test::RunResult r =
      dpt(fmt::format("eval --weights {} --threads 1 --logits-out {}", test::q(weights), test::q(out)));
  EXPECT_EQ(r.code, 1) << r.all();
  EXPECT_TRUE(r.err.starts_with("dpt: error: ")) << r.err;
  EXPECT_NE(r.err.find("--logits-out"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_FALSE(fs::exists(out));
}

TEST_F(LlamaCli, SaveFormatHfWritesConfigJsonThatRebuildsTheModel) {
  // One step on a shard of 1000 tokens below the fixture's vocabulary.
  std::vector<int32_t> tokens;
  for (int i = 0; i < 1000; ++i) tokens.push_back((i * 37 + 11) % 96);
  const std::string data = shard("train.bin", tokens);
  const fs::path saved = dir_ / "out" / "model.safetensors";
  fs::create_directories(saved.parent_path());
  const test::RunResult r =
      dpt(fmt::format("train --load {} --data {} --batch 1 --steps 1 --threads 1 --quiet --save {} --save-format hf",
                      test::q(fixture("llama_gqa")), test::q(data), test::q(saved)));
  ASSERT_EQ(r.code, 0) << r.all();
  const fs::path config = saved.parent_path() / "config.json";
  ASSERT_TRUE(fs::exists(config));
  // The config.json alone gives the fixture's hyper-parameters back, and the
  // model the directory rebuilds has them.
  const auto from_config = DecoderConfig::from(read_hf_config(config.string())).metadata();
  EXPECT_EQ(from_config, DecoderConfig::from(read_hf_config(fixture("llama_gqa/config.json"))).metadata());
  auto model = model_from_file(saved.parent_path().string(), {});
  EXPECT_EQ(model->metadata(), from_config);
  // And from config.json alone: the same tensors in a file without the
  // engine's metadata (as transformers writes them) rebuild the same model.
  const SafetensorsFile file = load_safetensors(saved.string());
  const fs::path bare = dir_ / "bare";
  fs::create_directories(bare);
  fs::copy_file(config, bare / "config.json");
  std::vector<TensorSpec> specs;
  for (const NamedTensor& t : file.tensors) specs.push_back({t.name, DType::F32, t.shape});
  SafetensorsWriter w((bare / "model.safetensors").string(), specs, {{"format", "pt"}});
  for (const NamedTensor& t : file.tensors) w.write(t.data.data(), t.data.size());
  w.commit();
  auto rebuilt = model_from_file(bare.string(), {});
  EXPECT_EQ(rebuilt->metadata(), from_config);
  EXPECT_TRUE(test::bitwise_equal(rebuilt->params(), model->params(), model->param_count()));
}

TEST_F(LlamaCli, SaveFormatHfRefusesUpFrontAModelItsConfigCannotSay) {
  // A llama with q/k/v biases but none on o_proj: a llama config.json's
  // attention_bias covers all four, so no config.json could say it.
  DecoderConfig c = DecoderConfig::llama();
  c.vocab = 32;
  c.layers = 1;
  c.width = 16;
  c.intermediate = 24;
  c.context = 8;
  c.qkv_bias = true;
  Decoder model(c);
  model.init_params(1);
  const fs::path weights = dir_ / "w.safetensors", saved = dir_ / "out.safetensors";
  save_weights(model, weights.string());
  const test::RunResult r = dpt(fmt::format("train --load {} --synthetic --steps 1 --threads 1 --save {} --save-format hf",
                                            test::q(weights), test::q(saved)));
  EXPECT_EQ(r.code, 1) << r.all();
  EXPECT_NE(r.err.find("qkv_bias 1 with o_bias 0"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("step"), std::string::npos) << "refused before any step: " << r.out;
  EXPECT_FALSE(fs::exists(saved));
}

}  // namespace
}  // namespace dpt
