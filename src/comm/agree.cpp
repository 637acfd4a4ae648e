#include "comm/agree.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/dot_rate.h"

namespace dpt::comm {

namespace {
constexpr size_t kMessageBytes = 512;
}  // namespace

std::string agreed_error(ProcessGroup& pg, const std::string& problem) {
  if (pg.size() == 1) return problem;
  // Every rank's message in a fixed-size record, all-gathered: every rank
  // says the first failing rank's sentence (that rank its own, uncut), so a
  // failure is one sentence, the same everywhere.
  std::vector<char> all(kMessageBytes * static_cast<size_t>(pg.size()), 0);
  std::memcpy(all.data() + kMessageBytes * static_cast<size_t>(pg.rank()), problem.data(),
              std::min(problem.size(), kMessageBytes - 1));
  pg.all_gather(all.data(), all.size() / sizeof(float), DType::F32);
  for (int r = 0; r < pg.size(); ++r) {
    const char* m = all.data() + kMessageBytes * static_cast<size_t>(r);
    if (*m) return r == pg.rank() ? problem : std::string(m, strnlen(m, kMessageBytes));
  }
  return "";
}

void agree_on_bf16_dot_rate(ProcessGroup& pg) {
  if (pg.size() == 1) return;
  double ratio = pg.rank() == 0 ? bf16_dot_over_fma() : 0.0;
  pg.broadcast(&ratio, sizeof(double) / sizeof(float), DType::F32, 0);  // a double as two floats' bytes
  // A core without AVX-512 BF16 (0) has one path whatever the others
  // timed, and its figure says nothing of theirs: only timings are shared.
  if (ratio > 0 && bf16_dot_over_fma() > 0) set_bf16_dot_over_fma(ratio);
}

}  // namespace dpt::comm
