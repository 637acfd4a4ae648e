// Every model must learn: the reference workloads, shortened to fit the test
// budget, on their real data.
#include <cmath>

#include <gtest/gtest.h>

#include "core/threads.h"
#include "train/train.h"

namespace dpt {
namespace {

TEST(Training, MlpReaches85PercentOnFashionMnist) {
  // W-MLP (784-1024-1024-10, SGD momentum 0.9, lr 0.05, batch 256) with the
  // rate annealed by a cosine over 4 epochs: at a constant 0.05 the test
  // accuracy after 3 epochs wanders around 85-86% with the seed (PyTorch's
  // does too), too close to the bar for a test; annealed it ends near 87%.
  set_threads(1);
  TrainOptions o;
  o.model = "mlp";
  o.epochs = 4;
  o.schedule.kind = "cosine";
  o.quiet = true;
  TrainResult r = run_training(o);
  EXPECT_EQ(r.steps, 4 * (60000 / 256));
  EXPECT_LT(r.final_loss, 0.5 * r.first_loss);
  EXPECT_GE(r.eval_accuracy, 0.85) << "test accuracy after 3 epochs";
}

TEST(Training, GptLossFallsWellBelowUniform) {
  // A smaller GPT than W-GPT (2 blocks of width 128, context 64) so the run
  // fits the suite's budget; same optimizer and data.
  set_threads(1);
  TrainOptions o;
  o.model = "gpt";
  o.hparams = {{"n_layer", "2"}, {"n_embd", "128"}, {"block_size", "64"}};
  o.steps = 150;
  o.schedule.lr = 1e-3f;
  o.eval_windows = 128;
  o.quiet = true;
  TrainResult r = run_training(o);
  const double uniform = std::log(256.0);
  EXPECT_NEAR(r.first_loss, uniform, 0.3);
  EXPECT_LT(r.eval_loss, 0.6 * uniform) << "validation loss after 150 steps";
}

}  // namespace
}  // namespace dpt
