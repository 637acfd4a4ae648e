// The GEMM layer (nn/gemm.h) on both backends against an fp64 reference: the
// workloads' shapes and awkward ones (1, 7, 1000; transposed operands; an
// operand at an odd offset into a flat buffer; leading dimensions above the
// row length; alpha != 1; beta = 0, 1 and 0.5), fp32 and bf16 inputs.
//
// The bound, per element of C (Higham, "Accuracy and Stability of Numerical
// Algorithms", 3.1): any order of summing K fp32 products has
//   |fl(sum a_k b_k) - sum a_k b_k| <= gamma_K * sum |a_k| |b_k|,
//   gamma_K = K u / (1 - K u), u = 2^-24 (fp32's unit roundoff).
// Scaling by alpha, rounding beta * c and the final add are three more
// roundings, so
//   |C - C_exact| <= (K + 3) u / (1 - (K + 3) u) * (|alpha| sum |a||b| + |beta| |c|).
// bf16 inputs are exact in fp32 and so are their products (8 + 8 significant
// bits), and both backends accumulate in fp32: against the exact product of
// the bf16 values the bound is the same. Against the fp32 values before
// rounding to bf16 (u_bf16 = 2^-9 per input, so each product is off by at most
// 2 u_bf16 + u_bf16^2 relative) the bound gains (2 u_bf16 + u_bf16^2) |alpha| sum |a||b|.
// The bound is rigorous, not a tuned tolerance: a wrong transpose, stride or
// beta misses it by orders of magnitude, and a NaN never passes (compare.h).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "compare.h"
#include "core/dot_rate.h"
#include "core/gemm_peak.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/threads.h"
#include "train/gemm_rate.h"
#include "nn/attention.h"
#include "nn/gemm.h"
#include "nn/linear.h"

namespace dpt {
namespace {

constexpr double kU32 = 1.0 / (1 << 24);   // fp32 unit roundoff
constexpr double kUBf16 = 1.0 / (1 << 9);  // bf16 unit roundoff

struct Case {
  int64_t M, N, K;
  Op op_a = Op::N, op_b = Op::N;
  float alpha = 1.0f, beta = 0.0f;
  int64_t pad = 0;     // added to every leading dimension
  int64_t offset = 0;  // elements before each operand in its buffer
  bool bias = false;   // gemm_bias: a bias row added to C (alpha 1, beta 0)
  std::string name() const {
    return fmt::format("{}x{}x{} {}{} alpha {} beta {} pad {} offset {}{}", M, N, K, op_a == Op::N ? 'N' : 'T',
                       op_b == Op::N ? 'N' : 'T', alpha, beta, pad, offset, bias ? " bias" : "");
  }
};

// A row-major [rows, cols] operand with leading dimension cols + pad, stored
// `offset` elements into a buffer; the padding holds sentinels.
struct Operand {
  int64_t rows, cols, ld, offset;
  std::vector<float> buf;
  Operand(int64_t r, int64_t c, int64_t pad, int64_t off, Rng& rng, float sentinel)
      : rows(r), cols(c), ld(c + pad), offset(off), buf(static_cast<size_t>(off + r * (c + pad)), sentinel) {
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) at(i, j) = rng.normal();
  }
  float& at(int64_t i, int64_t j) { return buf[static_cast<size_t>(offset + i * ld + j)]; }
  float get(int64_t i, int64_t j) const { return buf[static_cast<size_t>(offset + i * ld + j)]; }
  float* data() { return buf.data() + offset; }
  // op(X)[i][j]: the logical element.
  float op(Op o, int64_t i, int64_t j) const { return o == Op::N ? get(i, j) : get(j, i); }
  void round_to_bf16() {
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) at(i, j) = to_f32(to_bf16(at(i, j)));
  }
  std::vector<bf16> as_bf16() const {
    std::vector<bf16> out(buf.size());
    for (size_t i = 0; i < buf.size(); ++i) out[i] = to_bf16(buf[i]);
    return out;
  }
};

// The exact result in fp64 and the error bound of each element of C. a and
// b hold the values the result should be the product of (c0: C's values
// before, read when beta is not 0); `extra` adds that much relative error
// per product to the bound (bf16 rounding).
struct Reference {
  std::vector<double> want, bound;
};

Reference reference(const Case& c, const Operand& a, const Operand& b, const Operand& c0, double extra = 0.0,
                    const std::vector<float>& bias = {}) {
  Reference r;
  r.want.resize(static_cast<size_t>(c.M * c.N));
  r.bound.resize(r.want.size());
  const double n = static_cast<double>(c.K + 3) * kU32;
  const double gamma = n / (1.0 - n) + extra;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < c.M; ++i)
    for (int64_t j = 0; j < c.N; ++j) {
      double s = 0.0, abs = 0.0;
      for (int64_t k = 0; k < c.K; ++k) {
        const double p = static_cast<double>(a.op(c.op_a, i, k)) * b.op(c.op_b, k, j);
        s += p;
        abs += std::fabs(p);
      }
      const double old = c.beta != 0.0f ? c0.get(i, j) : 0.0;
      const double add = bias.empty() ? 0.0 : bias[static_cast<size_t>(j)];
      const size_t e = static_cast<size_t>(i * c.N + j);
      r.want[e] = c.alpha * s + c.beta * old + add;
      r.bound[e] = gamma * (std::fabs(c.alpha) * abs + std::fabs(c.beta * old) + std::fabs(add));
    }
  return r;
}

// Every element of C within its bound, and C's padding untouched.
::testing::AssertionResult check(const Case& c, const Operand& got, const Reference& r, float sentinel) {
  int64_t bad = 0;
  std::string first;
  for (int64_t i = 0; i < c.M; ++i)
    for (int64_t j = 0; j < c.N; ++j) {
      const size_t e = static_cast<size_t>(i * c.N + j);
      if (test::near(got.get(i, j), r.want[e], r.bound[e])) continue;
      if (bad++ == 0)
        first = fmt::format("C[{}][{}] = {:.9g}, want {:.9g} +- {:.3g}", i, j, got.get(i, j), r.want[e], r.bound[e]);
    }
  for (int64_t i = 0; i < c.M; ++i)
    for (int64_t j = c.N; j < got.ld; ++j)
      if (std::memcmp(&got.buf[static_cast<size_t>(got.offset + i * got.ld + j)], &sentinel, sizeof sentinel) != 0) {
        if (bad++ == 0) first = fmt::format("padding C[{}][{}] overwritten", i, j);
      }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " elements wrong, first " << first;
}

enum class In { F32, BF16 };

class Gemm : public ::testing::TestWithParam<GemmBackend> {
 protected:
  void SetUp() override {
    set_gemm_backend(GetParam());
    set_threads(2);
  }

  // Runs one case with fp32 or bf16 inputs and checks it against the bound.
  void run(const Case& c, In in) {
    SCOPED_TRACE(c.name() + (in == In::BF16 ? " bf16" : " fp32"));
    Rng rng(static_cast<uint64_t>(c.M * 7919 + c.N * 104729 + c.K));
    const int64_t a_rows = c.op_a == Op::N ? c.M : c.K, a_cols = c.op_a == Op::N ? c.K : c.M;
    const int64_t b_rows = c.op_b == Op::N ? c.K : c.N, b_cols = c.op_b == Op::N ? c.N : c.K;
    // NaN in A's and B's padding: a backend that reads it poisons C.
    const float nan = std::nanf(""), sentinel = -12345.0f;
    Operand a(a_rows, a_cols, c.pad, c.offset, rng, nan), b(b_rows, b_cols, c.pad, c.offset, rng, nan);
    Operand out(c.M, c.N, c.pad, c.offset, rng, sentinel);
    if (c.beta == 0.0f)  // beta = 0 must ignore C's old contents, NaN included
      for (int64_t i = 0; i < c.M; ++i)
        for (int64_t j = 0; j < c.N; ++j) out.at(i, j) = nan;
    if (in == In::BF16) a.round_to_bf16(), b.round_to_bf16();
    std::vector<float> bias;
    if (c.bias)
      for (int64_t j = 0; j < c.N; ++j) bias.push_back(rng.normal());
    const Reference r = reference(c, a, b, out, 0.0, bias);
    if (in == In::F32 && c.bias) {
      gemm_bias(c.op_a, c.op_b, c.M, c.N, c.K, a.data(), a.ld, b.data(), b.ld, bias.data(), out.data(), out.ld);
    } else if (in == In::F32) {
      gemm(c.op_a, c.op_b, c.M, c.N, c.K, c.alpha, a.data(), a.ld, b.data(), b.ld, c.beta, out.data(), out.ld);
    } else if (c.bias) {
      const std::vector<bf16> a16 = a.as_bf16(), b16 = b.as_bf16();
      gemm_bias(c.op_a, c.op_b, c.M, c.N, c.K, a16.data() + c.offset, a.ld, b16.data() + c.offset, b.ld, bias.data(),
                out.data(), out.ld);
    } else {
      const std::vector<bf16> a16 = a.as_bf16(), b16 = b.as_bf16();
      gemm(c.op_a, c.op_b, c.M, c.N, c.K, c.alpha, a16.data() + c.offset, a.ld, b16.data() + c.offset, b.ld, c.beta,
           out.data(), out.ld);
    }
    EXPECT_TRUE(check(c, out, r, sentinel));
  }
};

// The workloads' GEMMs, each in the layout the engine runs it: linear forward
// (inp W^T: NT), input gradient (dout W: NN), weight gradient (dout^T inp: TN,
// accumulated). 1024^3 is the peak's shape.
const Case kWorkloadCases[] = {
    {1024, 1024, 1024, Op::N, Op::T},
    {2048, 1024, 256, Op::N, Op::T},         // W-GPT c_fc forward
    {2048, 256, 1024, Op::N, Op::N},         // W-GPT c_fc input gradient
    {256, 1024, 784, Op::N, Op::T},          // W-MLP fc1 forward
    {1024, 784, 256, Op::T, Op::N, 1, 1},    // W-MLP fc1 weight gradient (+=)
};

TEST_P(Gemm, WorkloadShapesFp32) {
  for (const Case& c : kWorkloadCases) run(c, In::F32);
}

TEST_P(Gemm, WorkloadShapesBf16) {
  for (const Case& c : kWorkloadCases) run(c, In::BF16);
}

// Sizes 1, 7 and 1000 in every position, all four transpose pairs, with and
// without padding and offsets, and alpha/beta away from 1/0.
TEST_P(Gemm, AwkwardShapes) {
  const int64_t sizes[] = {1, 7, 1000};
  const Op ops[] = {Op::N, Op::T};
  int n = 0;
  for (int64_t M : sizes)
    for (int64_t N : sizes)
      for (int64_t K : sizes)
        for (Op oa : ops)
          for (Op ob : ops) {
            // The large ones in two transpose pairs only, 1000^3 in one:
            // their fp64 reference is the slow part.
            if (M * N * K >= 1000LL * 1000 * 7 && oa != ob) continue;
            if (M * N * K == 1000LL * 1000 * 1000 && oa == Op::T) continue;
            Case c{M, N, K, oa, ob};
            switch (n++ % 4) {
              case 0: break;
              case 1: c.pad = 3, c.offset = 5, c.beta = 1.0f; break;
              case 2: c.alpha = -0.375f, c.beta = 0.5f, c.pad = 1; break;
              case 3: c.alpha = 2.0f, c.offset = 1; break;
            }
            run(c, n % 2 ? In::F32 : In::BF16);
          }
}

// The engine's own strided calls: a column block of dout (the MLP's weight
// gradient in row blocks, ld = OC) and one head of qkv (ld = 3C).
TEST_P(Gemm, StridedSubBlocksOfFlatBuffers) {
  for (In in : {In::F32, In::BF16}) {
    run({64, 256, 2048, Op::T, Op::N, 1.0f, 1.0f, 1024 - 64, 192}, in);  // dout[:, 192:256]^T inp
    run({128, 128, 64, Op::N, Op::T, 0.125f, 0.0f, 3 * 256 - 64, 64}, in);  // q k^T of head 1
    run({128, 64, 128, Op::N, Op::N, 1.0f, 0.0f, 3 * 256 - 128, 7}, in);
  }
}

// A linear layer's forward: the bias added to every row as C is written (C's
// old contents, NaN here, ignored), at the workloads' shapes and awkward ones.
TEST_P(Gemm, BiasAddedToEveryRow) {
  for (In in : {In::F32, In::BF16}) {
    Case c{2048, 1024, 256, Op::N, Op::T};  // W-GPT c_fc
    c.bias = true;
    run(c, in);
    for (Case odd : {Case{7, 1000, 1, Op::N, Op::T, 1.0f, 0.0f, 3, 5}, Case{1, 7, 1000, Op::N, Op::T},
                     Case{1000, 10, 7, Op::N, Op::N, 1.0f, 0.0f, 1, 0}}) {
      odd.bias = true;
      run(odd, in);
    }
  }
}

// bf16 inputs against the fp32 values they were rounded from: the bf16 bound.
TEST_P(Gemm, Bf16AgainstUnroundedFp32) {
  const Case c{256, 1024, 784, Op::N, Op::T};
  Rng rng(5);
  const float sentinel = -1.0f;
  Operand a(c.M, c.K, 0, 0, rng, sentinel), b(c.N, c.K, 0, 0, rng, sentinel), out(c.M, c.N, 0, 0, rng, sentinel);
  const Reference r = reference(c, a, b, out, 2 * kUBf16 + kUBf16 * kUBf16);
  const std::vector<bf16> a16 = a.as_bf16(), b16 = b.as_bf16();
  gemm(c.op_a, c.op_b, c.M, c.N, c.K, 1.0f, a16.data(), c.K, b16.data(), c.K, 0.0f, out.data(), c.N);
  EXPECT_TRUE(check(c, out, r, sentinel));
  // And the bound is not vacuous: the bf16 result is measurably not the
  // fp32 one (if it were, bf16 rounding would not have happened).
  std::vector<float> f32(static_cast<size_t>(c.M * c.N));
  gemm(c.op_a, c.op_b, c.M, c.N, c.K, 1.0f, a.data(), c.K, b.data(), c.K, 0.0f, f32.data(), c.N);
  EXPECT_FALSE(test::bitwise_equal(out.buf.data(), f32.data(), f32.size()));
}

// Attention calls the GEMM from inside `omp parallel`: each thread's call
// must run on that thread alone and give what a 1-thread run gives, bit for
// bit; and the same call twice gives the same bits (determinism).
TEST_P(Gemm, InsideAParallelRegionMatchesOneThread) {
  const int64_t M = 128, N = 64, K = 128, pairs = 8;
  Rng rng(9);
  std::vector<float> a(static_cast<size_t>(pairs * M * K)), b(static_cast<size_t>(K * N));
  for (float& x : a) x = rng.normal();
  for (float& x : b) x = rng.normal();
  std::vector<float> nested(static_cast<size_t>(pairs * M * N)), serial(nested.size()), again(nested.size());
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < pairs; ++p)
    gemm(Op::N, Op::N, M, N, K, 1.0f, a.data() + p * M * K, K, b.data(), N, 0.0f, nested.data() + p * M * N, N);
  set_threads(1);
  for (std::vector<float>* out : {&serial, &again})
    for (int64_t p = 0; p < pairs; ++p)
      gemm(Op::N, Op::N, M, N, K, 1.0f, a.data() + p * M * K, K, b.data(), N, 0.0f, out->data() + p * M * N, N);
  EXPECT_TRUE(test::bitwise_equal(serial.data(), again.data(), serial.size()));
  EXPECT_TRUE(test::bitwise_equal(nested.data(), serial.data(), serial.size()));
}

INSTANTIATE_TEST_SUITE_P(Backends, Gemm, ::testing::Values(GemmBackend::OpenBlas, GemmBackend::OneDnn),
                         [](const auto& info) { return std::string(gemm_backend_name(info.param)); });

// oneDNN primitives are made in the first step and reused afterwards: a
// W-GPT-sized block's GEMMs (linear forward and backward, attention forward
// and backward, the latter inside parallel regions) twice.
TEST(GemmCache, SecondStepCreatesNoPrimitives) {
  set_gemm_backend(GemmBackend::OneDnn);
  set_threads(2);
  const int64_t B = 2, T = 32, C = 64, NH = 4, N = B * T;
  Rng rng(3);
  auto vec = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = 0.1f * rng.normal();
    return v;
  };
  auto x = vec(N * C), w = vec(3 * C * C), bias = vec(3 * C), qkv = vec(N * 3 * C), dqkv = vec(N * 3 * C);
  auto y = vec(N * C), att = vec(B * NH * T * T), dw = vec(3 * C * C), db = vec(3 * C), dx = vec(N * C);
  auto step = [&] {
    linear_forward(qkv.data(), x.data(), w.data(), bias.data(), N, C, 3 * C);
    attention_forward(y.data(), att.data(), qkv.data(), B, T, C, NH);
    attention_backward(dqkv.data(), y.data(), qkv.data(), att.data(), B, T, C, NH);
    linear_backward(dx.data(), dw.data(), db.data(), dqkv.data(), x.data(), w.data(), N, C, 3 * C);
  };
  const GemmCacheStats before = gemm_cache_stats();
  step();
  const GemmCacheStats first = gemm_cache_stats();
  step();
  const GemmCacheStats second = gemm_cache_stats();
  EXPECT_GT(first.created, before.created);
  EXPECT_EQ(second.created, first.created) << "primitives created in the second step";
  // 3 linear GEMMs and 6 per (batch, head) in attention, all from the cache.
  EXPECT_EQ(second.hits - first.hits, 3 + 6 * B * NH);
}

TEST(GemmBackendNames, ParseAndPrint) {
  for (GemmBackend b : {GemmBackend::OpenBlas, GemmBackend::OneDnn})
    EXPECT_EQ(parse_gemm_backend(gemm_backend_name(b)), b);
  EXPECT_THROW(parse_gemm_backend("foo"), InputError);
  EXPECT_THROW(parse_gemm_backend("OneDNN"), InputError);
}

// How bf16 GEMMs run (nn/gemm.h, --bf16-gemm). Widened is exactly the fp32
// GEMM of the widened values, on either backend and whatever the CPU has;
// native (where oneDNN has bf16 kernels) the same products summed in the
// bf16 kernel's order, within the fp32 bound of each other.
class Bf16GemmModes : public ::testing::TestWithParam<GemmBackend> {
 protected:
  void SetUp() override {
    set_gemm_backend(GetParam());
    set_threads(1);
  }
  void TearDown() override { set_bf16_gemm(Bf16Gemm::Auto); }
};

TEST_P(Bf16GemmModes, WidenedIsTheFp32GemmOfTheWidenedValues) {
  const Case c{96, 200, 130, Op::T, Op::N, 0.5f, 1.0f};
  Rng rng(11);
  const float sentinel = -1.0f;
  Operand a(c.K, c.M, 3, 1, rng, sentinel), b(c.K, c.N, 0, 0, rng, sentinel);
  const std::vector<bf16> a16 = a.as_bf16(), b16 = b.as_bf16();
  a.round_to_bf16();
  b.round_to_bf16();
  std::vector<float> widened(static_cast<size_t>(c.M * c.N), 7.0f), fp32 = widened;
  set_bf16_gemm(Bf16Gemm::Widened);
  EXPECT_FALSE(gemm_bf16_native());
  gemm(c.op_a, c.op_b, c.M, c.N, c.K, 0.5f, a16.data() + a.offset, a.ld, b16.data(), b.ld, 1.0f, widened.data(), c.N);
  gemm(c.op_a, c.op_b, c.M, c.N, c.K, 0.5f, a.data(), a.ld, b.data(), b.ld, 1.0f, fp32.data(), c.N);
  EXPECT_TRUE(test::bitwise_equal(widened.data(), fp32.data(), fp32.size()));
  // With a bias too (added as the fp32 path adds it: fused where oneDNN runs).
  std::vector<float> bias(static_cast<size_t>(c.N));
  for (float& x : bias) x = rng.normal();
  gemm_bias(c.op_a, c.op_b, c.M, c.N, c.K, a16.data() + a.offset, a.ld, b16.data(), b.ld, bias.data(), widened.data(),
            c.N);
  gemm_bias(c.op_a, c.op_b, c.M, c.N, c.K, a.data(), a.ld, b.data(), b.ld, bias.data(), fp32.data(), c.N);
  EXPECT_TRUE(test::bitwise_equal(widened.data(), fp32.data(), fp32.size()));
  if (!gemm_bf16_kernels()) return;
  std::vector<float> native(widened.size(), 7.0f);
  set_bf16_gemm(Bf16Gemm::Native);
  EXPECT_TRUE(gemm_bf16_native());
  gemm(c.op_a, c.op_b, c.M, c.N, c.K, 0.5f, a16.data() + a.offset, a.ld, b16.data(), b.ld, 1.0f, native.data(), c.N);
  Operand c0(c.M, c.N, 0, 0, rng, sentinel);
  std::fill(c0.buf.begin(), c0.buf.end(), 7.0f);
  const Reference r = reference(c, a, b, c0);
  for (size_t e = 0; e < native.size(); ++e) ASSERT_LE(std::fabs(native[e] - r.want[e]), r.bound[e]) << e;
}

// A bf16 linear's backward under widened GEMMs widens its output gradient
// once for both products: the same bits as the two products asked apart.
TEST_P(Bf16GemmModes, WidenedLinearBackwardIsItsTwoProducts) {
  const int64_t N = 37, C = 24, OC = 50;
  Rng rng(13);
  auto bf16s = [&](int64_t n) {
    std::vector<bf16> v(static_cast<size_t>(n));
    for (bf16& x : v) x = to_bf16(rng.normal());
    return v;
  };
  const std::vector<bf16> dout = bf16s(N * OC), inp = bf16s(N * C), weight = bf16s(OC * C);
  set_bf16_gemm(Bf16Gemm::Widened);
  std::vector<float> dinp(static_cast<size_t>(N * C)), dweight(static_cast<size_t>(OC * C), 0.25f);
  std::vector<float> dinp2 = dinp, dweight2 = dweight;
  const double before = gemm_seconds();
  linear_backward(dinp.data(), dweight.data(), nullptr, dout.data(), inp.data(), weight.data(), N, C, OC);
  EXPECT_GT(gemm_seconds(), before);
  linear_backward_input(dinp2.data(), dout.data(), weight.data(), N, C, OC);
  linear_backward_weight(dweight2.data(), dout.data(), inp.data(), N, C, OC, 0, OC);
  EXPECT_TRUE(test::bitwise_equal(dinp.data(), dinp2.data(), dinp.size()));
  EXPECT_TRUE(test::bitwise_equal(dweight.data(), dweight2.data(), dweight.size()));
}

TEST_P(Bf16GemmModes, AutoIsTheRuleOnThisCpu) {
  set_bf16_gemm(Bf16Gemm::Auto);
  if (!gemm_bf16_kernels()) {
    EXPECT_FALSE(gemm_bf16_native());  // nothing to choose: widened
    return;
  }
  // This CPU has AVX-512 BF16 (oneDNN's bf16 kernels need it), so the probe
  // measured a rate, and auto follows the rule on it.
  EXPECT_GT(bf16_dot_over_fma(), 0.0);
  EXPECT_EQ(gemm_bf16_native(), !auto_widens_bf16_gemm(bf16_dot_over_fma(), false) ||
                                    gemm_backend_detail().find("amx") != std::string::npos);
  EXPECT_NE(gemm_backend_detail().find(gemm_bf16_native() ? "bf16 kernels" : "bf16 widened to fp32: this CPU's AVX-512 BF16"),
            std::string::npos)
      << gemm_backend_detail();
}

INSTANTIATE_TEST_SUITE_P(Backends, Bf16GemmModes, ::testing::Values(GemmBackend::OpenBlas, GemmBackend::OneDnn),
                         [](const auto& info) { return std::string(gemm_backend_name(info.param)); });

TEST(Bf16GemmRule, WidensWhereDotProductsAreSlowAndNoAmx) {
  EXPECT_TRUE(auto_widens_bf16_gemm(0.5, false));    // Sapphire/Emerald Rapids, AMX hidden
  EXPECT_FALSE(auto_widens_bf16_gemm(0.5, true));    // the same cores with AMX
  EXPECT_FALSE(auto_widens_bf16_gemm(2.0, false));   // Zen 4 and 5
  EXPECT_FALSE(auto_widens_bf16_gemm(0.0, false));   // no AVX-512 BF16: nothing measured
  EXPECT_FALSE(auto_widens_bf16_gemm(0.75, false));  // the boundary stays native
  EXPECT_TRUE(auto_widens_bf16_gemm(0.74, false));
}

TEST(Bf16GemmRule, DotRateProbeIsAFlopRatioOrZero) {
  const double r = bf16_dot_over_fma();
  if (!__builtin_cpu_supports("avx512bf16")) {
    EXPECT_EQ(r, 0.0);
    return;
  }
  // One vdpbf16ps is at least a quarter and at most four times an FMA's
  // FLOPs per cycle on any core that has both.
  EXPECT_GT(r, 0.25);
  EXPECT_LT(r, 4.0);
  EXPECT_EQ(bf16_dot_over_fma(), r);  // measured once
}

TEST(Bf16GemmRule, ParseAndPrint) {
  for (Bf16Gemm b : {Bf16Gemm::Auto, Bf16Gemm::Native, Bf16Gemm::Widened})
    EXPECT_EQ(parse_bf16_gemm(bf16_gemm_name(b)), b);
  EXPECT_THROW(parse_bf16_gemm("fast"), InputError);
  EXPECT_THROW(parse_bf16_gemm("Native"), InputError);
}

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(to_bf16(1.0f).bits, 0x3f80);
  EXPECT_EQ(to_f32(to_bf16(1.0f)), 1.0f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even one, 1.
  EXPECT_EQ(to_f32(to_bf16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_EQ(to_f32(to_bf16(1.0f + 3.0f / 256)), 1.0f + 4.0f / 256);
  EXPECT_TRUE(std::isnan(to_f32(to_bf16(std::nanf("")))));
  EXPECT_TRUE(std::isinf(to_f32(to_bf16(INFINITY))));
  EXPECT_EQ(to_f32(to_bf16(-2.5f)), -2.5f);
}

}  // namespace
// The peak's measurement (core/gemm_peak.h): a warm-up and three timed runs
// with no budget; more, to at most 64, until the budget has passed; the
// best run's rate.
TEST(GemmPeak, RunsUntilTheBudgetAndKeepsTheBest) {
  int calls = 0;
  auto counted = [&](int, const float*, const float*, float*) { ++calls; };
  measure_gflops(counted, 0.0);
  EXPECT_EQ(calls, 4);
  calls = 0;
  const auto t0 = std::chrono::steady_clock::now();
  measure_gflops(
      [&](int n, const float* a, const float* b, float* c) {
        counted(n, a, b, c);
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      },
      0.05);
  EXPECT_GE(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 0.05);
  EXPECT_GT(calls, 4);
  calls = 0;
  measure_gflops(counted, 1e9);  // a budget no run reaches: 64 runs
  EXPECT_EQ(calls, 64);
  // The best: one run of the three fast ones is the rate reported.
  calls = 0;
  const double rate = measure_gflops(
      [&](int, const float*, const float*, float*) {
        std::this_thread::sleep_for(std::chrono::milliseconds(++calls == 3 ? 2 : 20));
      },
      0.0);
  const double fast = 2.0 * 1024 * 1024 * 1024 / 2e-3 / 1e9;
  EXPECT_GT(rate, 0.5 * fast);  // the 2 ms run's rate, give or take the sleep's overshoot
  EXPECT_LE(rate, fast);
}

// The CPU's peak is the GEMM backend's, named as the backend.
TEST(GemmPeak, TheCpuDeviceIsItsGemmBackend) {
  set_threads(1);
  EXPECT_GT(measure_device_gemm_gflops(Device::CPU, DType::F32), 0.0);
  EXPECT_STREQ(device_gemm_name(Device::CPU), gemm_backend_name(gemm_backend()));
}

}  // namespace dpt
