// Hugging Face's config.json and the engine's hyper-parameters, both ways
// (docs/models.md).
//
// The Llama family (model_type "llama", "qwen2", "mistral") becomes the
// engine's "llama" model: dpt.model = "llama" and the keys vocab_size,
// n_layer, n_head, n_kv_head, n_embd, head_dim, intermediate_size,
// block_size (max_position_embeddings), rope_theta, rms_norm_eps,
// tie_word_embeddings, qkv_bias, o_bias ("1"/"0"), model_type, and with
// Llama 3's rope scaling rope_scaling = "llama3", rope_factor,
// rope_low_freq_factor, rope_high_freq_factor,
// rope_original_max_position_embeddings. GPT-2's config.json (model_type
// "gpt2", or none) keeps its own translation (models/hf_gpt2.h).
//
// Anything the engine cannot represent is refused before any work, with
// InputError, one sentence that starts with the file and names the key.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace dpt {

// The model_type values a config.json may have: gpt2, llama, qwen2, mistral.
std::vector<std::string> hf_model_types();

// The engine's hyper-parameters for a Llama-family config (model_type
// llama, qwen2 or mistral); `where` (the file) starts every message.
// Required: model_type, vocab_size, hidden_size, intermediate_size,
// num_hidden_layers, num_attention_heads, and for qwen2 and mistral
// num_key_value_heads; the other keys default as transformers defaults
// them. Refused: an unknown model_type, a missing or mistyped key, a rope
// scaling type other than default and llama3, active sliding-window
// attention, mlp_bias true, hidden_act other than silu, head counts or
// sizes that do not fit together.
std::map<std::string, std::string> llama_hparams_from_hf_config(const nlohmann::json& config,
                                                                const std::string& where);

// Any config.json, routed by model_type: gpt2 (or no model_type: GPT-2's
// n_layer, n_head, n_embd, n_positions, vocab_size) or the Llama family;
// refused, listing the known ones, for any other.
std::map<std::string, std::string> hparams_from_hf_config(const nlohmann::json& config, const std::string& where);

// Reads the config.json at path and translates it (IoError if it cannot be
// read, InputError if it is not JSON).
std::map<std::string, std::string> read_hf_config(const std::string& path);

// The config.json of a "llama" model's hyper-parameters: architectures
// (LlamaForCausalLM, Qwen2ForCausalLM or MistralForCausalLM by model_type,
// "llama" when absent), torch_dtype "float32" and every key read above, so
// that llama_hparams_from_hf_config gives the same hyper-parameters back
// (padded_vocab_size, a memory layout, is not written). InputError for
// hyper-parameters the model_type cannot express (a llama with q/k/v biases
// but none on o_proj, a qwen2 without q/k/v biases, a mistral with any).
nlohmann::json hf_config_from_hparams(const std::map<std::string, std::string>& hparams);

// Writes hf_config_from_hparams(hparams) as config.json in the directory of
// weights_path (a file, an index, or a directory itself), atomically.
void write_hf_config(const std::string& weights_path, const std::map<std::string, std::string>& hparams);

// The end-of-sequence token ids of the model whose weights are at
// weights_path (a file, an index or a directory): eos_token_id in the
// generation_config.json beside them when there is one (as transformers'
// generate reads it: that file's value, absent meaning none), else in the
// config.json, else none. One id or a list of ids; null is none. IoError
// for a file that cannot be read, InputError naming the file for a value
// that is not an id >= 0 or a list of them, or a file that is not JSON.
std::vector<int32_t> hf_eos_token_ids(const std::string& weights_path);

}  // namespace dpt
