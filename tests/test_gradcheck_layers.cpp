// Finite-difference gradient checks of every layer's backward, on one
// thread and on two, and the two threads' gradients against the one's.
//
// The residual connection has no backward kernel (nn/residual.h: the models
// carry its identity backward in the residual stream's gradient buffer), so
// it is checked where that happens, in test_gradcheck_models.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "compare.h"
#include "core/threads.h"
#include "gradcheck.h"
#include "nn/activations.h"
#include "nn/attention.h"
#include "nn/cross_entropy.h"
#include "nn/embedding.h"
#include "nn/layernorm.h"
#include "nn/linear.h"

namespace dpt {
namespace {

using test::dot;
using test::expect_gradient;
using test::random_vector;

// Each gradient check runs on 1 and on 2 threads; LayerThreads below
// compares the two threads' gradients with the one's.
class LayerGrad : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { set_threads(GetParam()); }
  Rng rng{42};
};

TEST_P(LayerGrad, Linear) {
  const int64_t N = 6, C = 5, OC = 7;
  auto x = random_vector(N * C, rng), w = random_vector(OC * C, rng), b = random_vector(OC, rng);
  auto R = random_vector(N * OC, rng);
  std::vector<float> out(N * OC);
  auto loss = [&] {
    linear_forward(out.data(), x.data(), w.data(), b.data(), N, C, OC);
    return dot(out, R);
  };
  std::vector<float> dx(N * C), dw(OC * C, 0.0f), db(OC, 0.0f);
  linear_backward(dx.data(), dw.data(), db.data(), R.data(), x.data(), w.data(), N, C, OC);
  expect_gradient("linear dinp", x, dx, loss);
  expect_gradient("linear dweight", w, dw, loss);
  expect_gradient("linear dbias", b, db, loss);
}

TEST_P(LayerGrad, LinearAccumulatesWeightGradients) {
  // Backward adds into dweight/dbias: two calls give twice the gradient.
  const int64_t N = 4, C = 3, OC = 2;
  auto x = random_vector(N * C, rng), w = random_vector(OC * C, rng), R = random_vector(N * OC, rng);
  std::vector<float> dw1(OC * C, 0.0f), db1(OC, 0.0f), dw2(OC * C, 0.0f), db2(OC, 0.0f);
  linear_backward(nullptr, dw1.data(), db1.data(), R.data(), x.data(), w.data(), N, C, OC);
  for (int rep = 0; rep < 2; ++rep)
    linear_backward(nullptr, dw2.data(), db2.data(), R.data(), x.data(), w.data(), N, C, OC);
  for (size_t i = 0; i < dw1.size(); ++i) EXPECT_FLOAT_EQ(dw2[i], 2.0f * dw1[i]);
  for (size_t i = 0; i < db1.size(); ++i) EXPECT_FLOAT_EQ(db2[i], 2.0f * db1[i]);
}

TEST_P(LayerGrad, LinearWeightGradientInRowBlocks) {
  // The MLP computes large weight gradients in row blocks, last block first,
  // to report them ready early. Every block must land on its own rows with
  // the right values: checked against a double-precision product, to within
  // fp32 rounding of the sum's terms. (Not bitwise against one whole GEMM:
  // OpenBLAS's AVX2 kernels round the edge rows of a block differently; the
  // MLP always uses the same blocks, so runs stay reproducible.)
  const int64_t N = 128, C = 300, OC = 520;
  auto x = random_vector(N * C, rng), R = random_vector(N * OC, rng);
  for (int64_t rows : {1, 7, 128, 256, 520}) {
    std::vector<float> blocked(OC * C, 0.5f);
    for (int64_t o1 = OC; o1 > 0; o1 -= rows)
      linear_backward_weight(blocked.data(), R.data(), x.data(), N, C, OC, std::max<int64_t>(0, o1 - rows), o1);
    size_t bad = 0;
    for (int64_t o = 0; o < OC; ++o)
      for (int64_t c = 0; c < C; ++c) {
        double sum = 0.5, mag = 0.5;
        for (int64_t n = 0; n < N; ++n) {
          const double t = static_cast<double>(R[n * OC + o]) * x[n * C + c];
          sum += t;
          mag += std::fabs(t);
        }
        if (!test::near(blocked[o * C + c], sum, 1e-5 * mag)) ++bad;  // NaN counts as bad
      }
    EXPECT_EQ(bad, 0u) << "blocks of " << rows << " rows";
  }
}

TEST_P(LayerGrad, Relu) {
  const int64_t n = 40;
  auto x = random_vector(n, rng), R = random_vector(n, rng);
  // Keep inputs away from the kink, where the derivative is undefined.
  for (float& v : x) v += (v >= 0 ? 0.05f : -0.05f);
  std::vector<float> out(n), dx(n);
  auto loss = [&] {
    relu_forward(out.data(), x.data(), n);
    return dot(out, R);
  };
  loss();
  relu_backward(dx.data(), R.data(), out.data(), n);
  expect_gradient("relu", x, dx, loss, 1e-3);
}

TEST_P(LayerGrad, Gelu) {
  const int64_t n = 50;
  auto x = random_vector(n, rng, 2.0f), R = random_vector(n, rng);
  std::vector<float> out(n), dx(n);
  auto loss = [&] {
    gelu_forward(out.data(), x.data(), n);
    return dot(out, R);
  };
  gelu_backward(dx.data(), R.data(), x.data(), n);
  expect_gradient("gelu", x, dx, loss, 1e-3);
}

// The fused GELU backward (with the bias gradient and the bf16 copy) is its
// three parts: the gradient as gelu_backward's, to within 2e-4 (the bf16
// path's sigmoid: nn/activations_avx512.h, or nn/fast_tanh.h's, whose
// vector loop divides by a refined reciprocal; test_activations_bf16 holds
// both against the exact gelu'), and from that gradient exactly the bias
// sums linear_backward_bias makes, in its order, and convert's bf16; at a
// width that is not a multiple of the 64-column blocks, in place. Without
// the bf16 copy the fp32 path's gradient, to within 3e-5.
TEST_P(LayerGrad, GeluBackwardFusedIsItsParts) {
  const int64_t N = 37, OC = 150;
  const auto x = random_vector(N * OC, rng, 3.0f), dy = random_vector(N * OC, rng);
  const auto bias0 = random_vector(OC, rng);
  std::vector<float> dx(N * OC);
  gelu_backward(dx.data(), dy.data(), x.data(), N * OC);
  std::vector<float> fused = dy, fused_db = bias0;
  std::vector<bf16> fused16(N * OC);
  gelu_backward(fused.data(), fused16.data(), fused_db.data(), fused.data(), x.data(), N, OC);
  std::vector<float> db = bias0;
  std::vector<bf16> want16(N * OC);
  linear_backward_bias(db.data(), fused.data(), N, OC);
  convert(want16.data(), fused.data(), static_cast<size_t>(N * OC));
  for (int64_t i = 0; i < N * OC; ++i) {
    ASSERT_NEAR(fused[i], dx[i], 2e-4 * std::fabs(dy[i]) * (1.0f + std::fabs(x[i])))
        << i << ": x " << x[i] << ", dy " << dy[i];
    ASSERT_EQ(fused16[i].bits, want16[i].bits) << i;
  }
  for (int64_t o = 0; o < OC; ++o) ASSERT_EQ(fused_db[o], db[o]) << o;
  // Without the optional outputs: the same gradient.
  std::vector<float> plain(N * OC);
  gelu_backward(plain.data(), nullptr, nullptr, dy.data(), x.data(), N, OC);
  for (int64_t i = 0; i < N * OC; ++i) ASSERT_NEAR(plain[i], dx[i], 3e-5 * std::fabs(dy[i])) << i;
}

// A bf16 linear backward's operand and bias gradient from one pass are
// exactly its two parts: convert's bf16 and linear_backward_bias's sums (in
// its order, added to what dbias held), at widths that are and are not
// multiples of the 64-column blocks and of the threads' 16-column lines.
TEST_P(LayerGrad, BiasSumsWithTheBf16CopyAreTheirParts) {
  for (const int64_t OC : {1, 10, 150, 768}) {
    const int64_t N = 37;
    const auto dy = random_vector(N * OC, rng, 2.0f);
    const auto bias0 = random_vector(OC, rng);
    std::vector<float> fused_db = bias0, db = bias0;
    std::vector<bf16> fused16(N * OC), want16(N * OC);
    linear_backward_bias_bf16(fused_db.data(), fused16.data(), dy.data(), N, OC);
    linear_backward_bias(db.data(), dy.data(), N, OC);
    convert(want16.data(), dy.data(), static_cast<size_t>(N * OC));
    for (int64_t i = 0; i < N * OC; ++i) ASSERT_EQ(fused16[i].bits, want16[i].bits) << OC << ": " << i;
    for (int64_t o = 0; o < OC; ++o) ASSERT_EQ(fused_db[o], db[o]) << OC << ": " << o;
  }
}

// The logits' gradient with its bf16 copy is exactly cross_entropy_backward
// then convert, in place over the probabilities as the decoder runs it; and
// the copy alone (no fp32 gradient, as a bf16 run on the CPU asks) has the
// same bits and leaves the probabilities as they were.
TEST_P(LayerGrad, CrossEntropyBackwardWithTheBf16CopyIsItsParts) {
  for (int64_t V : {37, 1000}) {
    const int64_t N = 64;
    const auto probs = random_vector(N * V, rng);
    std::vector<int32_t> targets(N);
    for (int64_t n = 0; n < N; ++n) targets[n] = static_cast<int32_t>((7 * n + 3) % V);
    std::vector<float> want = probs, got = probs;
    cross_entropy_backward(want.data(), want.data(), targets.data(), N, V, 1.0f / N);
    std::vector<bf16> want16(N * V), got16(N * V), alone16(N * V);
    convert(want16.data(), want.data(), want.size());
    cross_entropy_backward_bf16(got.data(), got16.data(), V, got.data(), targets.data(), N, V, 1.0f / N);
    cross_entropy_backward_bf16(nullptr, alone16.data(), V, probs.data(), targets.data(), N, V, 1.0f / N);
    for (int64_t i = 0; i < N * V; ++i) {
      ASSERT_EQ(got[i], want[i]) << i;
      ASSERT_EQ(got16[i].bits, want16[i].bits) << i;
      ASSERT_EQ(alone16[i].bits, want16[i].bits) << "V " << V << ": " << i;
    }
    // A padded vocabulary (rows Vp apart): what the fp32 gradient unpacked
    // to the padded rows (pad columns zero) and converted gives, bit for bit.
    const int64_t Vp = V + 27;
    std::vector<float> unpacked(static_cast<size_t>(N * Vp), 0.0f);
    for (int64_t n = 0; n < N; ++n) std::copy(&want[n * V], &want[n * V] + V, &unpacked[n * Vp]);
    std::vector<bf16> want_padded(static_cast<size_t>(N * Vp)), padded(static_cast<size_t>(N * Vp), bf16{0x7777});
    convert(want_padded.data(), unpacked.data(), unpacked.size());
    cross_entropy_backward_bf16(nullptr, padded.data(), Vp, probs.data(), targets.data(), N, V, 1.0f / N);
    for (int64_t i = 0; i < N * Vp; ++i) ASSERT_EQ(padded[i].bits, want_padded[i].bits) << "V " << V << " padded: " << i;
  }
}

TEST_P(LayerGrad, GeluMatchesTanhFormula) {
  const float xs[] = {-6.0f, -1.5f, -0.1f, 0.0f, 0.3f, 2.0f, 9.0f};
  for (float x : xs) {
    float y;
    gelu_forward(&y, &x, 1);
    double ref = 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
    EXPECT_NEAR(y, ref, 1e-6 + 1e-6 * std::fabs(ref)) << "x = " << x;
  }
  // A dense grid over [-12, 12] through the vector loop (its own exp, not
  // libm's), the tails where tanh saturates included.
  const int64_t n = 24001;
  std::vector<float> x(n), y(n);
  for (int64_t i = 0; i < n; ++i) x[i] = -12.0f + 24.0f * static_cast<float>(i) / static_cast<float>(n - 1);
  gelu_forward(y.data(), x.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    const double xi = x[i];
    const double ref = 0.5 * xi * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (xi + 0.044715 * xi * xi * xi)));
    ASSERT_NEAR(y[i], ref, 1e-6 + 1e-6 * std::fabs(ref)) << "x = " << xi;
  }
}

TEST_P(LayerGrad, LayerNorm) {
  const int64_t N = 5, C = 8;
  auto x = random_vector(N * C, rng), w = random_vector(C, rng), b = random_vector(C, rng);
  auto R = random_vector(N * C, rng);
  std::vector<float> out(N * C), mean(N), rstd(N);
  auto loss = [&] {
    layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
    return dot(out, R);
  };
  loss();
  std::vector<float> dx(N * C, 0.0f), dw(C, 0.0f), db(C, 0.0f);
  layernorm_backward(dx.data(), dw.data(), db.data(), R.data(), x.data(), w.data(), mean.data(),
                     rstd.data(), N, C);
  expect_gradient("layernorm dinp", x, dx, loss);
  expect_gradient("layernorm dweight", w, dw, loss);
  expect_gradient("layernorm dbias", b, db, loss);
}

TEST_P(LayerGrad, LayerNormNormalises) {
  const int64_t N = 3, C = 16;
  auto x = random_vector(N * C, rng, 5.0f);
  std::vector<float> w(C, 1.0f), b(C, 0.0f), out(N * C), mean(N), rstd(N);
  layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  for (int64_t n = 0; n < N; ++n) {
    double m = 0, v = 0;
    for (int64_t c = 0; c < C; ++c) m += out[n * C + c];
    m /= C;
    for (int64_t c = 0; c < C; ++c) v += (out[n * C + c] - m) * (out[n * C + c] - m);
    EXPECT_NEAR(m, 0.0, 1e-5);
    EXPECT_NEAR(v / C, 1.0, 1e-3);
  }
}

TEST_P(LayerGrad, Embedding) {
  const int64_t V = 6, C = 4, N = 9;
  std::vector<int32_t> ids = {0, 3, 3, 5, 1, 3, 0, 2, 5};  // repeats on purpose
  auto table = random_vector(V * C, rng), R = random_vector(N * C, rng);
  std::vector<float> out(N * C), dtable(V * C, 0.0f);
  auto loss = [&] {
    embedding_forward(out.data(), ids.data(), table.data(), N, C);
    return dot(out, R);
  };
  embedding_backward(dtable.data(), R.data(), ids.data(), N, C);
  expect_gradient("embedding", table, dtable, loss);
}

TEST_P(LayerGrad, PositionEmbedding) {
  const int64_t B = 3, T = 4, Tmax = 6, C = 5;
  auto pos = random_vector(Tmax * C, rng), base = random_vector(B * T * C, rng);
  auto R = random_vector(B * T * C, rng);
  std::vector<float> out(B * T * C), dpos(Tmax * C, 0.0f);
  auto loss = [&] {
    out = base;
    position_embedding_forward(out.data(), pos.data(), B, T, C);
    return dot(out, R);
  };
  position_embedding_backward(dpos.data(), R.data(), B, T, C);
  expect_gradient("position embedding", pos, dpos, loss);
  // Positions past T get no gradient.
  for (int64_t i = T * C; i < Tmax * C; ++i) EXPECT_EQ(dpos[i], 0.0f);
}

TEST_P(LayerGrad, Attention) {
  const int64_t B = 2, T = 5, C = 8, NH = 2;
  auto qkv = random_vector(B * T * 3 * C, rng), R = random_vector(B * T * C, rng);
  std::vector<float> out(B * T * C), att(B * NH * T * T), dqkv(B * T * 3 * C);
  auto loss = [&] {
    attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
    return dot(out, R);
  };
  loss();
  attention_backward(dqkv.data(), R.data(), qkv.data(), att.data(), B, T, C, NH);
  expect_gradient("attention dqkv", qkv, dqkv, loss, 1e-2, 2e-3, 2e-2, 1000);
}

TEST_P(LayerGrad, AttentionIsCausal) {
  // Changing a later position never changes an earlier output.
  const int64_t B = 1, T = 6, C = 4, NH = 2;
  auto qkv = random_vector(B * T * 3 * C, rng);
  std::vector<float> out1(B * T * C), out2(B * T * C), att(B * NH * T * T);
  attention_forward(out1.data(), att.data(), qkv.data(), B, T, C, NH);
  for (int64_t c = 0; c < 3 * C; ++c) qkv[(T - 1) * 3 * C + c] += 1.0f;
  attention_forward(out2.data(), att.data(), qkv.data(), B, T, C, NH);
  for (int64_t i = 0; i < (T - 1) * C; ++i) EXPECT_EQ(out1[i], out2[i]);
  bool last_changed = false;
  for (int64_t c = 0; c < C; ++c) last_changed |= out1[(T - 1) * C + c] != out2[(T - 1) * C + c];
  EXPECT_TRUE(last_changed);
}

TEST_P(LayerGrad, CrossEntropy) {
  const int64_t N = 4, V = 7;
  auto logits = random_vector(N * V, rng, 2.0f);
  std::vector<int32_t> targets = {0, 6, 3, 3};
  std::vector<float> probs(N * V), dlogits(N * V);
  auto loss = [&] {
    return static_cast<double>(
        cross_entropy_forward(probs.data(), logits.data(), targets.data(), N, V, nullptr));
  };
  loss();
  cross_entropy_backward(dlogits.data(), probs.data(), targets.data(), N, V, 1.0f / N);
  expect_gradient("cross entropy", logits, dlogits, loss, 1e-2, 5e-4, 1e-2);
}

TEST_P(LayerGrad, CrossEntropyValueAndAccuracy) {
  // Uniform logits: loss ln(V); a row with a clear winner counts as correct.
  const int64_t V = 5;
  std::vector<float> logits = {0, 0, 0, 0, 0, 0, 0, 9, 0, 0}, probs(10);
  std::vector<int32_t> targets = {1, 2};
  int64_t correct = -1;
  float l = cross_entropy_forward(probs.data(), logits.data(), targets.data(), 1, V, &correct);
  EXPECT_NEAR(l, std::log(5.0), 1e-6);
  cross_entropy_forward(probs.data(), logits.data(), targets.data(), 2, V, &correct);
  EXPECT_EQ(correct, 1);
}

// A row counts as correct when its target is the first column holding the
// row's largest logit (ties go to the earlier column), wherever the columns
// fall in the kernel's blocks: rows of 1 to 1,000 columns, the maximum tied
// between two columns in one block, in two blocks, at the last column; each
// row asked once with the earlier column of the tie as the target (counted)
// and once with the later (not counted).
TEST_P(LayerGrad, CrossEntropyAccuracyCountsTheFirstLargestLogit) {
  for (int64_t V : {1, 2, 63, 64, 65, 130, 1000}) {
    SCOPED_TRACE(::testing::Message() << "V " << V);
    const std::vector<std::pair<int64_t, int64_t>> ties = {
        {0, 0}, {V / 3, V / 3 + 1}, {1, V - 1}, {V - 1, V - 1}, {V / 2, V - 1}};
    std::vector<float> logits, probs;
    std::vector<int32_t> first, later;
    for (auto [a, b] : ties) {
      a = std::min(a, V - 1), b = std::min(std::max(a, b), V - 1);
      std::vector<float> row = random_vector(V, rng, 2.0f);
      row[static_cast<size_t>(a)] = row[static_cast<size_t>(b)] = 7.5f;  // above any of the rest
      logits.insert(logits.end(), row.begin(), row.end());
      first.push_back(static_cast<int32_t>(a));
      later.push_back(static_cast<int32_t>(b == a ? (a + 1) % V : b));
    }
    const auto N = static_cast<int64_t>(ties.size());
    probs.resize(logits.size());
    int64_t correct = -1;
    cross_entropy_forward(probs.data(), logits.data(), first.data(), N, V, &correct);
    EXPECT_EQ(correct, N);
    cross_entropy_forward(probs.data(), logits.data(), later.data(), N, V, &correct);
    EXPECT_EQ(correct, V == 1 ? N : 0);
  }
}

// ------------------------------------------------- one thread against two

// Every layer's backward on `n` threads, from the same inputs each call, at
// sizes where the work is split between 2 threads: the OpenMP loops split
// any length, and the GEMMs are large enough for OpenBLAS to use both
// threads (it keeps small ones on one).
std::map<std::string, std::vector<float>> gradients_on(int n) {
  set_threads(n);
  Rng rng(2024);
  std::map<std::string, std::vector<float>> g;
  {
    const int64_t N = 128, C = 192, OC = 256;
    auto x = random_vector(N * C, rng), w = random_vector(OC * C, rng), R = random_vector(N * OC, rng);
    std::vector<float> dx(N * C), dw(OC * C, 0.0f), db(OC, 0.0f);
    linear_backward(dx.data(), dw.data(), db.data(), R.data(), x.data(), w.data(), N, C, OC);
    g["linear dinp"] = dx, g["linear dweight"] = dw, g["linear dbias"] = db;
  }
  {
    const int64_t n = 100000;
    auto x = random_vector(n, rng, 2.0f), R = random_vector(n, rng);
    std::vector<float> out(n), dx(n);
    relu_forward(out.data(), x.data(), n);
    relu_backward(dx.data(), R.data(), out.data(), n);
    g["relu"] = dx;
    gelu_backward(dx.data(), R.data(), x.data(), n);
    g["gelu"] = dx;
  }
  {
    const int64_t N = 256, C = 64;
    auto x = random_vector(N * C, rng), w = random_vector(C, rng), b = random_vector(C, rng);
    auto R = random_vector(N * C, rng);
    std::vector<float> out(N * C), mean(N), rstd(N), dx(N * C, 0.0f), dw(C, 0.0f), db(C, 0.0f);
    layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
    layernorm_backward(dx.data(), dw.data(), db.data(), R.data(), x.data(), w.data(), mean.data(), rstd.data(),
                       N, C);
    g["layernorm dinp"] = dx, g["layernorm dweight"] = dw, g["layernorm dbias"] = db;
  }
  {
    const int64_t V = 50, C = 64, N = 2048;
    std::vector<int32_t> ids(N);
    for (int32_t& id : ids) id = static_cast<int32_t>(rng.below(V));  // many repeats
    auto R = random_vector(N * C, rng);
    std::vector<float> dtable(V * C, 0.0f);
    embedding_backward(dtable.data(), R.data(), ids.data(), N, C);
    g["embedding"] = dtable;
    const int64_t B = 16, T = 32;
    std::vector<float> dpos(T * C, 0.0f);
    position_embedding_backward(dpos.data(), R.data(), B, T, C);
    g["position embedding"] = dpos;
  }
  {
    const int64_t B = 4, T = 32, C = 64, NH = 4;
    auto qkv = random_vector(B * T * 3 * C, rng), R = random_vector(B * T * C, rng);
    std::vector<float> out(B * T * C), att(B * NH * T * T), dqkv(B * T * 3 * C);
    attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
    attention_backward(dqkv.data(), R.data(), qkv.data(), att.data(), B, T, C, NH);
    g["attention"] = dqkv;
  }
  {
    const int64_t N = 256, V = 100;
    auto logits = random_vector(N * V, rng, 2.0f);
    std::vector<int32_t> targets(N);
    for (int32_t& t : targets) t = static_cast<int32_t>(rng.below(V));
    std::vector<float> probs(N * V), dlogits(N * V);
    cross_entropy_forward(probs.data(), logits.data(), targets.data(), N, V, nullptr);
    cross_entropy_backward(dlogits.data(), probs.data(), targets.data(), N, V, 1.0f / N);
    g["cross entropy"] = dlogits;
  }
  return g;
}

// Two threads must give one thread's gradients: bitwise where splitting the
// work between threads leaves every sum in its order (elementwise loops;
// loops split over columns, positions or (sequence, head) pairs; the
// attention's per-head GEMMs, which OpenBLAS runs on the calling thread).
// Two kernels do reorder sums with the thread count: OpenBLAS's GEMMs (the
// Linear layer's dinp and dweight; its threads take other blocks, and the
// AVX2 kernels round edge blocks differently) and LayerNorm's dweight and
// dbias (per-thread partial sums over rows, added in thread order). For
// those, fp32 sums of up to 256 terms in another order: measured at most
// 6.0e-7 of the tensor's largest value (Linear dinp; LayerNorm 3.4e-7) on
// the 2-core test machine; 5e-6 is about ten times that. The gradient
// checks above allow 2% and use sizes too small to split, so this is the
// test that sees a kernel go wrong on a second thread.
TEST(LayerThreads, TwoThreadsGiveTheGradientsOfOne) {
  const std::set<std::string> reordered = {"linear dinp", "linear dweight", "layernorm dweight",
                                           "layernorm dbias"};
  const auto one = gradients_on(1), two = gradients_on(2);
  set_threads(1);
  for (const auto& [name, g1] : one) {
    const std::vector<float>& g2 = two.at(name);
    ASSERT_EQ(g1.size(), g2.size()) << name;
    const test::Diff d = test::diff(g2.data(), g1.data(), g1.size());
    std::printf("[ measure  ] %s: %s\n", name.c_str(), d.describe().c_str());
    if (reordered.count(name))
      EXPECT_TRUE(test::all_close(g2.data(), g1.data(), g1.size(), 0.0, 5e-6)) << name;
    else
      EXPECT_TRUE(test::bitwise_equal(g2.data(), g1.data(), g1.size())) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, LayerGrad, ::testing::Values(1, 2),
                         [](const auto& info) { return "threads" + std::to_string(info.param); });

}  // namespace
}  // namespace dpt
