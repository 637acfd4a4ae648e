#include "core/memory.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace dpt {

size_t peak_rss_bytes() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  size_t kib = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, "VmHWM:", 6) == 0) {
      kib = std::strtoull(line + 6, nullptr, 10);  // "VmHWM:    12345 kB"
      break;
    }
  std::fclose(f);
  return kib * 1024;
}

}  // namespace dpt
