#include "parallel/tensor_parallel.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <optional>

#include <fmt/format.h>

#include "core/error.h"
#include "models/weights.h"
#include "tensor/flat_buffer.h"

namespace dpt {

void check_vocab_rows(const DecoderConfig& c, int tp) {
  if (c.rows() % tp != 0)
    throw InputError(fmt::format("the checkpoint holds wte as {} rows, which --tp-embedding vocab cannot split over "
                                 "--tp {} (a fresh run pads them to a multiple of tp; resume at a tp that divides {}, "
                                 "or with --tp-embedding replicated)",
                                 c.rows(), tp, c.rows()));
}

double sum_in_rank_order(comm::ProcessGroup& g, double mine, std::vector<double>& parts) {
  parts.assign(static_cast<size_t>(g.size()), 0.0);
  parts[static_cast<size_t>(g.rank())] = mine;
  g.all_gather(parts.data(), 2 * parts.size(), DType::F32);  // a double travels as two floats
  double sum = 0.0;
  for (double v : parts) sum += v;
  return sum;
}

void gather_slices(const Decoder& model, const Decoder& whole, comm::ProcessGroup& tp, int unit, const float* mine,
                   float* out, FlatBuffer& scratch) {
  const Layout &sliced = model.layout(), &all = whole.layout();
  const auto u = static_cast<size_t>(unit);
  const auto P = static_cast<size_t>(tp.size());
  for (size_t k = 0; k < sliced.slots().size(); ++k) {
    const Slot& s = sliced.slots()[k];
    if (s.unit != unit) continue;
    const Slot& w = all.slot(all.find(s.name));
    const float* v = mine + (s.offset - sliced.units()[u].offset);
    float* dst = out + (w.offset - all.units()[u].offset);
    scratch.reserve(P * s.numel);
    float* gathered = scratch.f32();
    const TensorSlice& sl = s.slice;
    if (sl.parts == 1) {
      // Replicated: TP rank 0's copy, and every rank's agreement with it.
      std::copy(v, v + s.numel, gathered);
      tp.broadcast(gathered, s.numel, DType::F32, 0);
      float differs = std::memcmp(gathered, v, s.numel * sizeof(float)) != 0 ? 1.0f : 0.0f;
      tp.all_reduce(&differs, 1, DType::F32, comm::ReduceOp::Max);
      if (differs > 0.0f)
        throw InternalError(fmt::format("the tensor-parallel ranks hold different copies of {}", s.name));
      std::copy(v, v + s.numel, dst);
      continue;
    }
    // Rank p's slice is part p of the whole tensor.
    std::copy(v, v + s.numel, gathered + static_cast<size_t>(tp.rank()) * s.numel);
    tp.all_gather(gathered, P * s.numel, DType::F32);
    for (size_t p = 0; p < P; ++p) {
      const TensorSlice part{sl.outer, sl.parts, static_cast<int64_t>(p), sl.inner};
      for (size_t i = 0; i < s.numel; ++i) dst[part.whole_index(i)] = gathered[p * s.numel + i];
    }
  }
}

void gather_whole_units(Strategy& strategy, const Decoder& model, const Mesh& mesh, comm::ProcessGroup& tp,
                        const std::function<void(int, const float*)>& take) {
  const Decoder whole(model.config(), model.stage());  // the file's layout; never allocated
  size_t unit_max = 0, whole_max = 0;
  for (size_t u = 0; u < model.layout().units().size(); ++u) {
    unit_max = std::max(unit_max, model.layout().units()[u].numel);
    whole_max = std::max(whole_max, whole.layout().units()[u].numel);
  }
  FlatBuffer unit(unit_max), out(whole_max), scratch;
  for (size_t u = 0; u < model.layout().units().size(); ++u) {
    strategy.gather_unit(static_cast<int>(u), unit.f32());
    if (mesh.dp_rank != 0) continue;  // replica 0's TP group gathers; the others hold the same
    gather_slices(model, whole, tp, static_cast<int>(u), unit.f32(), out.f32(), scratch);
    take(static_cast<int>(u), out.f32());
  }
}

void save_tensor_parallel(Strategy& strategy, const Decoder& model, const Mesh& mesh, comm::ProcessGroup& tp,
                          const std::string& path, const SaveOptions& options, bool lead) {
  const Decoder whole(model.config(), model.stage());  // the file's layout; never allocated
  std::optional<WeightWriter> file;
  if (lead) file.emplace(path, whole, options);
  gather_whole_units(strategy, model, mesh, tp, [&](int u, const float* values) {
    if (file) file->write_unit(u, values);
  });
  if (file) file->commit();
}

}  // namespace dpt
