// The GPU's fused causal attention (Kernels::flash_attention_*,
// src/cuda/flash_attention.cu; issue 35) against the GPU's unfused
// grouped-query layer and against the CPU's fused kernel on the same
// inputs: out, lse and the whole dqkv within 1e-5 ("within r": max|a - b|
// <= r max|b| per tensor), for T in {1, 7, 64, 129, 1000}, multi-head,
// grouped and multi-query heads, head sizes 8, 16, 64, 80, 128 (and 256,
// the largest); the same bits twice (no atomics); a head size past 256
// refused; and a decoder whose attention is fused on the GPU computing the
// gradients of one step as the unfused one does. Where no GPU is (CI),
// every test is skipped with the reason (tests/gpu_or_skip.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "device/kernels.h"
#include "decoder_step.h"
#include "gpu_or_skip.h"
#include "models/decoder.h"

namespace {

using dpt::Kernels;

constexpr double kF32 = 1e-5;

class CudaFlashAttention : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    g_ = dpt::test::gpu_or_reason(why);
    if (!g_) DPT_SKIP_WITHOUT_GPU(why);
  }
  void TearDown() override {
    if (g_)
      for (void* p : owned_) g_->free(p);
  }
  const Kernels& cpu() { return dpt::cpu_kernels(); }
  const Kernels& gk() { return *g_; }

  std::vector<float> random(size_t n, float scale) {
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng_);
    return v;
  }
  float* up(const std::vector<float>& h) {
    float* d = static_cast<float*>(g_->alloc(std::max<size_t>(h.size(), 1) * sizeof(float)));
    owned_.push_back(d);
    g_->upload(d, h.data(), h.size() * sizeof(float));
    return d;
  }
  // n floats of NaN: what a kernel does not write stays NaN and fails.
  float* nans(size_t n) { return up(std::vector<float>(n, std::numeric_limits<float>::quiet_NaN())); }
  std::vector<float> down(const float* d, size_t n) {
    std::vector<float> h(n);
    g_->download(h.data(), d, n * sizeof(float));
    return h;
  }
  // max|got - want| <= r max|want|, every element finite.
  static void expect_within(const std::vector<float>& got, const std::vector<float>& want, double r,
                            const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    double diff = 0.0, scale = 0.0;
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_TRUE(std::isfinite(got[i])) << what << ": element " << i << " is " << got[i];
      diff = std::max(diff, std::fabs(static_cast<double>(got[i]) - want[i]));
      scale = std::max(scale, std::fabs(static_cast<double>(want[i])));
    }
    EXPECT_LE(diff, r * scale) << what << ": max|got - want| = " << diff << ", max|want| = " << scale << ", ratio "
                               << (scale > 0 ? diff / scale : diff) << " (bar " << r << ")";
  }

  struct Case {
    int64_t B, T, NH, NKV, hd;
  };
  void compare(const Case& c);

  std::mt19937 rng_{35};
  const Kernels* g_ = nullptr;
  std::vector<void*> owned_;
};

void CudaFlashAttention::compare(const Case& c) {
  const std::string shape = " (B " + std::to_string(c.B) + ", T " + std::to_string(c.T) + ", heads " +
                            std::to_string(c.NH) + "/" + std::to_string(c.NKV) + ", hd " + std::to_string(c.hd) + ")";
  SCOPED_TRACE(shape);
  const int64_t ld = (c.NH + 2 * c.NKV) * c.hd;
  const size_t n_qkv = static_cast<size_t>(c.B * c.T * ld), n_out = static_cast<size_t>(c.B * c.T * c.NH * c.hd),
               n_lse = static_cast<size_t>(c.B * c.NH * c.T), n_att = n_lse * static_cast<size_t>(c.T);
  const auto qkv = random(n_qkv, 1.5f), dout = random(n_out, 1.0f);
  float *gqkv = up(qkv), *gdout = up(dout);

  // The CPU's fused kernel.
  std::vector<float> out(n_out), lse(n_lse), dqkv(n_qkv);
  cpu().flash_attention_forward(out.data(), nullptr, lse.data(), qkv.data(), c.B, c.T, c.NH, c.NKV, c.hd);
  cpu().flash_attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), c.B, c.T, c.NH, c.NKV,
                                 c.hd);
  // The GPU's unfused layer.
  float *uout = nans(n_out), *uatt = nans(n_att), *udqkv = nans(n_qkv);
  gk().gqa_attention_forward(uout, uatt, gqkv, c.B, c.T, c.NH, c.NKV, c.hd);
  gk().gqa_attention_backward(udqkv, gdout, gqkv, uatt, c.B, c.T, c.NH, c.NKV, c.hd);
  const auto unfused_out = down(uout, n_out), unfused_dqkv = down(udqkv, n_qkv);
  // The GPU's fused kernel, twice.
  std::vector<float> got_out, got_lse, got_dqkv;
  for (int run = 0; run < 2; ++run) {
    float *fout = nans(n_out), *flse = nans(n_lse), *fdqkv = nans(n_qkv);
    gk().flash_attention_forward(fout, nullptr, flse, gqkv, c.B, c.T, c.NH, c.NKV, c.hd);
    gk().flash_attention_backward(fdqkv, gdout, gqkv, fout, flse, c.B, c.T, c.NH, c.NKV, c.hd);
    auto o = down(fout, n_out), l = down(flse, n_lse), d = down(fdqkv, n_qkv);
    if (run == 1) {
      EXPECT_EQ(0, std::memcmp(o.data(), got_out.data(), n_out * sizeof(float))) << "out bits differ run to run";
      EXPECT_EQ(0, std::memcmp(l.data(), got_lse.data(), n_lse * sizeof(float))) << "lse bits differ run to run";
      EXPECT_EQ(0, std::memcmp(d.data(), got_dqkv.data(), n_qkv * sizeof(float))) << "dqkv bits differ run to run";
    }
    got_out.swap(o), got_lse.swap(l), got_dqkv.swap(d);
  }
  expect_within(got_out, unfused_out, kF32, "out against the GPU's unfused layer");
  expect_within(got_dqkv, unfused_dqkv, kF32, "dqkv against the GPU's unfused layer");
  expect_within(got_out, out, kF32, "out against the CPU's fused kernel");
  expect_within(got_lse, lse, kF32, "lse against the CPU's fused kernel");
  expect_within(got_dqkv, dqkv, kF32, "dqkv against the CPU's fused kernel");
}

TEST_F(CudaFlashAttention, MatchesUnfusedAndCpuAcrossContexts) {
  for (int64_t T : {1, 7, 64, 129, 1000})
    for (auto [NH, NKV] : {std::pair<int64_t, int64_t>{4, 4}, {4, 2}, {4, 1}}) compare(Case{2, T, NH, NKV, 64});
}

TEST_F(CudaFlashAttention, MatchesUnfusedAndCpuAcrossHeadSizes) {
  for (int64_t hd : {8, 16, 64, 80, 128, 256})
    for (int64_t T : {1, 7, 129, 1000}) {
      compare(Case{1, T, 2, 2, hd});
      compare(Case{1, T, 6, 2, hd});
    }
}

TEST_F(CudaFlashAttention, RefusesHeadsPast256) {
  const int64_t T = 4, NH = 1, hd = 257;
  float *qkv = nans(static_cast<size_t>(T * 3 * hd)), *out = nans(static_cast<size_t>(T * hd)), *lse = nans(T);
  EXPECT_THROW(gk().flash_attention_forward(out, nullptr, lse, qkv, 1, T, NH, NH, hd), dpt::InputError);
}

// A decoder whose attention is fused on the GPU: one step's gradients (every
// parameter) within 1e-5 of the same decoder unfused on the GPU, Llama
// (grouped, rotary) and GPT-2 (multi-head, biases).
std::vector<float> one_step_grads(const dpt::DecoderConfig& c, int64_t T, bool fused) {
  dpt::Decoder d(c);
  d.init_params(5);
  d.set_fused_attention(fused);
  d.set_device(dpt::Device::CUDA);
  return dpt::test::one_step_grads(d, dpt::test::random_batch(2, T, c.vocab, static_cast<uint64_t>(T)));
}

TEST_F(CudaFlashAttention, DecoderGradientsMatchUnfused) {
  const auto configs = dpt::test::small_llama_and_gpt(64, 129);  // Llama, GPT-2
  for (const dpt::DecoderConfig& c : configs)
    for (int64_t T : {7, 129}) {
      SCOPED_TRACE(c.family + " T " + std::to_string(T));
      const auto fused = one_step_grads(c, T, true), unfused = one_step_grads(c, T, false);
      const dpt::Decoder layout_of(c);
      for (const dpt::Slot& s : layout_of.layout().slots())
        expect_within(std::vector<float>(fused.begin() + s.offset, fused.begin() + s.offset + s.numel),
                      std::vector<float>(unfused.begin() + s.offset, unfused.begin() + s.offset + s.numel), kF32,
                      s.name);
    }
}

}  // namespace
