// Peak RSS is the engine's own high-water mark, not its parent's: a run
// started from a process that holds a lot of memory (a Python harness, a
// job runner) must report what the run itself held.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/memory.h"

namespace dpt {
namespace {

namespace fs = std::filesystem;

constexpr size_t kMiB = size_t{1} << 20;

// Runs `dpt train` on a small synthetic GPT writing its summary to `summary`;
// with parent_bytes > 0, from a child that first allocates and touches that
// many bytes, so the parent's high-water mark is far above the run's own.
// Returns the summary's bytes.peak_rss.
size_t run_and_read_peak(const fs::path& summary, size_t parent_bytes) {
  const std::string dpt = std::string(DPT_BINARY_DIR) + "/dpt";
  const std::string out = summary.string();
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (parent_bytes > 0) {
      void* p = ::mmap(nullptr, parent_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) ::_exit(90);
      std::memset(p, 1, parent_bytes);  // resident, so it counts in the high-water mark
      // Not unmapped: exec replaces the address space, as a harness's would be.
    }
    ::execl(dpt.c_str(), dpt.c_str(), "train", "--model", "gpt", "--layers", "2", "--width", "64", "--heads", "2",
            "--context", "32", "--steps", "10", "--synthetic", "--quiet", "--threads", "1", "--summary-out",
            out.c_str(), static_cast<char*>(nullptr));
    ::_exit(91);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  std::ifstream in(summary);
  nlohmann::json j;
  in >> j;
  return j.at("bytes").at("peak_rss").get<size_t>();
}

TEST(Memory, PeakRssCoversWhatThisProcessTouched) {
  const size_t before = peak_rss_bytes();
  ASSERT_GT(before, 0u);
  const size_t n = 64 * kMiB;
  void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  std::memset(p, 1, n);
  EXPECT_GE(peak_rss_bytes(), n);
  ::munmap(p, n);
  EXPECT_GE(peak_rss_bytes(), n) << "the high-water mark must not fall when memory is freed";
}

TEST(Memory, PeakRssOfARunIsNotItsParentsMemory) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("dpt_memory_{}", ::getpid());
  fs::create_directories(dir);
  const size_t alone = run_and_read_peak(dir / "alone.json", 0);
  const size_t from_big_parent = run_and_read_peak(dir / "big_parent.json", 600 * kMiB);
  fs::remove_all(dir);
  EXPECT_LT(alone, 300 * kMiB);
  EXPECT_LT(from_big_parent, 300 * kMiB) << "the run reported its parent's 600 MiB";
  EXPECT_NEAR(static_cast<double>(from_big_parent), static_cast<double>(alone), 8.0 * kMiB);
}

}  // namespace
}  // namespace dpt
