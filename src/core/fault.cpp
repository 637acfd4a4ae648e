#include "core/fault.h"

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

namespace dpt {

namespace {
struct Fault {
  std::string point;
  long long step = -1;
  int rank = -1;
};

Fault parse_fault() {
  Fault f;
  const char* v = std::getenv("DPT_FAULT");
  if (!v) return f;
  char point[32] = {0};
  if (std::sscanf(v, "%31[a-z]:%lld:%d", point, &f.step, &f.rank) != 3) {
    std::fprintf(stderr, "dpt: ignoring DPT_FAULT='%s' (expected point:step:rank)\n", v);
    return {};
  }
  f.point = point;
  return f;
}

struct Straggle {
  int rank = -1;
  double ms = 0.0;
};

Straggle parse_straggle() {
  Straggle s;
  const char* v = std::getenv("DPT_STRAGGLE");
  if (!v) return s;
  if (std::sscanf(v, "%d:%lf", &s.rank, &s.ms) != 2 || s.ms < 0) {
    std::fprintf(stderr, "dpt: ignoring DPT_STRAGGLE='%s' (expected rank:ms)\n", v);
    return {};
  }
  return s;
}
}  // namespace

void fault_point(const char* point, int64_t step, int rank) {
  static const Fault fault = parse_fault();
  if (fault.rank == rank && fault.step == step && fault.point == point) {
    std::fprintf(stderr, "dpt: DPT_FAULT: rank %d killed at %s of step %lld\n", rank, point,
                 static_cast<long long>(step));
    std::fflush(stderr);
    std::raise(SIGKILL);
  }
}

void straggle_point(int rank) {
  static const Straggle straggle = parse_straggle();
  if (straggle.rank == rank) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(straggle.ms));
}

}  // namespace dpt
