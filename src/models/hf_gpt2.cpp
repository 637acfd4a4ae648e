#include "models/hf_gpt2.h"

#include <filesystem>

#include <nlohmann/json.hpp>

#include <fmt/ranges.h>

#include "core/error.h"
#include "io/safetensors_set.h"
#include "models/decoder.h"
#include "models/hf_config.h"
#include "models/model.h"

namespace dpt {

namespace {

constexpr const char* kPrefix = "transformer.";

const TensorSpec* find(const std::vector<TensorSpec>& tensors, const std::string& name) {
  for (const TensorSpec& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

}  // namespace

WeightFormat parse_weight_format(const std::string& s) {
  if (s.empty() || s == "auto") return WeightFormat::Auto;
  if (s == "dpt") return WeightFormat::Dpt;
  if (s == "hf") return WeightFormat::Hf;
  throw InputError(fmt::format("unknown weight format '{}' (expected dpt or hf)", s));
}

std::string WeightNames::file_name(const std::string& slot) const {
  if (!hf || !slot.starts_with(kPrefix)) return slot;
  return prefix + slot.substr(std::string(kPrefix).size());
}

bool WeightNames::transposed(const std::string& slot) const {
  return hf && slot.find(".h.") != std::string::npos &&
         (slot.ends_with(".c_attn.weight") || slot.ends_with(".c_proj.weight") || slot.ends_with(".c_fc.weight"));
}

std::vector<int64_t> WeightNames::file_shape(const std::string& slot, const std::vector<int64_t>& shape) const {
  if (wte_rows > 0 && Decoder::vocab_matrix(slot)) return {wte_rows, shape[1]};
  return transposed(slot) ? std::vector<int64_t>{shape[1], shape[0]} : shape;
}

size_t WeightNames::stored(const std::string& slot, const std::vector<int64_t>& shape, size_t numel) const {
  if (wte_rows > 0 && Decoder::vocab_matrix(slot)) return static_cast<size_t>(wte_rows * shape[1]);
  return numel;
}

WeightNames weight_names(const Model& model, const std::vector<TensorSpec>& tensors, WeightFormat format) {
  WeightNames n;
  const auto* decoder = dynamic_cast<const Decoder*>(&model);
  if (!decoder) return n;
  const DecoderConfig& g = decoder->config();
  if (g.rows() != g.vocab) n.wte_rows = g.vocab;
  // The Llama family's names are Hugging Face's: one layout.
  if (format == WeightFormat::Dpt || g.family != "gpt") return n;
  // The engine writes every name with the prefix; a file without it is HF's.
  n.prefix = find(tensors, "transformer.wte.weight") ? kPrefix : "";
  if (format == WeightFormat::Hf || n.prefix.empty()) {
    n.hf = true;
    return n;
  }
  // Same names: the first block's c_attn.weight tells, [C, 3C] (Conv1D) or
  // [3C, C] (Linear). A file without it fails later naming the tensor.
  const TensorSpec* qkv = find(tensors, "transformer.h.0.attn.c_attn.weight");
  n.hf = qkv && qkv->shape.size() == 2 && qkv->shape[1] == 3 * qkv->shape[0];
  return n;
}

std::map<std::string, std::string> gpt2_hparams_from_config(const nlohmann::json& j, const std::string& where) {
  std::map<std::string, std::string> hp = {{"dpt.model", "gpt"}};
  // Hugging Face's GPT2Config names, and the engine's.
  for (const auto& [hf, ours] : {std::pair{"n_layer", "n_layer"}, {"n_head", "n_head"}, {"n_embd", "n_embd"},
                                 {"n_positions", "block_size"}, {"vocab_size", "vocab_size"}}) {
    if (!j.contains(hf)) continue;
    if (!j[hf].is_number_integer()) throw InputError(fmt::format("{}: {} is not an integer", where, hf));
    hp[ours] = std::to_string(j[hf].get<int64_t>());
  }
  return hp;
}

std::map<std::string, std::string> weight_file_hparams(const std::string& path) {
  const SafetensorsSet file(path);
  std::map<std::string, std::string> hp = file.metadata();
  if (hp.count("dpt.model")) return hp;
  const std::filesystem::path config = std::filesystem::path(file.path()).parent_path() / "config.json";
  std::error_code ec;
  if (!std::filesystem::exists(config, ec)) return hp;
  for (const auto& [k, v] : read_hf_config(config.string())) hp[k] = v;
  return hp;
}

namespace {

// The engine's GPT keys a file's hyper-parameters hold.
std::vector<std::string> engine_keys(const std::map<std::string, std::string>& hp) {
  std::vector<std::string> keys;
  for (const char* k : {"vocab_size", "n_layer", "n_head", "n_embd", "block_size"})
    if (hp.count(k)) keys.emplace_back(k);
  return keys;
}

}  // namespace

std::map<std::string, std::string> hparams_for_file(const std::string& path,
                                                    const std::map<std::string, std::string>& flags) {
  const std::map<std::string, std::string> file = weight_file_hparams(path);
  // Another family's weights would be refused one missing tensor or one
  // foreign setting at a time: name both families instead.
  const auto held = file.find("dpt.model"), asked = flags.find("dpt.model");
  if (held != file.end() && asked != flags.end() && held->second != asked->second)
    throw InputError(fmt::format("{}: the file holds a {} model, and --model says {}", path, held->second,
                                 asked->second));
  std::map<std::string, std::string> hp = file;
  for (const auto& [k, v] : flags) hp[k] = v;
  if (!hp.count("dpt.model"))
    throw InputError(fmt::format("{}: no dpt.model in the metadata and no config.json beside it; pass --model", path));
  // A file the engine wrote says everything; another may lack the head count.
  if (file.count("dpt.model") || hp["dpt.model"] != "gpt" || hp.count("n_head")) return hp;
  const std::vector<std::string> has = engine_keys(file);
  if (has.empty())
    throw InputError(fmt::format("{}: the file carries no hyper-parameters (no engine metadata, no config.json "
                                 "beside it) and a head count cannot be read from shapes; pass --model gpt2 (or "
                                 "gpt2-medium, gpt2-large, gpt2-xl), or --heads with the other sizes",
                                 path));
  throw InputError(fmt::format("{}: the file's hyper-parameters give {} but no n_head, and a head count cannot be "
                               "read from shapes; pass --heads",
                               path, fmt::join(has, ", ")));
}

}  // namespace dpt
