#include "models/presets.h"
#include "tools/commands.h"
#include "tools/flag_checks.h"

#include "core/error.h"
#include "nn/gemm.h"

namespace dpt {

void ModelFlags::add(CLI::App* cmd) {
  std::vector<std::string> names = {"mlp", "gpt", "llama"};
  for (const std::string& p : model_preset_names()) names.push_back(p);
  cmd->add_option("--model", model,
                  "mlp (W-MLP), gpt (W-GPT), llama (W-LLAMA), a GPT-2 shape: gpt2 (124M), gpt2-medium, "
                  "gpt2-large, gpt2-xl (vocabulary 50257 held as 50304 rows, context 1024), or a Llama-family "
                  "one: smollm2-135m, llama-3.2-1b, qwen2.5-0.5b, w-llama (docs/models.md); other flags override")
      ->check(CLI::IsMember(names));
  cmd->add_option("--sizes", sizes, "mlp: layer sizes, inputs to classes (784,1024,1024,10)");
  cmd->add_option("--vocab", vocab, "gpt, llama: vocabulary size (256)")->check(positive());
  cmd->add_option("--padded-vocab", padded_vocab,
                  "gpt: embedding rows held in memory, >= --vocab (the gpt2 presets: 50304, a multiple of 64); "
                  "the pad rows are never trained nor saved")
      ->check(positive());
  cmd->add_option("--layers", layers, "gpt, llama: transformer blocks (4)")->check(positive());
  cmd->add_option("--heads", heads, "gpt, llama: attention (query) heads (4)")->check(positive());
  cmd->add_option("--width", width, "gpt, llama: embedding width (256)")->check(positive());
  cmd->add_option("--context", context, "gpt, llama: context length (128)")->check(positive());
  cmd->add_option("--kv-heads", kv_heads, "llama: key/value heads, dividing --heads (2)")->check(positive());
  cmd->add_option("--head-dim", head_dim, "llama: channels per head (width / heads)")->check(positive());
  cmd->add_option("--intermediate", intermediate, "llama: SwiGLU's inner width (704)")->check(positive());
  cmd->add_flag("--tie-embeddings,!--untie-embeddings", tie,
                "llama: the head is the embedding's transpose (no lm_head), or an lm_head of its own (untied: "
                "w-llama's default; the other presets are tied)");
}

std::map<std::string, std::string> ModelFlags::hparams() const {
  std::map<std::string, std::string> hp = model_preset(model).value_or(std::map<std::string, std::string>{});
  if (!model.empty() && hp.empty()) hp["dpt.model"] = model;
  if (!sizes.empty()) hp["sizes"] = sizes;
  auto put = [&hp](const char* key, int64_t v) {
    if (v > 0) hp[key] = std::to_string(v);
  };
  put("vocab_size", vocab);
  put("padded_vocab_size", padded_vocab);
  put("n_layer", layers);
  put("n_head", heads);
  put("n_embd", width);
  put("block_size", context);
  put("n_kv_head", kv_heads);
  put("head_dim", head_dim);
  put("intermediate_size", intermediate);
  if (tie != 0) hp["tie_word_embeddings"] = tie > 0 ? "1" : "0";
  return hp;
}

std::string ModelFlags::kind() const {
  const auto preset = model_preset(model);
  return preset ? preset->at("dpt.model") : model;
}

void add_gemm_flag(CLI::App* cmd, GemmFlags& gemm) {
  // Checked by set_gemm_flag, not CLI11, so a bad name is the engine's usual
  // one-sentence error with exit code 1.
  cmd->add_option("--gemm", gemm.backend,
                  fmt::format("GEMM backend: onednn or openblas (default: onednn on CPUs with AVX-512, openblas "
                              "otherwise; here {})",
                              gemm_backend_name(default_gemm_backend())));
  cmd->add_option("--bf16-gemm", gemm.bf16,
                  "how bf16 products run where the CPU has bf16 instructions: native (oneDNN's bf16 kernels, the "
                  "fused attention on vdpbf16ps), widened (fp32 GEMMs and FMAs on the bf16 values), or auto "
                  "(default: widened where this CPU's AVX-512 BF16 dot products run under 0.75 of its fp32 FMA "
                  "rate; the GEMMs stay native where it has AMX)");
}

void add_precision_flag(CLI::App* cmd, std::string& precision) {
  cmd->add_option("--precision", precision,
                  "fp32, or bf16: bf16 weights and inputs for every matrix product, fp32 master weights, "
                  "gradients and the rest (default fp32)");
}

void add_device_flag(CLI::App* cmd, std::string& device) {
  cmd->add_option("--device", device,
                  "cpu (default), or cuda: the GPT's buffers and passes on this rank's GPU (docs/gpu.md)");
}

void set_gemm_flag(const GemmFlags& gemm) {
  if (!gemm.backend.empty()) set_gemm_backend(parse_gemm_backend(gemm.backend));
  if (gemm.bf16.empty()) return;
  const Bf16Gemm mode = parse_bf16_gemm(gemm.bf16);
  if (mode == Bf16Gemm::Native && !gemm_bf16_kernels())
    throw InputError(fmt::format("--bf16-gemm native needs oneDNN's bf16 kernels: {}",
                                 gemm_backend() == GemmBackend::OneDnn ? "oneDNN has none for this CPU"
                                                                       : "the openblas backend has none"));
  set_bf16_gemm(mode);
}

CLI::App* bench_subcommand(CLI::App& app) {
  for (CLI::App* s : app.get_subcommands([](CLI::App*) { return true; }))
    if (s->get_name() == "bench") return s;
  CLI::App* bench = app.add_subcommand("bench", "measure the engine");
  bench->require_subcommand(1);
  return bench;
}

}  // namespace dpt
