#include "train/trace_file.h"

#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace dpt {

namespace {
const char* kind_name(int kind) {
  static const char* names[] = {"data",      "forward",    "backward",   "comm wait",  "input grad",
                                "weight grad", "optimizer", "all_reduce", "all_gather", "reduce_scatter"};
  static_assert(sizeof(names) / sizeof(names[0]) == Timeline::kKinds);
  return kind >= 0 && kind < Timeline::kKinds ? names[kind] : "?";
}
}  // namespace

void write_trace(const Timeline& timeline, AtomicFile* out, comm::ProcessGroup& pg) {
  constexpr size_t kFields = Timeline::kFields;
  const std::vector<double>& spans = timeline.spans();
  const int world = pg.size();
  // Every rank contributes the same number of doubles: the largest, padded
  // with kind -1. all_gather only copies bytes, so doubles travel as pairs
  // of fp32 elements.
  float most = static_cast<float>(spans.size());
  pg.all_reduce(&most, 1, DType::F32, comm::ReduceOp::Max);
  const size_t per_rank = static_cast<size_t>(most);
  std::vector<double> all(per_rank * static_cast<size_t>(world), -1.0);
  std::copy(spans.begin(), spans.end(), all.begin() + static_cast<std::ptrdiff_t>(per_rank * pg.rank()));
  static_assert(sizeof(double) == 2 * sizeof(float));
  pg.all_gather(all.data(), 2 * all.size(), DType::F32);
  if (pg.rank() != 0) return;
  DPT_CHECK(out != nullptr, "rank 0 writes the timeline but has no file");

  // Times from the first span of any rank.
  double first = 0.0;
  bool any = false;
  for (size_t i = 0; i + kFields <= all.size(); i += kFields)
    if (all[i] >= 0 && (!any || all[i + 4] < first)) {
      first = all[i + 4];
      any = true;
    }
  using nlohmann::json;
  json events = json::array();
  for (int r = 0; r < world; ++r) {
    events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", r}, {"args", {{"name", fmt::format("rank {}", r)}}}});
    events.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", r}, {"args", {{"sort_index", r}}}});
    events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", r}, {"tid", 0}, {"args", {{"name", "compute"}}}});
    events.push_back(
        {{"ph", "M"}, {"name", "thread_name"}, {"pid", r}, {"tid", 1}, {"args", {{"name", "communication"}}}});
    const double* f = all.data() + per_rank * static_cast<size_t>(r);
    for (size_t i = 0; i + kFields <= per_rank; i += kFields) {
      const int kind = static_cast<int>(f[i]);
      if (kind < 0) break;
      const int64_t step = static_cast<int64_t>(f[i + 1]);
      const int index = static_cast<int>(f[i + 2]);
      const bool comm = Timeline::is_collective(kind);
      json e = {{"ph", "X"}, {"pid", r}, {"tid", comm ? 1 : 0}, {"ts", f[i + 4] - first}, {"dur", f[i + 5]},
                {"cat", comm ? "comm" : "compute"}};
      json args = {{"step", step}};
      if (comm) {
        const char* what = kind == Timeline::AllReduce ? "bucket" : "unit";
        e["name"] = fmt::format("{} {} {}", kind_name(kind), what, index);
        args[what] = index;
        args["bytes"] = static_cast<size_t>(f[i + 3]);
      } else if (index >= 0) {  // a pipeline stage's micro-batch
        e["name"] = fmt::format("{} {}", kind_name(kind), index);
        args["micro_batch"] = index;
        args["chunk"] = static_cast<int>(f[i + 3]);
      } else {
        e["name"] = kind_name(kind);
      }
      e["args"] = args;
      events.push_back(std::move(e));
    }
  }
  json trace = {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
  out->write(trace.dump() + "\n");
  out->commit();
}

}  // namespace dpt
