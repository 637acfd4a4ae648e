// The progress display of `dpt train`: on a terminal one line redrawn in
// place (step, loss, throughput, ETA, a bar); otherwise one plain line per
// update, so logs stay readable.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace dpt {

class Progress {
 public:
  Progress(int64_t total_steps, bool quiet, std::string rate_unit);
  void update(int64_t step, double loss, double rate);
  // A line of its own (an evaluation result), above the bar.
  void line(const std::string& text);
  void finish();

 private:
  int64_t total_;
  bool quiet_, tty_;
  std::string unit_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace dpt
