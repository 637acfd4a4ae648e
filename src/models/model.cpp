#include "models/model.h"

#include "core/error.h"
#include "models/gpt.h"
#include "models/mlp.h"

namespace dpt {

float* Model::own_params() const {
  if (params_.numel() != layout_.numel()) params_.reserve(layout_.numel());
  return params_.f32();
}

float* Model::own_grads() const {
  if (grads_.numel() != layout_.numel()) grads_.reserve(layout_.numel());
  return grads_.f32();
}

void Model::begin(Pass pass) {
  pass_ = pass;
  unit_params_.assign(layout_.units().size(), nullptr);
  unit_grads_.assign(layout_.units().size(), nullptr);
  store_->begin_pass(pass);
}

void Model::open(int unit) {
  const auto u = static_cast<size_t>(unit);
  unit_params_[u] = store_->acquire(unit);
  if (pass_ == Pass::Backward) unit_grads_[u] = store_->unit_grads(unit);
}

void Model::close(int unit) {
  const auto u = static_cast<size_t>(unit);
  unit_params_[u] = nullptr;
  unit_grads_[u] = nullptr;
  store_->release(unit);
}

int64_t hparam_int(const std::map<std::string, std::string>& hparams, const std::string& key,
                   int64_t fallback) {
  auto it = hparams.find(key);
  if (it == hparams.end()) return fallback;
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(it->second, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != it->second.size() || used == 0 || v <= 0)
    throw InputError(fmt::format("model setting {} = '{}' is not a positive integer", key, it->second));
  return v;
}

std::unique_ptr<Model> make_model(const std::map<std::string, std::string>& hparams) {
  auto it = hparams.find("dpt.model");
  std::string kind = it == hparams.end() ? "" : it->second;
  if (kind == "mlp") return std::make_unique<Mlp>(MlpConfig::from(hparams));
  if (kind == "gpt") return std::make_unique<Gpt>(GptConfig::from(hparams));
  throw InputError(fmt::format("unknown model '{}' (expected mlp or gpt)", kind));
}

}  // namespace dpt
