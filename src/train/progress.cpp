#include "train/progress.h"

#include <unistd.h>

#include <cstdio>

#include <fmt/format.h>

namespace dpt {

Progress::Progress(int64_t total_steps, bool quiet, std::string rate_unit)
    : total_(total_steps), quiet_(quiet), tty_(::isatty(1) != 0), unit_(std::move(rate_unit)),
      start_(std::chrono::steady_clock::now()) {}

namespace {
std::string clock_str(double s) {
  long t = static_cast<long>(s + 0.5);
  return t >= 3600 ? fmt::format("{}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60)
                   : fmt::format("{}:{:02}", t / 60, t % 60);
}
}  // namespace

void Progress::update(int64_t step, double loss, double rate) {
  if (quiet_) return;
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  double eta = step > 0 ? elapsed / static_cast<double>(step) * static_cast<double>(total_ - step) : 0;
  std::string text = fmt::format("step {}/{} | loss {:.4f} | {:.0f} {} | {} elapsed, ETA {}", step,
                                 total_, loss, rate, unit_, clock_str(elapsed), clock_str(eta));
  if (tty_) {
    const int width = 24;
    int filled = total_ > 0 ? static_cast<int>(width * step / total_) : width;
    std::string bar = std::string(static_cast<size_t>(filled), '#') +
                      std::string(static_cast<size_t>(width - filled), '.');
    std::printf("\r\033[K[%s] %s", bar.c_str(), text.c_str());
    drawn_ = true;
  } else {
    std::printf("%s\n", text.c_str());
  }
  std::fflush(stdout);
}

void Progress::line(const std::string& text) {
  if (quiet_) return;
  if (tty_ && drawn_) std::printf("\r\033[K");
  std::printf("%s\n", text.c_str());
  drawn_ = false;
  std::fflush(stdout);
}

void Progress::finish() {
  if (!quiet_ && tty_ && drawn_) std::printf("\n");
  drawn_ = false;
}

}  // namespace dpt
