// The `dpt` command end to end: train and eval runs, the files they write,
// and how bad input is reported (one "dpt: error:" line, exit code 1).
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli_run.h"
#include "core/rng.h"

namespace dpt {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using test::q;
using test::read_file;
using test::RunResult;

void write_file(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}


class CliTest : public ::testing::Test {
 protected:
  // Shared by every test: a temp directory and two trained weight files
  // (training is the slow part, so it happens once).
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / fmt::format("dpt_cli_{}", ::getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    mlp_weights_ = dir_ / "saved" / "mlp.safetensors";
    gpt_weights_ = dir_ / "saved" / "gpt.safetensors";
    fs::create_directories(dir_ / "saved");
    mlp_train_ = run("train --model mlp --steps 3 --synthetic --quiet --threads 1 --save " + q(mlp_weights_));
    gpt_train_ = run("train --model gpt " + std::string(kSmallGpt) +
                     " --steps 3 --synthetic --quiet --threads 1 --save " + q(gpt_weights_));
    // ~2 KB of text for GPT evaluation.
    std::string text;
    for (int i = 0; text.size() < 2048; ++i)
      text += fmt::format("line {}: the quick brown fox jumps over the lazy dog.\n", i);
    text_ = dir_ / "text.txt";
    write_file(text_, text);
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  // Runs `dpt <args>`, capturing stdout, stderr and the exit code.
  static RunResult run(const std::string& args) {
    return test::run_shell(fmt::format("{}/dpt {}", DPT_BINARY_DIR, args), dir_);
  }

  // The command must fail the way user errors do: exit code 1 and exactly
  // one line on stderr, "dpt: error: ...", that mentions `keyword`.
  static void expect_user_error(const std::string& args, const std::string& keyword) {
    SCOPED_TRACE("dpt " + args);
    RunResult r = run(args);
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_TRUE(r.err.starts_with("dpt: error: ")) << r.err;
    ASSERT_FALSE(r.err.empty());
    EXPECT_EQ(r.err.back(), '\n') << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find(keyword), std::string::npos) << "'" << keyword << "' not in: " << r.err;
  }

  // CLI11 rejects the command line itself: a non-zero code of its own, and
  // no crash (a signal would show as 128 + signal).
  static void expect_parse_error(const std::string& args) {
    SCOPED_TRACE("dpt " + args);
    RunResult r = run(args);
    EXPECT_NE(r.code, 0);
    EXPECT_GT(r.code, 0);
    EXPECT_LT(r.code, 128);
    EXPECT_FALSE(r.err.empty());
  }

  static constexpr const char* kSmallGpt = "--layers 1 --width 32 --heads 2 --context 16";
  // vocab 256, C 32, T 16, one block: V*C + T*C + 12C^2 + 13C + 2C.
  static constexpr int64_t kSmallGptParams = 256 * 32 + 16 * 32 + 12 * 32 * 32 + 13 * 32 + 2 * 32;

  static inline fs::path dir_, mlp_weights_, gpt_weights_, text_;
  static inline RunResult mlp_train_, gpt_train_;
};

// ---------------------------------------------------------------- success

TEST_F(CliTest, TrainWritesSummaryJson) {
  const fs::path f = dir_ / "summary.json";
  RunResult r = run("train --model mlp --steps 5 --threads 1 --synthetic --quiet --summary-out " + q(f));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "");  // --quiet
  EXPECT_EQ(r.err, "");
  json j = json::parse(read_file(f));  // throws (fails the test) if not JSON
  for (const char* key : {"model", "steps", "step_ms_median", "samples_per_s", "gflops", "mfu", "bytes"})
    EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_EQ(j["model"], "mlp");
  EXPECT_EQ(j["steps"], 5);
  EXPECT_GT(j["step_ms_median"].get<double>(), 0.0);
  EXPECT_GT(j["samples_per_s"].get<double>(), 0.0);
  EXPECT_GT(j["gflops"].get<double>(), 0.0);
  EXPECT_GE(j["mfu"].get<double>(), 0.0);
  // W-MLP, fp32, SGD momentum: one float of state per parameter.
  EXPECT_EQ(j["bytes"]["parameters"], 1863690 * 4);
  EXPECT_EQ(j["bytes"]["optimizer"], 1863690 * 4);
}

TEST_F(CliTest, SummaryNamesTheBlasKernelsThatRan) {
  // OPENBLAS_CORETYPE forces OpenBLAS's kernel set; the summary reports it.
  const fs::path f = dir_ / "summary_blas.json";
  RunResult r = test::run_shell(fmt::format("OPENBLAS_CORETYPE=Haswell {}/dpt train --model mlp --steps 2 "
                                            "--threads 1 --synthetic --quiet --summary-out {}",
                                            DPT_BINARY_DIR, q(f)),
                                dir_);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(json::parse(read_file(f))["blas_core"], "Haswell");
}

TEST_F(CliTest, MlpSaveThenEvalPrintsAccuracy) {
  ASSERT_EQ(mlp_train_.code, 0) << mlp_train_.err;
  ASSERT_TRUE(fs::exists(mlp_weights_));
  RunResult r = run("eval --weights " + q(mlp_weights_) + " --threads 1");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("accuracy"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("10000 images"), std::string::npos) << r.out;  // the whole test set
  double loss = NAN, acc = NAN;
  ASSERT_EQ(std::sscanf(r.out.c_str(), "loss %lf accuracy %lf%%", &loss, &acc), 2) << r.out;
  EXPECT_TRUE(std::isfinite(loss));
  EXPECT_GE(acc, 0.0);
  EXPECT_LE(acc, 100.0);
}

TEST_F(CliTest, GptSaveThenEvalPrintsFiniteLoss) {
  ASSERT_EQ(gpt_train_.code, 0) << gpt_train_.err;
  RunResult r = run("eval --weights " + q(gpt_weights_) + " --data " + q(text_) + " --threads 1");
  ASSERT_EQ(r.code, 0) << r.err;
  double loss = NAN;
  long long positions = 0;
  ASSERT_EQ(std::sscanf(r.out.c_str(), "loss %lf (%lld positions)", &loss, &positions), 2) << r.out;
  EXPECT_TRUE(std::isfinite(loss));
  EXPECT_GT(loss, 0.0);
  // Every whole window of context + 1 = 17 bytes, 16 targets each.
  const auto bytes = static_cast<long long>(fs::file_size(text_));
  EXPECT_EQ(positions, bytes / 17 * 16);
}

TEST_F(CliTest, TrainFromLoadReadsModelFromMetadata) {
  ASSERT_EQ(gpt_train_.code, 0) << gpt_train_.err;
  const fs::path f = dir_ / "load_summary.json";
  RunResult r = run("train --load " + q(gpt_weights_) +
                    " --steps 1 --synthetic --quiet --threads 1 --summary-out " + q(f));
  ASSERT_EQ(r.code, 0) << r.err;
  json j = json::parse(read_file(f));
  EXPECT_EQ(j["model"], "gpt");
  // The file's small model, not W-GPT's defaults.
  EXPECT_EQ(j["params"], kSmallGptParams);
}

TEST_F(CliTest, MetricsOutHasOneLinePerLoggedStep) {
  const fs::path m = dir_ / "metrics.jsonl";
  RunResult r = run("train --model mlp --steps 4 --log-every 1 --synthetic --quiet --threads 1 "
                    "--metrics-out " + q(m));
  ASSERT_EQ(r.code, 0) << r.err;
  std::istringstream in(read_file(m));
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    json j = json::parse(line);
    EXPECT_EQ(j["step"], n);
    EXPECT_TRUE(std::isfinite(j["loss"].get<double>())) << line;
    EXPECT_FLOAT_EQ(j["lr"].get<float>(), 0.05f) << line;  // SGD's default, constant
  }
  EXPECT_EQ(n, 4);
}

TEST_F(CliTest, SavingLeavesNoTemporaryFiles) {
  ASSERT_EQ(mlp_train_.code, 0) << mlp_train_.err;
  ASSERT_EQ(gpt_train_.code, 0) << gpt_train_.err;
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir_ / "saved")) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"gpt.safetensors", "mlp.safetensors"}));
  for (const auto& n : names) EXPECT_EQ(n.find(".tmp."), std::string::npos) << n;
}

// ---------------------------------------------------------------- user errors

TEST_F(CliTest, EvalOfMissingWeightsFile) {
  expect_user_error("eval --threads 1 --weights " + q(dir_ / "nothing_here.safetensors"),
                    "nothing_here.safetensors");
}

TEST_F(CliTest, EvalOfCorruptWeightsFile) {
  Rng rng(42);
  std::string junk(4096, '\0');
  for (char& c : junk) c = static_cast<char>(rng.below(256));
  const fs::path p = dir_ / "corrupt.safetensors";
  write_file(p, junk);
  expect_user_error("eval --threads 1 --weights " + q(p), "corrupt.safetensors");
  expect_user_error("eval --threads 1 --weights " + q(p), "header");
}

TEST_F(CliTest, EvalOfTruncatedWeightsFile) {
  ASSERT_EQ(gpt_train_.code, 0) << gpt_train_.err;
  const std::string whole = read_file(gpt_weights_);
  const fs::path p = dir_ / "truncated.safetensors";
  write_file(p, whole.substr(0, whole.size() / 2));
  expect_user_error("eval --threads 1 --weights " + q(p) + " --data " + q(text_), "truncated.safetensors");
}

TEST_F(CliTest, EvalWithFlagsThatDisagreeWithFileNamesTheTensor) {
  ASSERT_EQ(gpt_train_.code, 0) << gpt_train_.err;
  expect_user_error("eval --threads 1 --weights " + q(gpt_weights_) + " --width 64 --data " + q(text_),
                    "transformer.wte.weight");
}

TEST_F(CliTest, TrainMlpOnNonexistentData) {
  expect_user_error("train --model mlp --data /nonexistent --steps 1 --quiet --threads 1", "/nonexistent");
}

TEST_F(CliTest, TraceOutInAMissingDirectoryFailsBeforeTraining) {
  RunResult r = run("train --model mlp --synthetic --steps 100000 --quiet --threads 1 --trace-out "
                    "/nonexistent/trace.json");
  EXPECT_LT(r.seconds, 10.0);  // not after 100,000 steps
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_TRUE(r.err.starts_with("dpt: error: /nonexistent/trace.json")) << r.err;
}

TEST_F(CliTest, GptEvalOnTextShorterThanOneWindow) {
  ASSERT_EQ(gpt_train_.code, 0) << gpt_train_.err;
  const fs::path p = dir_ / "short.txt";
  write_file(p, "too short");  // 9 bytes; a window is 17
  expect_user_error("eval --threads 1 --weights " + q(gpt_weights_) + " --data " + q(p), "window");
}

TEST_F(CliTest, GradAccumThatDoesNotDivideBatch) {
  expect_user_error("train --model mlp --synthetic --steps 1 --quiet --threads 1 --batch 256 --grad-accum 3",
                    "micro-batches");
}

// ---------------------------------------------------------------- parse errors

TEST_F(CliTest, UnknownFlagIsAParseError) {
  expect_parse_error("train --model mlp --steps 1 --threads 1 --no-such-flag");
}

TEST_F(CliTest, UnknownModelIsAParseError) { expect_parse_error("train --model foo --steps 1 --threads 1"); }

TEST_F(CliTest, NegativeStepsIsAParseError) { expect_parse_error("train --model mlp --steps -1 --threads 1"); }

TEST_F(CliTest, NoSubcommandIsAParseError) { expect_parse_error(""); }

}  // namespace
}  // namespace dpt
