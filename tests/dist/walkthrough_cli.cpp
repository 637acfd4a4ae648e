// docs/walkthrough.md run as written, at a smaller shape: its sh block is
// taken from the page, a few flags are swapped for smaller values (each
// swap must find its flag, so a changed page fails here instead of going
// untested), and the block runs under bash in a scratch directory where
// build/ is this build and tests/ the source tree's. Then: the tokens were
// written, generate wrote text before and after, the 2-rank fine-tune
// printed its sample (--sample-every with --tokenizer), and the held-out
// loss fell from about ln 2000 (a random model) by more than 1.
//
// Registered in tests/CMakeLists.txt (ctest names walkthrough_cli.*).
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "../cli_run.h"

namespace dpt {
namespace {

namespace fs = std::filesystem;
using test::q;
using test::read_file;

// The page's first ```sh block.
std::string sh_block(const std::string& page) {
  const size_t begin = page.find("```sh\n");
  if (begin == std::string::npos) return "";
  const size_t end = page.find("```", begin + 6);
  return page.substr(begin + 6, end - begin - 6);
}

TEST(Walkthrough, RunsAsWrittenAtASmallShape) {
  std::string block = sh_block(read_file(fs::path(DPT_SOURCE_DIR) / "docs" / "walkthrough.md"));
  ASSERT_FALSE(block.empty()) << "docs/walkthrough.md has no sh block";
  // Smaller: fewer held-out tokens, a narrower model, fewer and smaller steps.
  const std::vector<std::pair<std::string, std::string>> swaps = {
      {"--val-tokens 20000", "--val-tokens 4000"}, {"--width 128", "--width 64"},
      {"--intermediate 352", "--intermediate 176"}, {"--batch 16", "--batch 8"},
      {"--steps 300", "--steps 100"},             {"--sample-every 100", "--sample-every 50"}};
  for (const auto& [from, to] : swaps) {
    const size_t at = block.find(from);
    ASSERT_NE(at, std::string::npos) << "docs/walkthrough.md no longer says " << from;
    block.replace(at, from.size(), to);
  }
  const fs::path dir = fs::temp_directory_path() / fmt::format("dpt_walkthrough_{}", ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::create_directory_symlink(DPT_BINARY_DIR, dir / "build");
  fs::create_directory_symlink(fs::path(DPT_SOURCE_DIR) / "tests", dir / "tests");
  {
    std::ofstream script(dir / "walkthrough.sh");
    script << "set -e\ncd " << q(dir) << "\n" << block;
  }
  const test::RunResult r =
      test::run_shell(fmt::format("env -u DPT_COMM_ALGO -u DPT_COMM_TRANSPORT -u DPT_COMM_CHECK OMP_NUM_THREADS=1 "
                                  "DPT_COMM_TIMEOUT=60 bash {}",
                                  q(dir / "walkthrough.sh")),
                      dir, 240);
  ASSERT_EQ(r.code, 0) << r.all();
  EXPECT_TRUE(fs::exists(dir / "shards" / "fortunes_train_000000.bin"));
  EXPECT_TRUE(fs::exists(dir / "shards" / "fortunes_val_000000.bin"));
  // dpt eval's lines, before and after (each right after generate's text,
  // which a pipe gets without a newline); the 2-rank run's samples.
  std::vector<double> losses;
  const std::regex eval_line(R"(loss ([0-9.]+) \([0-9]+ positions\)\n)");
  for (auto it = std::sregex_iterator(r.out.begin(), r.out.end(), eval_line); it != std::sregex_iterator(); ++it)
    losses.push_back(std::stod((*it)[1]));
  ASSERT_EQ(losses.size(), 2u) << r.out;
  EXPECT_NEAR(losses[0], std::log(2000.0), 0.2) << r.out;  // a random model: about uniform
  EXPECT_LT(losses[1], losses[0] - 1.0) << r.out;
  for (const char* step : {"sample after step 50: ", "sample after step 100: "})
    EXPECT_NE(r.out.find(step), std::string::npos) << r.out;
  // Each generate wrote text: stderr has its two rate lines.
  size_t rates = 0;
  for (size_t at = r.err.find("generated: "); at != std::string::npos; at = r.err.find("generated: ", at + 1)) ++rates;
  EXPECT_EQ(rates, 2u) << r.err;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace dpt
