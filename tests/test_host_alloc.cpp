// The CPU's buffer allocations (core/host_alloc.h): zeroed, aligned, and a
// buffer of 2 MiB or more on a 2 MiB boundary advised onto huge pages, which
// the kernel marks on the mapping ("hg" in /proc/self/smaps' VmFlags).
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "core/host_alloc.h"

namespace dpt {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

// The VmFlags line of the mapping that holds address p ("" if none).
std::string vm_flags_at(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto a = reinterpret_cast<uintptr_t>(p);
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-') {
      inside = lo <= a && a < hi;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line;
    }
  }
  return "";
}

TEST(HostAlloc, ZeroedAndAligned) {
  for (size_t bytes : {size_t{1}, size_t{1000}, 3 * kMiB + 12}) {
    auto* p = static_cast<unsigned char*>(host_alloc(bytes));
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u) << bytes;
    for (size_t i = 0; i < bytes; ++i) ASSERT_EQ(p[i], 0) << "byte " << i << " of " << bytes;
    std::memset(p, 0xab, bytes);  // all of it is ours to write
    host_free(p);
  }
  EXPECT_EQ(host_alloc(0), nullptr);
}

TEST(HostAlloc, LargeBuffersAreAdvisedOntoHugePages) {
  if (!std::filesystem::exists("/sys/kernel/mm/transparent_hugepage"))
    GTEST_SKIP() << "this kernel has no transparent huge pages";
  ASSERT_TRUE(host_huge_pages()) << "run without DPT_HUGE_PAGES=0";
  void* p = host_alloc(6 * kMiB);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % (2 * kMiB), 0u);
  const std::string flags = vm_flags_at(p);
  EXPECT_NE(flags.find(" hg"), std::string::npos) << "mapping of the buffer: " << flags;
  host_free(p);
}

}  // namespace
}  // namespace dpt
