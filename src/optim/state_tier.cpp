#include "optim/state_tier.h"

#include <cstring>

#include "core/error.h"
#include "device/pinned.h"
#include "optim/file_tier.h"

namespace dpt {

namespace {

// numel zeroed floats of host memory page-locked for `gpu`, freed with it.
FlatBuffer pinned_buffer(Device gpu, size_t numel) {
  Pinned<float> p = pinned<float>(kernels(gpu), numel);
  std::memset(p.get(), 0, numel * sizeof(float));
  return FlatBuffer(std::shared_ptr<void>(std::move(p)), numel);
}

}  // namespace

std::unique_ptr<RamTier> RamTier::pinned_for(Device gpu) {
  auto t = std::make_unique<RamTier>(Device::CPU);
  t->pinned_for_ = gpu;
  return t;
}

int RamTier::add_region(size_t tensors, size_t n) {
  DPT_CHECK(tensors <= kMaxTensors, "a region of {} tensors (at most {})", tensors, kMaxTensors);
  FlatBuffer buf;
  if (tensors > 0 && pinned_for_ != Device::CPU)
    buf = pinned_buffer(pinned_for_, tensors * n);
  else if (tensors > 0)
    buf = FlatBuffer(tensors * n, DType::F32, device_);
  regions_.push_back({tensors, n, std::move(buf)});
  return static_cast<int>(regions_.size() - 1);
}

// The whole span in one call: the arithmetic of the engine without a tier.
void RamTier::stream(const Job* jobs, size_t count) {
  for (size_t j = 0; j < count; ++j) {
    Region& r = regions_[static_cast<size_t>(jobs[j].region)];
    float* tensors[kMaxTensors] = {};
    for (size_t i = 0; i < r.tensors; ++i) tensors[i] = r.buf.f32() + i * r.n;
    jobs[j].kernel->update(0, r.n, tensors);
  }
}

void RamTier::read(int region, size_t tensor, size_t at, size_t n, float* out) {
  kernels(device_).download(out, data(region, tensor) + at, n * sizeof(float));
}

void RamTier::write(int region, size_t tensor, size_t at, size_t n, const float* in) {
  kernels(device_).upload(data(region, tensor) + at, in, n * sizeof(float));
}

float* RamTier::data(int region, size_t tensor) {
  Region& r = regions_[static_cast<size_t>(region)];
  DPT_CHECK(tensor < r.tensors, "tensor {} of a region of {}", tensor, r.tensors);
  return r.buf.f32() + tensor * r.n;
}

size_t RamTier::ram_bytes() const {
  size_t b = 0;
  for (const Region& r : regions_) b += r.buf.bytes();
  return b;
}

nlohmann::json RamTier::detail() const {
  if (pinned_for_ == Device::CPU) return nullptr;
  return {{"pinned_for", device_name(pinned_for_)}, {"ram_bytes", ram_bytes()}};
}

Offload parse_offload(const std::string& s) {
  if (s.empty() || s == "none") return Offload::None;
  if (s == "optimizer") return Offload::Optimizer;
  if (s == "params") return Offload::Params;
  throw InputError(fmt::format("unknown --offload '{}' (expected optimizer or params)", s));
}

std::unique_ptr<StateTier> make_state_tier(const OffloadOptions& options, int rank, Device device) {
  if (options.what == Offload::None) return std::make_unique<RamTier>(device);
  if (device != Device::CPU && options.dir.empty()) return RamTier::pinned_for(device);
  // "params": the optimizers keep the master weights as one more tensor.
  return std::make_unique<FileTier>(options.dir, rank, options.chunk_bytes);
}

}  // namespace dpt
