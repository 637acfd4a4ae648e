#include "tools/commands.h"
#include "tools/flag_checks.h"

#include "nn/gemm.h"

namespace dpt {

void ModelFlags::add(CLI::App* cmd) {
  cmd->add_option("--model", model, "mlp (W-MLP) or gpt (W-GPT)")
      ->check(CLI::IsMember({"mlp", "gpt"}));
  cmd->add_option("--sizes", sizes, "mlp: layer sizes, inputs to classes (784,1024,1024,10)");
  cmd->add_option("--vocab", vocab, "gpt: vocabulary size (256)")->check(positive());
  cmd->add_option("--layers", layers, "gpt: transformer blocks (4)")->check(positive());
  cmd->add_option("--heads", heads, "gpt: attention heads (4)")->check(positive());
  cmd->add_option("--width", width, "gpt: embedding width (256)")->check(positive());
  cmd->add_option("--context", context, "gpt: context length (128)")->check(positive());
}

std::map<std::string, std::string> ModelFlags::hparams() const {
  std::map<std::string, std::string> hp;
  if (!model.empty()) hp["dpt.model"] = model;
  if (!sizes.empty()) hp["sizes"] = sizes;
  auto put = [&hp](const char* key, int64_t v) {
    if (v > 0) hp[key] = std::to_string(v);
  };
  put("vocab_size", vocab);
  put("n_layer", layers);
  put("n_head", heads);
  put("n_embd", width);
  put("block_size", context);
  return hp;
}

void add_gemm_flag(CLI::App* cmd, std::string& gemm) {
  // Checked by set_gemm_flag, not CLI11, so a bad name is the engine's usual
  // one-sentence error with exit code 1.
  cmd->add_option("--gemm", gemm,
                  fmt::format("GEMM backend: onednn or openblas (default {})", gemm_backend_name(kDefaultGemmBackend)));
}

void set_gemm_flag(const std::string& gemm) {
  if (!gemm.empty()) set_gemm_backend(parse_gemm_backend(gemm));
}

}  // namespace dpt
