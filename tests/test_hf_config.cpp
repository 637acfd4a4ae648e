// Hugging Face's config.json and the engine's hyper-parameters
// (models/hf_config.h): the published configs of the presets translated
// key by key, each refusal with its sentence, config.json written from
// hyper-parameters and read back to the same ones, GPT-2's route kept, and
// the Llama-family presets against their published parameter counts.
#include <unistd.h>

#include <filesystem>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "models/hf_config.h"
#include "models/presets.h"

namespace dpt {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Hparams = std::map<std::string, std::string>;

// SmolLM2-135M's config.json as published (every key, the unread ones too).
const char* kSmolLM2 = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 0, "eos_token_id": 0, "hidden_act": "silu", "hidden_size": 576,
  "initializer_range": 0.041666666666666664, "intermediate_size": 1536, "is_llama_config": true,
  "max_position_embeddings": 8192, "model_type": "llama", "num_attention_heads": 9, "num_hidden_layers": 30,
  "num_key_value_heads": 3, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_interleaved": false,
  "rope_scaling": null, "rope_theta": 100000, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.40.1", "use_cache": true, "vocab_size": 49152})";

// Qwen2.5-0.5B's: sliding_window given, use_sliding_window false.
const char* kQwen25 = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
  "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24, "model_type": "qwen2",
  "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.40.1", "use_cache": true, "use_mrope": false, "use_sliding_window": false,
  "vocab_size": 151936})";

// Llama-3.2-1B's, with Llama 3's rope scaling.
const char* kLlama32 = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048,
  "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 131072, "mlp_bias": false,
  "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 128256})";

// A Mistral-7B-v0.3-like config: no sliding window.
const char* kMistral = R"({
  "architectures": ["MistralForCausalLM"], "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336,
  "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32, "num_hidden_layers": 32,
  "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": null,
  "tie_word_embeddings": false, "vocab_size": 32768})";

Hparams translate(const std::string& text) { return llama_hparams_from_hf_config(json::parse(text), "config.json"); }

// The translation of `base` with `edit` applied (keys set; null values kept).
Hparams translate(const char* base, const json& edit) {
  json j = json::parse(base);
  for (const auto& [k, v] : edit.items()) j[k] = v;
  return llama_hparams_from_hf_config(j, "config.json");
}

// The sentence the translation of `base` + `edit` is refused with.
std::string refusal(const char* base, const json& edit) {
  try {
    translate(base, edit);
  } catch (const InputError& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(HfConfig, SmolLM2TranslatesKeyByKey) {
  const Hparams want = {{"dpt.model", "llama"},     {"model_type", "llama"},  {"vocab_size", "49152"},
                        {"n_layer", "30"},          {"n_head", "9"},          {"n_kv_head", "3"},
                        {"n_embd", "576"},          {"head_dim", "64"},       {"intermediate_size", "1536"},
                        {"block_size", "8192"},     {"rope_theta", "100000"}, {"rms_norm_eps", "1e-05"},
                        {"tie_word_embeddings", "1"}, {"qkv_bias", "0"},      {"o_bias", "0"}};
  EXPECT_EQ(translate(kSmolLM2), want);
}

TEST(HfConfig, Llama32CarriesItsRopeScaling) {
  const Hparams hp = translate(kLlama32);
  EXPECT_EQ(hp.at("rope_scaling"), "llama3");
  EXPECT_EQ(hp.at("rope_factor"), "32");
  EXPECT_EQ(hp.at("rope_low_freq_factor"), "1");
  EXPECT_EQ(hp.at("rope_high_freq_factor"), "4");
  EXPECT_EQ(hp.at("rope_original_max_position_embeddings"), "8192");
  EXPECT_EQ(hp.at("rope_theta"), "500000");
  EXPECT_EQ(hp.at("head_dim"), "64");
  EXPECT_EQ(hp.at("n_kv_head"), "8");
  EXPECT_EQ(hp.at("block_size"), "131072");
  // The older spelling of the type key, and transformers 5's rope_parameters.
  json older = json::parse(kLlama32);
  older["rope_scaling"].erase("rope_type");
  older["rope_scaling"]["type"] = "llama3";
  EXPECT_EQ(llama_hparams_from_hf_config(older, "c"), hp);
  json v5 = json::parse(kLlama32);
  v5["rope_parameters"] = v5["rope_scaling"];
  v5["rope_parameters"]["rope_theta"] = 500000.0;
  v5.erase("rope_scaling");
  v5.erase("rope_theta");
  EXPECT_EQ(llama_hparams_from_hf_config(v5, "c"), hp);
  // "default" and null are no scaling.
  for (const json& none : {json(nullptr), json{{"rope_type", "default"}}})
    EXPECT_FALSE(translate(kLlama32, {{"rope_scaling", none}}).count("rope_scaling")) << none.dump();
}

TEST(HfConfig, Qwen2HasQkvBiasesAndLoadsWithAnInactiveSlidingWindow) {
  const Hparams hp = translate(kQwen25);
  EXPECT_EQ(hp.at("model_type"), "qwen2");
  EXPECT_EQ(hp.at("qkv_bias"), "1");
  EXPECT_EQ(hp.at("o_bias"), "0");
  EXPECT_EQ(hp.at("head_dim"), "64");
  EXPECT_EQ(hp.at("rms_norm_eps"), "1e-06");
  EXPECT_EQ(hp.at("rope_theta"), "1000000");
  // use_sliding_window with a window covering every position, or only from
  // a layer past the last, changes nothing.
  EXPECT_NO_THROW(translate(kQwen25, {{"use_sliding_window", true}}));
  EXPECT_NO_THROW(translate(kQwen25, {{"use_sliding_window", true}, {"sliding_window", 4096}}));
  EXPECT_EQ(refusal(kQwen25, {{"use_sliding_window", true}, {"sliding_window", 4096}, {"max_window_layers", 21}}),
            "config.json: use_sliding_window is true (a window of 4096 positions from layer 21 on), and "
            "sliding-window attention is not implemented");
}

TEST(HfConfig, MistralLoadsWithoutASlidingWindowAndIsRefusedWithOne) {
  const Hparams hp = translate(kMistral);
  EXPECT_EQ(hp.at("model_type"), "mistral");
  EXPECT_EQ(hp.at("qkv_bias"), "0");
  EXPECT_EQ(hp.at("head_dim"), "128");
  EXPECT_EQ(hp.at("tie_word_embeddings"), "0");
  EXPECT_NO_THROW(translate(kMistral, {{"sliding_window", 32768}}));  // covers every position
  EXPECT_EQ(refusal(kMistral, {{"sliding_window", 4096}}),
            "config.json: sliding_window is 4096, below max_position_embeddings 32768, and sliding-window attention "
            "is not implemented (null means full attention)");
  json absent = json::parse(kMistral);
  absent.erase("sliding_window");
  try {
    llama_hparams_from_hf_config(absent, "config.json");
    FAIL() << "transformers' default window of 4096 is active";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(), "config.json: sliding_window is 4096 (transformers' default), below "
                           "max_position_embeddings 32768, and sliding-window attention is not implemented (null "
                           "means full attention)");
  }
}

TEST(HfConfig, DefaultsAreTransformers) {
  json j = {{"model_type", "llama"}, {"vocab_size", 64},       {"hidden_size", 32},
            {"intermediate_size", 48}, {"num_hidden_layers", 2}, {"num_attention_heads", 4}};
  const Hparams hp = llama_hparams_from_hf_config(j, "c");
  EXPECT_EQ(hp.at("n_kv_head"), "4");  // llama: the head count
  EXPECT_EQ(hp.at("head_dim"), "8");
  EXPECT_EQ(hp.at("block_size"), "2048");
  EXPECT_EQ(hp.at("rms_norm_eps"), "1e-06");
  EXPECT_EQ(hp.at("rope_theta"), "10000");
  EXPECT_EQ(hp.at("tie_word_embeddings"), "0");
  EXPECT_EQ(hp.at("qkv_bias"), "0");
  j["model_type"] = "qwen2";
  j["num_key_value_heads"] = 2;
  EXPECT_EQ(llama_hparams_from_hf_config(j, "c").at("block_size"), "32768");
}

TEST(HfConfig, EveryRefusalIsOneSentenceNamingTheKey) {
  const std::pair<json, std::string> cases[] = {
      {{{"model_type", "gemma"}},
       "config.json: model_type 'gemma' is not supported (known: gpt2, llama, qwen2, mistral)"},
      {{{"hidden_size", nullptr}}, "config.json: required key hidden_size is missing"},
      {{{"hidden_size", "576"}}, "config.json: hidden_size is \"576\", not a positive integer"},
      {{{"rms_norm_eps", -1}}, "config.json: rms_norm_eps is -1, not a positive number"},
      {{{"tie_word_embeddings", 1}}, "config.json: tie_word_embeddings is 1, not true or false"},
      {{{"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}}}},
       "config.json: rope_scaling.rope_type 'yarn' is not implemented (implemented: default, llama3)"},
      {{{"rope_scaling", {{"type", "linear"}, {"factor", 4.0}}}},
       "config.json: rope_scaling.type 'linear' is not implemented (implemented: default, llama3)"},
      {{{"rope_scaling", {{"factor", 4.0}}}}, "config.json: rope_scaling gives neither rope_type nor type"},
      {{{"rope_scaling", {{"rope_type", "llama3"}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                          {"original_max_position_embeddings", 8192}}}},
       "config.json: required key rope_scaling.factor is missing"},
      {{{"rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 4.0},
                          {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}}}},
       "config.json: rope_scaling.high_freq_factor 4 must be above rope_scaling.low_freq_factor 4"},
      {{{"rope_scaling", 2}}, "config.json: rope_scaling is 2, not an object"},
      {{{"mlp_bias", true}}, "config.json: mlp_bias is true, but the engine's SwiGLU MLP has no biases"},
      {{{"hidden_act", "gelu"}},
       "config.json: hidden_act is 'gelu', but the engine's SwiGLU MLP implements silu only"},
      {{{"num_key_value_heads", 2}}, "config.json: num_key_value_heads 2 does not divide num_attention_heads 9"},
      {{{"num_attention_heads", 7}, {"num_key_value_heads", 7}},
       "config.json: hidden_size 576 is not a multiple of num_attention_heads 7 and no head_dim is given"},
      {{{"head_dim", 63}}, "config.json: head_dim 63 is odd, and rotary embeddings rotate pairs of channels"},
      {{{"layer_types", {"full_attention", "sliding_attention"}}},
       "config.json: layer_types gives layer 1 \"sliding_attention\" attention; only full attention is "
       "implemented"},
  };
  for (const auto& [edit, sentence] : cases) EXPECT_EQ(refusal(kSmolLM2, edit), sentence) << edit.dump();
  EXPECT_EQ(refusal(kQwen25, {{"attention_bias", true}}),
            "config.json: attention_bias is true, but a qwen2 model's attention biases are fixed (on q, k and v, "
            "not on o_proj) and transformers does not read the key");
  EXPECT_EQ(refusal(kQwen25, {{"num_key_value_heads", nullptr}}),
            "config.json: required key num_key_value_heads is missing");
  EXPECT_EQ(refusal(kSmolLM2, {{"model_type", nullptr}}), "config.json: required key model_type is missing");
  // A sentence is one line.
  for (const auto& [edit, sentence] : cases) EXPECT_EQ(sentence.find('\n'), std::string::npos);
}

TEST(HfConfig, LlamaAttentionBiasCoversAllFourProjections) {
  const Hparams hp = translate(kSmolLM2, {{"attention_bias", true}});
  EXPECT_EQ(hp.at("qkv_bias"), "1");
  EXPECT_EQ(hp.at("o_bias"), "1");
}

TEST(HfConfig, GptTwoConfigsKeepTheirRoute) {
  const json gpt2 = {{"n_layer", 2}, {"n_head", 4}, {"n_embd", 32}, {"n_positions", 16}, {"vocab_size", 300}};
  const Hparams want = {{"dpt.model", "gpt"}, {"n_layer", "2"},     {"n_head", "4"},
                        {"n_embd", "32"},     {"block_size", "16"}, {"vocab_size", "300"}};
  EXPECT_EQ(hparams_from_hf_config(gpt2, "c"), want);  // no model_type: GPT-2's keys
  json typed = gpt2;
  typed["model_type"] = "gpt2";
  EXPECT_EQ(hparams_from_hf_config(typed, "c"), want);
  EXPECT_EQ(hparams_from_hf_config(json::parse(kQwen25), "c"), translate(kQwen25));
  typed["model_type"] = "phi3";
  try {
    hparams_from_hf_config(typed, "c");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(), "c: model_type 'phi3' is not supported (known: gpt2, llama, qwen2, mistral)");
  }
}

// config.json from hyper-parameters, read back: the same hyper-parameters.
TEST(HfConfig, WrittenConfigReadsBackToTheSameHparams) {
  std::vector<Hparams> all = {translate(kSmolLM2), translate(kLlama32), translate(kQwen25), translate(kMistral),
                              translate(kSmolLM2, {{"attention_bias", true}})};
  for (const std::string& name : llama_preset_names()) all.push_back(*llama_preset(name));
  for (const Hparams& hp : all) {
    const json j = hf_config_from_hparams(hp);
    EXPECT_EQ(llama_hparams_from_hf_config(j, "written"), hp) << j.dump();
    EXPECT_EQ(j.at("torch_dtype"), "float32");
  }
  EXPECT_EQ(hf_config_from_hparams(translate(kQwen25)).at("architectures"), json::array({"Qwen2ForCausalLM"}));
  EXPECT_EQ(hf_config_from_hparams(translate(kMistral)).at("architectures"), json::array({"MistralForCausalLM"}));
  EXPECT_TRUE(hf_config_from_hparams(translate(kMistral)).at("sliding_window").is_null());
  // Through a file beside the weights, atomically written.
  const fs::path dir = fs::temp_directory_path() / fmt::format("dpt_hf_config_{}", ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  write_hf_config((dir / "model.safetensors.index.json").string(), all[1]);
  EXPECT_EQ(read_hf_config((dir / "config.json").string()), all[1]);
  write_hf_config(dir.string(), all[2]);  // a directory: config.json inside it
  EXPECT_EQ(read_hf_config((dir / "config.json").string()), all[2]);
  size_t files = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++files;
  EXPECT_EQ(files, 1u);  // no temporary left
  fs::remove_all(dir);
}

TEST(HfConfig, HparamsAModelTypeCannotSayAreRefused) {
  Hparams llama = translate(kSmolLM2);
  llama["qkv_bias"] = "1";
  EXPECT_THROW(
      {
        try {
          hf_config_from_hparams(llama);
        } catch (const InputError& e) {
          EXPECT_STREQ(e.what(), "a llama config.json cannot say qkv_bias 1 with o_bias 0 (its attention_bias "
                                 "covers q, k, v and o_proj alike)");
          throw;
        }
      },
      InputError);
  Hparams qwen = translate(kQwen25);
  qwen["qkv_bias"] = "0";
  EXPECT_THROW(hf_config_from_hparams(qwen), InputError);
  Hparams mistral = translate(kMistral);
  mistral["o_bias"] = "1";
  EXPECT_THROW(hf_config_from_hparams(mistral), InputError);
  Hparams missing = translate(kSmolLM2);
  missing.erase("n_kv_head");
  try {
    hf_config_from_hparams(missing);
    FAIL();
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(), "hyper-parameter n_kv_head is missing, so no config.json can be written");
  }
}

// Parameters of a "llama" model from its hyper-parameters: embedding, head
// when untied, per layer q/k/v/o (+ biases), gate/up/down and two norms,
// then the final norm.
uint64_t llama_params(const Hparams& hp) {
  auto n = [&](const char* k) { return std::stoull(hp.at(k)); };
  const uint64_t V = n("vocab_size"), C = n("n_embd"), L = n("n_layer"), H = n("n_head"), K = n("n_kv_head"),
                 D = n("head_dim"), I = n("intermediate_size");
  const bool tied = hp.at("tie_word_embeddings") == "1", qkv = hp.at("qkv_bias") == "1",
             o = hp.at("o_bias") == "1";
  const uint64_t attn = C * H * D + 2 * C * K * D + H * D * C + (qkv ? H * D + 2 * K * D : 0) + (o ? C : 0);
  return V * C * (tied ? 1 : 2) + L * (attn + 3 * C * I + 2 * C) + C;
}

TEST(HfConfig, PresetsHaveThePublishedShapes) {
  // The models' published parameter counts (tied heads counted once), and
  // W-LLAMA's from shared/WORKLOADS.md.
  const std::pair<const char*, uint64_t> expected[] = {{"smollm2-135m", 134'515'008},
                                                       {"llama-3.2-1b", 1'235'814'400},
                                                       {"qwen2.5-0.5b", 494'032'768},
                                                       {"w-llama", 3'082'496}};
  for (const auto& [name, params] : expected) {
    const auto hp = llama_preset(name);
    ASSERT_TRUE(hp) << name;
    EXPECT_EQ(hp->at("dpt.model"), "llama");
    EXPECT_EQ(llama_params(*hp), params) << name;
    EXPECT_TRUE(model_preset(name) == hp) << name;
  }
  const Hparams w = *llama_preset("w-llama");
  EXPECT_EQ(w.at("block_size"), "128");
  EXPECT_EQ(w.at("rms_norm_eps"), "1e-05");
  EXPECT_EQ(w.at("rope_theta"), "10000");
  EXPECT_EQ(w.at("tie_word_embeddings"), "0");
  EXPECT_EQ(llama_preset("llama-3.2-1b")->at("rope_scaling"), "llama3");
  EXPECT_EQ(llama_preset("qwen2.5-0.5b")->at("qkv_bias"), "1");
  EXPECT_FALSE(llama_preset("gpt2"));
  EXPECT_TRUE(model_preset("gpt2") == gpt_preset("gpt2"));
  EXPECT_EQ(model_preset_names().size(), gpt_preset_names().size() + 4);
}

}  // namespace
}  // namespace dpt
