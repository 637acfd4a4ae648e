// bf16 mixed precision (--precision bf16, docs/precision.md) in one process:
// it really computes in bf16 (close to fp32, not equal), it learns as fp32
// does, and it accounts its bytes as WORKLOADS.md's mixed-precision table.
// Under DDP and ZeRO-1/2/3 it is compared in tests/dist/dist_zero.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <string>

#include "core/threads.h"
#include "data/batches.h"
#include "models/decoder.h"
#include "models/mlp.h"
#include "train/train.h"

namespace dpt {
namespace {

// The loss of one forward on the same weights and batch in each precision.
template <typename M, typename C>
std::pair<float, float> losses(const C& config) {
  float out[2];
  for (DType p : {DType::F32, DType::BF16}) {
    M model(config);
    model.init_params(5);
    model.set_precision(p);
    Batch batch;
    fill_synthetic(model, 4, 9, batch);
    out[p == DType::BF16] = model.forward(batch).loss;
  }
  return {out[0], out[1]};
}

TEST(Precision, Bf16ForwardIsCloseToFp32ButNotEqual) {
  set_threads(1);
  const auto [g32, g16] = losses<Decoder>(DecoderConfig{256, 2, 4, 64, 32});
  const auto [m32, m16] = losses<Mlp>(MlpConfig{{784, 128, 10}});
  for (auto [a, b] : {std::pair{g32, g16}, std::pair{m32, m16}}) {
    EXPECT_NE(a, b) << "a bf16 forward that equals fp32 bit for bit did not round its operands";
    // bf16 operands carry 8 significant bits: relative errors of ~2^-9 per
    // product, averaging out over the dot products.
    EXPECT_NEAR(b, a, 5e-3 * std::fabs(a));
  }
  std::printf("[ measure  ] loss fp32 %.6f bf16 %.6f (gpt), %.6f %.6f (mlp)\n", g32, g16, m32, m16);
}

TEST(Precision, Bf16ArenaHoldsGemmInputsInHalfTheBytes) {
  // GPT: ln1, atty, ln2, fch_gelu and ln_f feed only GEMMs and are kept in
  // bf16; the fp32 scratch for attention's output and the bf16 scratch for
  // converted output gradients come on top.
  DecoderConfig c{256, 3, 4, 64, 32};
  Decoder a(c), b(c);
  b.set_precision(DType::BF16);
  const int64_t B = 4, N = B * c.context, C = c.width;
  const int64_t halved = c.layers * (N * C + N * C + N * C + N * 4 * C) + N * C;  // elements
  const int64_t scratch = N * C * 4 + (N * std::max<int64_t>(c.vocab, 4 * C) + 31) / 32 * 64;
  EXPECT_EQ(static_cast<int64_t>(b.activation_bytes_for(B)),
            static_cast<int64_t>(a.activation_bytes_for(B)) - halved * 2 + scratch);
  EXPECT_LT(b.activation_bytes_for(B), a.activation_bytes_for(B));
}

TrainOptions small_gpt(DType precision) {
  TrainOptions o;
  o.model = "gpt";
  o.hparams = {{"n_layer", "2"}, {"n_embd", "64"}, {"block_size", "32"}};
  o.steps = 200;
  o.schedule.lr = 1e-3f;
  o.eval_windows = 128;
  o.precision = precision;
  o.quiet = true;
  return o;
}

TEST(Precision, Bf16GptLearnsAsFp32Does) {
  // The bar, on a GPT small enough for the suite (W-GPT itself is in
  // bench/precision_bench.py): after 200 steps on the bundled text the
  // validation loss in bf16 is within 0.03 of fp32's.
  set_threads(1);
  const TrainResult f = run_training(small_gpt(DType::F32));
  const TrainResult h = run_training(small_gpt(DType::BF16));
  std::printf("[ measure  ] validation loss after 200 steps: fp32 %.4f, bf16 %.4f\n", f.eval_loss, h.eval_loss);
  EXPECT_LT(h.final_loss, 0.6 * h.first_loss);
  EXPECT_NEAR(h.eval_loss, f.eval_loss, 0.03);
  // Accounted bytes, WORKLOADS.md's mixed-precision table for one process:
  // parameters 2 bytes (the bf16 copy), gradients 4, optimizer 12 (fp32
  // master + AdamW's m and v).
  std::map<std::string, std::string> hp = small_gpt(DType::F32).hparams;
  hp["dpt.model"] = "gpt";
  const size_t P = make_model(hp)->param_count();
  EXPECT_EQ(h.memory.parameters, 2 * P);
  EXPECT_EQ(h.memory.gradients, 4 * P);
  EXPECT_EQ(h.memory.optimizer, 12 * P);
  EXPECT_EQ(f.memory.parameters, 4 * P);
  EXPECT_EQ(f.memory.optimizer, 8 * P);
}

TEST(Precision, Bf16MlpLearns) {
  set_threads(1);
  TrainOptions o;
  o.model = "mlp";
  o.hparams = {{"sizes", "784,128,10"}};
  o.steps = 150;
  o.precision = DType::BF16;
  o.quiet = true;
  const TrainResult r = run_training(o);
  EXPECT_LT(r.final_loss, 0.5 * r.first_loss);
  EXPECT_GE(r.eval_accuracy, 0.75);
  std::printf("[ measure  ] bf16 MLP after 150 steps: loss %.4f, test accuracy %.4f\n", r.final_loss, r.eval_accuracy);
}

}  // namespace
}  // namespace dpt
