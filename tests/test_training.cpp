// Every model must learn: the reference workloads, shortened to fit the test
// budget, on their real data.
#include <cmath>
#include <cstdio>
#include <vector>

#include <gtest/gtest.h>

#include "core/threads.h"
#include "data/byte_corpus.h"
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

// The loss of a byte-bigram model on the windows a run evaluates (the first
// `windows` whole windows of T+1 bytes of the validation part, T targets
// each): next-byte counts of the training part with add-0.1 smoothing (the
// best of 1, 0.1, 0.01 and 0.001 on these windows, so the bar is the
// bigram at its best). A GPT whose attention did nothing could at most
// learn this.
double bigram_loss(const ByteCorpus& c, int64_t T, int64_t windows) {
  std::vector<double> counts(256 * 256, 0.0), rows(256, 0.0);
  const uint8_t* tr = c.train();
  for (size_t i = 0; i + 1 < c.train_size(); ++i) {
    counts[tr[i] * 256u + tr[i + 1]] += 1.0;
    rows[tr[i]] += 1.0;
  }
  const double alpha = 0.1;
  double sum = 0.0;
  int64_t n = 0;
  for (int64_t w = 0; w < windows; ++w) {
    const uint8_t* x = c.val() + w * (T + 1);
    for (int64_t t = 0; t < T; ++t, ++n)
      sum -= std::log((counts[x[t] * 256u + x[t + 1]] + alpha) / (rows[x[t]] + 256.0 * alpha));
  }
  return sum / static_cast<double>(n);
}

TEST(Training, GptBeatsABigramModel) {
  // A smaller GPT than W-GPT (2 blocks of width 128, context 64) so the run
  // fits the suite's budget; same optimizer and data, at lr 1e-3. Its
  // validation loss must be below the bigram's (2.589 on these 128 windows)
  // by 0.1, which takes the context only attention gives. Measured at 600
  // steps: 2.330, 2.404, 2.383 and 2.330 for seeds 0 to 3 (at 500 steps
  // 2.397 to 2.525: the drop below the bigram comes late, and a cosine
  // decay that starts it early ends higher). An attention that looks only
  // at its own position ends at 2.658. About 40 s on one thread of the
  // 2-core test machine (60 s while it also compiles).
  set_threads(1);
  TrainOptions o;
  o.model = "gpt";
  o.hparams = {{"n_layer", "2"}, {"n_embd", "128"}, {"block_size", "64"}};
  o.steps = 600;
  o.schedule.lr = 1e-3f;
  o.eval_windows = 128;
  o.quiet = true;
  TrainResult r = run_training(o);
  const double uniform = std::log(256.0);
  EXPECT_NEAR(r.first_loss, uniform, 0.3);
  const ByteCorpus corpus = ByteCorpus::load(kFortunesDir, o.val_fraction, 65);
  const double bigram = bigram_loss(corpus, 64, o.eval_windows);
  std::printf("[ measure  ] validation loss after %lld steps %.4f, bigram %.4f\n", static_cast<long long>(o.steps),
              r.eval_loss, bigram);
  EXPECT_LT(r.eval_loss, bigram - 0.1) << "validation loss after " << o.steps << " steps; the bigram's is " << bigram;
}

}  // namespace
}  // namespace dpt
