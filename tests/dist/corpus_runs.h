// A dist CLI test suite's scratch folder, holding a word corpus, and the
// `dpt train` runs made in it: each saves its weights, metrics and summary
// beside one another (STEM.st, STEM.jsonl, STEM.json) for the comparisons.
// Shared by cp_cli, sp_cli, llama_cli, pp_cli and tp_cli; Suite is the test
// fixture deriving from it (each suite its own folder).
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../cli_run.h"

namespace dpt::test {

template <typename Suite>
class CorpusRuns : public ::testing::Test {
 protected:
  // Call from the suite's SetUpTestSuite: a fresh folder named after the
  // suite and this process, with a corpus of `words`.
  static void make_folder(const std::string& name, const std::vector<std::string>& words) {
    dir_ = std::filesystem::temp_directory_path() / fmt::format("{}_{}", name, ::getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    write_word_corpus(dir_ / "corpus.txt", words);
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(dir_); }

  static RunResult train(int n, const std::string& args) {
    return train_ranks(dpt_bin(), n, dir_ / "corpus.txt", args, dir_, 180);
  }

  // A run that must succeed, saving under dir_/name.
  static std::filesystem::path run_ok(int n, const std::string& name, const std::string& args) {
    const std::filesystem::path stem = dir_ / name;
    const RunResult r = train(n, fmt::format("{} --save {} --metrics-out {} --summary-out {}", args,
                                             q(stem.string() + ".st"), q(stem.string() + ".jsonl"),
                                             q(stem.string() + ".json")));
    EXPECT_EQ(r.code, 0) << name << ": " << r.err;
    return stem;
  }

  static nlohmann::json summary(const std::filesystem::path& stem) {
    return nlohmann::json::parse(read_file(stem.string() + ".json"));
  }

  static inline std::filesystem::path dir_;
};

}  // namespace dpt::test
