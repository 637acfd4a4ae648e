// Comparing tensors in tests, so that a NaN or an infinity can never pass.
//
// The obvious loop, `if (err > worst) worst = err` or
// `worst = std::max(worst, err)`, silently skips NaN (every comparison with
// NaN is false), so a tensor full of NaN differs from anything by 0, and two
// tensors with the same NaN bits compare bitwise equal. Every comparison of
// tensors in tests/ goes through diff() instead: a non-finite element on
// either side makes the difference +inf and is named in the message.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "core/dtype.h"

namespace dpt::test {

struct Diff {
  size_t n = 0;
  double max_abs = 0;       // max |got - want|; +inf when any element is non-finite
  size_t worst = 0;         // index of max_abs: the first non-finite element if any
  double got_worst = 0, want_worst = 0;  // the values there
  double peak = 0;          // max |want| over the finite elements
  size_t nonfinite = 0;     // elements where got or want is NaN or infinite
  size_t differing = 0;     // elements whose bits differ (non-finite ones count)

  bool finite() const { return nonfinite == 0; }
  bool bitwise() const { return differing == 0; }  // and therefore finite
  std::string describe() const {
    if (!finite())
      return fmt::format("{} of {} elements non-finite, first at {}: got {} want {}", nonfinite, n, worst,
                         got_worst, want_worst);
    return fmt::format("max |diff| {:.3e} at {} (got {:.9g} want {:.9g}), max |want| {:.3e}, {} of {} differ",
                       max_abs, worst, got_worst, want_worst, peak, differing, n);
  }
};

inline bool finite_pair(double a, double b) { return std::isfinite(a) && std::isfinite(b); }

// |got - want| <= tol for finite got and want; false whenever either is not.
inline bool near(double got, double want, double tol) {
  return finite_pair(got, want) && std::fabs(got - want) <= tol;
}

// An element's value: itself, or a bf16's (exactly, as fp32).
inline double value_of(double x) { return x; }
inline double value_of(bf16 x) { return to_f32(x); }

// Element-wise difference of got[0..n) and want[0..n) (float, double or
// bf16).
template <class G, class W>
Diff diff(const G* got, const W* want, size_t n) {
  Diff d;
  d.n = n;
  for (size_t i = 0; i < n; ++i) {
    const double g = value_of(got[i]), w = value_of(want[i]);
    if (!finite_pair(g, w)) {
      if (d.nonfinite++ == 0) d.worst = i, d.got_worst = g, d.want_worst = w;
      d.max_abs = std::numeric_limits<double>::infinity();
      ++d.differing;
      continue;
    }
    if (std::fabs(w) > d.peak) d.peak = std::fabs(w);
    const double e = std::fabs(g - w);
    if (d.finite() && (e > d.max_abs || i == 0)) d.max_abs = e, d.worst = i, d.got_worst = g, d.want_worst = w;
    if constexpr (sizeof(G) == sizeof(W)) {
      if (std::memcmp(&got[i], &want[i], sizeof(G)) != 0) ++d.differing;
    } else if (g != w) {
      ++d.differing;
    }
  }
  return d;
}

// Every element finite and within atol + rtol * max|want| (the tensor's
// scale) of want.
template <class G, class W>
::testing::AssertionResult all_close(const G* got, const W* want, size_t n, double atol, double rtol) {
  const Diff d = diff(got, want, n);
  const double tol = atol + rtol * d.peak;
  if (d.finite() && d.max_abs <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << d.describe() << "; tolerance " << tol;
}

// Bitwise equal and finite (two NaN with the same bits are not "equal").
template <class T>
::testing::AssertionResult bitwise_equal(const T* got, const T* want, size_t n) {
  const Diff d = diff(got, want, n);
  if (d.bitwise()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "not bitwise equal: " << d.describe();
}

}  // namespace dpt::test
