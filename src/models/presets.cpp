#include "models/presets.h"

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

}  // namespace dpt
