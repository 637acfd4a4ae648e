#include "comm/agree.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace dpt::comm {

namespace {
constexpr size_t kMessageBytes = 512;
}  // namespace

std::string agreed_error(ProcessGroup& pg, const std::string& problem) {
  if (pg.size() == 1) return problem;
  // Every rank's message in a fixed-size record, all-gathered: the ranks
  // that failed keep their own sentence, the others take the first one's.
  std::vector<char> all(kMessageBytes * static_cast<size_t>(pg.size()), 0);
  std::memcpy(all.data() + kMessageBytes * static_cast<size_t>(pg.rank()), problem.data(),
              std::min(problem.size(), kMessageBytes - 1));
  pg.all_gather(all.data(), all.size() / sizeof(float), DType::F32);
  if (!problem.empty()) return problem;
  for (int r = 0; r < pg.size(); ++r) {
    const char* m = all.data() + kMessageBytes * static_cast<size_t>(r);
    if (*m) return std::string(m, strnlen(m, kMessageBytes));
  }
  return "";
}

}  // namespace dpt::comm
