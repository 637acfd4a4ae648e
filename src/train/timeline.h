// A timeline of training steps: when each rank's compute thread ran data,
// forward, backward, the wait for communication and the optimizer, and when
// its communication thread ran each collective (a DDP bucket's all-reduce, a
// ZeRO unit's all-gather or reduce-scatter). Written by
// `dpt train --trace-out` as a Chrome trace (open it in https://ui.perfetto.dev
// or chrome://tracing; bench/plot_timeline.py draws it as an SVG), one
// process per rank, so overlap of communication with backward is visible.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "io/atomic_file.h"

namespace dpt {

class Timeline {
 public:
  using Clock = std::chrono::steady_clock;
  enum Kind { Data, Forward, Backward, CommWait, Optimizer, AllReduce, AllGather, ReduceScatter, kKinds };
  static bool is_collective(int kind) { return kind >= AllReduce && kind < kKinds; }

  // Spans are kept in wall-clock time (the monotonic clock plus its offset
  // from the system clock, read once), so the ranks' timelines line up
  // exactly on one host and to the hosts' clock sync (NTP) across hosts.
  // Room for `spans` is reserved up front, so recording allocates nothing.
  explicit Timeline(size_t spans);

  // A span [t0, t1) of `kind` in `step`. Collectives name what they moved:
  // `index` is the DDP bucket or the ZeRO unit, `bytes` its size; compute
  // spans pass -1 and 0.
  void add(Kind kind, int64_t step, int index, size_t bytes, Clock::time_point t0, Clock::time_point t1);
  void add(Kind kind, int64_t step, Clock::time_point t0, Clock::time_point t1) { add(kind, step, -1, 0, t0, t1); }

  // Collective: gathers every rank's spans to rank 0, which writes the
  // Chrome trace JSON into `out` and commits it (the caller opens it before
  // training, so a bad path fails at once).
  void write(AtomicFile* out, comm::ProcessGroup& pg) const;

  size_t size() const { return spans_.size() / kFields; }

 private:
  // Each span as kFields doubles: kind, step, index, bytes, start us,
  // duration us.
  static constexpr size_t kFields = 6;
  double wall_offset_us_;  // system clock minus monotonic clock
  std::vector<double> spans_;
};

}  // namespace dpt
