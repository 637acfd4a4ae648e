// GPT-2 after the decoder rewrite (issue 31): with the GPT-2 configuration
// the weights saved after 20 steps are bit for bit those of the commit
// before it, under local, DDP, ZeRO-3, --tp 2 and --pp 2.
//
// tests/fixtures/gpt_bitwise/expected.json holds, per run, its flags and the
// FNV-1a 64 hash of the saved file's tensor bytes, made with that commit's
// binary by scripts/make_gpt_bitwise_fixture.py, and the machine facts the
// bits depend on: the GEMM backend and its kernels, OpenBLAS's core, the
// CPU kernel level. Where this machine's differ, the run is skipped with
// the reason (another CPU rounds in other places); where they match, the
// hashes must be equal.
//
// Registered in tests/CMakeLists.txt (ctest names gpt_bitwise.*).
#include <cstdint>
#include <filesystem>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../cli_run.h"

namespace dpt {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using test::dpt_bin;
using test::q;
using test::read_file;

const fs::path kFixture = fs::path(DPT_SOURCE_DIR) / "tests" / "fixtures" / "gpt_bitwise";

// FNV-1a 64 of the tensor bytes of a safetensors file (after its header).
std::string tensor_hash(const fs::path& path) {
  const std::string raw = read_file(path);
  uint64_t header = 0;
  for (int i = 7; i >= 0; --i) header = header << 8 | static_cast<unsigned char>(raw.at(static_cast<size_t>(i)));
  uint64_t h = 0xCBF29CE484222325ull;
  for (size_t i = 8 + header; i < raw.size(); ++i) h = (h ^ static_cast<unsigned char>(raw[i])) * 0x100000001B3ull;
  return fmt::format("{:016x}", h);
}

class GptBitwise : public ::testing::TestWithParam<std::string> {};

TEST_P(GptBitwise, SavedWeightsAreThoseOfTheCommitBeforeTheDecoder) {
  const json expected = json::parse(read_file(kFixture / "expected.json"));
  const json& run = expected["runs"][GetParam()];
  const fs::path dir = fs::temp_directory_path() / fmt::format("dpt_gpt_bitwise_{}_{}", GetParam(), ::getpid());
  fs::create_directories(dir);
  const fs::path save = dir / "w.safetensors", summary = dir / "s.json";
  // --attention unfused: the commit before the decoder had only the unfused
  // layer; the fused one (the CPU default since issue 35) rounds otherwise.
  std::string cmd = fmt::format("{} train {} {} --attention unfused --data {} --save {} --summary-out {}", q(dpt_bin()),
                                expected["model"].get<std::string>(), run["flags"].get<std::string>(),
                                q(kFixture / "text.txt"), q(save), q(summary));
  if (run["ranks"].get<int>() > 1) cmd = fmt::format("{} launch -n {} -- {}", q(dpt_bin()), run["ranks"].get<int>(), cmd);
  const test::RunResult r = test::run_shell("env -u DPT_GEMM -u DPT_CPU_LEVEL OMP_NUM_THREADS=1 " + cmd, dir, 120);
  ASSERT_EQ(r.code, 0) << r.all();
  const json here = json::parse(read_file(summary));
  for (const auto& [key, value] : expected["machine"].items())
    if (here[key] != value) {
      fs::remove_all(dir);
      GTEST_SKIP() << "recorded with " << key << " " << value << ", this machine has " << here[key]
                   << ": the bits are another CPU's (expected.json, commit " << expected["commit"] << ")";
    }
  EXPECT_EQ(tensor_hash(save), run["fnv1a64"].get<std::string>())
      << "the " << GetParam() << " run's saved weights differ from commit " << expected["commit"];
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Runs, GptBitwise, ::testing::Values("local", "ddp", "zero3", "tp2", "pp2"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace dpt
