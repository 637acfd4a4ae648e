// --metrics-out: one JSON line per logged step, flushed as it is written, so
// `tail -f` follows a run and a run that dies keeps its lines so far. A
// resumed run keeps the lines of the steps it does not repeat and appends.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace dpt {

class MetricsFile {
 public:
  // Starts the file afresh, or (resumed_at >= 0) keeps the lines of an
  // existing one whose "step" is at most resumed_at. IoError naming the file
  // if it cannot be written.
  MetricsFile(const std::string& path, int64_t resumed_at);
  ~MetricsFile();
  MetricsFile(const MetricsFile&) = delete;
  MetricsFile& operator=(const MetricsFile&) = delete;

  void write_line(const std::string& json_line);  // adds the newline; flushes

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
};

}  // namespace dpt
