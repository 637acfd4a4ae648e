#include "core/timeline.h"

#include <algorithm>

namespace dpt {

Timeline::Timeline(size_t spans) {
  spans_.reserve(spans * kFields);
  using us = std::chrono::duration<double, std::micro>;
  wall_offset_us_ = us(std::chrono::system_clock::now().time_since_epoch()).count() -
                    us(Clock::now().time_since_epoch()).count();
}

void Timeline::add(Kind kind, int64_t step, int index, size_t bytes, Clock::time_point t0, Clock::time_point t1) {
  const auto us = [this](Clock::time_point t) {
    return std::chrono::duration<double, std::micro>(t.time_since_epoch()).count() + wall_offset_us_;
  };
  spans_.insert(spans_.end(), {static_cast<double>(kind), static_cast<double>(step), static_cast<double>(index),
                               static_cast<double>(bytes), us(t0), std::max(0.0, us(t1) - us(t0))});
}

}  // namespace dpt
