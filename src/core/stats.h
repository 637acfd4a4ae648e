// Small statistics over timings.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

namespace dpt {

// The median (upper median for even sizes) of v; 0 for an empty v.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::nth_element(v.begin(), v.begin() + static_cast<long>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

// Steps left out of steady-state figures: the first 20 (warm-up of caches
// and allocator) when a run has more than 40, else just the first.
inline size_t warmup_steps(size_t steps) { return steps > 40 ? 20 : (steps > 1 ? 1 : 0); }

// The median of per-step timings after the warm-up steps.
inline double steady_median(const std::vector<double>& per_step) {
  const long skip = static_cast<long>(warmup_steps(per_step.size()));
  return median(std::vector<double>(per_step.begin() + skip, per_step.end()));
}

}  // namespace dpt
