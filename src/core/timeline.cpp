#include "core/timeline.h"

#include <algorithm>

namespace dpt {

namespace {

// The system clock minus the monotonic clock, in us. One read of each can
// be split by a preemption (or a slow clock read under a hypervisor), which
// would shift this rank's whole timeline against the others', so the system
// clock is read between two monotonic reads several times and the tightest
// bracket wins: its error is at most half its width.
double wall_offset_us() {
  using us = std::chrono::duration<double, std::micro>;
  double best_width = 0, best = 0;
  for (int i = 0; i < 16; ++i) {
    const double before = us(Timeline::Clock::now().time_since_epoch()).count();
    const double wall = us(std::chrono::system_clock::now().time_since_epoch()).count();
    const double after = us(Timeline::Clock::now().time_since_epoch()).count();
    if (i == 0 || after - before < best_width) {
      best_width = after - before;
      best = wall - (before + after) / 2;
    }
  }
  return best;
}

}  // namespace

Timeline::Timeline(size_t spans) : wall_offset_us_(wall_offset_us()) { spans_.reserve(spans * kFields); }

void Timeline::add(Kind kind, int64_t step, int index, size_t bytes, Clock::time_point t0, Clock::time_point t1) {
  const auto us = [this](Clock::time_point t) {
    return std::chrono::duration<double, std::micro>(t.time_since_epoch()).count() + wall_offset_us_;
  };
  spans_.insert(spans_.end(), {static_cast<double>(kind), static_cast<double>(step), static_cast<double>(index),
                               static_cast<double>(bytes), us(t0), std::max(0.0, us(t1) - us(t0))});
}

}  // namespace dpt
