#include "models/weights.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace dpt {

void save_weights(const Model& model, const std::string& path) {
  std::vector<NamedTensor> tensors;
  for (const Slot& s : model.layout().slots()) {
    NamedTensor t;
    t.name = s.name;
    t.shape = s.shape;
    t.data.assign(model.params() + s.offset, model.params() + s.offset + s.numel);
    tensors.push_back(std::move(t));
  }
  save_safetensors(path, tensors, model.metadata());
}

namespace {
// Buffers PyTorch checkpoints may carry that are not parameters: nanoGPT's
// causal mask. They hold no learned state, so they are skipped.
bool is_known_buffer(const std::string& name) {
  return name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias");
}
}  // namespace

void load_weights(Model& model, const SafetensorsFile& file, const std::string& path) {
  const Layout& layout = model.layout();
  for (const Slot& s : layout.slots()) {
    const NamedTensor* t = file.find(s.name);
    if (!t) throw InputError(fmt::format("{}: tensor '{}' is missing", path, s.name));
    if (t->shape != s.shape)
      throw InputError(fmt::format("{}: tensor '{}' has shape {} but the model expects {}", path,
                                   s.name, shape_str(t->shape), shape_str(s.shape)));
    std::memcpy(model.params() + s.offset, t->data.data(), sizeof(float) * s.numel);
  }
  for (const NamedTensor& t : file.tensors) {
    if (layout.find(t.name) >= 0 || is_known_buffer(t.name)) continue;
    if (t.name == "lm_head.weight" && model.kind() == "gpt") {
      const Slot& wte = layout.slot(layout.find("transformer.wte.weight"));
      if (t.shape != wte.shape ||
          std::memcmp(t.data.data(), model.params() + wte.offset, sizeof(float) * wte.numel) != 0)
        throw InputError(fmt::format(
            "{}: lm_head.weight differs from transformer.wte.weight, but this GPT ties them", path));
      continue;
    }
    throw InputError(fmt::format("{}: unexpected tensor '{}' for a {} model", path, t.name,
                                 model.kind()));
  }
}

void check_weight_file(const Model& model, const SafetensorsReader& file) {
  const Layout& layout = model.layout();
  const std::string& path = file.path();
  for (const Slot& s : layout.slots()) {
    const TensorSpec* t = file.find(s.name);
    if (!t) throw InputError(fmt::format("{}: tensor '{}' is missing", path, s.name));
    if (t->shape != s.shape)
      throw InputError(fmt::format("{}: tensor '{}' has shape {} but the model expects {}", path, s.name,
                                   shape_str(t->shape), shape_str(s.shape)));
  }
  for (const TensorSpec& t : file.tensors()) {
    if (layout.find(t.name) >= 0 || is_known_buffer(t.name)) continue;
    if (t.name == "lm_head.weight" && model.kind() == "gpt") {
      const Slot& wte = layout.slot(layout.find("transformer.wte.weight"));
      bool same = t.shape == wte.shape;
      constexpr size_t kPiece = 1 << 16;
      std::vector<float> a(kPiece), b(kPiece);
      for (size_t at = 0; same && at < wte.numel; at += kPiece) {
        const size_t n = std::min(kPiece, wte.numel - at);
        file.read(t.name, at, n, a.data());
        file.read(wte.name, at, n, b.data());
        same = std::memcmp(a.data(), b.data(), n * sizeof(float)) == 0;
      }
      if (!same)
        throw InputError(fmt::format(
            "{}: lm_head.weight differs from transformer.wte.weight, but this GPT ties them", path));
      continue;
    }
    throw InputError(fmt::format("{}: unexpected tensor '{}' for a {} model", path, t.name, model.kind()));
  }
}

void load_weight_range(const Model& model, const SafetensorsReader& file, size_t begin, size_t n, float* out) {
  const size_t end = begin + n;
  for (const Slot& s : model.layout().slots()) {
    const size_t lo = std::max(begin, s.offset), hi = std::min(end, s.offset + s.numel);
    if (lo < hi) file.read(s.name, lo - s.offset, hi - lo, out + (lo - begin));
  }
}

std::unique_ptr<Model> model_from_file(const std::string& path,
                                       const std::map<std::string, std::string>& overrides) {
  SafetensorsFile file = load_safetensors(path);
  std::map<std::string, std::string> hp = file.metadata;
  for (const auto& [k, v] : overrides) hp[k] = v;
  if (!hp.count("dpt.model"))
    throw InputError(fmt::format("{}: no dpt.model in the metadata; pass --model", path));
  auto model = make_model(hp);
  load_weights(*model, file, path);
  return model;
}

}  // namespace dpt
