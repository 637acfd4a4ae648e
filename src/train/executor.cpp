#include "train/executor.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "core/fault.h"
#include "models/weights.h"
#include "parallel/tensor_parallel.h"
#include "train/data_source.h"
#include "core/timeline.h"
#include "train/train.h"

namespace dpt {

using Clock = std::chrono::steady_clock;

namespace {
double ms(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }
}  // namespace

double SequentialExecutor::run(int64_t step, StepBreakdown& t, Timeline* tl) {
  const int rank = pg_.rank();
  double loss = 0.0;
  for (int64_t k = 0; k < o_.grad_accum; ++k) {
    auto td = Clock::now();
    data_.next(batch_);
    t.data_ms += ms(td, Clock::now());
    strategy_.begin_micro_step(k == o_.grad_accum - 1);  // no_sync before the last
    auto tf = Clock::now();
    for (auto* g : {&pg_, tp_}) if (g) g->set_phase("forward");
    fault_point("forward", step + 1, rank);
    straggle_point(rank);
    loss += model_.forward(batch_).loss;
    auto tb = Clock::now();
    for (auto* g : {&pg_, tp_}) if (g) g->set_phase("backward");
    fault_point("backward", step + 1, rank);
    model_.backward(loss_scale_);
    auto te = Clock::now();
    t.forward_ms += ms(tf, tb);
    t.backward_ms += ms(tb, te);
    if (tl) {
      tl->add(Timeline::Data, step, td, tf);
      tl->add(Timeline::Forward, step, tf, tb);
      tl->add(Timeline::Backward, step, tb, te);
    }
  }
  return loss / static_cast<double>(o_.grad_accum);
}

size_t SequentialExecutor::trace_spans() const { return 3 * static_cast<size_t>(o_.grad_accum); }

double SequentialExecutor::grad_norm_squared() {
  const double mine = strategy_.grad_norm_squared();
  if (!tp_) return mine;
  tp_->set_phase("optimizer");  // as the loop's groups are by now
  return sum_in_rank_order(*tp_, mine, norm_parts_);
}

void SequentialExecutor::save(const std::string& path, const SaveOptions& options) {
  if (tp_)
    save_tensor_parallel(strategy_, dynamic_cast<const Decoder&>(model_), mesh_, *tp_, path, options, pg_.rank() == 0);
  else
    save_model(strategy_, model_, path, options, pg_.rank() == 0);
}

void SequentialExecutor::gather_weights(float* whole) {
  const auto& decoder = dynamic_cast<const Decoder&>(model_);
  if (tp_) {
    const Decoder all(decoder.config(), decoder.stage());  // the whole tensors' layout; never allocated
    gather_whole_units(strategy_, decoder, mesh_, *tp_, [&](int u, const float* values) {
      if (!whole) return;
      const Unit& w = all.layout().units()[static_cast<size_t>(u)];
      std::copy(values, values + w.numel, whole + w.offset);
    });
    return;
  }
  // Rank 0 gathers each unit in its place; the others into scratch.
  const Layout& layout = model_.layout();
  size_t max_unit = 0;
  for (const Unit& u : layout.units()) max_unit = std::max(max_unit, u.numel);
  FlatBuffer scratch(whole ? 0 : max_unit);
  for (size_t u = 0; u < layout.units().size(); ++u)
    strategy_.gather_unit(static_cast<int>(u), whole ? whole + layout.units()[u].offset : scratch.f32());
}

// Under zero3 no rank ever holds more than one unit: the tensors of a unit
// are consecutive in the file, as in the buffer.
void save_model(Strategy& strategy, const Model& model, const std::string& path, const SaveOptions& options,
                bool lead) {
  const Layout& layout = model.layout();
  std::optional<WeightWriter> file;
  if (lead) file.emplace(path, model, options);
  size_t max_unit = 0;
  for (const Unit& u : layout.units()) max_unit = std::max(max_unit, u.numel);
  FlatBuffer unit(max_unit);
  for (size_t u = 0; u < layout.units().size(); ++u) {
    strategy.gather_unit(static_cast<int>(u), unit.f32());
    if (file) file->write_unit(static_cast<int>(u), unit.f32());
  }
  if (file) file->commit();
}

}  // namespace dpt
