// OpenBLAS kernel choice: the decision table, and that `dpt` really runs with
// the kernels it should (it re-executes itself to get them).
#include <unistd.h>

#include <filesystem>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli_run.h"
#include "core/blas_kernel.h"

namespace dpt {
namespace {

namespace fs = std::filesystem;

TEST(BlasKernel, ForcesAvx512KernelsWhenOpenBlasChoseAvx2OnAnAvx512Cpu) {
  EXPECT_EQ(better_blas_core("Haswell", true, false, false), "SkylakeX");
  EXPECT_EQ(better_blas_core("Zen", true, false, false), "SkylakeX");
  EXPECT_EQ(better_blas_core("haswell", true, true, false), "Cooperlake");
  EXPECT_EQ(better_blas_core("Prescott", true, false, false), "SkylakeX");
}

TEST(BlasKernel, KeepsAvx512KernelsTheCpuWithoutAvx512AndTheUsersChoice) {
  for (const char* fast : {"SkylakeX", "Cooperlake", "SAPPHIRERAPIDS", "skylakex"})
    EXPECT_EQ(better_blas_core(fast, true, true, false), "") << fast;
  EXPECT_EQ(better_blas_core("Haswell", false, false, false), "");
  EXPECT_EQ(better_blas_core("Haswell", true, true, true), "");
}

bool cpu_has_avx512() {
#if defined(__x86_64__)
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vl");
#else
  return false;
#endif
}

// The kernel set a `dpt train` run reports in its summary, with `env` before it.
std::string core_of_run(const std::string& env) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("dpt_blas_{}", ::getpid());
  fs::create_directories(dir);
  const fs::path summary = dir / "s.json";
  test::RunResult r = test::run_shell(
      fmt::format("env -u OPENBLAS_CORETYPE -u DPT_KEEP_BLAS_CORE {} {}/dpt train --model mlp "
                  "--steps 2 --batch 8 --synthetic --quiet --threads 1 --summary-out {}",
                  env, DPT_BINARY_DIR, test::q(summary)),
      dir);
  EXPECT_EQ(r.code, 0) << r.err;
  std::string core;
  if (r.code == 0) core = nlohmann::json::parse(test::read_file(summary))["blas_core"].get<std::string>();
  fs::remove_all(dir);
  return core;
}

TEST(BlasKernel, DptRunsWithTheKernelsItChose) {
  const std::string chosen = core_of_run("");
  ASSERT_FALSE(chosen.empty());
  // What OpenBLAS picks by itself (this test program does not re-execute,
  // unless the environment already forces a core).
  const std::string own = core_of_run("DPT_KEEP_BLAS_CORE=1");
  const std::string better = better_blas_core(own, cpu_has_avx512(), false, false);
  if (better.empty())
    EXPECT_EQ(chosen, own);
  else  // SkylakeX or Cooperlake, depending on BF16
    EXPECT_TRUE(chosen == "SkylakeX" || chosen == "Cooperlake") << chosen << " (OpenBLAS chose " << own << ")";
}

TEST(BlasKernel, TheUsersCoreTypeIsKept) {
  EXPECT_EQ(core_of_run("OPENBLAS_CORETYPE=Haswell"), "Haswell");
}

}  // namespace
}  // namespace dpt
