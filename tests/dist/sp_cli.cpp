// Sequence parallelism under tensor parallelism end to end
// (docs/tensor_parallel.md, "Sequence parallelism"): `dpt train --tp N
// --sequence-parallel` jobs under `dpt launch` against the same job without
// the flag and against one process with the same global batch.
//
//   GPT (LayerNorm, tied head) and Llama (RMSNorm, GQA, SwiGLU, rotary),
//     tp 2, 20 SGD steps (momentum 0.9) over 2 micro-batches each (so the
//     norms' weight gradients, summed over the TP group per micro-batch,
//     also accumulate): every element within 1e-5 of tp 2 without it and of
//     one process, the logged losses and the final validation loss too
//     (evaluation's last partial batch, whose rows tp need not divide, runs
//     as plain TP). Also tp 3, --checkpoint-activations (each block's
//     gathers and reduce-scatters recomputed) and --tp-embedding vocab.
//     Leaving out the sum of the norms' weight gradients, or gathering the
//     wrong rows, fails these.
//   The ledger: forward and backward bytes per step equal to the formula:
//     TP's (a reduce-scatter + an all-gather are the ring all-reduce's two
//     halves) plus, per micro-batch, one all-gather of B x T x C each way
//     (ln_f's output before the head; the embedding output's gradient) and
//     2 L + 1 all-reduces of the norms' weight (and bias) gradients.
//   Activations: the residual stream's res2 and res3 and the norms'
//     statistics hold N / tp of the N = B x T rows, exactly the formula.
//   bf16: the norms' outputs gathered in bf16; within 1e-2 of tp 2 bf16
//     and of one bf16 process (tp_cli's bar), the ledger by the formula.
//   Refusals: one sentence, exit 1, before any work.
//
// "Within r": per tensor, max|a - b| <= r x max|b|.
//
// Registered in tests/CMakeLists.txt (ctest names sp_cli.*).

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../cli_run.h"
#include "corpus_runs.h"
#include "comm/types.h"
#include "io/safetensors.h"

namespace dpt {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kLayers = 2, kContext = 16, kVocab = 256, kGptWidth = 48, kLlamaWidth = 32;
// Six heads: tp 2 and 3 divide them. One thread everywhere.
const std::string kGpt = fmt::format(
    "--model gpt --layers {} --heads 6 --width {} --context {} --seed 3 --quiet --log-every 1 --threads 1", kLayers,
    kGptWidth, kContext);
// Four query heads, two key/value heads.
const std::string kLlama = fmt::format(
    "--model llama --layers {} --width {} --heads 4 --kv-heads 2 --intermediate 64 --context {} --vocab {} --seed 3 "
    "--quiet --log-every 1 --threads 1",
    kLayers, kLlamaWidth, kContext, kVocab);
const std::string kSgd = " --optimizer sgd --lr 0.05 --momentum 0.9 --steps 20";

class SpCliTest : public test::CorpusRuns<SpCliTest> {
 protected:
  static void SetUpTestSuite() {
    make_folder("dpt_sp_cli", {"the", "sequence", "slice", "rows", "gather", "scatter", "norm", "sum", "grad", "loss"});
  }

  // Every element of every tensor, every logged loss and the validation loss.
  static void expect_within(const fs::path& a, const fs::path& b, double r) {
    const double worst = test::expect_tensors_within(a.string() + ".st", b.string() + ".st", r);
    test::expect_losses_within(a, b, r);
    const nlohmann::json sa = summary(a), sb = summary(b);
    ASSERT_TRUE(sb.contains("val_loss"));
    const double va = sa.at("val_loss").get<double>(), vb = sb["val_loss"].get<double>();
    EXPECT_LE(std::fabs(va - vb), r * std::fabs(vb)) << "validation loss";
    std::printf("[ measure  ] %s vs %s: worst tensor max|a-b|/max|b| %.3e\n", a.filename().c_str(),
                b.filename().c_str(), worst);
  }

};

// What TP rank 0 (ring position 0) sends in a reduce-scatter and an
// all-gather of `count` floats: every chunk but its own, every chunk but its
// successor's.
uint64_t rs_bytes(size_t count, int tp) { return 4 * (count - comm::chunk_range(count, tp, 0).size); }
uint64_t ag_bytes(size_t count, int tp) { return 4 * (count - comm::chunk_range(count, tp, 1).size); }
uint64_t ar_bytes(size_t count, int tp) { return rs_bytes(count, tp) + ag_bytes(count, tp); }

// GPT and Llama at tp 2 over 2 micro-batches: the weights, losses and
// validation loss against tp 2 without the flag and against one process;
// the ledger and the activation bytes against the formulas.
TEST_F(SpCliTest, SequenceParallelWithinTpAndOneProcess) {
  struct Family {
    std::string name, args;
    int64_t width, stats;  // stats: a norm's saved floats per row (LayerNorm's mean and rstd, RMSNorm's rstd)
  };
  const int64_t M = 2, B = 4 / M, N = B * kContext, L = kLayers;
  const int tp = 2;
  for (const Family& f : {Family{"gpt", kGpt, kGptWidth, 2}, Family{"llama", kLlama, kLlamaWidth, 1}}) {
    SCOPED_TRACE(f.name);
    const std::string args = f.args + kSgd + fmt::format(" --batch 4 --micro-batches {}", M);
    const fs::path one = run_ok(1, f.name + "_one", args);
    const fs::path plain = run_ok(tp, f.name + "_tp2", args + " --tp 2");
    const fs::path sp = run_ok(tp, f.name + "_sp2", args + " --tp 2 --sequence-parallel");
    expect_within(sp, plain, 1e-5);
    expect_within(sp, one, 1e-5);
    expect_within(plain, one, 1e-5);  // what TP alone rounds to, for the measure

    const int64_t C = f.width;
    // A norm's gradient: LayerNorm's weight and bias (2 C), RMSNorm's weight (C).
    const auto count = static_cast<size_t>(N * C), norm = static_cast<size_t>(f.stats * C);
    const nlohmann::json ps = summary(plain)["comm_bytes_per_phase"], ss = summary(sp)["comm_bytes_per_phase"];
    const uint64_t blocks = 2 * L * ar_bytes(count, tp);
    EXPECT_EQ(ps["forward"].get<uint64_t>(), M * blocks) << ps;
    EXPECT_EQ(ss["forward"].get<uint64_t>(), M * (blocks + ag_bytes(count, tp))) << ss;
    EXPECT_EQ(ss["backward"].get<uint64_t>(),
              M * (blocks + ag_bytes(count, tp) + (2 * L + 1) * ar_bytes(norm, tp)))
        << ss;
    // The plan (dpt plan, the summary's planned bytes) counts the same.
    EXPECT_EQ(summary(sp)["planned_comm_bytes_per_step"].get<uint64_t>(),
              summary(sp)["comm_bytes_per_step"].get<uint64_t>());

    const int64_t held = N / tp;  // rows of the residual stream and the norms per rank
    const int64_t saved = (N - held) * (L * (2 * C + 2 * f.stats) + f.stats);
    EXPECT_EQ(summary(sp)["bytes"]["activations"].get<int64_t>(),
              summary(plain)["bytes"]["activations"].get<int64_t>() - 4 * saved);
  }
}

// GPT against one process: tp 3 (48 rows per micro-batch, 16 per rank),
// recomputed blocks (with the ledger) and the vocabulary-parallel embedding.
TEST_F(SpCliTest, SequenceParallelWithTp3CheckpointsAndVocab) {
  const std::string b6 = kGpt + kSgd + " --batch 6 --micro-batches 2";  // 3 x 16 = 48 rows per micro-batch
  expect_within(run_ok(3, "gpt_sp3", b6 + " --tp 3 --sequence-parallel"), run_ok(1, "gpt_one_b6", b6), 1e-5);

  const std::string b4 = kGpt + kSgd + " --batch 4 --micro-batches 2";
  const fs::path one = run_ok(1, "gpt_one_ckpt", b4 + " --checkpoint-activations");
  const fs::path ck = run_ok(2, "gpt_sp2_ckpt", b4 + " --checkpoint-activations --tp 2 --sequence-parallel");
  expect_within(ck, one, 1e-5);
  // Backward recomputes each block's forward: its reduce-scatters and
  // gathers twice, the rest as without checkpointing.
  const int64_t M = 2, N = 2 * kContext, C = kGptWidth;
  const auto count = static_cast<size_t>(N * C);
  const nlohmann::json phases = summary(ck)["comm_bytes_per_phase"];
  EXPECT_EQ(phases["backward"].get<uint64_t>(),
            M * (4 * kLayers * ar_bytes(count, 2) + ag_bytes(count, 2) +
                 (2 * kLayers + 1) * ar_bytes(static_cast<size_t>(2 * C), 2)))
      << phases;

  expect_within(run_ok(2, "gpt_sp2_vocab", b4 + " --tp 2 --tp-embedding vocab --sequence-parallel"),
                run_ok(1, "gpt_one_vocab", b4), 1e-5);
}

// --precision bf16: the norms' outputs are gathered in bf16 (the GEMMs'
// operands), the rest in fp32. Against tp 2 bf16 without the flag and one
// bf16 process: within 1e-2, tp_cli's bar for bf16 (every GEMM rounds its
// inputs to bf16, so fp32 rounding differences of the sums cross bf16
// rounding boundaries); the ledger: per block forward two fp32
// reduce-scatters and two bf16 all-gathers of N x C, and the plan's bytes
// equal to it, also with --checkpoint-activations.
TEST_F(SpCliTest, Bf16GathersTheNormsInBf16) {
  const std::string args = kGpt + kSgd + " --batch 4 --micro-batches 2 --precision bf16";
  const fs::path one = run_ok(1, "gpt_one_bf16", args);
  const fs::path plain = run_ok(2, "gpt_tp2_bf16", args + " --tp 2");
  const fs::path sp = run_ok(2, "gpt_sp2_bf16", args + " --tp 2 --sequence-parallel");
  expect_within(sp, plain, 1e-2);
  expect_within(sp, one, 1e-2);
  const int64_t M = 2, N = 2 * kContext, C = kGptWidth;
  const auto count = static_cast<size_t>(N * C);
  const uint64_t ag16 = 2 * (count - comm::chunk_range(count, 2, 1).size);
  const nlohmann::json j = summary(sp), phases = j["comm_bytes_per_phase"];
  EXPECT_EQ(phases["forward"].get<uint64_t>(), M * (2 * kLayers * (rs_bytes(count, 2) + ag16) + ag16)) << phases;
  EXPECT_EQ(j["planned_comm_bytes_per_step"].get<uint64_t>(), j["comm_bytes_per_step"].get<uint64_t>());
  // With checkpointing, backward's recomputed forwards gather in bf16 too.
  const fs::path ck = run_ok(2, "gpt_sp2_bf16_ckpt", args + " --tp 2 --sequence-parallel --checkpoint-activations");
  expect_within(ck, one, 1e-2);
  const nlohmann::json jc = summary(ck);
  EXPECT_EQ(jc["planned_comm_bytes_per_step"].get<uint64_t>(), jc["comm_bytes_per_step"].get<uint64_t>());
}

TEST_F(SpCliTest, ImpossibleLayoutsAreRefused) {
  struct Case {
    int ranks;
    std::string args, says;
  };
  const std::string gpt = kGpt + " --batch 4 --steps 2";
  const std::vector<Case> cases = {
      {1, gpt + " --sequence-parallel", "--sequence-parallel splits the TP group's rows: it needs --tp 2 or more"},
      {3, gpt + " --tp 3 --sequence-parallel",
       "--sequence-parallel splits a micro-batch's 64 rows (batch x context) over --tp 3, which does not divide them"},
      {4, gpt + " --tp 2 --pp 2 --sequence-parallel", "--sequence-parallel is not built with --pp yet"},
      {2, gpt + " --tp 2 --sequence-parallel --device cuda", test::cuda_refusal("is not built with --tp 2")},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.args);
    test::expect_one_refusal(train(c.ranks, c.args), c.says);
  }
}

}  // namespace
}  // namespace dpt
