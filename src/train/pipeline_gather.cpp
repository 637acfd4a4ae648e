#include "train/pipeline_gather.h"

#include <algorithm>

#include "core/error.h"
#include "parallel/tensor_parallel.h"
#include "tensor/flat_buffer.h"

namespace dpt {

void gather_pipeline_weights(const Mesh& mesh, MeshGroups& groups, const Decoder& model, Strategy& strategy,
                             const std::vector<DecoderStage>& stages, float* whole) {
  const auto stage_model = [&](int s) { return Decoder(model.config(), stages[static_cast<size_t>(s)]); };
  const Decoder held = stage_model(mesh.pp_rank);  // this stage, its tensors whole; never allocated
  FlatBuffer mine(held.param_count());
  comm::ProcessGroup* tp = groups.tp();
  FlatBuffer unit(tp ? model.param_count() : 0), scratch;
  for (size_t u = 0; u < model.layout().units().size(); ++u) {
    float* whole_unit = mine.f32() + held.layout().units()[u].offset;
    if (!tp) {
      strategy.gather_unit(static_cast<int>(u), whole_unit);
      continue;
    }
    strategy.gather_unit(static_cast<int>(u), unit.f32());
    if (mesh.dp_rank == 0) gather_slices(model, held, *tp, static_cast<int>(u), unit.f32(), whole_unit, scratch);
  }
  if (mesh.dp_rank != 0 || mesh.tp_rank != 0) return;
  comm::ProcessGroup& pp = groups.pp();
  if (mesh.pp_rank != 0) {
    pp.send(mine.f32(), held.param_count(), DType::F32, 0);
    return;
  }
  DPT_CHECK(whole != nullptr, "the first stage's replica 0, TP rank 0, is rank 0 and gathers the model");
  const Decoder all(model.config());
  const auto place = [&](const Layout& stage, const float* values) {
    for (const Slot& slot : stage.slots())
      std::copy(values + slot.offset, values + slot.offset + slot.numel,
                whole + all.layout().slot(all.layout().find(slot.name)).offset);
  };
  place(held.layout(), mine.f32());
  for (int s = 1; s < mesh.pp; ++s) {
    const Decoder stage = stage_model(s);
    FlatBuffer theirs(stage.param_count());
    pp.recv(theirs.f32(), stage.param_count(), DType::F32, s);
    place(stage.layout(), theirs.f32());
  }
}

}  // namespace dpt
