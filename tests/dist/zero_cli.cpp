// Weights saved under one strategy and world size, loaded under another,
// end to end through `dpt launch` (one job per world size): zero3 on 3 ranks
// to DDP on 2, and DDP on 2 to zero3 on 3, bit for bit.
//
// A run cannot train zero steps (--steps 0 is refused), so the
// loading run trains one step that cannot change a bit: SGD without
// momentum or weight decay, the gradient clipped to norm 1 (so every element
// is at most 1 in magnitude) and lr 1e-30. Each update is then at most
// 1e-30, less than half the spacing of floats around any value p of
// magnitude 2^-70 or more (at least 2^-70 x 2^-25 = 2^-95 = 2.5e-29: half
// the spacing just below a power of two), so p - update rounds back to p;
// the test checks that every saved value is that large. The file it saves
// is then the weights it loaded, written again: it must equal the file it
// loaded, byte for byte (a real step, lr 1e-3, changes it).
//
// Registered by hand in tests/CMakeLists.txt (ctest names zero_cli.*).
#include <unistd.h>

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

// The MLP of dist_zero: units of 22765, 390 and 140 elements, uneven over
// 2 and 3 ranks.
constexpr const char* kModel = "--model mlp --sizes 784,29,13,10";
constexpr const char* kQuiet = "--log-every 1000 --seed 7";
// The step that changes nothing (see the top of this file).
constexpr const char* kNoChange = "--steps 1 --lr 1e-30 --momentum 0 --clip 1";

class ZeroCliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / fmt::format("dpt_zero_cli_{}", ::getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  // `dpt launch -n <n> -- dpt train <args>` with one thread per rank and
  // the engine's settings from the environment removed.
  static RunResult train(int n, const std::string& args) {
    const std::string cmd =
        fmt::format("env -u DPT_COMM_ALGO -u DPT_COMM_TRANSPORT -u DPT_COMM_CHECK OMP_NUM_THREADS=1 "
                    "DPT_COMM_TIMEOUT=60 {} launch -n {} -- {} train {}",
                    q(dpt_bin()), n, q(dpt_bin()), args);
    return test::run_shell(cmd, dir_, 120);
  }

  // Every value is finite and at least 2^-70 in magnitude.
  static void expect_large_values(const fs::path& file) {
    const SafetensorsFile f = load_safetensors(file.string());
    EXPECT_EQ(f.tensors.size(), 6u);
    size_t small = 0;
    for (const NamedTensor& t : f.tensors)
      for (float v : t.data)
        if (!std::isfinite(v) || std::fabs(v) < std::ldexp(1.0f, -70)) ++small;
    EXPECT_EQ(small, 0u) << file << ": values the no-change step could move";
  }

  // Trains under `from` on n_from ranks and saves; loads that under `to` on
  // n_to ranks, takes the step that changes nothing and saves again.
  static void round_trip(const std::string& from, int n_from, const std::string& to, int n_to) {
    const fs::path a = dir_ / fmt::format("{}_{}.safetensors", from, n_from);
    const fs::path b = dir_ / fmt::format("{}_{}_from_{}_{}.safetensors", to, n_to, from, n_from);
    RunResult r = train(n_from, fmt::format("{} {} --strategy {} --steps 2 --batch 48 --save {}", kModel, kQuiet,
                                            from, q(a)));
    ASSERT_EQ(r.code, 0) << r.all();
    expect_large_values(a);
    r = train(n_to, fmt::format("--load {} {} --strategy {} {} --batch 48 --save {}", q(a), kQuiet, to, kNoChange,
                                q(b)));
    ASSERT_EQ(r.code, 0) << r.all();
    const std::string saved = read_file(a), again = read_file(b);
    EXPECT_GT(saved.size(), 93180u);  // 23295 floats and a header
    EXPECT_TRUE(saved == again) << from << " on " << n_from << " ranks saved " << a << ", " << to << " on " << n_to
                                << " ranks loaded it and saved " << b << ": the files differ";
  }

  static inline fs::path dir_;
};

TEST_F(ZeroCliTest, Zero3OnThreeRanksToDdpOnTwo) { round_trip("zero3", 3, "ddp", 2); }

TEST_F(ZeroCliTest, DdpOnTwoRanksToZero3OnThree) { round_trip("ddp", 2, "zero3", 3); }

}  // namespace
}  // namespace dpt
