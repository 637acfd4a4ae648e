// `dpt train --sample-every` under every layout (docs/generate.md): the
// ranks gather the whole model to rank 0, which generates and prints while
// the others wait. Each case trains twice, with samples and without, and
// checks
//   - that samples change nothing: the saved weights byte for byte and
//     every logged loss exactly equal, and the bytes sent per step (the
//     samples' gathers are a phase of their own);
//   - that the sample after the last step is what `dpt generate` writes
//     from the weights that run saved at that step, with the sampler's seed
//     the run used (counter_bits(seed, step)) and the run's precision.
// Layouts: zero3 on 2 ranks, tp 2, pp 2 (gpipe, 2 micro-batches), tp 2 x
// pp 2 and hsdp (shard groups of 2) on 4 ranks, zero1 in bf16 on 2 ranks, naive dp (2 replica threads, one process), and a Llama on
// BPE shards with --tokenizer (its prompt encoded, its samples decoded) at
// tp 2 in bf16.
//
// Registered in tests/CMakeLists.txt (ctest names sample_cli.*).
#include <unistd.h>

#include <filesystem>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../cli_run.h"
#include "core/rng.h"
#include "data/utf8.h"

namespace dpt {
namespace {

namespace fs = std::filesystem;
using test::dpt_bin;
using test::q;
using test::read_file;
using test::RunResult;

constexpr const char* kTokenizer = DPT_SOURCE_DIR "/tests/fixtures/tokenizer/gpt2_style.json";

constexpr uint64_t kSeed = 7;
constexpr int64_t kSteps = 4, kEvery = 2, kTokens = 24;
const std::string kGpt = fmt::format(
    "--model gpt --layers 2 --heads 2 --width 32 --context 32 --batch 4 --steps {} --seed {} --log-every 1",
    kSteps, kSeed);

class SampleCliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / fmt::format("dpt_sample_cli_{}", ::getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    test::write_word_corpus(dir_ / "corpus.txt", {"the", "cat", "sat", "on", "a", "mat", "and", "then", "slept"});
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  // `dpt train` on n ranks; returns its stdout (the samples), the weights
  // and metrics under dir_/name.{st,jsonl}.
  static std::string train(int n, const fs::path& data, const std::string& name, const std::string& args) {
    const fs::path stem = dir_ / name;
    const std::string metrics = name.starts_with("dp") ? ""
                                                       : fmt::format(" --metrics-out {} --summary-out {}",
                                                                     q(stem.string() + ".jsonl"),
                                                                     q(stem.string() + ".json"));
    const RunResult r =
        test::train_ranks(dpt_bin(), n, data, fmt::format("{} --save {}{}", args, q(stem.string() + ".st"), metrics),
                          dir_, 180);
    EXPECT_EQ(r.code, 0) << name << ": " << r.err;
    return r.out;
  }

  // The text `dpt generate` writes from `weights` as the sample after
  // `step` was drawn, invalid UTF-8 replaced as the sample line does.
  static std::string generated(const fs::path& weights, const std::string& extra, int64_t step) {
    const RunResult r = test::run_shell(
        fmt::format("env OMP_NUM_THREADS=1 {} generate --weights {} --prompt 'the cat' --max-new-tokens {} "
                    "--seed {} --ignore-eos --threads 1 {}",
                    q(dpt_bin()), q(weights), kTokens, counter_bits(kSeed, static_cast<uint64_t>(step)), extra),
        dir_, 120);
    EXPECT_EQ(r.code, 0) << r.err;
    return utf8::replace_invalid(r.out);
  }

  // Trains with samples and without; both must save the same bytes and log
  // the same losses, and the last sample must be dpt generate's.
  // precision: the run's --precision as dpt generate spells it; tokenizer:
  // a tokenizer.json given to both the run and dpt generate (--tokenizer).
  static void check(int n, const fs::path& data, const std::string& name, const std::string& args,
                    const std::string& precision = "", const std::string& tokenizer = "") {
    const std::string tok = tokenizer.empty() ? "" : "--tokenizer " + q(tokenizer);
    const std::string out = train(n, data, name, fmt::format("{} --sample-every {} --sample-tokens {} "
                                                             "--sample-prompt 'the cat' {}",
                                                             args, kEvery, kTokens, tok));
    train(n, data, name + "_plain", args);
    const fs::path with = dir_ / name, without = dir_ / (name + "_plain");
    const std::string w = read_file(with.string() + ".st");
    EXPECT_FALSE(w.empty()) << name;
    EXPECT_TRUE(w == read_file(without.string() + ".st")) << name << ": the samples changed the weights";
    EXPECT_EQ(test::logged_losses(with), test::logged_losses(without)) << name;
    // Naive dp writes no metrics file: its weights say it all.
    if (name != "dp") {
      EXPECT_EQ(test::logged_losses(with).size(), static_cast<size_t>(kSteps)) << name;
      // The samples' gathers are their own phase, not the step's traffic.
      const auto summary = [](const fs::path& stem) { return nlohmann::json::parse(read_file(stem.string() + ".json")); };
      EXPECT_EQ(summary(with)["comm_bytes_per_step"], summary(without)["comm_bytes_per_step"]) << name;
      EXPECT_FALSE(summary(without)["comm_bytes_per_phase"].contains("sample")) << name;
    }
    for (int64_t s = kEvery; s <= kSteps; s += kEvery)
      EXPECT_NE(out.find(fmt::format("sample after step {}: ", s)), std::string::npos) << name << "\n" << out;
    const std::string text = generated(with.string() + ".st", precision + " " + tok, kSteps);
    EXPECT_FALSE(text.empty());
    EXPECT_NE(out.find(fmt::format("sample after step {}: {}", kSteps, text)), std::string::npos)
        << name << ": dpt generate wrote\n" << text << "\nthe run printed\n" << out;
  }

  static fs::path corpus() { return dir_ / "corpus.txt"; }
  static fs::path dir_;
};
fs::path SampleCliTest::dir_;

TEST_F(SampleCliTest, Zero3OnTwoRanks) { check(2, corpus(), "zero3", kGpt + " --strategy zero3"); }

TEST_F(SampleCliTest, TensorParallelTwo) { check(2, corpus(), "tp2", kGpt + " --tp 2"); }

TEST_F(SampleCliTest, PipelineTwoStages) {
  check(2, corpus(), "pp2", kGpt + " --pp 2 --grad-accum 2 --pp-schedule gpipe");
}

// Four ranks: tp 2 x pp 2 (each stage's slices gathered over its TP group,
// then the stages to the first), and hsdp in shard groups of 2 replicated
// twice.
TEST_F(SampleCliTest, MeshTp2Pp2) {
  check(4, corpus(), "tp2pp2", kGpt + " --tp 2 --pp 2 --grad-accum 2");
}

TEST_F(SampleCliTest, HsdpFourRanks) { check(4, corpus(), "hsdp", kGpt + " --strategy hsdp --shard-group 2"); }

TEST_F(SampleCliTest, Zero1Bf16OnTwoRanks) {
  check(2, corpus(), "zero1_bf16", kGpt + " --strategy zero1 --precision bf16", "--precision bf16");
}

TEST_F(SampleCliTest, NaiveDpReplicaThreads) {
  check(1, corpus(), "dp", kGpt + " --strategy dp --dp-replicas 2");
}

// A Llama trained on BPE shards: the prompt is encoded with --tokenizer and
// the samples decoded with it, at tp 2 in bf16.
TEST_F(SampleCliTest, LlamaOnBpeShardsWithTokenizerAtTp2Bf16) {
  const RunResult t = test::run_shell(fmt::format("{} tokens --tokenizer {} --input {} --out {} --name c --val-tokens 0",
                                                  q(dpt_bin()), q(kTokenizer), q(corpus()), q(dir_ / "shards")),
                                      dir_, 120);
  ASSERT_EQ(t.code, 0) << t.err;
  const std::string llama = fmt::format(
      "--model llama --vocab 2000 --layers 2 --width 32 --heads 4 --kv-heads 2 --intermediate 64 --context 32 "
      "--batch 4 --steps {} --seed {} --log-every 1 --tp 2 --precision bf16",
      kSteps, kSeed);
  check(2, dir_ / "shards" / "c_train_000000.bin", "llama_tok", llama, "--precision bf16", kTokenizer);
}

}  // namespace
}  // namespace dpt
