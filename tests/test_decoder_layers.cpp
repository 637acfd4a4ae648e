// The Llama family's layers (nn/rmsnorm, rope, swiglu, gqa_attention):
//  - against PyTorch: tests/fixtures/decoder_layers/, written by
//    scripts/make_decoder_layer_fixtures.py (Debian's python3-torch, the
//    layers as transformers' modeling_llama.py writes them), every output
//    and gradient within 1e-5 relative (max|a - b| <= 1e-5 max|b|);
//  - every backward against finite differences (tests/gradcheck.h);
//  - on 1 and on 2 threads, each reproducible bit for bit across runs;
//  - the bf16 outputs are the fp32 ones rounded;
//  - each kernel has its x86-64-v4 copy (core/cpu_level.h).
#include <cstdio>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "compare.h"
#include "core/cpu_level.h"
#include "core/threads.h"
#include "gradcheck.h"
#include "io/safetensors.h"
#include "nn/gqa_attention.h"
#include "nn/rmsnorm.h"
#include "nn/rope.h"
#include "nn/swiglu.h"

namespace dpt {
namespace {

using test::dot;
using test::expect_gradient;
using test::random_vector;

constexpr double kWithin = 1e-5;  // per tensor, relative to max|reference|

struct Fixture {
  SafetensorsFile file;
  explicit Fixture(const std::string& name)
      : file(load_safetensors(DPT_SOURCE_DIR "/tests/fixtures/decoder_layers/" + name + ".safetensors")) {}
  const std::vector<float>& operator[](const std::string& name) const {
    const NamedTensor* t = file.find(name);
    if (!t) throw std::runtime_error("fixture has no tensor " + name);
    return t->data;
  }
  int64_t integer(const std::string& key) const { return std::stoll(file.metadata.at(key)); }
  float real(const std::string& key) const { return std::stof(file.metadata.at(key)); }
};

::testing::AssertionResult within(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << ", reference " << want.size();
  return test::all_close(got.data(), want.data(), want.size(), 0.0, kWithin);
}

class DecoderLayers : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { set_threads(GetParam()); }
  Rng rng{7};
};

// --- RMSNorm ------------------------------------------------------------------

struct RmsNormRun {
  std::vector<float> out, rstd, dx, dw;
};

RmsNormRun run_rmsnorm(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>& dout,
                       int64_t N, int64_t C, float eps) {
  RmsNormRun r{std::vector<float>(N * C), std::vector<float>(N), std::vector<float>(N * C, 0.0f),
               std::vector<float>(C, 0.0f)};
  rmsnorm_forward(r.out.data(), r.rstd.data(), x.data(), w.data(), N, C, eps);
  rmsnorm_backward(r.dx.data(), r.dw.data(), dout.data(), x.data(), w.data(), r.rstd.data(), N, C);
  return r;
}

TEST_P(DecoderLayers, RmsNormMatchesPyTorch) {
  const Fixture f("rmsnorm");
  const RmsNormRun r = run_rmsnorm(f["x"], f["weight"], f["dout"], f.integer("N"), f.integer("C"), f.real("eps"));
  EXPECT_TRUE(within(r.out, f["out"])) << "out";
  EXPECT_TRUE(within(r.dx, f["dx"])) << "dx";
  EXPECT_TRUE(within(r.dw, f["dweight"])) << "dweight";
}

TEST_P(DecoderLayers, RmsNormGradients) {
  const int64_t N = 5, C = 12;
  auto x = random_vector(N * C, rng), w = random_vector(C, rng), R = random_vector(N * C, rng);
  for (float& v : x) v += 0.5f;
  std::vector<float> out(N * C), rstd(N);
  auto loss = [&] {
    rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f);
    return dot(out, R);
  };
  loss();
  // dinp is accumulated: start it at 1 and take the 1 off again.
  std::vector<float> dx(N * C, 1.0f), dw(C, 0.0f);
  rmsnorm_backward(dx.data(), dw.data(), R.data(), x.data(), w.data(), rstd.data(), N, C);
  for (float& v : dx) v -= 1.0f;
  expect_gradient("rmsnorm dinp", x, dx, loss);
  expect_gradient("rmsnorm dweight", w, dw, loss);
}

// --- Rotary embedding -----------------------------------------------------------

struct RopeShape {
  int64_t B, T, NH, NKV, hd, ld;
};

// The decoder's use: q and k rotated in place in the fused qkv rows; the
// backward in place on a copy of dout (v's gradient passes through).
std::pair<std::vector<float>, std::vector<float>> run_rope(const std::vector<float>& qkv,
                                                           const std::vector<float>& dout,
                                                           const std::vector<float>& inv_freq, const RopeShape& s) {
  std::vector<float> cos(s.T * s.hd / 2), sin(s.T * s.hd / 2);
  rope_cache(cos.data(), sin.data(), inv_freq.data(), s.T, s.hd);
  std::vector<float> out = qkv, dqkv = dout;
  rope_forward(out.data(), out.data(), cos.data(), sin.data(), s.B, s.T, s.NH + s.NKV, s.hd, s.ld);
  rope_backward(dqkv.data(), dqkv.data(), cos.data(), sin.data(), s.B, s.T, s.NH + s.NKV, s.hd, s.ld);
  return {out, dqkv};
}

TEST_P(DecoderLayers, RopeMatchesPyTorchWithAndWithoutLlama3Scaling) {
  const Fixture f("rope");
  RopeShape s{f.integer("B"), f.integer("T"), f.integer("NH"), f.integer("NKV"), f.integer("hd"), 0};
  s.ld = (s.NH + 2 * s.NKV) * s.hd;
  RopeLlama3Scaling llama3{f.real("factor"), f.real("low_freq_factor"), f.real("high_freq_factor"),
                           f.integer("original_max_position_embeddings")};
  std::vector<float> outs[2];
  for (int scaled = 0; scaled < 2; ++scaled) {
    const std::string v = scaled ? "llama3." : "plain.";
    std::vector<float> inv_freq(s.hd / 2);
    rope_inv_freq(inv_freq.data(), s.hd, f.real("theta"), scaled ? &llama3 : nullptr);
    EXPECT_TRUE(within(inv_freq, f[v + "inv_freq"])) << v << "inv_freq";
    auto [out, dqkv] = run_rope(f["qkv"], f["dout"], inv_freq, s);
    EXPECT_TRUE(within(out, f[v + "out"])) << v << "out";
    EXPECT_TRUE(within(dqkv, f[v + "dqkv"])) << v << "dqkv";
    outs[scaled] = out;
  }
  // The scaling must matter here, far beyond the tolerance, or the scaled
  // check above could not fail.
  const test::Diff d = test::diff(outs[1].data(), outs[0].data(), outs[0].size());
  EXPECT_GT(d.max_abs, 1000 * kWithin * d.peak) << d.describe();
}

TEST_P(DecoderLayers, RopeGradients) {
  const int64_t B = 2, T = 5, H = 3, hd = 8, ld = H * hd;
  std::vector<float> inv_freq(hd / 2), cos(T * hd / 2), sin(T * hd / 2);
  const RopeLlama3Scaling llama3{4.0f, 1.0f, 4.0f, 16};
  for (const RopeLlama3Scaling* scaling : {static_cast<const RopeLlama3Scaling*>(nullptr), &llama3}) {
    rope_inv_freq(inv_freq.data(), hd, 10000.0f, scaling);
    rope_cache(cos.data(), sin.data(), inv_freq.data(), T, hd);
    auto x = random_vector(B * T * ld, rng), R = random_vector(B * T * ld, rng);
    std::vector<float> out(B * T * ld), dx(B * T * ld);
    auto loss = [&] {
      rope_forward(out.data(), x.data(), cos.data(), sin.data(), B, T, H, hd, ld);
      return dot(out, R);
    };
    rope_backward(dx.data(), R.data(), cos.data(), sin.data(), B, T, H, hd, ld);
    expect_gradient(scaling ? "rope (llama3) dinp" : "rope dinp", x, dx, loss);
  }
}

// --- SwiGLU ---------------------------------------------------------------------

TEST_P(DecoderLayers, SwiGluMatchesPyTorch) {
  const Fixture f("swiglu");
  const int64_t N = f.integer("N"), I = f.integer("I");
  std::vector<float> out(N * I), dgu(N * 2 * I);
  swiglu_forward(out.data(), f["gu"].data(), N, I);
  swiglu_backward(dgu.data(), nullptr, f["dout"].data(), f["gu"].data(), N, I);
  EXPECT_TRUE(within(out, f["out"])) << "out";
  EXPECT_TRUE(within(dgu, f["dgu"])) << "dgu";
}

TEST_P(DecoderLayers, SwiGluGradients) {
  const int64_t N = 4, I = 9;
  auto gu = random_vector(N * 2 * I, rng, 2.0f), R = random_vector(N * I, rng);
  std::vector<float> out(N * I), dgu(N * 2 * I);
  auto loss = [&] {
    swiglu_forward(out.data(), gu.data(), N, I);
    return dot(out, R);
  };
  swiglu_backward(dgu.data(), nullptr, R.data(), gu.data(), N, I);
  expect_gradient("swiglu dgu", gu, dgu, loss);
}

// --- Grouped-query attention ----------------------------------------------------

TEST_P(DecoderLayers, GqaAttentionMatchesPyTorch) {
  const Fixture f("gqa");
  const int64_t B = f.integer("B"), T = f.integer("T"), NH = f.integer("NH"), NKV = f.integer("NKV"),
                hd = f.integer("hd");
  std::vector<float> out(B * T * NH * hd), att(B * NH * T * T), dqkv(B * T * (NH + 2 * NKV) * hd, -1.0f);
  gqa_attention_forward(out.data(), att.data(), f["qkv"].data(), B, T, NH, NKV, hd);
  gqa_attention_backward(dqkv.data(), f["dout"].data(), f["qkv"].data(), att.data(), B, T, NH, NKV, hd);
  EXPECT_TRUE(within(out, f["out"])) << "out";
  EXPECT_TRUE(within(att, f["att"])) << "att";
  EXPECT_TRUE(within(dqkv, f["dqkv"])) << "dqkv";
}

TEST_P(DecoderLayers, GqaAttentionGradients) {
  // Groups of 2, multi-query (one key/value head) and multi-head; hd 6 is
  // not tied to any width.
  for (const auto& [NH, NKV] : std::vector<std::pair<int64_t, int64_t>>{{4, 2}, {3, 1}, {2, 2}}) {
    const int64_t B = 2, T = 5, hd = 6, ld = (NH + 2 * NKV) * hd;
    auto qkv = random_vector(B * T * ld, rng), R = random_vector(B * T * NH * hd, rng);
    std::vector<float> out(B * T * NH * hd), att(B * NH * T * T), dqkv(B * T * ld);
    auto loss = [&] {
      gqa_attention_forward(out.data(), att.data(), qkv.data(), B, T, NH, NKV, hd);
      return dot(out, R);
    };
    loss();
    gqa_attention_backward(dqkv.data(), R.data(), qkv.data(), att.data(), B, T, NH, NKV, hd);
    expect_gradient("gqa dqkv NH " + std::to_string(NH) + " NKV " + std::to_string(NKV), qkv, dqkv, loss);
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, DecoderLayers, ::testing::Values(1, 2),
                         [](const auto& info) { return std::to_string(info.param) + "threads"; });

}  // namespace
}  // namespace dpt
