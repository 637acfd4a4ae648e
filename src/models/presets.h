// Named model shapes (`--model gpt2` ...). A preset is a set of
// hyper-parameters for one of the engine's models; flags given beside it
// win. docs/models.md lists them with their sources.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace dpt {

// GPT-2 and its larger siblings as nanoGPT and llm.c define them: "gpt2"
// (124M), "gpt2-medium" (350M), "gpt2-large" (774M), "gpt2-xl" (1558M):
// vocab_size 50257 held as 50304 rows in memory (padded_vocab_size, a
// multiple of 64, as llm.c; files hold 50257), block_size 1024, and their
// layers, heads and width; with "dpt.model" = "gpt". nullopt for any other
// name.
std::optional<std::map<std::string, std::string>> gpt_preset(const std::string& name);

// The GPT preset names, for --model's help and check.
std::vector<std::string> gpt_preset_names();

// Llama-family shapes, "dpt.model" = "llama" (models/hf_config.h's keys),
// each the translation of its published config.json (docs/models.md cites
// each file): "smollm2-135m" (HuggingFaceTB/SmolLM2-135M), "llama-3.2-1b"
// (meta-llama/Llama-3.2-1B, with Llama 3's rope scaling), "qwen2.5-0.5b"
// (Qwen/Qwen2.5-0.5B, q/k/v biases), all three with a tied head; and
// "w-llama", the shared workload W-LLAMA (vocabulary 256, 4 layers, width
// 256, 4 heads, 2 key/value heads of 64, SwiGLU 704, RMSNorm eps 1e-5, rope
// theta 10000, no biases, untied head, context 128). block_size is the
// published max_position_embeddings (8192, 131072, 32768): the model's
// limit, which the saved config.json gives back; a training run picks its
// window with --context. nullopt for any other name.
std::optional<std::map<std::string, std::string>> llama_preset(const std::string& name);

// The Llama-family preset names.
std::vector<std::string> llama_preset_names();

// Either family's preset (gpt_preset, then llama_preset), and all the names.
std::optional<std::map<std::string, std::string>> model_preset(const std::string& name);
std::vector<std::string> model_preset_names();

}  // namespace dpt
