// Every CUDA op against the CPU op of the same name on the same inputs
// (issue 17; device/kernels.h). "Within r": max|gpu - cpu| <= r * max|cpu| per
// output tensor; fp32 r = 1e-5, bf16 r = 1.6e-2, optimizer updates 1e-6.
// Where no GPU is (CI), every test is skipped with the reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "gpu_or_skip.h"
#include "train/gemm_rate.h"
#include "device/kernels.h"

namespace {

using dpt::bf16;
using dpt::Device;
using dpt::Kernels;

constexpr double kF32 = 1e-5, kBf16 = 1.6e-2, kOptim = 1e-6;

using dpt::test::gpu_or_reason;

class CudaKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    g_ = gpu_or_reason(why);
    if (!g_) DPT_SKIP_WITHOUT_GPU(why);
  }
  void TearDown() override {
    if (g_)
      for (void* p : owned_) g_->free(p);
  }
  const Kernels& cpu() { return dpt::cpu_kernels(); }
  const Kernels& gk() { return *g_; }

  std::vector<float> random(size_t n, float lo = -1.0f, float hi = 1.0f) {
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng_);
    return v;
  }
  std::vector<bf16> rounded(const std::vector<float>& v) {
    std::vector<bf16> b(v.size());
    dpt::convert(b.data(), v.data(), v.size());
    return b;
  }
  // A device copy of host data (freed at the end of the test).
  template <typename T>
  T* up(const std::vector<T>& h) {
    T* d = static_cast<T*>(g_->alloc(std::max<size_t>(h.size(), 1) * sizeof(T)));
    owned_.push_back(d);
    g_->upload(d, h.data(), h.size() * sizeof(T));
    return d;
  }
  template <typename T>
  std::vector<T> down(const T* d, size_t n) {
    std::vector<T> h(n);
    g_->download(h.data(), d, n * sizeof(T));
    return h;
  }
  // max|a - b| <= r * max|b|
  static void expect_within(const std::vector<float>& gpu, const std::vector<float>& cpu, double r,
                            const std::string& what) {
    ASSERT_EQ(gpu.size(), cpu.size()) << what;
    double diff = 0.0, scale = 0.0;
    for (size_t i = 0; i < cpu.size(); ++i) {
      ASSERT_TRUE(std::isfinite(gpu[i])) << what << ": element " << i << " is " << gpu[i];
      diff = std::max(diff, std::fabs(static_cast<double>(gpu[i]) - cpu[i]));
      scale = std::max(scale, std::fabs(static_cast<double>(cpu[i])));
    }
    EXPECT_LE(diff, r * scale) << what << ": max|gpu - cpu| = " << diff << ", max|cpu| = " << scale
                               << ", ratio " << (scale > 0 ? diff / scale : diff) << " (bar " << r << ")";
  }

  std::mt19937 rng_{1234};
  const Kernels* g_ = nullptr;
  std::vector<void*> owned_;
};

TEST_F(CudaKernels, MemoryAllocZeroesUploadDownloadCopy) {
  const size_t n = 1000;
  float* a = static_cast<float*>(gk().alloc(n * sizeof(float)));
  owned_.push_back(a);
  EXPECT_EQ(down(a, n), std::vector<float>(n, 0.0f)) << "alloc returns zero-filled memory";
  const auto x = random(n);
  gk().upload(a, x.data(), n * sizeof(float));
  EXPECT_EQ(down(a, n), x);
  float* b = up(std::vector<float>(n, 7.0f));
  gk().copy(b, a, n * sizeof(float));
  EXPECT_EQ(down(b, n), x);
  gk().zero(b + 10, 20 * sizeof(float));
  auto z = x;
  std::fill(z.begin() + 10, z.begin() + 30, 0.0f);
  EXPECT_EQ(down(b, n), z);
  EXPECT_EQ(dpt::pointer_device(a), Device::CUDA);
  EXPECT_EQ(dpt::pointer_device(x.data()), Device::CPU);
  EXPECT_GT(dpt::device_memory(Device::CUDA).peak, 0u);
}

TEST_F(CudaKernels, ConvertRoundsExactlyAsTheCpu) {
  auto x = random(4099, -300.0f, 300.0f);
  x[0] = NAN;
  x[1] = INFINITY;
  x[2] = -0.0f;
  std::vector<bf16> c(x.size());
  cpu().convert(c.data(), x.data(), x.size());
  bf16* d = up(std::vector<bf16>(x.size()));
  gk().convert(d, up(x), x.size());
  const auto g = down(d, x.size());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(g[i].bits, c[i].bits) << "element " << i;
  std::vector<float> w(x.size()), gw;
  cpu().convert(w.data(), c.data(), c.size());
  float* dw = up(std::vector<float>(x.size()));
  gk().convert(dw, d, x.size());
  gw = down(dw, x.size());
  EXPECT_EQ(0, std::memcmp(gw.data(), w.data(), w.size() * sizeof(float)));
}

TEST_F(CudaKernels, LinearFp32) {
  const int64_t N = 130, C = 96, OC = 288;
  const auto x = random(N * C), w = random(OC * C), b = random(OC), dy = random(N * OC);
  for (bool bias : {true, false}) {
    std::vector<float> out(N * OC);
    cpu().linear_forward(out.data(), x.data(), w.data(), bias ? b.data() : nullptr, N, C, OC);
    float* go = up(std::vector<float>(N * OC, 5.0f));  // overwritten
    gk().linear_forward(go, up(x), up(w), bias ? up(b) : nullptr, N, C, OC);
    expect_within(down(go, N * OC), out, kF32, bias ? "forward with bias" : "forward without bias");
  }
  // Gradients: dweight and dbias accumulate (prefilled), dinp is overwritten.
  const auto dw0 = random(OC * C), db0 = random(OC);
  std::vector<float> dx(N * C, 3.0f), dw = dw0, db = db0;
  cpu().linear_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), N, C, OC, nullptr);
  float *gdx = up(std::vector<float>(N * C, 3.0f)), *gdw = up(dw0), *gdb = up(db0);
  gk().linear_backward(gdx, gdw, gdb, up(dy), up(x), up(w), N, C, OC, nullptr);
  expect_within(down(gdx, N * C), dx, kF32, "dinp");
  expect_within(down(gdw, OC * C), dw, kF32, "dweight");
  expect_within(down(gdb, OC), db, kF32, "dbias");
  // No input gradient asked (the first layer).
  std::vector<float> dw2 = dw0;
  cpu().linear_backward(nullptr, dw2.data(), nullptr, dy.data(), x.data(), w.data(), N, C, OC, nullptr);
  float* gdw2 = up(dw0);
  gk().linear_backward(nullptr, gdw2, nullptr, up(dy), up(x), up(w), N, C, OC, nullptr);
  expect_within(down(gdw2, OC * C), dw2, kF32, "dweight without dinp");
}

TEST_F(CudaKernels, LinearBf16) {
  const int64_t N = 100, C = 64, OC = 200;
  const auto x = rounded(random(N * C)), w = rounded(random(OC * C));
  const auto b = random(OC), dy32 = random(N * OC);
  const auto dy = rounded(dy32);
  std::vector<float> out(N * OC);
  cpu().linear_forward(out.data(), x.data(), w.data(), b.data(), N, C, OC);
  float* go = up(std::vector<float>(N * OC));
  gk().linear_forward(go, up(x), up(w), up(b), N, C, OC);
  expect_within(down(go, N * OC), out, kBf16, "bf16 forward");
  const auto dw0 = random(OC * C), db0 = random(OC);
  std::vector<float> dx(N * C), dw = dw0, db = db0;
  cpu().linear_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), N, C, OC, dy32.data());
  float *gdx = up(std::vector<float>(N * C)), *gdw = up(dw0), *gdb = up(db0);
  gk().linear_backward(gdx, gdw, gdb, up(dy), up(x), up(w), N, C, OC, up(dy32));
  expect_within(down(gdx, N * C), dx, kBf16, "bf16 dinp");
  expect_within(down(gdw, OC * C), dw, kBf16, "bf16 dweight");
  expect_within(down(gdb, OC), db, kF32, "bias gradient from the fp32 output gradient");
}

TEST_F(CudaKernels, LayerNorm) {
  const int64_t N = 77, C = 96;
  const auto x = random(N * C, -2.0f, 3.0f), w = random(C, 0.5f, 1.5f), b = random(C);
  std::vector<float> y(N * C), m(N), r(N);
  cpu().layernorm_forward(y.data(), m.data(), r.data(), x.data(), w.data(), b.data(), N, C);
  float *gy = up(std::vector<float>(N * C)), *gm = up(std::vector<float>(N)), *gr = up(std::vector<float>(N));
  gk().layernorm_forward(gy, gm, gr, up(x), up(w), up(b), N, C);
  expect_within(down(gy, N * C), y, kF32, "layernorm out");
  expect_within(down(gm, N), m, kF32, "mean");
  expect_within(down(gr, N), r, kF32, "rstd");
  std::vector<bf16> y16(N * C);
  cpu().layernorm_forward(y16.data(), m.data(), r.data(), x.data(), w.data(), b.data(), N, C);
  bf16* gy16 = up(std::vector<bf16>(N * C));
  gk().layernorm_forward(gy16, gm, gr, up(x), up(w), up(b), N, C);
  std::vector<float> a(N * C), c(N * C);
  const auto g16 = down(gy16, N * C);
  dpt::convert(a.data(), g16.data(), a.size());
  dpt::convert(c.data(), y16.data(), c.size());
  expect_within(a, c, kBf16, "layernorm bf16 out");
  // Backward: dinp, dweight, dbias all accumulate.
  const auto dy = random(N * C), dx0 = random(N * C), dw0 = random(C), db0 = random(C);
  std::vector<float> dx = dx0, dw = dw0, db = db0;
  cpu().layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), m.data(), r.data(), N, C);
  float *gdx = up(dx0), *gdw = up(dw0), *gdb = up(db0);
  gk().layernorm_backward(gdx, gdw, gdb, up(dy), up(x), up(w), up(m), up(r), N, C);
  expect_within(down(gdx, N * C), dx, kF32, "layernorm dinp");
  expect_within(down(gdw, C), dw, kF32, "layernorm dweight");
  expect_within(down(gdb, C), db, kF32, "layernorm dbias");
}

TEST_F(CudaKernels, Activations) {
  const int64_t n = 5000;
  const auto x = random(n, -6.0f, 6.0f), dy = random(n);
  std::vector<float> y(n), dx(n);
  cpu().gelu_forward(y.data(), x.data(), n);
  float* gy = up(std::vector<float>(n));
  gk().gelu_forward(gy, up(x), n);
  expect_within(down(gy, n), y, kF32, "gelu");
  cpu().gelu_backward(dx.data(), dy.data(), x.data(), n);
  float* gdx = up(std::vector<float>(n));
  gk().gelu_backward(gdx, up(dy), up(x), n);
  expect_within(down(gdx, n), dx, kF32, "gelu backward");
  {  // fused with the bias gradient and the bf16 copy, against the CPU's:
    // fp32 against its fp32 path (no copy asked), the copy against its bf16
    // path's (which, with AVX-512 BF16, takes an approximate sigmoid within
    // 2e-4 of GELU's gradient: nn/activations_avx512.h)
    const int64_t N = 50, OC = n / N;
    std::vector<float> fdx(n), fdb(OC, 0.5f), unused(n), unused_db(OC, 0.5f);
    std::vector<bf16> fdx16(n);
    cpu().gelu_backward(fdx.data(), nullptr, fdb.data(), dy.data(), x.data(), N, OC);
    cpu().gelu_backward(unused.data(), fdx16.data(), unused_db.data(), dy.data(), x.data(), N, OC);
    float *g = up(std::vector<float>(n)), *gdb = up(std::vector<float>(OC, 0.5f));
    bf16* g16 = up(std::vector<bf16>(n));
    gk().gelu_backward(g, g16, gdb, up(dy), up(x), N, OC);
    expect_within(down(g, n), fdx, kF32, "fused gelu backward");
    expect_within(down(gdb, OC), fdb, kF32, "fused gelu backward's bias");
    std::vector<float> a(n), c(n);
    dpt::convert(a.data(), down(g16, n).data(), n);
    dpt::convert(c.data(), fdx16.data(), n);
    expect_within(a, c, kBf16, "fused gelu backward's bf16 copy");
  }
  std::vector<bf16> y16(n);
  cpu().gelu_forward(y16.data(), x.data(), n);
  bf16* gy16 = up(std::vector<bf16>(n));
  gk().gelu_forward(gy16, up(x), n);
  const auto g16 = down(gy16, n);
  std::vector<float> a(n), c(n);
  dpt::convert(a.data(), g16.data(), n);
  dpt::convert(c.data(), y16.data(), n);
  expect_within(a, c, kBf16, "gelu bf16");
  cpu().relu_forward(y.data(), x.data(), n);
  gk().relu_forward(gy, up(x), n);
  expect_within(down(gy, n), y, 0.0, "relu");
  cpu().relu_backward(dx.data(), dy.data(), y.data(), n);
  gk().relu_backward(gdx, up(dy), up(y), n);
  expect_within(down(gdx, n), dx, 0.0, "relu backward");
  const auto b = random(n);
  cpu().residual_forward(y.data(), x.data(), b.data(), n);
  gk().residual_forward(gy, up(x), up(b), n);
  expect_within(down(gy, n), y, 0.0, "residual");
}

TEST_F(CudaKernels, Attention) {
  for (auto [B, T, C, NH] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{2, 64, 96, 3}, {1, 37, 64, 4}}) {
    const auto qkv = random(B * T * 3 * C, -2.0f, 2.0f), dy = random(B * T * C);
    std::vector<float> y(B * T * C), att(B * NH * T * T), dqkv(B * T * 3 * C);
    cpu().attention_forward(y.data(), att.data(), qkv.data(), B, T, C, NH);
    float *gy = up(std::vector<float>(B * T * C)), *gatt = up(std::vector<float>(B * NH * T * T, 9.0f));
    float* gqkv = up(qkv);
    gk().attention_forward(gy, gatt, gqkv, B, T, C, NH);
    const std::string shape = " (T = " + std::to_string(T) + ")";
    expect_within(down(gy, B * T * C), y, kF32, "attention out" + shape);
    expect_within(down(gatt, B * NH * T * T), att, kF32, "attention probabilities" + shape);
    cpu().attention_backward(dqkv.data(), dy.data(), qkv.data(), att.data(), B, T, C, NH);
    float* gd = up(std::vector<float>(B * T * 3 * C, 4.0f));  // overwritten
    gk().attention_backward(gd, up(dy), gqkv, gatt, B, T, C, NH);
    expect_within(down(gd, B * T * 3 * C), dqkv, kF32, "attention dqkv" + shape);
  }
}

TEST_F(CudaKernels, Embeddings) {
  const int64_t V = 50, N = 300, C = 40, B = 3, T = 100;
  std::vector<int32_t> ids(N);
  for (int64_t i = 0; i < N; ++i) ids[i] = static_cast<int32_t>((i * 7) % V);  // repeats
  const auto table = random(V * C), pos = random(T * C), dy = random(N * C);
  std::vector<float> out(N * C);
  cpu().embedding_forward(out.data(), ids.data(), table.data(), N, C);
  float* gout = up(std::vector<float>(N * C));
  int32_t* gids = up(ids);
  gk().embedding_forward(gout, gids, up(table), N, C);
  expect_within(down(gout, N * C), out, 0.0, "embedding");
  cpu().position_embedding_forward(out.data(), pos.data(), B, T, C);
  gk().position_embedding_forward(gout, up(pos), B, T, C);
  expect_within(down(gout, N * C), out, kF32, "position embedding");
  const auto t16 = rounded(table);
  cpu().embedding_forward(out.data(), ids.data(), t16.data(), N, C);
  gk().embedding_forward(gout, gids, up(t16), N, C);
  expect_within(down(gout, N * C), out, 0.0, "bf16 embedding");
  const auto dt0 = random(V * C), dp0 = random(T * C);
  std::vector<float> dt = dt0, dp = dp0;
  cpu().embedding_backward(dt.data(), dy.data(), ids.data(), N, C);
  float* gdt = up(dt0);
  gk().embedding_backward(gdt, up(dy), gids, N, C);
  // Each token's rows added in position order, as the CPU adds them: the same bits.
  expect_within(down(gdt, V * C), dt, 0.0, "embedding backward");
  cpu().position_embedding_backward(dp.data(), dy.data(), B, T, C);
  float* gdp = up(dp0);
  gk().position_embedding_backward(gdp, up(dy), B, T, C);
  expect_within(down(gdp, T * C), dp, kF32, "position embedding backward");
}

TEST_F(CudaKernels, CrossEntropyAndPaddedRows) {
  for (auto [N, V, Vp] : {std::tuple<int64_t, int64_t, int64_t>{130, 257, 320}, {64, 50257, 50304}}) {
    const auto logits = random(N * Vp, -8.0f, 8.0f);
    std::vector<int32_t> t(N);
    for (int64_t n = 0; n < N; ++n) t[n] = static_cast<int32_t>((n * 131) % V);
    const std::string shape = " (V = " + std::to_string(V) + ")";
    // Padded rows packed to the vocabulary, as the GPT's head does.
    std::vector<float> c = logits;
    cpu().pack_rows(c.data(), N, V, Vp);
    float* g = up(logits);
    gk().pack_rows(g, N, V, Vp);
    expect_within(down(g, N * V), std::vector<float>(c.begin(), c.begin() + N * V), 0.0, "pack_rows" + shape);
    int64_t cc = 0, gc = 0;
    const float cl = cpu().cross_entropy_forward(c.data(), c.data(), t.data(), N, V, &cc);
    int32_t* gt = up(t);
    const float gl = gk().cross_entropy_forward(g, g, gt, N, V, &gc);
    EXPECT_LE(std::fabs(gl - cl), kF32 * std::fabs(cl)) << "loss" << shape << ": gpu " << gl << ", cpu " << cl;
    EXPECT_EQ(gc, cc) << "correct argmaxes" << shape;
    expect_within(down(g, N * V), std::vector<float>(c.begin(), c.begin() + N * V), kF32, "probabilities" + shape);
    // A bf16 run's copy in the padded rows (the CPU's without the fp32
    // gradient), the pad columns zero: within bf16 rounding.
    std::vector<bf16> c16(static_cast<size_t>(N * Vp));
    cpu().cross_entropy_backward(nullptr, c16.data(), Vp, c.data(), t.data(), N, V, 0.25f);
    bf16* g16 = up(std::vector<bf16>(static_cast<size_t>(N * Vp), bf16{0x7777}));
    gk().cross_entropy_backward(nullptr, g16, Vp, g, gt, N, V, 0.25f);
    std::vector<float> c16f(c16.size()), g16f(c16.size());
    cpu().convert(c16f.data(), c16.data(), c16.size());
    const auto g16d = down(g16, c16.size());
    cpu().convert(g16f.data(), g16d.data(), g16d.size());
    expect_within(g16f, c16f, kBf16, "bf16 dlogits, padded" + shape);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t v = V; v < Vp; ++v) ASSERT_EQ(g16d[n * Vp + v].bits, 0) << "pad column " << v << shape;
    cpu().cross_entropy_backward(c.data(), c.data(), t.data(), N, V, 0.25f);
    gk().cross_entropy_backward(g, g, gt, N, V, 0.25f);
    expect_within(down(g, N * V), std::vector<float>(c.begin(), c.begin() + N * V), kF32, "dlogits" + shape);
    cpu().unpack_rows(c.data(), N, V, Vp);
    gk().unpack_rows(g, N, V, Vp);
    expect_within(down(g, N * Vp), c, kF32, "unpack_rows" + shape);
  }
}

// pack_rows and unpack_rows past the backend's 64 MiB of scratch for them:
// 700 rows of 24,064 floats move in two blocks (697 rows, then 3), up to
// pack and down to unpack, exactly as the CPU moves them.
TEST_F(CudaKernels, PaddedRowsMoveInBlocks) {
  const int64_t N = 700, V = 24000, Vp = 24064;
  const auto x = random(N * Vp);
  std::vector<float> c = x;
  cpu().pack_rows(c.data(), N, V, Vp);
  float* g = up(x);
  gk().pack_rows(g, N, V, Vp);
  expect_within(down(g, N * V), std::vector<float>(c.begin(), c.begin() + N * V), 0.0, "pack_rows in blocks");
  // The summary's device memory names the scratch: a block of 697 rows here,
  // the backend's other scratch from earlier tests being small.
  const size_t scratch = dpt::device_memory(Device::CUDA).scratch;
  EXPECT_GE(scratch, size_t{697} * Vp * sizeof(float));
  EXPECT_LE(scratch, size_t{80} << 20);
  cpu().unpack_rows(c.data(), N, V, Vp);
  gk().unpack_rows(g, N, V, Vp);
  expect_within(down(g, N * Vp), c, 0.0, "unpack_rows in blocks");
}

TEST_F(CudaKernels, OptimizersAndNorms) {
  const size_t n = 100003;
  const auto p0 = random(n), g = random(n), m0 = random(n, -0.1f, 0.1f), v0 = random(n, 0.0f, 0.01f);
  const std::vector<float> zeros(n, 0.0f);
  for (bool consume : {false, true}) {
    std::vector<float> p = p0, m = m0, v = v0, gc = g;
    cpu().adamw_update(p.data(), gc.data(), m.data(), v.data(), n, 0.9f, 0.95f, 1e-8f, 1.0f - 3e-4f * 0.1f, 3e-3f,
                       1.7f, consume, nullptr);
    float *gp = up(p0), *gm = up(m0), *gv = up(v0), *gg = up(g);
    gk().adamw_update(gp, gg, gm, gv, n, 0.9f, 0.95f, 1e-8f, 1.0f - 3e-4f * 0.1f, 3e-3f, 1.7f, consume, nullptr);
    expect_within(down(gp, n), p, kOptim, "adamw params");
    expect_within(down(gm, n), m, kOptim, "adamw exp_avg");
    expect_within(down(gv, n), v, kOptim, "adamw exp_avg_sq");
    EXPECT_EQ(down(gg, n), consume ? zeros : g) << "adamw gradients after the update";
  }
  for (bool first : {true, false}) {
    for (bool consume : {false, true}) {
      std::vector<float> ps = p0, buf = m0, gs = g;
      cpu().sgd_update(ps.data(), gs.data(), buf.data(), n, 0.05f, 0.9f, 1e-4f, first, consume, nullptr);
      float *gps = up(p0), *gbuf = up(m0), *ggs = up(g);
      gk().sgd_update(gps, ggs, gbuf, n, 0.05f, 0.9f, 1e-4f, first, consume, nullptr);
      expect_within(down(gps, n), ps, kOptim, first ? "sgd first step" : "sgd");
      expect_within(down(gbuf, n), buf, kOptim, "sgd momentum");
      EXPECT_EQ(down(ggs, n), consume ? zeros : g) << "sgd gradients after the update";
    }
  }
  const double cs = cpu().sum_of_squares(g.data(), n), gs = gk().sum_of_squares(up(g), n);
  EXPECT_LE(std::fabs(gs - cs), 1e-6 * cs) << "sum of squares: gpu " << gs << ", cpu " << cs;
  std::vector<float> s = g;
  cpu().scale(s.data(), n, 0.3f);
  float* gsx = up(g);
  gk().scale(gsx, n, 0.3f);
  expect_within(down(gsx, n), s, 0.0, "scale");
}

// The peak a GPU run's MFU is against (train/gemm_rate.h): measured on the
// GPU's own GEMMs, bf16 above fp32 (no TF32) on every GPU this engine runs
// on, and its operands' device memory given back.
TEST_F(CudaKernels, GemmRateIsTheGpusOwn) {
  const size_t before = dpt::device_memory(Device::CUDA).in_use;
  const double fp32 = dpt::measure_device_gemm_gflops(Device::CUDA, dpt::DType::F32);
  const double bf16 = dpt::measure_device_gemm_gflops(Device::CUDA, dpt::DType::BF16);
  EXPECT_GT(fp32, 0.0);
  EXPECT_GT(bf16, fp32);
  EXPECT_GT(bf16, 10 * dpt::measure_device_gemm_gflops(Device::CPU, dpt::DType::BF16)) << "a CPU's rate?";
  EXPECT_EQ(dpt::device_memory(Device::CUDA).in_use, before);
  EXPECT_STREQ(dpt::device_gemm_name(Device::CUDA), "cuda");
}

}  // namespace
