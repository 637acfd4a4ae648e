#include "core/memory.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace dpt {

namespace {
// A "Key:   12345 kB" line of a /proc/self file, in bytes (0 if absent).
size_t kib_field(const char* file, const char* key) {
  std::FILE* f = std::fopen(file, "r");
  if (!f) return 0;
  char line[256];
  const size_t n = std::strlen(key);
  size_t kib = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, key, n) == 0) {
      kib = std::strtoull(line + n, nullptr, 10);
      break;
    }
  std::fclose(f);
  return kib * 1024;
}
}  // namespace

size_t peak_rss_bytes() { return kib_field("/proc/self/status", "VmHWM:"); }

size_t current_rss_bytes() { return kib_field("/proc/self/status", "VmRSS:"); }

size_t huge_page_bytes() { return kib_field("/proc/self/smaps_rollup", "AnonHugePages:"); }

}  // namespace dpt
