#include "models/model.h"

#include "core/error.h"
#include "models/gpt.h"
#include "models/mlp.h"

namespace dpt {

void Model::allocate_state() {
  params_ = FlatBuffer(layout_.numel());
  grads_ = FlatBuffer(layout_.numel());
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
