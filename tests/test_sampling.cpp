// The next-token sampler of `dpt generate` (models/sampling.h): each knob,
// seeding, and the draws' frequencies.
#include <cmath>
#include <limits>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "core/rng.h"
#include "models/sampling.h"

namespace dpt {
namespace {

// V logits drawn N(0, 2), seeded.
std::vector<float> random_logits(int64_t V, uint64_t seed) {
  std::vector<float> l(static_cast<size_t>(V));
  for (int64_t i = 0; i < V; ++i) l[static_cast<size_t>(i)] = 2.0f * counter_normal(seed, i);
  return l;
}

// Logits whose softmax is exactly `probs` (up to rounding).
std::vector<float> logits_of(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(static_cast<float>(std::log(p)));
  return l;
}

std::vector<int32_t> draws(const std::vector<float>& logits, const SamplingOptions& o, uint64_t seed, int n) {
  TokenSampler s(o, seed);
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) out.push_back(s.next(logits.data(), static_cast<int64_t>(logits.size())));
  return out;
}

TEST(Sampling, GreedyIsTheFirstLargestLogit) {
  const std::vector<float> l = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f};
  EXPECT_EQ(argmax_token(l.data(), 5), 1);
  SamplingOptions o;
  o.greedy = true;
  EXPECT_EQ(draws(l, o, 3, 5), std::vector<int32_t>(5, 1));
}

TEST(Sampling, TopK1AndTemperature0AreGreedy) {
  for (uint64_t seed = 0; seed < 20; ++seed) {
    const std::vector<float> l = random_logits(500, seed);
    const int32_t best = argmax_token(l.data(), 500);
    SamplingOptions k1;
    k1.top_k = 1;
    k1.temperature = 5.0f;
    SamplingOptions t0;
    t0.temperature = 0.0f;
    EXPECT_EQ(draws(l, k1, seed, 3), std::vector<int32_t>(3, best)) << seed;
    EXPECT_EQ(draws(l, t0, seed, 3), std::vector<int32_t>(3, best)) << seed;
  }
}

TEST(Sampling, TheSameSeedGivesTheSameTokens) {
  const std::vector<float> l = random_logits(300, 1);
  SamplingOptions o;
  o.top_k = 40;
  o.top_p = 0.9f;
  o.temperature = 0.8f;
  EXPECT_EQ(draws(l, o, 42, 200), draws(l, o, 42, 200));
  // Nothing else in the process moves a seed's stream.
  const std::vector<int32_t> first = draws(l, o, 42, 200);
  (void)draws(l, o, 7, 33);
  EXPECT_EQ(draws(l, o, 42, 200), first);
}

TEST(Sampling, DifferentSeedsDifferOnAFlatDistribution) {
  const std::vector<float> flat(1000, 0.0f);
  const SamplingOptions o;
  const std::vector<int32_t> a = draws(flat, o, 1, 50), b = draws(flat, o, 2, 50);
  EXPECT_NE(a, b);
  // A flat distribution's 50 draws spread over many tokens.
  EXPECT_GT(std::set<int32_t>(a.begin(), a.end()).size(), 40u);
}

TEST(Sampling, TopKKeepsTheKLargest) {
  const std::vector<float> l = random_logits(200, 5);
  SamplingOptions o;
  o.top_k = 7;
  const auto c = sampling_candidates(l.data(), 200, o);
  ASSERT_EQ(c.size(), 7u);
  // Every kept logit is at least every dropped one.
  std::set<int32_t> kept;
  float lowest_kept = std::numeric_limits<float>::infinity();
  for (const auto& [id, p] : c) kept.insert(id), lowest_kept = std::min(lowest_kept, l[static_cast<size_t>(id)]);
  for (int32_t i = 0; i < 200; ++i) {
    if (!kept.count(i)) {
      EXPECT_LE(l[static_cast<size_t>(i)], lowest_kept) << i;
    }
  }
  for (int32_t t : draws(l, o, 9, 500)) EXPECT_TRUE(kept.count(t)) << t;
}

TEST(Sampling, TopPKeepsTheSmallestSetReachingP) {
  // Probabilities 0.5, 0.2, 0.15, 0.1, 0.05, in a shuffled order of ids.
  const std::vector<double> probs = {0.1, 0.5, 0.05, 0.2, 0.15};
  const std::vector<float> l = logits_of(probs);
  const std::vector<std::pair<float, std::vector<int32_t>>> cases = {
      {0.45f, {1}}, {0.6f, {1, 3}}, {0.8f, {1, 3, 4}}, {0.92f, {1, 3, 4, 0}}, {0.999f, {1, 3, 4, 0, 2}}};
  for (const auto& [p, want] : cases) {
    SamplingOptions o;
    o.top_p = p;
    const auto c = sampling_candidates(l.data(), 5, o);
    std::vector<int32_t> ids;
    double sum = 0, kept = 0;
    for (const auto& [id, q] : c) ids.push_back(id), sum += q, kept += probs[static_cast<size_t>(id)];
    EXPECT_EQ(ids, want) << "top-p " << p;
    EXPECT_NEAR(sum, 1.0, 1e-12);
    // Renormalised over the kept set.
    for (const auto& [id, q] : c) EXPECT_NEAR(q, probs[static_cast<size_t>(id)] / kept, 1e-6) << p;
  }
}

TEST(Sampling, TemperatureScalesTheLogits) {
  const std::vector<float> l = {1.0f, 2.0f, 3.0f};
  SamplingOptions o;
  o.temperature = 2.0f;
  const auto c = sampling_candidates(l.data(), 3, o);
  ASSERT_EQ(c.size(), 3u);
  const double z = std::exp(0.5) + std::exp(1.0) + std::exp(1.5);
  for (const auto& [id, p] : c) EXPECT_NEAR(p, std::exp((id + 1) / 2.0) / z, 1e-9) << id;
}

TEST(Sampling, DrawsFollowTheProbabilities) {
  const std::vector<double> probs = {0.1, 0.5, 0.05, 0.2, 0.15};
  const std::vector<float> l = logits_of(probs);
  const int n = 20000;
  std::vector<int> count(5, 0);
  for (int32_t t : draws(l, SamplingOptions{}, 123, n)) ++count[static_cast<size_t>(t)];
  // Five standard deviations of a binomial at n = 20000: at most 0.018.
  for (size_t i = 0; i < 5; ++i) EXPECT_NEAR(count[i] / double(n), probs[i], 0.018) << i;
}

TEST(Sampling, BadKnobsAreRefused) {
  const auto refused = [](SamplingOptions o) { EXPECT_THROW(TokenSampler(o, 1), InputError); };
  SamplingOptions o;
  o.temperature = -1.0f;
  refused(o);
  o.temperature = std::numeric_limits<float>::quiet_NaN();
  refused(o);
  o = {};
  o.top_k = -2;
  refused(o);
  o = {};
  o.top_p = 0.0f;
  refused(o);
  o.top_p = 1.5f;
  refused(o);
}

}  // namespace
}  // namespace dpt
