// Named GPT shapes: GPT-2 and its larger siblings as nanoGPT and llm.c
// define them (`--model gpt2` ...). A preset is a set of hyper-parameters
// for the engine's "gpt" model; flags given beside it win.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace dpt {

// "gpt2" (124M), "gpt2-medium" (350M), "gpt2-large" (774M), "gpt2-xl"
// (1558M): vocab_size 50257 held as 50304 rows in memory (padded_vocab_size,
// a multiple of 64, as llm.c; files hold 50257), block_size 1024, and their
// layers, heads and width; with "dpt.model" = "gpt". nullopt for any other
// name.
std::optional<std::map<std::string, std::string>> gpt_preset(const std::string& name);

// The preset names, for --model's help and check.
std::vector<std::string> gpt_preset_names();

}  // namespace dpt
