// Optimizers (SGD with momentum, AdamW), learning-rate schedules and
// gradient clipping, checked against hand-computed values and plain
// double-precision references of PyTorch's update rules.
#include "nn/update.h"
#include "optim/optimizer.h"

#include <cmath>
#include <cstring>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "compare.h"
#include "core/error.h"
#include "core/rng.h"
#include "optim/schedule.h"
#include "tensor/layout.h"

namespace dpt {
namespace {

// Two slots of 2 elements: "w" is decayed (a matrix), "b" is not (a bias).
Layout tiny_layout() {
  Layout l;
  l.begin_unit("u");
  l.add("w", {1, 2}, true);
  l.add("b", {2}, false);
  return l;
}

// Slots of awkward sizes, decayed and not, in two units; 1000 elements, so
// vectorised loops have bodies and remainders.
Layout mixed_layout() {
  Layout l;
  l.begin_unit("a");
  l.add("a.w", {13, 17}, true);   // 221
  l.add("a.b", {13}, false);      // 13
  l.add("a.w2", {11, 29}, true);  // 319
  l.begin_unit("b");
  l.add("b.ln", {47}, false);     // 47
  l.add("b.w", {20, 20}, true);   // 400
  return l;
}

std::vector<float> random_vector(size_t n, uint64_t seed, float scale = 1.0f) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = scale * (2.0f * rng.uniform() - 1.0f);
  return v;
}

// ---------------------------------------------------------------- SGD

TEST(Sgd, MatchesHandComputedThreeStepTrajectory) {
  // momentum 0.9, lr 0.1, weight decay 0.5 (decay slot only); every
  // parameter starts at 1 and step t (1-based) has gradient t everywhere.
  //   no decay: buf 1, 2.9, 5.61        -> p 0.9, 0.61, 0.049
  //   decay:    g 1.5, 2.425, 3.23625
  //             buf 1.5, 3.775, 6.63375 -> p 0.85, 0.4725, -0.190875
  Layout l = tiny_layout();
  OptimizerConfig c;
  c.name = "sgd";
  c.momentum = 0.9f;
  c.weight_decay = 0.5f;
  Sgd opt(c, l, 0, l.numel());
  std::vector<float> p(4, 1.0f), g(4);
  const float expect_decay[3] = {0.85f, 0.4725f, -0.190875f};
  const float expect_plain[3] = {0.9f, 0.61f, 0.049f};
  for (int t = 0; t < 3; ++t) {
    std::fill(g.begin(), g.end(), static_cast<float>(t + 1));
    opt.step(p.data(), g.data(), 0.1f);
    EXPECT_EQ(opt.steps(), t + 1);
    for (int i = 0; i < 2; ++i) EXPECT_NEAR(p[i], expect_decay[t], 1e-5) << "decay slot, step " << t + 1;
    for (int i = 2; i < 4; ++i) EXPECT_NEAR(p[i], expect_plain[t], 1e-5) << "plain slot, step " << t + 1;
  }
}

TEST(Sgd, WithoutMomentumIsPlainGradientDescentAndHoldsNoState) {
  Layout l = tiny_layout();
  OptimizerConfig c;
  c.momentum = 0.0f;
  Sgd opt(c, l, 0, l.numel());
  EXPECT_EQ(opt.state_bytes(), 0u);
  std::vector<float> p = {1.0f, 2.0f, 3.0f, 4.0f}, g = {1.0f, -1.0f, 0.5f, 2.0f};
  opt.step(p.data(), g.data(), 0.5f);
  opt.step(p.data(), g.data(), 0.5f);
  EXPECT_FLOAT_EQ(p[0], 0.0f);
  EXPECT_FLOAT_EQ(p[1], 3.0f);
  EXPECT_FLOAT_EQ(p[2], 2.5f);
  EXPECT_FLOAT_EQ(p[3], 2.0f);
}

// ---------------------------------------------------------------- AdamW

// torch.optim.AdamW for one element, in double.
struct AdamRef {
  double m = 0, v = 0;
  void step(double& p, double g, double lr, double b1, double b2, double eps, double wd, int t) {
    p *= 1.0 - lr * wd;
    m = b1 * m + (1 - b1) * g;
    v = b2 * v + (1 - b2) * g * g;
    const double c1 = 1 - std::pow(b1, t), c2 = 1 - std::pow(b2, t);
    p -= lr / c1 * m / (std::sqrt(v) / std::sqrt(c2) + eps);
  }
};

TEST(AdamW, MatchesDoublePrecisionReferenceOverFiveSteps) {
  Layout l = mixed_layout();
  const size_t n = l.numel();
  OptimizerConfig c;
  c.name = "adamw";
  c.beta1 = 0.9f;
  c.beta2 = 0.95f;
  c.eps = 1e-8f;
  c.weight_decay = 0.1f;
  AdamW opt(c, l, 0, n);
  EXPECT_EQ(opt.state_bytes(), 8 * n);

  std::vector<float> p = random_vector(n, 1);
  std::vector<double> ref(p.begin(), p.end());
  std::vector<AdamRef> st(n);
  std::vector<double> wd(n);
  for (const Slot& s : l.slots())
    for (size_t i = 0; i < s.numel; ++i) wd[s.offset + i] = s.decay ? c.weight_decay : 0.0;

  const float lrs[5] = {1e-2f, 2e-2f, 5e-3f, 1e-2f, 3e-3f};
  for (int t = 1; t <= 5; ++t) {
    std::vector<float> g = random_vector(n, 100 + t, 0.5f * t);
    opt.step(p.data(), g.data(), lrs[t - 1]);
    for (size_t i = 0; i < n; ++i)
      st[i].step(ref[i], g[i], lrs[t - 1], c.beta1, c.beta2, c.eps, wd[i], t);
  }
  EXPECT_EQ(opt.steps(), 5);
  for (size_t i = 0; i < n; ++i)
    ASSERT_NEAR(p[i], ref[i], 1e-6 * std::max(1.0, std::abs(ref[i]))) << "element " << i;
}

TEST(AdamW, DecaysOnlySlotsMarkedForDecay) {
  // With zero gradients the Adam term is 0 / (0 + eps) = 0, so what moves is
  // the decoupled decay alone: p * (1 - lr * wd)^steps on decay slots, and
  // nothing elsewhere.
  Layout l = mixed_layout();
  const size_t n = l.numel();
  OptimizerConfig c;
  c.name = "adamw";
  c.weight_decay = 0.5f;
  AdamW opt(c, l, 0, n);
  const std::vector<float> p0 = random_vector(n, 2);
  std::vector<float> p = p0, g(n, 0.0f);
  const float lr = 0.1f;
  for (int t = 0; t < 5; ++t) opt.step(p.data(), g.data(), lr);
  const double keep = std::pow(1.0 - lr * c.weight_decay, 5);
  int decayed = 0, plain = 0;
  for (const Slot& s : l.slots()) {
    for (size_t i = s.offset; i < s.offset + s.numel; ++i) {
      if (s.decay) {
        ASSERT_NEAR(p[i], p0[i] * keep, 1e-6) << s.name;
        ++decayed;
      } else {
        ASSERT_EQ(p[i], p0[i]) << s.name;
        ++plain;
      }
    }
  }
  EXPECT_EQ(decayed, 221 + 319 + 400);
  EXPECT_EQ(plain, 13 + 47);
}

// ---------------------------------------------------------------- sharding

// An optimizer over [begin, begin + n) must update that span exactly as the
// whole-buffer optimizer does, so ZeRO shards reproduce unsharded training.
void expect_shard_matches_full(const std::string& name) {
  Layout l = mixed_layout();
  const size_t N = l.numel();
  OptimizerConfig c;
  c.name = name;
  c.weight_decay = 0.2f;
  // Spans that start and end inside slots, cover one unit boundary, are a
  // single element, or the tail.
  const std::pair<size_t, size_t> spans[] = {{100, 500}, {7, 226}, {553, 1}, {230, 770}, {0, 221}};
  for (auto [begin, n] : spans) {
    SCOPED_TRACE(fmt::format("{} span [{}, {})", name, begin, begin + n));
    auto full = make_optimizer(c, l, 0, N);
    auto shard = make_optimizer(c, l, begin, n);
    EXPECT_EQ(shard->state_bytes(), (name == "sgd" ? 4 : 8) * n);
    std::vector<float> p_full = random_vector(N, 3);
    // The shard's own copy, so any write outside its span would show.
    std::vector<float> p_shard(p_full.begin() + begin, p_full.begin() + begin + n);
    for (int t = 0; t < 4; ++t) {
      std::vector<float> g = random_vector(N, 200 + t);
      const float lr = 0.01f * (t + 1);
      full->step(p_full.data(), g.data(), lr);
      shard->step(p_shard.data(), g.data() + begin, lr);
    }
    ASSERT_TRUE(test::bitwise_equal(p_shard.data(), p_full.data() + begin, n))
        << "shard differs from the full-span update";
  }
}

TEST(Sharding, SgdShardIsBitwiseEqualToFullSpan) { expect_shard_matches_full("sgd"); }
TEST(Sharding, AdamWShardIsBitwiseEqualToFullSpan) { expect_shard_matches_full("adamw"); }

// GradsAfter::Zeroed clears exactly the span's gradients as the update reads
// them and changes nothing else: parameters and state bitwise those of a
// Kept update, on every step (the next step's gradients then accumulate
// from zero, as after a memset).
void expect_zeroed_matches_kept(const std::string& name) {
  Layout l = mixed_layout();
  const size_t N = l.numel(), begin = 7, n = 900;
  OptimizerConfig c;
  c.name = name;
  c.weight_decay = 0.2f;
  auto kept = make_optimizer(c, l, begin, n), zeroed = make_optimizer(c, l, begin, n);
  std::vector<float> p_kept = random_vector(n, 5), p_zeroed = p_kept;
  for (int t = 0; t < 4; ++t) {
    SCOPED_TRACE(fmt::format("{} step {}", name, t + 1));
    const std::vector<float> g = random_vector(N, 300 + t);
    std::vector<float> g_kept = g, g_zeroed = g;
    kept->step(p_kept.data(), g_kept.data() + begin, 0.01f, GradsAfter::Kept);
    zeroed->step(p_zeroed.data(), g_zeroed.data() + begin, 0.01f, GradsAfter::Zeroed);
    ASSERT_TRUE(test::bitwise_equal(p_zeroed.data(), p_kept.data(), n)) << "parameters";
    std::vector<float> a(n), b(n);
    for (size_t i = 0; i < kept->state_names().size(); ++i) {
      kept->read_state(i, 0, n, a.data());
      zeroed->read_state(i, 0, n, b.data());
      ASSERT_TRUE(test::bitwise_equal(b.data(), a.data(), n)) << "state " << kept->state_names()[i];
    }
    EXPECT_EQ(g_kept, g) << "a Kept update wrote its gradients";
    for (size_t i = 0; i < N; ++i) {
      const bool in_span = i >= begin && i < begin + n;
      ASSERT_EQ(g_zeroed[i], in_span ? 0.0f : g[i]) << "gradient " << i;
    }
  }
}

TEST(GradsAfter, SgdZeroedClearsTheSpanAndUpdatesAsKept) { expect_zeroed_matches_kept("sgd"); }
TEST(GradsAfter, AdamWZeroedClearsTheSpanAndUpdatesAsKept) { expect_zeroed_matches_kept("adamw"); }

// A bf16 run's compute copy written by the update itself (publish): the
// parameters, state and gradients bitwise those of an update without it,
// and the copy exactly the parameters rounded to bf16, every step.
void expect_copy_is_the_rounded_update(const std::string& name) {
  Layout l = mixed_layout();
  const size_t N = l.numel(), begin = 7, n = 900;
  OptimizerConfig c;
  c.name = name;
  c.momentum = 0.9f;
  c.weight_decay = 0.2f;
  auto plain = make_optimizer(c, l, begin, n), copying = make_optimizer(c, l, begin, n);
  std::vector<float> p_plain = random_vector(n, 6), p_copying = p_plain;
  std::vector<bf16> copy(n), want(n);
  for (int t = 0; t < 3; ++t) {
    SCOPED_TRACE(fmt::format("{} step {}", name, t + 1));
    const std::vector<float> g = random_vector(N, 400 + t);
    std::vector<float> g_plain = g, g_copying = g;
    plain->step(p_plain.data(), g_plain.data() + begin, 0.01f, GradsAfter::Zeroed);
    copying->step(p_copying.data(), g_copying.data() + begin, 0.01f, GradsAfter::Zeroed, copy.data());
    ASSERT_TRUE(test::bitwise_equal(p_copying.data(), p_plain.data(), n)) << "parameters";
    ASSERT_EQ(g_copying, g_plain) << "gradients";
    std::vector<float> a(n), b(n);
    for (size_t i = 0; i < plain->state_names().size(); ++i) {
      plain->read_state(i, 0, n, a.data());
      copying->read_state(i, 0, n, b.data());
      ASSERT_TRUE(test::bitwise_equal(b.data(), a.data(), n)) << "state " << plain->state_names()[i];
    }
    convert(want.data(), p_plain.data(), n);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(copy[i].bits, want[i].bits) << "bf16 copy " << i;
  }
}

TEST(Bf16Copy, SgdWritesTheRoundedParameters) { expect_copy_is_the_rounded_update("sgd"); }
TEST(Bf16Copy, AdamWWritesTheRoundedParameters) { expect_copy_is_the_rounded_update("adamw"); }

TEST(Sharding, SpanPastTheLayoutIsAnInternalError) {
  Layout l = tiny_layout();
  OptimizerConfig c;
  EXPECT_THROW(Sgd(c, l, 2, 3), InternalError);
}

// ---------------------------------------------------------------- factory

TEST(MakeOptimizer, BuildsByName) {
  Layout l = tiny_layout();
  OptimizerConfig c;
  c.name = "sgd";
  EXPECT_NE(dynamic_cast<Sgd*>(make_optimizer(c, l, 0, 4).get()), nullptr);
  c.name = "adamw";
  EXPECT_NE(dynamic_cast<AdamW*>(make_optimizer(c, l, 0, 4).get()), nullptr);
}

TEST(MakeOptimizer, UnknownNameIsAnInputError) {
  Layout l = tiny_layout();
  OptimizerConfig c;
  c.name = "lamb";
  try {
    make_optimizer(c, l, 0, 4);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("lamb"), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------- schedule

TEST(Schedule, ConstantIsConstant) {
  Schedule s;
  s.kind = "constant";
  s.lr = 0.05f;
  s.total_steps = 100;
  for (int64_t step : {0, 1, 50, 99, 100, 1000}) EXPECT_EQ(s.at(step), 0.05f) << step;
}

TEST(Schedule, WarmupIsLinearFromLrOverWarmupToLr) {
  Schedule s;
  s.kind = "constant";
  s.lr = 0.1f;
  s.warmup = 4;
  s.total_steps = 20;
  EXPECT_FLOAT_EQ(s.at(0), 0.025f);  // lr / warmup
  EXPECT_FLOAT_EQ(s.at(1), 0.05f);
  EXPECT_FLOAT_EQ(s.at(2), 0.075f);
  EXPECT_FLOAT_EQ(s.at(3), 0.1f);    // warmup - 1: lr
  EXPECT_FLOAT_EQ(s.at(4), 0.1f);
  EXPECT_FLOAT_EQ(s.at(19), 0.1f);
}

TEST(Schedule, CosineDecaysFromLrToMinLr) {
  Schedule s;
  s.kind = "cosine";
  s.lr = 1.0f;
  s.min_lr = 0.1f;
  s.warmup = 10;
  s.total_steps = 110;
  EXPECT_FLOAT_EQ(s.at(0), 0.1f);      // warm-up still applies
  EXPECT_FLOAT_EQ(s.at(9), 1.0f);
  EXPECT_FLOAT_EQ(s.at(10), 1.0f);     // right after warm-up: lr
  EXPECT_NEAR(s.at(60), 0.55f, 1e-6);  // half way: the midpoint
  EXPECT_NEAR(s.at(110), 0.1f, 1e-7);  // total_steps: min_lr
  EXPECT_NEAR(s.at(500), 0.1f, 1e-7);  // and it stays there
  float prev = s.at(10);
  for (int64_t step = 11; step <= 130; ++step) {
    const float cur = s.at(step);
    ASSERT_LE(cur, prev) << "step " << step;
    ASSERT_GE(cur, s.min_lr - 1e-7f) << "step " << step;
    prev = cur;
  }
}

TEST(Schedule, CosineWithoutWarmupStartsAtLr) {
  Schedule s;
  s.kind = "cosine";
  s.lr = 3e-4f;
  s.min_lr = 0.0f;
  s.total_steps = 50;
  EXPECT_FLOAT_EQ(s.at(0), 3e-4f);
  EXPECT_NEAR(s.at(50), 0.0f, 1e-10);
  EXPECT_LT(s.at(25), s.at(24));
}

TEST(Schedule, UnknownKindIsAnInputError) {
  Schedule s;
  s.kind = "step";
  EXPECT_THROW(s.at(3), InputError);
}

// ---------------------------------------------------------------- clipping

TEST(Clip, NormTenClippedToOneHasNormOne) {
  std::vector<float> g(100);
  for (size_t i = 0; i < g.size(); ++i) g[i] = (i % 2 ? 1.0f : -1.0f);  // norm sqrt(100) = 10
  const double norm = std::sqrt(sum_of_squares(g.data(), g.size()));
  EXPECT_DOUBLE_EQ(norm, 10.0);
  const float f = clip_factor(norm, 1.0f);
  EXPECT_NEAR(f, 0.1f, 1e-7);
  scale(g.data(), g.size(), f);
  EXPECT_NEAR(std::sqrt(sum_of_squares(g.data(), g.size())), 1.0, 1e-5);
  EXPECT_FLOAT_EQ(g[0], -f);
  EXPECT_FLOAT_EQ(g[1], f);
}

TEST(Clip, NormBelowMaxLeavesGradientAlone) {
  EXPECT_EQ(clip_factor(0.5, 1.0f), 1.0f);
  EXPECT_EQ(clip_factor(0.0, 1.0f), 1.0f);
  EXPECT_EQ(clip_factor(0.999, 1.0f), 1.0f);
}

TEST(Clip, SumOfSquaresIsExactForSmallIntegers) {
  const float g[] = {3.0f, 4.0f, -12.0f};
  EXPECT_DOUBLE_EQ(sum_of_squares(g, 3), 169.0);
  EXPECT_DOUBLE_EQ(sum_of_squares(g, 0), 0.0);
}

}  // namespace
}  // namespace dpt
