// GELU's and SwiGLU's bf16 paths (what a bf16 run's GEMMs read) against
// the exact functions, computed in double: every output within one bf16
// rounding step of the exact value, and fewer than 1% of those above 0.05 a
// step off the correctly rounded one. Both paths where this CPU has the AVX-512 BF16
// kernels (nn/activations_avx512.h; the portable ones with the kernels
// turned off), on 1 and 2 threads, at widths that are not whole vectors.
#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "compare.h"
#include "core/dtype.h"
#include "core/threads.h"
#include "gradcheck.h"
#include "nn/activations.h"
#include "nn/activations_avx512.h"
#include "nn/swiglu.h"

namespace dpt {
namespace {

using test::random_vector;

constexpr double kK = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kC = 0.044715;

double sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }
// GELU as x sigmoid(2u), not 0.5 x (1 + tanh(u)), which cancels to zero
// in double too where x is far below zero; the same for its derivative.
double gelu(double x) { return x * sigmoid(2.0 * kK * (x + kC * x * x * x)); }
double gelu_grad(double x) {
  const double e = std::exp(-2.0 * kK * (x + kC * x * x * x)), s = 1.0 / (1.0 + e);
  return s * (1.0 + x * (e * s) * 2.0 * kK * (1.0 + 3.0 * kC * x * x));
}

// got[i] against ref[i]: within one bf16 step (2^-7 of |ref|, past the half
// step of a correct rounding) or tol[i] (where a tail saturates, or a
// gradient crosses zero); and, of the outputs above 0.05 in magnitude,
// under 1% other than ref correctly rounded (a path that saturates early
// or cancels is off more often below that).
::testing::AssertionResult within_a_rounding_step(const std::vector<bf16>& got, const std::vector<double>& ref,
                                                  const std::vector<double>& tol) {
  size_t off = 0, counted = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = to_f32(got[i]);
    if (!(std::fabs(g - ref[i]) <= 1.5 * std::ldexp(std::fabs(ref[i]), -7) + tol[i]))
      return ::testing::AssertionFailure() << "element " << i << ": " << g << ", exact " << ref[i];
    if (std::fabs(ref[i]) < 0.05) continue;
    ++counted;
    if (got[i].bits != to_bf16(static_cast<float>(ref[i])).bits) ++off;
  }
  if (off * 100 >= counted)
    return ::testing::AssertionFailure() << off << " of " << counted << " a rounding step off";
  return ::testing::AssertionSuccess();
}

// A grid over [-lim, lim] (the tails where the sigmoid saturates included)
// then random values, n in all.
std::vector<float> inputs(int64_t n, float lim, Rng& rng) {
  std::vector<float> x(static_cast<size_t>(n));
  const int64_t grid = n / 2;
  for (int64_t i = 0; i < grid; ++i) x[i] = -lim + 2.0f * lim * static_cast<float>(i) / static_cast<float>(grid - 1);
  for (int64_t i = grid; i < n; ++i) x[i] = lim * (2.0f * rng.uniform() - 1.0f);
  return x;
}

// Parameters: the thread count, and whether the AVX-512 kernels are on.
class Bf16Activations : public ::testing::TestWithParam<std::tuple<int, bool>> {
 protected:
  void SetUp() override {
    set_threads(std::get<0>(GetParam()));
    avx512_activations::set_off(!std::get<1>(GetParam()));
    if (std::get<1>(GetParam()) && !avx512_activations::enabled())
      GTEST_SKIP() << "this CPU has no AVX-512 BF16: the portable path is the one tested";
  }
  void TearDown() override { avx512_activations::set_off(false); }
  Rng rng{7};
};

TEST_P(Bf16Activations, GeluForwardWithinARoundingStep) {
  const int64_t n = 48007;
  const auto x = inputs(n, 12.0f, rng);
  std::vector<bf16> y(n);
  gelu_forward(y.data(), x.data(), n);
  std::vector<double> ref(n), tol(n, 1e-6);  // (the portable tanh is -1 where GELU is under 1e-6)
  for (int64_t i = 0; i < n; ++i) ref[i] = gelu(x[i]);
  EXPECT_TRUE(within_a_rounding_step(y, ref, tol));
  // Far out: x itself, and zero.
  const std::vector<float> far = {30.0f, -30.0f, 1e20f, -1e20f, 3e38f};
  std::vector<bf16> yf(far.size());
  gelu_forward(yf.data(), far.data(), static_cast<int64_t>(far.size()));
  for (size_t i = 0; i < far.size(); ++i)
    EXPECT_EQ(to_f32(yf[i]), far[i] > 0 ? to_f32(to_bf16(far[i])) : 0.0f) << far[i];
  const float nan = std::nanf("");
  bf16 ynan;
  gelu_forward(&ynan, &nan, 1);
  EXPECT_TRUE(std::isnan(to_f32(ynan)));
}

// The backward's bf16 copy within a rounding step of dy gelu'(x); its fp32
// gradient within 2e-4 of it (and 1e-4 of |dy| (1 + |x|), the size of its
// terms); the bias sums exactly the fp32 gradient's
// column sums in row order, added to what the bias held.
TEST_P(Bf16Activations, GeluBackwardWithinARoundingStep) {
  const int64_t N = 41, OC = 150;
  const auto x = inputs(N * OC, 8.0f, rng), dy = random_vector(N * OC, rng);
  const auto bias0 = random_vector(OC, rng);
  std::vector<float> dx(N * OC), db = bias0;
  std::vector<bf16> dx16(N * OC), alone16(N * OC);
  gelu_backward(dx.data(), dx16.data(), db.data(), dy.data(), x.data(), N, OC);
  std::vector<double> ref(N * OC), tol(N * OC);
  for (int64_t i = 0; i < N * OC; ++i) {
    ref[i] = dy[i] * gelu_grad(x[i]);
    tol[i] = 1e-4 * std::fabs(dy[i]) * (1.0 + std::fabs(x[i]));
    ASSERT_NEAR(dx[i], ref[i], 2e-4 * std::fabs(ref[i]) + tol[i]) << i << ": x " << x[i];
  }
  EXPECT_TRUE(within_a_rounding_step(dx16, ref, tol));
  for (int64_t o = 0; o < OC; ++o) {
    float sum = 0.0f;
    for (int64_t n = 0; n < N; ++n) sum += dx[n * OC + o];
    ASSERT_EQ(db[o], bias0[o] + sum) << o;
  }
  // The copy alone (no fp32 gradient, as a bf16 run on the CPU asks): the
  // same bits.
  gelu_backward(nullptr, alone16.data(), nullptr, dy.data(), x.data(), N, OC);
  EXPECT_TRUE(test::bitwise_equal(alone16.data(), dx16.data(), dx16.size()));
}

TEST_P(Bf16Activations, SwigluWithinARoundingStep) {
  const int64_t N = 23, I = 200;
  const auto g = inputs(N * I, 20.0f, rng), up = random_vector(N * I, rng, 2.0f);
  const auto dy = random_vector(N * I, rng);
  std::vector<float> gu(N * 2 * I);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < I; ++i) {
      gu[n * 2 * I + i] = g[n * I + i];
      gu[n * 2 * I + I + i] = up[n * I + i];
    }
  std::vector<bf16> y(N * I), dgu16(N * 2 * I), alone16(N * 2 * I);
  swiglu_forward(y.data(), gu.data(), N, I);
  // Tolerances: 1e-4 of the size of each value's terms.
  std::vector<double> ref(N * I), tol(N * I), dref(N * 2 * I), dtol(N * 2 * I);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < I; ++i) {
      const double gv = g[n * I + i], u = up[n * I + i], d = dy[n * I + i], s = sigmoid(gv);
      ref[n * I + i] = gv * s * u;
      tol[n * I + i] = 1e-4 * std::fabs(gv * u);
      dref[n * 2 * I + i] = d * u * s * (1.0 + gv * (1.0 - s));
      dtol[n * 2 * I + i] = 1e-4 * std::fabs(d * u) * (1.0 + std::fabs(gv));
      dref[n * 2 * I + I + i] = d * gv * s;
      dtol[n * 2 * I + I + i] = 1e-4 * std::fabs(d * gv);
    }
  EXPECT_TRUE(within_a_rounding_step(y, ref, tol));
  // In place over gu, as a split backward runs it: the fp32 gradient and
  // the bf16 copy; then the copy alone, the same bits.
  std::vector<float> dgu = gu;
  swiglu_backward(dgu.data(), dgu16.data(), dy.data(), dgu.data(), N, I);
  EXPECT_TRUE(within_a_rounding_step(dgu16, dref, dtol));
  for (int64_t i = 0; i < N * 2 * I; ++i) ASSERT_NEAR(dgu[i], dref[i], 2e-4 * std::fabs(dref[i]) + dtol[i]) << i;
  swiglu_backward(nullptr, alone16.data(), dy.data(), gu.data(), N, I);
  EXPECT_TRUE(test::bitwise_equal(alone16.data(), dgu16.data(), dgu16.size()));
}

INSTANTIATE_TEST_SUITE_P(ThreadsAndKernels, Bf16Activations,
                         ::testing::Combine(::testing::Values(1, 2), ::testing::Bool()),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) + "threads_" +
                                  (std::get<1>(info.param) ? "avx512" : "portable");
                         });

// Where the CPU has AVX-512 BF16 the bf16 paths run its kernels: the
// outputs are theirs, bit for bit, and not the portable path's.
TEST(Bf16ActivationsDispatch, TheAvx512KernelsRunWhereTheCpuHasThem) {
  if (!avx512_activations::enabled()) GTEST_SKIP() << "this CPU has no AVX-512 BF16";
  Rng rng{3};
  const int64_t n = 4099;
  const auto x = inputs(n, 6.0f, rng);
  std::vector<bf16> direct(n), engine(n), portable(n);
  avx512_activations::gelu_forward(direct.data(), x.data(), n);
  gelu_forward(engine.data(), x.data(), n);
  avx512_activations::set_off(true);
  gelu_forward(portable.data(), x.data(), n);
  avx512_activations::set_off(false);
  EXPECT_TRUE(test::bitwise_equal(engine.data(), direct.data(), direct.size()));
  EXPECT_FALSE(test::bitwise_equal(portable.data(), direct.data(), direct.size()));
}

}  // namespace
}  // namespace dpt
