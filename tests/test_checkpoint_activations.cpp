// Activation checkpointing (Model::set_checkpoint_activations): the same
// gradients bit for bit, and a smaller activation arena. The multi-rank
// strategies (DDP, ZeRO-3) are compared through `dpt train` in
// tests/checkpoint_activations.sh.
#include <gtest/gtest.h>

#include <vector>

#include "compare.h"
#include "core/threads.h"
#include "data/batches.h"
#include "models/decoder.h"
#include "models/mlp.h"

namespace dpt {
namespace {

// Gradients of two forward/backward passes (two batch sizes, accumulated),
// from a model built by make() with checkpointing on or off.
template <typename Make>
std::vector<float> grads_of(Make make, bool checkpoint, size_t* arena, DType precision = DType::F32) {
  auto model = make();
  model->set_checkpoint_activations(checkpoint);
  model->set_precision(precision);
  model->zero_grads();
  for (int64_t B : {3, 2}) {
    Batch batch;
    fill_synthetic(*model, B, static_cast<uint64_t>(7 + B), batch);
    model->forward(batch);
    model->backward(0.5f);
  }
  *arena = model->activation_bytes();
  EXPECT_EQ(*arena, model->activation_bytes_for(3)) << "the estimate is the arena (grown for the larger batch)";
  return {model->grads(), model->grads() + model->param_count()};
}

TEST(CheckpointActivations, GptGradientsBitwiseAndArenaShrinks) {
  set_threads(2);
  DecoderConfig c{13, 3, 2, 16, 8};
  auto make = [&] {
    auto m = std::make_unique<Decoder>(c);
    m->init_params(3);
    return m;
  };
  size_t full = 0, kept = 0;
  const auto want = grads_of(make, false, &full);
  const auto got = grads_of(make, true, &kept);
  const test::Diff d = test::diff(got.data(), want.data(), want.size());
  EXPECT_TRUE(d.bitwise()) << d.describe();
  // The bound: without checkpointing the arena holds L blocks of activations;
  // with it, L block inputs (B*T*C floats each) plus one block's full
  // activations, so it shrinks by (L - 1) blocks less their inputs.
  const int64_t B = 3, T = c.context, C = c.width, N = B * T;
  const int64_t per_block = N * (16 * C + 4) + B * c.heads * T * T;
  const size_t saved = static_cast<size_t>((c.layers - 1) * (per_block - N * C)) * sizeof(float);
  EXPECT_EQ(kept, full - saved);
  EXPECT_LT(kept, full);
}

TEST(CheckpointActivations, Bf16GptGradientsBitwise) {
  // The recomputed forward rounds the same fp32 values to the same bf16
  // operands, so mixed precision keeps the gradients bitwise too.
  set_threads(2);
  DecoderConfig c{13, 3, 2, 16, 8};
  auto make = [&] {
    auto m = std::make_unique<Decoder>(c);
    m->init_params(3);
    return m;
  };
  size_t full = 0, kept = 0;
  const auto want = grads_of(make, false, &full, DType::BF16);
  const auto got = grads_of(make, true, &kept, DType::BF16);
  const test::Diff d = test::diff(got.data(), want.data(), want.size());
  EXPECT_TRUE(d.bitwise()) << d.describe();
  EXPECT_LT(kept, full);
}

TEST(CheckpointActivations, MlpGradientsBitwise) {
  // The MLP's unit is one Linear: its only activation is its output, which
  // is the next unit's input, so checkpointing keeps everything it kept.
  set_threads(2);
  auto make = [] {
    auto m = std::make_unique<Mlp>(MlpConfig{{12, 9, 7, 5}});
    m->init_params(4);
    return m;
  };
  size_t full = 0, kept = 0;
  const auto want = grads_of(make, false, &full);
  const auto got = grads_of(make, true, &kept);
  const test::Diff d = test::diff(got.data(), want.data(), want.size());
  EXPECT_TRUE(d.bitwise()) << d.describe();
  EXPECT_EQ(kept, full);
}

}  // namespace
}  // namespace dpt
