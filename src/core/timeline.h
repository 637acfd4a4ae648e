// A timeline of training steps: when each rank's compute thread ran data,
// forward, backward, the wait for communication and the optimizer, and when
// its communication thread ran each collective (a DDP bucket's all-reduce, a
// ZeRO unit's all-gather or reduce-scatter). This is the recording half: it
// needs only a clock, so the strategies below train/ record into it. The
// writing half (train/trace_file.h) gathers every rank's spans into the
// Chrome trace of `dpt train --trace-out`.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>


namespace dpt {

class Timeline {
 public:
  using Clock = std::chrono::steady_clock;
  // InputGrad and WeightGrad: a split backward's B and W halves (pipeline
  // schedules zb-h1 and zb-v); Backward is a whole one.
  enum Kind {
    Data, Forward, Backward, CommWait, InputGrad, WeightGrad, Optimizer, AllReduce, AllGather, ReduceScatter, kKinds
  };
  static bool is_collective(int kind) { return kind >= AllReduce && kind < kKinds; }

  // Spans are kept in wall-clock time (the monotonic clock plus its offset
  // from the system clock, read once), so the ranks' timelines line up
  // exactly on one host and to the hosts' clock sync (NTP) across hosts.
  // Room for `spans` is reserved up front, so recording allocates nothing.
  explicit Timeline(size_t spans);

  // A span [t0, t1) of `kind` in `step`. Collectives name what they moved:
  // `index` is the DDP bucket or the ZeRO unit, `bytes` its size; a
  // pipeline's compute spans pass the micro-batch and, in `bytes`, the chunk;
  // other compute spans -1 and 0.
  void add(Kind kind, int64_t step, int index, size_t bytes, Clock::time_point t0, Clock::time_point t1);
  void add(Kind kind, int64_t step, Clock::time_point t0, Clock::time_point t1) { add(kind, step, -1, 0, t0, t1); }

  size_t size() const { return spans_.size() / kFields; }
  // Each span as kFields doubles: kind, step, index, bytes, start us (wall
  // clock), duration us.
  static constexpr size_t kFields = 6;
  const std::vector<double>& spans() const { return spans_; }

 private:
  double wall_offset_us_;  // system clock minus monotonic clock
  std::vector<double> spans_;
};

}  // namespace dpt
