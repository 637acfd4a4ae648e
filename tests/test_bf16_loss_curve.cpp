// A bf16 run learns as it did before issue 36's faster kernels: W-GPT in
// bf16, 200 steps on the bundled fortunes corpus, one thread, seed 1, loses
// within 1% of the loss recorded at every 20th step by the commit before them
// (tests/fixtures/bf16_loss_curve/expected.json, written by
// scripts/make_bf16_loss_fixture.py with that commit's binary).
//
// The whole W-GPT, not a smaller model: the kernels it holds (GELU's
// approximation, the fused conversions, the bf16 copy written by AdamW) are
// the ones a W-GPT step spends its time in. About 26 s on one quiet core of
// the recording machine. On another CPU the run rounds elsewhere (the
// machine facts are in the fixture and in the failure message), and the bar
// is the same: 1% is far above rounding's effect on the loss and far below
// what a wrong kernel does (a GELU off by 1e-2 moves these losses by more).
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli_run.h"

namespace dpt {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using test::q;
using test::read_file;

TEST(Bf16LossCurve, WgptStaysWithinOnePercentOfTheRecordedCurve) {
  const fs::path fixture = fs::path(DPT_SOURCE_DIR) / "tests" / "fixtures" / "bf16_loss_curve" / "expected.json";
  const json expected = json::parse(read_file(fixture));
  const std::string dpt = q(std::string(DPT_BINARY_DIR) + "/dpt");
  const fs::path dir = fs::temp_directory_path() / fmt::format("dpt_bf16_loss_curve_{}", ::getpid());
  const fs::path data = dir / "data";  // only the shards: run_shell keeps its stderr files in dir
  fs::create_directories(data);
  test::RunResult r = test::run_shell(fmt::format("{} tokens --out {} --name fortunes", dpt, q(data)), dir, 120);
  ASSERT_EQ(r.code, 0) << r.all();
  const fs::path metrics = dir / "m.jsonl", summary = dir / "s.json";
  r = test::run_shell(fmt::format("env -u DPT_GEMM -u DPT_CPU_LEVEL OMP_NUM_THREADS=1 {} train {} --data {} "
                                  "--metrics-out {} --summary-out {}",
                                  dpt, expected["train"].get<std::string>(), q(data), q(metrics), q(summary)),
                      dir, 500);
  ASSERT_EQ(r.code, 0) << r.all();
  const json here = json::parse(read_file(summary));
  std::string machine;
  for (const auto& [key, value] : expected["machine"].items())
    machine += fmt::format(" {}: recorded {}, here {};", key, value.dump(), here[key].dump());
  std::ifstream in(metrics);
  int compared = 0;
  for (std::string line; std::getline(in, line);) {
    const json row = json::parse(line);
    const std::string step = std::to_string(row["step"].get<int>());
    ASSERT_TRUE(expected["losses"].contains(step)) << "step " << step << " was not recorded";
    const double want = expected["losses"][step].get<double>(), got = row["loss"].get<double>();
    EXPECT_LE(std::fabs(got - want), 0.01 * want)
        << "step " << step << ": loss " << got << " against the recorded " << want << " (commit "
        << expected["commit"].get<std::string>() << ";" << machine << ")";
    ++compared;
  }
  EXPECT_EQ(compared, static_cast<int>(expected["losses"].size()));
  const double want_val = expected["val_loss"].get<double>(), got_val = here["val_loss"].get<double>();
  EXPECT_LE(std::fabs(got_val - want_val), 0.01 * want_val) << "validation loss" << machine;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace dpt
