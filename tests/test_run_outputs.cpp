// A finished run is never lost: every output path is checked before the
// first step, a run with no held-out text skips evaluation instead of
// failing after training, and the weights are written before anything that
// could still fail.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "cli_run.h"

namespace dpt {
namespace {

namespace fs = std::filesystem;
using test::q;
using test::RunResult;

class RunOutputs : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / fmt::format("dpt_outputs_{}", ::getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::string text;
    for (int i = 0; text.size() < 4096; ++i) text += fmt::format("line {}: a small corpus for a small model.\n", i);
    text_ = dir_ / "text.txt";
    std::ofstream(text_) << text;
  }
  void TearDown() override { fs::remove_all(dir_); }

  RunResult run(const std::string& args) {
    return test::run_shell(fmt::format("{}/dpt {}", DPT_BINARY_DIR, args), dir_, 120);
  }

  // A run of 100,000 steps (minutes) with one bad output path must fail at
  // once, naming the path, before its first step.
  void expect_fails_before_training(const std::string& flag) {
    const std::string bad = "/nonexistent/out.file";
    SCOPED_TRACE(flag);
    RunResult r = run(fmt::format("train --model gpt {} --steps 100000 --synthetic --threads 1 {} {}", kSmallGpt,
                                  flag, bad));
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_TRUE(r.err.starts_with("dpt: error: " + bad + ": cannot create file")) << r.err;
    EXPECT_LT(r.seconds, 10.0);
    EXPECT_EQ(r.out.find("step 1"), std::string::npos) << "it trained first:\n" << r.out;
  }

  static constexpr const char* kSmallGpt = "--layers 1 --width 32 --heads 2 --context 16";
  fs::path dir_, text_;
};

TEST_F(RunOutputs, SaveToAMissingDirectoryFailsBeforeTraining) { expect_fails_before_training("--save"); }
TEST_F(RunOutputs, MetricsToAMissingDirectoryFailsBeforeTraining) { expect_fails_before_training("--metrics-out"); }
TEST_F(RunOutputs, SummaryToAMissingDirectoryFailsBeforeTraining) { expect_fails_before_training("--summary-out"); }

TEST_F(RunOutputs, SaveOntoADirectoryFailsBeforeTraining) {
  RunResult r = run(fmt::format("train --model gpt {} --steps 100000 --synthetic --threads 1 --save {}", kSmallGpt,
                                q(dir_)));
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("is a directory"), std::string::npos) << r.err;
  EXPECT_LT(r.seconds, 10.0);
}

TEST_F(RunOutputs, AMissingBaselineFailsBeforeTraining) {
  RunResult r = run(fmt::format("train --model gpt {} --steps 100000 --synthetic --threads 1 --baseline {}",
                                kSmallGpt, q(dir_ / "no_such_summary.json")));
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("no_such_summary.json"), std::string::npos) << r.err;
  EXPECT_LT(r.seconds, 10.0);
}

// Read as a stream, a directory threw std::ios_base::failure: exit 2,
// "internal error: basic_filebuf::underflow error reading the file".
TEST_F(RunOutputs, ABaselineThatIsADirectoryIsOneSentence) {
  RunResult r = run(fmt::format("train --model gpt {} --steps 1 --synthetic --threads 1 --quiet --baseline {}",
                                kSmallGpt, q(dir_)));
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_EQ(r.err, fmt::format("dpt: error: {}: a directory, not a --summary-out file\n", dir_.string()));
}

TEST_F(RunOutputs, NoHeldOutTextSkipsEvaluationAndSaves) {
  const fs::path weights = dir_ / "w.safetensors", summary = dir_ / "s.json";
  RunResult r = run(fmt::format("train --model gpt {} --data {} --val-fraction 0 --steps 5 --eval-every 2 "
                                "--threads 1 --save {} --summary-out {}",
                                kSmallGpt, q(text_), q(weights), q(summary)));
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("evaluation is skipped"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(weights));
  const std::string s = test::read_file(summary);
  EXPECT_EQ(s.find("val_loss"), std::string::npos) << "a summary with no evaluation has no validation loss";
  // The saved weights are a complete file that evaluates.
  RunResult ev = run(fmt::format("eval --threads 1 --weights {} --data {}", q(weights), q(text_)));
  EXPECT_EQ(ev.code, 0) << ev.err;
}

TEST_F(RunOutputs, AValidationPartShorterThanAWindowFailsBeforeTraining) {
  // Evaluation runs after training: a held-out part too short to evaluate
  // must be refused when the corpus loads, not at the end.
  const fs::path tiny = dir_ / "tiny.txt", weights = dir_ / "w.safetensors";
  std::ofstream(tiny) << std::string(200, 'a');
  RunResult r = run(fmt::format("train --model gpt {} --data {} --val-fraction 0.02 --steps 100000 --threads 1 "
                                "--save {}",
                                kSmallGpt, q(tiny), q(weights)));
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("validation part"), std::string::npos) << r.err;
  EXPECT_LT(r.seconds, 10.0);
}

}  // namespace
}  // namespace dpt
