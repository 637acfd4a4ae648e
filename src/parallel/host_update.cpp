#include "parallel/host_update.h"

#include <chrono>

namespace dpt {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

HostUpdate::HostUpdate(const Kernels& k, size_t n)
    : k_(k), n_(n), params_(pinned<float>(k, n)), grads_(pinned<float>(k, n)), copy16_(pinned<bf16>(k, 0)) {}

void HostUpdate::step(Optimizer& opt, float* params, float* grads, bf16* copy16, float lr, GradsAfter after) {
  auto t0 = std::chrono::steady_clock::now();
  if (!synced_) {
    k_.download(params_.get(), params, n_ * sizeof(float));
    down_bytes_ += n_ * sizeof(float);
    synced_ = true;
  }
  k_.download(grads_.get(), grads, n_ * sizeof(float));  // waits for the backward's kernels
  down_bytes_ += n_ * sizeof(float);
  down_s_ += seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  // The host's gradients are overwritten next step: no need to zero them.
  if (copy16 && !copy16_) copy16_ = pinned<bf16>(k_, n_);
  opt.step(params_.get(), grads_.get(), lr, GradsAfter::Kept, copy16 ? copy16_.get() : nullptr);
  update_s_ += seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  k_.upload(params, params_.get(), n_ * sizeof(float));
  up_bytes_ += n_ * sizeof(float);
  if (copy16) {
    k_.upload(copy16, copy16_.get(), n_ * sizeof(bf16));
    up_bytes_ += n_ * sizeof(bf16);
  }
  if (after == GradsAfter::Zeroed) k_.zero(grads, n_ * sizeof(float));
  up_s_ += seconds_since(t0);
  ++steps_;
}

size_t HostUpdate::host_bytes() const { return n_ * (2 * sizeof(float) + (copy16_ ? sizeof(bf16) : 0)); }

nlohmann::json HostUpdate::detail() const {
  const double s = steps_ > 0 ? steps_ : 1;
  return {{"host_bytes", host_bytes()},   {"steps", steps_},
          {"down_bytes", down_bytes_ / s}, {"up_bytes", up_bytes_ / s},
          {"down_s", down_s_ / s},         {"update_s", update_s_ / s},
          {"up_s", up_s_ / s}};
}

nlohmann::json with_host_updates(nlohmann::json tier_detail, const std::vector<const HostUpdate*>& hosts) {
  nlohmann::json sum;
  for (const HostUpdate* h : hosts) {
    if (!h) continue;
    const nlohmann::json d = h->detail();
    if (sum.is_null()) {
      sum = d;
      continue;
    }
    for (const char* k : {"host_bytes", "down_bytes", "up_bytes", "down_s", "update_s", "up_s"})
      sum[k] = sum[k].get<double>() + d[k].get<double>();
  }
  if (sum.is_null()) return tier_detail;
  if (tier_detail.is_null()) tier_detail = nlohmann::json::object();
  tier_detail["host_update"] = std::move(sum);
  return tier_detail;
}

}  // namespace dpt
