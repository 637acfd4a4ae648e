// The CUDA fused attention's own kernel source
// (src/cuda/flash_attention_kernels.cuh), launched exactly as
// src/cuda/flash_attention.cu launches it (forward_launches,
// backward_launches: grids, threads, shared bytes), run on the CPU by
// tests/simt_emulator.h: out, lse and the whole dqkv against the CPU's
// fused kernel (nn/flash_attention.h) and the unfused grouped-query layer
// (nn/gqa_attention.h), within 1e-5, for every register width the launches
// pick (hd 1 to 256), T in {1, 7, 64, 129, 1000} (one row, a partial tile,
// whole tiles, one past them, many), multi-head, grouped and multi-query;
// and a decoder's gradients with its fused attention through that source.
// The threads run between barriers in order, reversed and shuffled: a read
// of shared memory no barrier orders, a barrier some threads skip, a read
// of shared memory no thread wrote (NaN) or past the launch's bytes, or a
// misaligned float4 load fails here, where no GPU is. What the GPU itself
// adds (its expf, its memory model) is for test_cuda_flash_attention on a
// GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "compare.h"
#include "core/rng.h"
#include "core/threads.h"
#include "decoder_step.h"
#include "forwarding_kernels.h"
#include "models/decoder.h"
#include "nn/flash_attention.h"
#include "nn/gqa_attention.h"

// Last: the emulator defines CUDA's keywords and builtins for the kernels.
#include "simt_emulator.h"
#include "cuda/flash_attention_kernels.cuh"

namespace dpt {
namespace {

namespace flash = cuda::flash;

struct Case {
  int64_t B, T, NH, NKV, hd;
};

std::string name(const Case& c) {
  return "B " + std::to_string(c.B) + " T " + std::to_string(c.T) + " heads " + std::to_string(c.NH) + "/" +
         std::to_string(c.NKV) + " hd " + std::to_string(c.hd);
}

struct Emulated {
  template <typename K, typename... A>
  void operator()(K* kernel, flash::Grid g, int threads, size_t bytes, A... args) const {
    simt::launch(kernel, g, threads, bytes, args...);
  }
};

::testing::AssertionResult within(const std::vector<float>& got, const std::vector<float>& want, double r) {
  return test::all_close(got.data(), want.data(), want.size(), 0.0, r);
}

void check_case(const Case& c, simt::Order order) {
  SCOPED_TRACE(name(c));
  const int64_t ld = (c.NH + 2 * c.NKV) * c.hd, rows = c.B * c.T;
  Rng rng(static_cast<uint64_t>(c.T * 131 + c.hd));
  std::vector<float> qkv(static_cast<size_t>(rows * ld)), dout(static_cast<size_t>(rows * c.NH * c.hd));
  for (float& x : qkv) x = rng.normal() * 1.5f;
  for (float& x : dout) x = rng.normal();
  const size_t n_out = dout.size(), n_lse = static_cast<size_t>(c.B * c.NH * c.T);

  // The references: the CPU's fused kernel and the unfused layer.
  std::vector<float> out(n_out), lse(n_lse), dqkv(qkv.size());
  flash_attention_forward(out.data(), lse.data(), qkv.data(), c.B, c.T, c.NH, c.NKV, c.hd);
  flash_attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), c.B, c.T, c.NH, c.NKV,
                           c.hd);
  std::vector<float> uout(n_out), att(static_cast<size_t>(c.B * c.NH * c.T * c.T)), udqkv(qkv.size());
  gqa_attention_forward(uout.data(), att.data(), qkv.data(), c.B, c.T, c.NH, c.NKV, c.hd);
  gqa_attention_backward(udqkv.data(), dout.data(), qkv.data(), att.data(), c.B, c.T, c.NH, c.NKV, c.hd);

  // The kernels, every output prefilled with NaN: what they do not write shows.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> gout(n_out, nan), glse(n_lse, nan), gdqkv(qkv.size(), nan), D(n_lse, nan);
  const flash::Shape s{c.B, c.T, static_cast<int>(c.NH), static_cast<int>(c.NKV), static_cast<int>(c.hd),
                       1.0f / std::sqrt(static_cast<float>(c.hd))};
  simt::st().order = order;
  flash::forward_launches(Emulated{}, gout.data(), glse.data(), qkv.data(), s);
  flash::backward_launches(Emulated{}, gdqkv.data(), dout.data(), qkv.data(), gout.data(), glse.data(), D.data(), s);

  constexpr double r = 1e-5;
  EXPECT_TRUE(within(gout, out, r)) << "out against the CPU fused kernel";
  EXPECT_TRUE(within(glse, lse, r)) << "lse against the CPU fused kernel";
  EXPECT_TRUE(within(gdqkv, dqkv, r)) << "dqkv against the CPU fused kernel";
  EXPECT_TRUE(within(gout, uout, r)) << "out against the unfused layer";
  EXPECT_TRUE(within(gdqkv, udqkv, r)) << "dqkv against the unfused layer";
}

// Every DV the launches instantiate (ceil(hd / 32) = 1 to 8), head sizes
// that fill the lanes and ones that do not, and ones that are not whole
// float4s (the warp tiles' rows padded with zeros).
TEST(CudaFlashEmulated, EveryHeadWidthForwardAndBackward) {
  set_threads(1);
  for (int64_t hd : {1, 6, 8, 16, 33, 40, 64, 80, 100, 128, 150, 200, 250, 256})
    for (int64_t T : {1, 7, 33})
      check_case(Case{1, T, 2, 1, hd}, simt::Order::InOrder);
}

// T in {1, 7, 64, 129, 1000}: one row, a partial tile, whole tiles of
// every kernel, one past them, many; multi-head, grouped, multi-query.
TEST(CudaFlashEmulated, ContextsAndHeadGroupings) {
  set_threads(1);
  for (int64_t T : {1, 7, 64, 129, 1000})
    for (auto [NH, NKV] : {std::pair<int64_t, int64_t>{2, 2}, {4, 2}, {3, 1}})
      check_case(Case{2, T, NH, NKV, 16}, simt::Order::InOrder);
  check_case(Case{1, 129, 4, 2, 64}, simt::Order::InOrder);  // Llama's and GPT's head size
}

// The threads between barriers in other orders: the same results.
TEST(CudaFlashEmulated, ThreadOrderDoesNotMatter) {
  set_threads(1);
  for (simt::Order order : {simt::Order::Reversed, simt::Order::Shuffled}) {
    check_case(Case{1, 70, 4, 2, 40}, order);
    check_case(Case{1, 37, 2, 1, 128}, order);
  }
}

// Kernels whose fused attention is the CUDA kernels' source on the
// emulator (the rest the CPU's): what a decoder on a GPU calls, so a
// decoder computing through them checks the launches on the decoder's own
// layouts (its arena's lse, out and dqkv; rotary and GPT-2 biases around).
class EmulatedFlashKernels : public test::ForwardingKernels {
 public:
  EmulatedFlashKernels() : ForwardingKernels(cpu_kernels()) {}
  void flash_attention_forward(float* out, bf16* out16, float* lse, const float* qkv, int64_t B, int64_t T,
                               int64_t NH, int64_t NKV, int64_t hd) const override {
    flash::forward_launches(Emulated{}, out, lse, qkv, shape(B, T, NH, NKV, hd));
    if (out16) inner_.convert(out16, out, static_cast<size_t>(B * T * NH * hd));  // as the GPU's backend
  }
  void flash_attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                                int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t hd) const override {
    std::vector<float> D(static_cast<size_t>(B * NH * T));
    flash::backward_launches(Emulated{}, dqkv, dout, qkv, out, lse, D.data(), shape(B, T, NH, NKV, hd));
  }

 private:
  static flash::Shape shape(int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t hd) {
    return flash::Shape{B, T, static_cast<int>(NH), static_cast<int>(NKV), static_cast<int>(hd),
                        1.0f / std::sqrt(static_cast<float>(hd))};
  }
};

std::vector<float> one_step_grads(const DecoderConfig& c, int64_t T, const Kernels* k) {
  Decoder d(c);
  d.init_params(5);
  d.set_fused_attention(true);
  if (k) d.use_kernels(*k);
  return test::one_step_grads(d, test::random_batch(2, T, c.vocab, static_cast<uint64_t>(T)));
}

// One step's gradients of every parameter, the decoder's fused attention
// through the CUDA kernels' source, within 1e-5 of the CPU's fused kernel:
// Llama (grouped heads of 16, rotary) and GPT-2 (plain heads of 16, biases).
TEST(CudaFlashEmulated, DecoderGradientsMatchTheCpu) {
  set_threads(1);
  const auto configs = test::small_llama_and_gpt(64, 70);  // Llama, GPT-2
  const EmulatedFlashKernels emulated;
  for (const DecoderConfig& c : configs)
    for (int64_t T : {7, 70}) {
      SCOPED_TRACE(c.family + " T " + std::to_string(T));
      const auto got = one_step_grads(c, T, &emulated), want = one_step_grads(c, T, nullptr);
      const Decoder layout_of(c);
      for (const Slot& s : layout_of.layout().slots())
        EXPECT_TRUE(test::all_close(got.data() + s.offset, want.data() + s.offset, s.numel, 0.0, 1e-5)) << s.name;
    }
}

}  // namespace
}  // namespace dpt
