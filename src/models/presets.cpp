#include "models/presets.h"

#include <nlohmann/json.hpp>

#include "models/hf_config.h"

namespace dpt {

namespace {

struct Preset {
  const char* name;
  int layers, heads, width;
};
// nanoGPT's model.py GPT.from_pretrained, llm.c's train_gpt2.py.
constexpr Preset kPresets[] = {
    {"gpt2", 12, 12, 768},
    {"gpt2-medium", 24, 16, 1024},
    {"gpt2-large", 36, 20, 1280},
    {"gpt2-xl", 48, 25, 1600},
};

// The keys of each published config.json that the translation reads
// (models/hf_config.h), copied value for value; docs/models.md cites each
// file. Keys the engine has no use for (token ids, torch_dtype,
// initializer_range) are left out.
struct LlamaPreset {
  const char* name;
  const char* config;
};
constexpr LlamaPreset kLlamaPresets[] = {
    // https://huggingface.co/HuggingFaceTB/SmolLM2-135M/blob/main/config.json
    {"smollm2-135m", R"({"model_type": "llama", "vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536,
        "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
        "max_position_embeddings": 8192, "rms_norm_eps": 1e-05, "rope_theta": 100000, "rope_scaling": null,
        "tie_word_embeddings": true, "attention_bias": false, "hidden_act": "silu"})"},
    // https://huggingface.co/meta-llama/Llama-3.2-1B/blob/main/config.json
    {"llama-3.2-1b", R"({"model_type": "llama", "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192,
        "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
        "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
        "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "tie_word_embeddings": true, "attention_bias": false, "mlp_bias": false, "hidden_act": "silu"})"},
    // https://huggingface.co/Qwen/Qwen2.5-0.5B/blob/main/config.json
    {"qwen2.5-0.5b", R"({"model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864,
        "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
        "max_position_embeddings": 32768, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
        "sliding_window": 32768, "use_sliding_window": false, "max_window_layers": 24,
        "tie_word_embeddings": true, "hidden_act": "silu"})"},
    // W-LLAMA (shared/WORKLOADS.md), written as the config.json it would have.
    {"w-llama", R"({"model_type": "llama", "vocab_size": 256, "hidden_size": 256, "intermediate_size": 704,
        "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
        "max_position_embeddings": 128, "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "rope_scaling": null,
        "tie_word_embeddings": false, "attention_bias": false, "mlp_bias": false, "hidden_act": "silu"})"},
};

}  // namespace

std::optional<std::map<std::string, std::string>> gpt_preset(const std::string& name) {
  for (const Preset& p : kPresets)
    if (name == p.name)
      return std::map<std::string, std::string>{{"dpt.model", "gpt"},
                                                {"vocab_size", "50257"},
                                                {"padded_vocab_size", "50304"},  // 786 x 64
                                                {"block_size", "1024"},
                                                {"n_layer", std::to_string(p.layers)},
                                                {"n_head", std::to_string(p.heads)},
                                                {"n_embd", std::to_string(p.width)}};
  return std::nullopt;
}

std::vector<std::string> gpt_preset_names() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.emplace_back(p.name);
  return names;
}

std::optional<std::map<std::string, std::string>> llama_preset(const std::string& name) {
  for (const LlamaPreset& p : kLlamaPresets)
    if (name == p.name) return llama_hparams_from_hf_config(nlohmann::json::parse(p.config), "preset " + name);
  return std::nullopt;
}

std::vector<std::string> llama_preset_names() {
  std::vector<std::string> names;
  for (const LlamaPreset& p : kLlamaPresets) names.emplace_back(p.name);
  return names;
}

std::optional<std::map<std::string, std::string>> model_preset(const std::string& name) {
  if (auto hp = gpt_preset(name)) return hp;
  return llama_preset(name);
}

std::vector<std::string> model_preset_names() {
  std::vector<std::string> names = gpt_preset_names();
  for (const std::string& n : llama_preset_names()) names.push_back(n);
  return names;
}

}  // namespace dpt
