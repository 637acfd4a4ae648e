// Fused causal attention (nn/flash_attention.h) against the unfused
// grouped-query layer it replaces (nn/gqa_attention.h): outputs and every
// input gradient within 1e-5 ("within r": max|a - b| <= r x max|b|) for T
// in {1, 7, 64, 129, 1000} (one tile, a partial tile, whole tiles, one past
// them, many), multi-head, grouped and multi-query; the same bits twice.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/rng.h"
#include "core/threads.h"
#include "nn/flash_attention.h"
#include "nn/gqa_attention.h"

namespace dpt {
namespace {

std::vector<float> random_vector(size_t n, Rng& rng) {
  std::vector<float> v(n);
  for (float& x : v) x = rng.normal() * 1.5f;
  return v;
}

double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0.0, peak = 0.0;
  for (size_t i = 0; i < b.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
    peak = std::max(peak, std::fabs(static_cast<double>(b[i])));
  }
  return peak > 0 ? diff / peak : diff;
}

struct Case {
  int64_t B, T, NH, NKV, hd;
};

TEST(FlashAttention, MatchesTheUnfusedLayerForwardAndBackward) {
  set_threads(2);
  for (const Case& c : {Case{2, 1, 4, 2, 16}, Case{2, 7, 4, 4, 16}, Case{2, 64, 4, 2, 16}, Case{2, 129, 4, 1, 8},
                        Case{1, 1000, 2, 1, 16}}) {
    SCOPED_TRACE(::testing::Message() << "T " << c.T << " heads " << c.NH << "/" << c.NKV);
    Rng rng(static_cast<uint64_t>(c.T));
    const int64_t ld = (c.NH + 2 * c.NKV) * c.hd, rows = c.B * c.T;
    const auto qkv = random_vector(static_cast<size_t>(rows * ld), rng);
    const auto dout = random_vector(static_cast<size_t>(rows * c.NH * c.hd), rng);
    std::vector<float> out0(dout.size()), att(static_cast<size_t>(c.B * c.NH * c.T * c.T)), dqkv0(qkv.size());
    gqa_attention_forward(out0.data(), att.data(), qkv.data(), c.B, c.T, c.NH, c.NKV, c.hd);
    gqa_attention_backward(dqkv0.data(), dout.data(), qkv.data(), att.data(), c.B, c.T, c.NH, c.NKV, c.hd);
    std::vector<float> out(dout.size()), lse(static_cast<size_t>(c.B * c.NH * c.T)), dqkv(qkv.size(), 7.0f);
    flash_attention_forward(out.data(), lse.data(), qkv.data(), c.B, c.T, c.NH, c.NKV, c.hd);
    flash_attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), c.B, c.T, c.NH, c.NKV,
                             c.hd);
    EXPECT_LE(rel_diff(out, out0), 1e-5);
    EXPECT_LE(rel_diff(dqkv, dqkv0), 1e-5);
    std::printf("[ measure  ] T %lld: out %.2e, dqkv %.2e\n", static_cast<long long>(c.T), rel_diff(out, out0),
                rel_diff(dqkv, dqkv0));
    std::vector<float> again(qkv.size());
    flash_attention_backward(again.data(), dout.data(), qkv.data(), out.data(), lse.data(), c.B, c.T, c.NH, c.NKV,
                             c.hd);
    EXPECT_EQ(again, dqkv);
  }
}

// A wrong mask or a missing rescale moves the output by far more than the
// tolerance: the test can fail.
TEST(FlashAttention, DiffersFromAttentionWithoutTheCausalMask) {
  const int64_t B = 1, T = 70, NH = 2, NKV = 2, hd = 8, ld = (NH + 2 * NKV) * hd;
  Rng rng(3);
  const auto qkv = random_vector(static_cast<size_t>(B * T * ld), rng);
  std::vector<float> out(static_cast<size_t>(B * T * NH * hd)), lse(static_cast<size_t>(B * NH * T));
  flash_attention_forward(out.data(), lse.data(), qkv.data(), B, T, NH, NKV, hd);
  // Row 0 attends to key 0 alone: its output is value 0.
  for (int64_t d = 0; d < hd; ++d) EXPECT_NEAR(out[static_cast<size_t>(d)], qkv[static_cast<size_t>(2 * NH * hd + d)], 1e-6);
}

}  // namespace
}  // namespace dpt
