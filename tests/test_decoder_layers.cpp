// The Llama family's layers (nn/rmsnorm, rope, swiglu, gqa_attention):
//  - against PyTorch: tests/fixtures/decoder_layers/, written by
//    scripts/make_decoder_layer_fixtures.py (Debian's python3-torch, the
//    layers as transformers' modeling_llama.py writes them), every output
//    and gradient within 1e-5 relative (max|a - b| <= 1e-5 max|b|);
//  - every backward against finite differences (tests/gradcheck.h);
//  - on 1 and on 2 threads, each reproducible bit for bit across runs;
//  - the bf16 outputs are the fp32 ones rounded;
//  - each kernel has its x86-64-v4 copy (core/cpu_level.h);
//  - the Kernels interface's CPU ops are these functions, and its CUDA ops
//    agree with them within 1e-5 (skipped without a GPU).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "compare.h"
#include "core/cpu_level.h"
#include "core/threads.h"
#include "device/kernels.h"
#include "gpu_or_skip.h"
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

// Rotary's backward with the bf16 copy of the whole rows (q and k turned
// back, v as it is) is exactly rope_backward then convert, in place (the
// decoder's use) and not: rows of q, k and v heads, v past the rotated ones.
TEST_P(DecoderLayers, RopeBackwardBf16IsRopeBackwardThenConvert) {
  const int64_t B = 2, T = 5, H = 3, hd = 8, ld = (H + 1) * hd;
  std::vector<float> inv_freq(hd / 2), cos(T * hd / 2), sin(T * hd / 2);
  rope_inv_freq(inv_freq.data(), hd, 10000.0f, nullptr);
  rope_cache(cos.data(), sin.data(), inv_freq.data(), T, hd);
  const auto dout = random_vector(B * T * ld, rng);
  std::vector<float> want = dout;
  rope_backward(want.data(), want.data(), cos.data(), sin.data(), B, T, H, hd, ld);
  std::vector<bf16> want16(want.size());
  convert(want16.data(), want.data(), want.size());
  for (const bool in_place : {true, false}) {
    std::vector<float> got = in_place ? dout : std::vector<float>(dout.size(), 0.0f);
    std::vector<bf16> got16(dout.size());
    rope_backward_bf16(got.data(), got16.data(), in_place ? got.data() : dout.data(), cos.data(), sin.data(), B, T,
                       H, hd, ld);
    for (int64_t i = 0; i < B * T * ld; ++i) {
      ASSERT_EQ(got16[i].bits, want16[i].bits) << (in_place ? "in place " : "") << i;
      if (in_place || i % ld < H * hd) {
        ASSERT_EQ(got[i], want[i]) << i;
      }
    }
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

// --- Reproducible, bf16 outputs ----------------------------------------------

// Every output and gradient of the four layers at sizes that give both
// threads work, as one vector of vectors.
std::vector<std::vector<float>> run_all(uint64_t seed) {
  Rng rng(seed);
  std::vector<std::vector<float>> got;
  {
    const int64_t N = 64, C = 96;
    auto x = random_vector(N * C, rng), w = random_vector(C, rng), dy = random_vector(N * C, rng);
    RmsNormRun r = run_rmsnorm(x, w, dy, N, C, 1e-5f);
    got.insert(got.end(), {r.out, r.rstd, r.dx, r.dw});
  }
  {
    const RopeShape s{2, 32, 4, 2, 16, (4 + 2 * 2) * 16};
    const RopeLlama3Scaling llama3{8.0f, 1.0f, 4.0f, 64};
    std::vector<float> inv_freq(s.hd / 2);
    rope_inv_freq(inv_freq.data(), s.hd, 500000.0f, &llama3);
    auto x = random_vector(s.B * s.T * s.ld, rng), dy = random_vector(s.B * s.T * s.ld, rng);
    auto [out, dx] = run_rope(x, dy, inv_freq, s);
    got.insert(got.end(), {inv_freq, out, dx});
  }
  {
    const int64_t N = 64, I = 80;
    auto gu = random_vector(N * 2 * I, rng, 2.0f), dy = random_vector(N * I, rng);
    std::vector<float> out(N * I), dgu(N * 2 * I);
    swiglu_forward(out.data(), gu.data(), N, I);
    swiglu_backward(dgu.data(), nullptr, dy.data(), gu.data(), N, I);
    got.insert(got.end(), {out, dgu});
  }
  {
    const int64_t B = 2, T = 32, NH = 4, NKV = 2, hd = 16, ld = (NH + 2 * NKV) * hd;
    auto qkv = random_vector(B * T * ld, rng), dy = random_vector(B * T * NH * hd, rng);
    std::vector<float> out(B * T * NH * hd), att(B * NH * T * T), dqkv(B * T * ld);
    gqa_attention_forward(out.data(), att.data(), qkv.data(), B, T, NH, NKV, hd);
    gqa_attention_backward(dqkv.data(), dy.data(), qkv.data(), att.data(), B, T, NH, NKV, hd);
    got.insert(got.end(), {out, att, dqkv});
  }
  return got;
}

TEST_P(DecoderLayers, SameBitsOnEveryRun) {
  const auto first = run_all(11);
  for (int run = 0; run < 3; ++run) {
    const auto again = run_all(11);
    ASSERT_EQ(again.size(), first.size());
    for (size_t i = 0; i < first.size(); ++i)
      EXPECT_TRUE(test::bitwise_equal(again[i].data(), first[i].data(), first[i].size()))
          << "output " << i << ", run " << run;
  }
}

TEST_P(DecoderLayers, Bf16OutputsAreTheFp32OnesRounded) {
  const int64_t N = 16, C = 40, I = 24;
  auto x = random_vector(N * C, rng), w = random_vector(C, rng);
  std::vector<float> y(N * C), rstd(N);
  std::vector<bf16> y16(N * C);
  rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), N, C, 1e-6f);
  rmsnorm_forward(y16.data(), rstd.data(), x.data(), w.data(), N, C, 1e-6f);
  auto gu = random_vector(N * 2 * I, rng, 2.0f), dy = random_vector(N * I, rng);
  std::vector<float> s(N * I), dgu(N * 2 * I);
  std::vector<bf16> s16(N * I), dgu16(N * 2 * I);
  swiglu_forward(s.data(), gu.data(), N, I);
  swiglu_forward(s16.data(), gu.data(), N, I);
  swiglu_backward(dgu.data(), dgu16.data(), dy.data(), gu.data(), N, I);
  const std::vector<std::pair<const std::vector<float>*, const std::vector<bf16>*>> pairs{
      {&y, &y16}, {&s, &s16}, {&dgu, &dgu16}};
  // RMSNorm's exactly; SwiGLU's bf16 path takes its sigmoid another way
  // (nn/activations_avx512.h or nn/fast_tanh.h, held against the exact
  // function by test_activations_bf16), so an output may sit one rounding
  // step from the fp32 value's.
  for (size_t p = 0; p < pairs.size(); ++p) {
    const auto& [f32, b16] = pairs[p];
    const int max_steps = p == 0 ? 0 : 1;
    for (size_t i = 0; i < f32->size(); ++i) {
      const int want = to_bf16((*f32)[i]).bits, got = (*b16)[i].bits;
      ASSERT_LE(std::abs(got - want), max_steps) << "pair " << p << ", element " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, DecoderLayers, ::testing::Values(1, 2),
                         [](const auto& info) { return std::to_string(info.param) + "threads"; });

// --- Through the Kernels interface (device/kernels.h) --------------------------

// Device buffers of one Kernels, freed at the end.
class DeviceBuffers {
 public:
  explicit DeviceBuffers(const Kernels& k) : k_(k) {}
  ~DeviceBuffers() {
    for (void* p : owned_) k_.free(p);
  }
  float* up(const std::vector<float>& h) {
    auto* d = static_cast<float*>(k_.alloc(std::max<size_t>(h.size(), 1) * sizeof(float)));
    owned_.push_back(d);
    k_.upload(d, h.data(), h.size() * sizeof(float));
    return d;
  }
  float* zeros(size_t n) { return up(std::vector<float>(n, 0.0f)); }
  std::vector<float> down(const float* d, size_t n) const {
    std::vector<float> h(n);
    k_.download(h.data(), d, n * sizeof(float));
    return h;
  }

 private:
  const Kernels& k_;
  std::vector<void*> owned_;
};

// run_all's layers and inputs, on k's device, in run_all's output order.
std::vector<std::vector<float>> run_through(const Kernels& k, uint64_t seed) {
  Rng rng(seed);
  DeviceBuffers m(k);
  std::vector<std::vector<float>> got;
  {
    const int64_t N = 64, C = 96;
    auto x = random_vector(N * C, rng), w = random_vector(C, rng), dy = random_vector(N * C, rng);
    float *out = m.zeros(N * C), *rstd = m.zeros(N), *dx = m.zeros(N * C), *dw = m.zeros(C);
    float *gx = m.up(x), *gw = m.up(w);
    k.rmsnorm_forward(out, rstd, gx, gw, N, C, 1e-5f);
    k.rmsnorm_backward(dx, dw, m.up(dy), gx, gw, rstd, N, C);
    got.insert(got.end(), {m.down(out, N * C), m.down(rstd, N), m.down(dx, N * C), m.down(dw, C)});
  }
  {
    const RopeShape s{2, 32, 4, 2, 16, (4 + 2 * 2) * 16};
    const RopeLlama3Scaling llama3{8.0f, 1.0f, 4.0f, 64};
    std::vector<float> inv_freq(s.hd / 2), cos(s.T * s.hd / 2), sin(s.T * s.hd / 2);
    rope_inv_freq(inv_freq.data(), s.hd, 500000.0f, &llama3);
    rope_cache(cos.data(), sin.data(), inv_freq.data(), s.T, s.hd);
    auto x = random_vector(s.B * s.T * s.ld, rng), dy = random_vector(s.B * s.T * s.ld, rng);
    float *gx = m.up(x), *gd = m.up(dy), *gc = m.up(cos), *gs = m.up(sin);
    k.rope_forward(gx, gx, gc, gs, s.B, s.T, s.NH + s.NKV, s.hd, s.ld);
    k.rope_backward(gd, gd, gc, gs, s.B, s.T, s.NH + s.NKV, s.hd, s.ld);
    got.insert(got.end(), {inv_freq, m.down(gx, x.size()), m.down(gd, dy.size())});
  }
  {
    const int64_t N = 64, I = 80;
    auto gu = random_vector(N * 2 * I, rng, 2.0f), dy = random_vector(N * I, rng);
    float *out = m.zeros(N * I), *dgu = m.zeros(N * 2 * I), *ggu = m.up(gu);
    k.swiglu_forward(out, ggu, N, I);
    k.swiglu_backward(dgu, nullptr, m.up(dy), ggu, N, I);
    got.insert(got.end(), {m.down(out, N * I), m.down(dgu, N * 2 * I)});
  }
  {
    const int64_t B = 2, T = 32, NH = 4, NKV = 2, hd = 16, ld = (NH + 2 * NKV) * hd;
    auto qkv = random_vector(B * T * ld, rng), dy = random_vector(B * T * NH * hd, rng);
    float *out = m.zeros(B * T * NH * hd), *att = m.zeros(B * NH * T * T), *gq = m.up(qkv);
    float* dqkv = m.up(std::vector<float>(B * T * ld, 4.0f));  // overwritten
    k.gqa_attention_forward(out, att, gq, B, T, NH, NKV, hd);
    k.gqa_attention_backward(dqkv, m.up(dy), gq, att, B, T, NH, NKV, hd);
    got.insert(got.end(), {m.down(out, B * T * NH * hd), m.down(att, B * NH * T * T), m.down(dqkv, B * T * ld)});
  }
  return got;
}

TEST_P(DecoderLayers, CpuKernelsAreTheNnFunctions) {
  const auto direct = run_all(11), through = run_through(cpu_kernels(), 11);
  ASSERT_EQ(through.size(), direct.size());
  for (size_t i = 0; i < direct.size(); ++i)
    EXPECT_TRUE(test::bitwise_equal(through[i].data(), direct[i].data(), direct[i].size())) << "output " << i;
}

// The CUDA kernels against the CPU's on the same inputs (skipped without a
// GPU; DPT_REQUIRE_GPU=1 makes that a failure).
TEST(DecoderLayerKernels, CudaMatchesTheCpu) {
  std::string why;
  const Kernels* gpu = test::gpu_or_reason(why);
  if (!gpu) DPT_SKIP_WITHOUT_GPU(why);
  set_threads(2);
  const auto cpu = run_all(11), got = run_through(*gpu, 11);
  ASSERT_EQ(got.size(), cpu.size());
  for (size_t i = 0; i < cpu.size(); ++i) EXPECT_TRUE(within(got[i], cpu[i])) << "output " << i;
}

// Each kernel has its x86-64-v4 copy, and AVX-512 code (zmm or mask
// registers) appears only there (tests/test_cpu_level.cpp's rule, on this
// program, which links these kernels).
TEST(DecoderLayerClones, EveryKernelHasAnAvx512CopyAndOnlyThere) {
  if (!cpu_kernels_cloned()) GTEST_SKIP() << "this build has no x86-64-v4 copies (" << cpu_kernel_level() << ")";
  const std::vector<std::string> kernels{
      "_ZN3dpt15rmsnorm_forwardIfEEvPT_PfPKfS5_llf", "_ZN3dpt15rmsnorm_forwardINS_4bf16EEEvPT_PfPKfS6_llf",
      "_ZN3dpt16rmsnorm_backwardEPfS0_PKfS2_S2_S2_ll", "_ZN3dpt12rope_forwardEPfPKfS2_S2_lllll",
      "_ZN3dpt13rope_backwardEPfPKfS2_S2_lllll", "_ZN3dpt18rope_backward_bf16EPfPNS_4bf16EPKfS4_S4_lllll",
      "_ZN3dpt14swiglu_forwardIfEEvPT_PKfll",
      "_ZN3dpt14swiglu_forwardINS_4bf16EEEvPT_PKfll", "_ZN3dpt15swiglu_backwardEPfPNS_4bf16EPKfS4_ll",
      "_ZN3dpt21gqa_attention_forwardEPfS0_PKflllll", "_ZN3dpt22gqa_attention_backwardEPfPKfS2_S2_lllll"};
  std::set<std::string> avx512;
  // This program's own path (/proc/self in the shell would be the shell's).
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  FILE* p = ::popen(("objdump -d --no-show-raw-insn '" + self + "' 2>/dev/null").c_str(), "r");
  ASSERT_NE(p, nullptr);
  const std::regex header(R"(^[0-9a-f]+ <(.+)>:$)"), zmm(R"(%zmm[0-9]|%k[0-7]\b)");
  std::string current;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p)) {
    std::string line = buf;
    if (!line.empty() && line.back() == '\n') line.pop_back();
    std::smatch m;
    if (std::regex_match(line, m, header))
      current = m[1];
    else if (line.find('%') != std::string::npos && std::regex_search(line, zmm))
      avx512.insert(current);
  }
  ::pclose(p);
  for (const std::string& k : kernels) {
    bool cloned = false;
    for (const std::string& f : avx512)
      if (f.rfind(k, 0) == 0) {
        cloned = true;
        EXPECT_NE(f.find(".arch_x86_64_v4"), std::string::npos) << f << " uses AVX-512 outside its v4 copy";
      }
    EXPECT_TRUE(cloned) << k << " has no AVX-512 copy";
  }
}

}  // namespace
}  // namespace dpt
