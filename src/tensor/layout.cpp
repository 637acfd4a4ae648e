#include "tensor/layout.h"

#include "core/error.h"

namespace dpt {

void Layout::begin_unit(const std::string& name) {
  Unit u;
  u.name = name;
  u.offset = numel_;
  u.first_slot = static_cast<int>(slots_.size());
  units_.push_back(u);
}

int Layout::add(const std::string& name, std::vector<int64_t> shape, bool decay, TensorSlice slice,
                std::vector<int64_t> whole_shape) {
  DPT_CHECK(!units_.empty(), "add '{}' before any begin_unit", name);
  DPT_CHECK(find(name) < 0, "duplicate slot '{}'", name);
  size_t n = 1;
  for (int64_t d : shape) {
    DPT_CHECK(d > 0, "slot '{}' has a non-positive dimension", name);
    n *= static_cast<size_t>(d);
  }
  Slot s;
  s.name = name;
  s.shape = std::move(shape);
  s.offset = numel_;
  s.numel = n;
  s.unit = static_cast<int>(units_.size()) - 1;
  s.decay = decay;
  if (slice.parts > 1) {
    size_t whole = 1;
    for (int64_t d : whole_shape) whole *= static_cast<size_t>(d);
    DPT_CHECK(slice.part >= 0 && slice.part < slice.parts && static_cast<size_t>(slice.outer * slice.inner) == n &&
                  whole == n * static_cast<size_t>(slice.parts),
              "slot '{}' is not part {} of {} of a tensor {}", name, slice.part, slice.parts, shape_str(whole_shape));
    s.whole_shape = std::move(whole_shape);
    s.slice = slice;
  } else {
    s.whole_shape = s.shape;
    s.slice = {1, 1, 0, static_cast<int64_t>(n)};
  }
  index_.emplace(s.name, static_cast<int>(slots_.size()));
  slots_.push_back(std::move(s));
  numel_ += n;
  units_.back().numel += n;
  units_.back().slot_count += 1;
  return static_cast<int>(slots_.size()) - 1;
}

int Layout::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? -1 : it->second;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

}  // namespace dpt
