#include "core/memory.h"

#include <sys/resource.h>

namespace dpt {

size_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<size_t>(u.ru_maxrss) * 1024;  // Linux reports KiB
}

}  // namespace dpt
