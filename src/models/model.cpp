#include "models/model.h"

#include <algorithm>

#include "core/error.h"
#include "models/decoder.h"
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

namespace {
// Moves what `from` holds (if it is allocated) into `to`, which replaces it.
void move_into(FlatBuffer& from, FlatBuffer to, size_t numel, Device device, const char* what) {
  DPT_CHECK(device == Device::CPU && to.dtype() == DType::F32 && to.numel() == numel,
            "{} placed in {} {} elements on {} (want {} fp32 on the CPU)", what, to.numel(), dtype_name(to.dtype()),
            device_name(device), numel);
  if (from.numel() == numel) std::copy(from.f32(), from.f32() + numel, to.f32());
  from = std::move(to);
}
}  // namespace

void Model::place_grads(FlatBuffer buffer) { move_into(grads_, std::move(buffer), layout_.numel(), device_, "gradients"); }

void Model::place_params(FlatBuffer buffer) {
  move_into(params_, std::move(buffer), layout_.numel(), device_, "parameters");
  ++params_version_;  // the bf16 copies are of the old memory's values: same values, but say so
}

void Model::init_params(uint64_t seed) {
  if (device_ == Device::CPU) {
    init_range(seed, 0, param_count(), params());
    return;
  }
  std::vector<float> host(param_count());
  init_range(seed, 0, param_count(), host.data());
  upload_params(0, host.size(), host.data());
}

void Model::set_device(Device d) {
  if (d == device_) return;
  place_buffers(d);  // first: a model that cannot run there refuses before anything moves
  for (FlatBuffer* b : {&acts_, &params_, &grads_, &params16_, &vectors_}) b->place(d);
  device_ = d;
  k_ = &kernels(d);
}

void Model::use_kernels(const Kernels& k) {
  DPT_CHECK(k.device() == device_, "kernels of another device than the model's");
  k_ = &k;
}

void Model::download_params(size_t begin, size_t n, float* host) const {
  DPT_CHECK(begin + n <= param_count(), "parameters [{}, {}) of {}", begin, begin + n, param_count());
  k_->download(host, params() + begin, n * sizeof(float));
}

void Model::upload_params(size_t begin, size_t n, const float* host) {
  DPT_CHECK(begin + n <= param_count(), "parameters [{}, {}) of {}", begin, begin + n, param_count());
  k_->upload(params() + begin, host, n * sizeof(float));
}

const bf16* UnitStore::acquire_bf16(int /*unit*/) {
  throw InternalError("this parameter store holds no bf16 compute copies");
}

bf16* Model::params16_for_update() {
  if (precision_ != DType::BF16) return nullptr;
  if (params16_.numel() != layout_.numel()) {
    params16_.reserve(layout_.numel());
    converted_version_.assign(layout_.units().size(), 0);
  }
  return params16_.b16();
}

void Model::params16_written() {
  if (params16_.numel() == layout_.numel())
    std::fill(converted_version_.begin(), converted_version_.end(), params_version_);
}

const bf16* Model::own_params16(int unit) {
  const auto u = static_cast<size_t>(unit);
  if (params16_.numel() != layout_.numel()) {
    params16_.reserve(layout_.numel());
    converted_version_.assign(layout_.units().size(), 0);
  }
  const size_t off = unit_offset(unit);
  if (converted_version_[u] != params_version_) {
    k_->convert(params16_.b16() + off, own_params() + off, layout_.units()[u].numel);
    converted_version_[u] = params_version_;
  }
  return params16_.b16() + off;
}

void Model::widen_vectors(int unit) {
  if (vector_at_.empty()) {
    size_t n = 0;
    vector_at_.assign(layout_.slots().size(), 0);
    for (size_t i = 0; i < layout_.slots().size(); ++i)
      if (layout_.slots()[i].shape.size() == 1) {
        vector_at_[i] = n;
        n += layout_.slots()[i].numel;
      }
    vectors_.reserve(n);
  }
  const Unit& u = layout_.units()[static_cast<size_t>(unit)];
  const bf16* base = unit_params16_[static_cast<size_t>(unit)];
  for (size_t i = 0; i < layout_.slots().size(); ++i) {
    const Slot& s = layout_.slots()[i];
    if (s.unit == unit && s.shape.size() == 1) k_->convert(vectors_.f32() + vector_at_[i], base + (s.offset - u.offset), s.numel);
  }
}

const float* Model::param(int slot) const {
  if (precision_ == DType::F32) return at(unit_params_, slot);
  const Slot& s = layout_.slot(slot);
  DPT_CHECK(s.shape.size() == 1, "matrix {} read as fp32 in a bf16 run", s.name);
  DPT_CHECK(unit_params16_[static_cast<size_t>(s.unit)] != nullptr, "slot {} used outside an open unit", s.name);
  return vectors_.f32() + vector_at_[static_cast<size_t>(slot)];
}

void Model::begin(Pass pass, int part) {
  pass_ = pass;
  unit_params_.assign(layout_.units().size(), nullptr);
  unit_params16_.assign(layout_.units().size(), nullptr);
  unit_grads_.assign(layout_.units().size(), nullptr);
  store_->begin_pass(pass, part);
}

void Model::open(int unit) {
  const auto u = static_cast<size_t>(unit);
  if (precision_ == DType::BF16) {
    unit_params16_[u] = store_->acquire_bf16(unit);
    widen_vectors(unit);
  } else {
    unit_params_[u] = store_->acquire(unit);
  }
  if (pass_ == Pass::Backward) unit_grads_[u] = store_->unit_grads(unit);
}

void Model::close(int unit) {
  const auto u = static_cast<size_t>(unit);
  unit_params_[u] = nullptr;
  unit_params16_[u] = nullptr;
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
  if (kind == "gpt" || kind == "llama") return std::make_unique<Decoder>(DecoderConfig::from(hparams));
  throw InputError(fmt::format("unknown model '{}' (expected mlp, gpt or llama)", kind));
}

}  // namespace dpt
