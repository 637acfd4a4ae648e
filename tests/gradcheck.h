// Finite-difference gradient checking, shared by the layer and model tests.
//
// The loss is a fixed random projection of a layer's output, L = sum(out * R),
// so dL/dout = R, and every input and parameter gradient the backward pass
// computes can be compared with the central difference
// (L(x + eps) - L(x - eps)) / (2 eps), evaluated in double.
#pragma once

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "compare.h"
#include "core/rng.h"

namespace dpt::test {

inline std::vector<float> random_vector(size_t n, Rng& rng, float scale = 1.0f) {
  std::vector<float> v(n);
  for (float& x : v) x = scale * rng.normal();
  return v;
}

// Checks `analytic` (the backward's gradient w.r.t. `x`) against finite
// differences of `loss` w.r.t. x at up to `max_checks` evenly spread entries.
// The tolerance is absolute plus relative, sized for fp32 forward passes.
inline void expect_gradient(const std::string& what, std::vector<float>& x,
                            const std::vector<float>& analytic, const std::function<double()>& loss,
                            double eps = 1e-2, double atol = 2e-3, double rtol = 2e-2,
                            size_t max_checks = 64) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  const size_t stride = x.size() > max_checks ? x.size() / max_checks : 1;
  for (size_t i = 0; i < x.size(); i += stride) {
    const float saved = x[i];
    x[i] = saved + static_cast<float>(eps);
    double plus = loss();
    x[i] = saved - static_cast<float>(eps);
    double minus = loss();
    x[i] = saved;
    double numeric = (plus - minus) / (2.0 * eps);
    EXPECT_TRUE(near(analytic[i], numeric, atol + rtol * std::fabs(numeric)))
        << what << "[" << i << "]: analytic " << analytic[i] << ", numeric " << numeric;
  }
  // A gradient of all zeros would pass trivially against a flat loss; make
  // sure the check looked at something.
  double norm = 0.0;
  for (float g : analytic) norm += std::fabs(g);
  EXPECT_TRUE(std::isfinite(norm)) << what << ": gradient has non-finite values";
  EXPECT_GT(norm, 0.0) << what << ": gradient is all zeros";
}

inline double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

}  // namespace dpt::test
