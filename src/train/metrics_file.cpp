#include "train/metrics_file.h"

#include <cerrno>
#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/atomic_file.h"

namespace dpt {

MetricsFile::MetricsFile(const std::string& path, int64_t resumed_at) : path_(path) {
  if (resumed_at >= 0) {
    // The lines up to the checkpoint, rewritten atomically: a run killed
    // after its checkpoint logged steps that the resumed run repeats.
    std::string kept;
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line, nullptr, false);
      if (!j.is_discarded() && j.is_object() && j.value("step", INT64_MAX) <= resumed_at) kept += line + "\n";
    }
    AtomicFile f(path);
    f.write(kept);
    f.commit();
  }
  f_ = std::fopen(path.c_str(), resumed_at >= 0 ? "a" : "w");
  if (!f_) throw IoError(fmt::format("{}: cannot create file: {}", path, std::strerror(errno)));
}

MetricsFile::~MetricsFile() {
  if (f_) std::fclose(f_);
}

void MetricsFile::write_line(const std::string& json_line) {
  if (std::fprintf(f_, "%s\n", json_line.c_str()) < 0 || std::fflush(f_) != 0)
    throw IoError(fmt::format("{}: write failed: {}", path_, std::strerror(errno)));
}

}  // namespace dpt
