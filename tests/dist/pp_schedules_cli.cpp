// Pipeline schedules past 1F1B end to end (docs/pipeline.md): `dpt train
// --pp N --pp-schedule interleaved | zb-h1 | zb-v` under mpirun against
// gpipe at the same micro-batch count, on a 12-block test model.
//
//   Every schedule, pp 2, 3 and 4, M in {pp, 2 pp, 8} (interleaved where M
//     is a multiple of pp), 10 SGD steps, no clipping: bitwise gpipe's
//     weights and losses. Each chunk runs its backwards (or W halves) in
//     micro-batch order, W runs the very kernels backward() runs into the
//     same gradient buffers, and the tied embedding's head part is added
//     before micro-batch M - 1's embedding backward on every layout, also
//     when a V puts both ends on rank 0: every addition is gpipe's, in
//     gpipe's order.
//   M = 1: 1f1b, zb-h1 and zb-v bitwise one process (interleaved needs M a
//     multiple of pp).
//   --clip 0.5 under SGD: within 1e-6 of gpipe (the norm's partial sums
//     follow the chunks).
//   Every strategy follows the chunk layout: pp 2 x dp 2 under zero1 and
//     zero3, zb-v and interleaved, bitwise gpipe under the same strategy;
//     Llama (untied head, RMSNorm, rotary, SwiGLU) in bf16 likewise.
//   --checkpoint-activations under zb-h1 and zb-v: bitwise gpipe.
//   A checkpoint written under zb-v resumes under 1f1b (bitwise the
//     uninterrupted zb-v run) and under zero3 on 2 ranks (within 1e-5).
//   Schedules that cannot run: one sentence, exit 1, before any work.
//
// Registered in tests/CMakeLists.txt (ctest names pp_schedules_cli.*).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "../cli_run.h"
#include "io/safetensors.h"

namespace dpt {
namespace {

namespace fs = std::filesystem;
using test::dpt_bin;
using test::q;
using test::read_file;
using test::RunResult;

// 12 blocks, one thread per rank, SGD (AdamW would magnify a rounding
// difference where clipping adds one; none is expected without it).
constexpr const char* kModel =
    "--model gpt --layers 12 --heads 2 --width 32 --context 16 --seed 3 --quiet --log-every 1 --threads 1 "
    "--optimizer sgd --lr 0.05 --momentum 0.9";

class PpSchedulesCliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / fmt::format("dpt_pp_schedules_cli_{}", ::getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    test::write_word_corpus(dir_ / "corpus.txt", {"the", "chunk", "wave", "weight", "input", "bubble", "zero", "vee"});
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  static RunResult train(int n, const std::string& args) {
    return test::train_ranks(dpt_bin(), n, dir_ / "corpus.txt", args, dir_, 180);
  }
  static fs::path run_ok(int n, const std::string& name, const std::string& args) {
    const fs::path stem = dir_ / name;
    const RunResult r = train(n, fmt::format("{} --save {} --metrics-out {}", args, q(stem.string() + ".st"),
                                             q(stem.string() + ".jsonl")));
    EXPECT_EQ(r.code, 0) << name << ": " << r.err;
    return stem;
  }
  static void expect_bitwise(const fs::path& a, const fs::path& b) {
    EXPECT_TRUE(read_file(a.string() + ".st") == read_file(b.string() + ".st"))
        << a.filename() << " and " << b.filename() << ": weights differ";
    EXPECT_EQ(test::logged_losses(a), test::logged_losses(b)) << a.filename();
  }
  // Per tensor: max|a - b| <= r x max|b|; and every logged loss.
  static void expect_within(const fs::path& a, const fs::path& b, double r) {
    const SafetensorsFile fa = load_safetensors(a.string() + ".st"), fb = load_safetensors(b.string() + ".st");
    ASSERT_EQ(fa.tensors.size(), fb.tensors.size());
    for (const NamedTensor& tb : fb.tensors) {
      const NamedTensor* ta = fa.find(tb.name);
      ASSERT_NE(ta, nullptr) << tb.name;
      double diff = 0.0, peak = 0.0;
      for (size_t i = 0; i < tb.data.size(); ++i) {
        diff = std::max(diff, std::fabs(static_cast<double>(ta->data[i]) - tb.data[i]));
        peak = std::max(peak, std::fabs(static_cast<double>(tb.data[i])));
      }
      EXPECT_LE(diff, r * peak) << tb.name << " of " << a.filename();
    }
    test::expect_losses_within(a, b, r);
  }

  // Every schedule against gpipe at pp, for each M.
  static void every_schedule(int pp, std::initializer_list<int> micro_batches) {
    for (int M : micro_batches) {
      const std::string args = fmt::format("{} --batch 24 --steps 10 --pp {} --micro-batches {}", kModel, pp, M);
      const fs::path gpipe = run_ok(pp, fmt::format("pp{}_m{}_gpipe", pp, M), args + " --pp-schedule gpipe");
      for (const char* schedule : {"1f1b", "interleaved", "zb-h1", "zb-v"}) {
        if (std::string(schedule) == "interleaved" && M % pp != 0) continue;
        SCOPED_TRACE(fmt::format("pp {} M {} {}", pp, M, schedule));
        expect_bitwise(run_ok(pp, fmt::format("pp{}_m{}_{}", pp, M, schedule),
                              fmt::format("{} --pp-schedule {}", args, schedule)),
                       gpipe);
      }
    }
  }

  static inline fs::path dir_;
};

TEST_F(PpSchedulesCliTest, EveryScheduleBitwiseGpipeAtPp2) { every_schedule(2, {2, 4, 8}); }
TEST_F(PpSchedulesCliTest, EveryScheduleBitwiseGpipeAtPp3) { every_schedule(3, {3, 6, 8}); }
TEST_F(PpSchedulesCliTest, EveryScheduleBitwiseGpipeAtPp4) { every_schedule(4, {4, 8}); }

TEST_F(PpSchedulesCliTest, OneMicroBatchIsBitwiseOneProcess) {
  const std::string args = fmt::format("{} --batch 4 --steps 3", kModel);
  const fs::path one = run_ok(1, "one_m1", args);
  for (const char* schedule : {"1f1b", "zb-h1", "zb-v"}) {
    SCOPED_TRACE(schedule);
    expect_bitwise(run_ok(2, fmt::format("pp2_m1_{}", schedule), fmt::format("{} --pp 2 --pp-schedule {}", args, schedule)),
                   one);
  }
}

TEST_F(PpSchedulesCliTest, ClippingWithinGpipe) {
  const std::string args = fmt::format("{} --batch 8 --steps 10 --pp 2 --micro-batches 4 --clip 0.5", kModel);
  const fs::path gpipe = run_ok(2, "clip_gpipe", args + " --pp-schedule gpipe");
  for (const char* schedule : {"interleaved", "zb-h1", "zb-v"}) {
    SCOPED_TRACE(schedule);
    expect_within(run_ok(2, fmt::format("clip_{}", schedule), fmt::format("{} --pp-schedule {}", args, schedule)),
                  gpipe, 1e-6);
  }
}

// pp 2 x dp 2: the strategies' reductions follow the chunks (a DDP bucket
// or a ZeRO unit is final after its chunk's last backward or W).
TEST_F(PpSchedulesCliTest, StrategiesFollowTheChunks) {
  for (const char* strategy : {"zero1", "zero3"}) {
    const std::string args =
        fmt::format("{} --batch 8 --steps 5 --pp 2 --micro-batches 2 --strategy {}", kModel, strategy);
    const fs::path gpipe = run_ok(4, fmt::format("{}_gpipe", strategy), args + " --pp-schedule gpipe");
    for (const char* schedule : {"interleaved", "zb-v"}) {
      SCOPED_TRACE(fmt::format("{} {}", strategy, schedule));
      expect_bitwise(run_ok(4, fmt::format("{}_{}", strategy, schedule), fmt::format("{} --pp-schedule {}", args, schedule)),
                     gpipe);
    }
  }
}

TEST_F(PpSchedulesCliTest, LlamaInBf16BitwiseGpipe) {
  const std::string args =
      "--model llama --layers 12 --heads 2 --kv-heads 1 --width 32 --context 16 --seed 3 --quiet --log-every 1 "
      "--threads 1 --optimizer sgd --lr 0.05 --momentum 0.9 --precision bf16 --batch 8 --steps 5 --pp 2 "
      "--micro-batches 4";
  const fs::path gpipe = run_ok(2, "llama_gpipe", std::string(args) + " --pp-schedule gpipe");
  for (const char* schedule : {"interleaved", "zb-h1", "zb-v"}) {
    SCOPED_TRACE(schedule);
    expect_bitwise(run_ok(2, fmt::format("llama_{}", schedule), fmt::format("{} --pp-schedule {}", args, schedule)),
                   gpipe);
  }
}

// Activation checkpointing: B recomputes each block's forward from its
// input (as backward() does) and copies what W reads out of the scratch
// block: bitwise gpipe without checkpointing.
TEST_F(PpSchedulesCliTest, ActivationCheckpointingUnderSplitSchedules) {
  const std::string args = fmt::format("{} --batch 8 --steps 5 --pp 2 --micro-batches 4", kModel);
  const fs::path gpipe = run_ok(2, "ckpt_gpipe", args + " --pp-schedule gpipe");
  for (const char* schedule : {"zb-h1", "zb-v"}) {
    SCOPED_TRACE(schedule);
    expect_bitwise(run_ok(2, fmt::format("ckpt_{}", schedule),
                          fmt::format("{} --pp-schedule {} --checkpoint-activations", args, schedule)),
                   gpipe);
  }
}

TEST_F(PpSchedulesCliTest, CheckpointFromZbVResumesUnderOtherLayouts) {
  const std::string args = fmt::format("{} --batch 8 --steps 8 --micro-batches 4", kModel);
  const fs::path ck = dir_ / "ck";
  const fs::path whole = run_ok(
      2, "zbv_whole",
      fmt::format("{} --pp 2 --pp-schedule zb-v --checkpoint-dir {} --checkpoint-every 4", args, q(ck.string())));
  const std::string from = q((ck / "step-00000004").string());
  // (A resumed run logs from its checkpoint's step on: within 0 over those.)
  const fs::path resumed = run_ok(2, "resumed_1f1b", fmt::format("{} --pp 2 --pp-schedule 1f1b --resume {}", args, from));
  EXPECT_TRUE(read_file(resumed.string() + ".st") == read_file(whole.string() + ".st")) << "weights differ";
  test::expect_losses_within(resumed, whole, 0.0);
  expect_within(run_ok(2, "resumed_zero3", fmt::format("{} --strategy zero3 --resume {}", args, from)), whole, 1e-5);
}

TEST_F(PpSchedulesCliTest, SchedulesThatCannotRunAreRefused) {
  const std::string base = fmt::format("{} --batch 8 --steps 1", kModel);
  const struct {
    int ranks;
    std::string flags, says;
  } cases[] = {
      {2, "--pp 2 --micro-batches 3 --pp-schedule interleaved", "not a multiple of --pp 2"},
      {2, "--pp 2 --micro-batches 2 --pp-schedule zb-v --virtual-stages 3", "two chunks per rank"},
      {2, "--pp 2 --micro-batches 2 --pp-schedule 1f1b --virtual-stages 2", "one chunk per rank"},
      {1, "--virtual-stages 2", "--virtual-stages needs --pp 2 or more"},
      {2, "--pp 2 --micro-batches 2 --pp-schedule zb-v --pp-split 1,1,1", "must give 4 counts of blocks (one per chunk"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.flags);
    const RunResult r = train(c.ranks, base + " " + c.flags);
    EXPECT_EQ(r.code, 1) << r.all();
    EXPECT_NE(r.err.find(c.says), std::string::npos) << r.err;
  }
}

}  // namespace
}  // namespace dpt
