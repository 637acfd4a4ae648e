// The vocabulary-parallel embedding and cross-entropy (nn/vocab_parallel.h)
// against the whole-vocabulary layers, with P ranks simulated in one
// process: each part computed on its own rows or columns, the group's Max
// and Sum taken by hand between the passes. V = 10 rows split over P = 4 as
// 3 + 3 + 3 + 1 live (2 pad rows on the last part), and over P = 6 as
// 2 + 2 + 2 + 2 + 2 + 0 live: a part without a single row of the
// vocabulary must still take part in the reductions.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "core/rng.h"
#include "nn/cross_entropy.h"
#include "nn/embedding.h"
#include "nn/vocab_parallel.h"

namespace dpt {
namespace {

constexpr int64_t kV = 10, kN = 7, kC = 5;

std::vector<float> normal(size_t n, uint64_t seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = 3.0f * counter_normal(seed, i);
  return v;
}

class VocabParallel : public ::testing::TestWithParam<int64_t> {};

TEST_P(VocabParallel, EmbeddingSumsToTheWholeLookup) {
  const int64_t P = GetParam(), rows = (kV + P - 1) / P;
  std::vector<float> table = normal(static_cast<size_t>(rows * P * kC), 1);
  std::fill(table.begin() + kV * kC, table.end(), 0.0f);  // pad rows
  const std::vector<int32_t> ids = {0, 9, 3, 3, 7, 1, 9};
  std::vector<float> whole(kN * kC), sum(kN * kC, 0.0f), part(kN * kC);
  embedding_forward(whole.data(), ids.data(), table.data(), kN, kC);
  const std::vector<float> dout = normal(kN * kC, 2);
  std::vector<float> dwhole(kV * kC, 0.0f), dparts(static_cast<size_t>(rows * P * kC), 0.0f);
  embedding_backward(dwhole.data(), dout.data(), ids.data(), kN, kC);
  for (int64_t r = 0; r < P; ++r) {
    vocab_embedding_forward(part.data(), ids.data(), table.data() + r * rows * kC, r * rows, rows, kN, kC);
    for (size_t i = 0; i < part.size(); ++i) sum[i] += part[i];
    vocab_embedding_backward(dparts.data() + r * rows * kC, dout.data(), ids.data(), r * rows, rows, kN, kC);
  }
  EXPECT_EQ(sum, whole);  // one value and zeros per element: exact
  EXPECT_TRUE(std::equal(dwhole.begin(), dwhole.end(), dparts.begin()));
  EXPECT_TRUE(std::all_of(dparts.begin() + kV * kC, dparts.end(), [](float g) { return g == 0.0f; }));
}

TEST_P(VocabParallel, CrossEntropyMatchesTheWholeVocabularys) {
  const int64_t P = GetParam(), W = (kV + P - 1) / P;
  const std::vector<float> logits = normal(kN * kV, 3);
  const std::vector<int32_t> targets = {0, 9, 4, 4, 8, 1, 6};
  std::vector<float> probs(kN * kV);
  int64_t whole_correct = 0;
  const float whole_loss =
      cross_entropy_forward(probs.data(), logits.data(), targets.data(), kN, kV, &whole_correct);
  cross_entropy_backward(probs.data(), probs.data(), targets.data(), kN, kV, 0.5f);
  // Each part's columns [r W, r W + W) of the logits, pad columns garbage.
  std::vector<std::vector<float>> parts(static_cast<size_t>(P), std::vector<float>(kN * W, 1e30f));
  auto live = [&](int64_t r) { return std::clamp<int64_t>(kV - r * W, 0, W); };
  for (int64_t r = 0; r < P; ++r)
    for (int64_t n = 0; n < kN; ++n)
      for (int64_t v = 0; v < live(r); ++v) parts[r][n * W + v] = logits[n * kV + r * W + v];
  std::vector<float> zmax(kN, -std::numeric_limits<float>::infinity()), sums(2 * kN, 0.0f), mine(kN), part_sums(2 * kN);
  for (int64_t r = 0; r < P; ++r) {
    vocab_ce_max(mine.data(), parts[r].data(), kN, W, live(r));
    for (int64_t n = 0; n < kN; ++n) zmax[n] = std::max(zmax[n], mine[n]);
  }
  for (int64_t r = 0; r < P; ++r) {
    vocab_ce_exp(parts[r].data(), part_sums.data(), zmax.data(), targets.data(), r * W, kN, W, live(r));
    for (int64_t i = 0; i < 2 * kN; ++i) sums[i] += part_sums[i];
  }
  for (int64_t r = 0; r < P; ++r) {
    int64_t correct = 0;
    const float loss = vocab_ce_loss(parts[r].data(), sums.data(), zmax.data(), kN, W, live(r), &correct);
    EXPECT_NEAR(loss, whole_loss, 1e-6 * std::fabs(whole_loss));
    EXPECT_EQ(correct, whole_correct);
    vocab_ce_backward(parts[r].data(), targets.data(), r * W, kN, W, live(r), 0.5f);
    for (int64_t n = 0; n < kN; ++n) {
      for (int64_t v = 0; v < live(r); ++v)
        EXPECT_NEAR(parts[r][n * W + v], probs[n * kV + r * W + v], 1e-6) << "part " << r << " row " << n;
      for (int64_t v = live(r); v < W; ++v) EXPECT_EQ(parts[r][n * W + v], 0.0f) << "pad column";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Parts, VocabParallel, ::testing::Values(1, 2, 4, 6));

}  // namespace
}  // namespace dpt
