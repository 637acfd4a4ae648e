// Small statistics over timings.
#pragma once

#include <algorithm>
#include <vector>

namespace dpt {

// The median (upper median for even sizes) of v; 0 for an empty v.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::nth_element(v.begin(), v.begin() + static_cast<long>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

}  // namespace dpt
