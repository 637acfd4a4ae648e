// plan_stage: what one rank of a mesh holds and sends per step (train/plan.h).
// The bytes held are the strategy's over the DP group (rank_bytes on the
// stage's sliced model, as training builds it) plus the activation arenas
// its schedule keeps; the bytes sent are the strategy's (planned_comm over
// the DP group) plus what the mesh adds, collective by collective as
// models/gpt.cpp, parallel/tensor_parallel.cpp and train/pipeline_executor.cpp
// issue them.
#include "models/gpt.h"
#include "parallel/rank_bytes.h"
#include "train/plan.h"

namespace dpt {

namespace {

// The tensor-parallel all-reduces of one step: per micro-batch, each block
// sums its attention's and its MLP's row-parallel outputs in forward and the
// column-parallel input gradients in backward, B x T x C floats each; with
// checkpointing backward runs each block's forward again, its two sums
// included. A logged step adds the gradient norm's sum over the TP group
// (a double per rank, as two floats).
CommPlan tensor_parallel_comm(const Gpt& gpt, const Mesh& mesh, int64_t blocks, int64_t micro, int64_t M) {
  CommPlan c;
  if (mesh.tp == 1) return c;
  const RingSends tp{mesh.tp, 0};
  const auto n = static_cast<size_t>(micro * gpt.config().context * gpt.config().width);
  const uint64_t per_block = static_cast<uint64_t>(M * blocks) * tp.ar(n, sizeof(float));
  c.forward = 2 * per_block;
  c.backward = (gpt.checkpoint_activations() ? 4 : 2) * per_block;
  c.logged_optimizer = tp.ag(2 * static_cast<size_t>(mesh.tp), sizeof(float));
  return c;
}

// Stage s's pipeline transfers in one step (train/pipeline_executor.cpp):
// each micro-batch's activations to the next stage (forward) and their
// gradients to the previous one (backward); the last stage's head gradient
// for wte to the first (backward), and the first stage's updated wte to the
// last after the step (optimizer: with zero3 the first stage gathers that
// unit over its DP group first); the loss broadcast from the last stage
// along a chain that every stage but the one before the root forwards (a
// double as two floats); a logged step's gradient norm gathered over the
// stages.
CommPlan pipeline_comm(const StrategyOptions& so, const Gpt& gpt, const Mesh& mesh, int s, int64_t micro,
                       int64_t M) {
  CommPlan c;
  if (mesh.pp == 1) return c;
  const GptConfig& cfg = gpt.config();
  const uint64_t boundary = sizeof(float) * static_cast<uint64_t>(micro * cfg.context * cfg.width);
  const uint64_t wte = sizeof(float) * static_cast<uint64_t>(cfg.rows() * cfg.width);
  const uint64_t Mu = static_cast<uint64_t>(M);
  if (s + 1 < mesh.pp) c.forward += Mu * boundary;
  if (s > 0) c.backward += Mu * boundary;
  if (s + 1 == mesh.pp) c.backward += wte;
  if (s == 0) {
    c.optimizer += wte;
    if (zero_stage(so.name) == 3 && mesh.dp > 1)
      c.optimizer += RingSends{mesh.dp, 0}.ag(gpt.layout().units()[0].numel, sizeof(float));
  }
  if (s != mesh.pp - 2) c.backward += 2 * sizeof(float);
  c.logged_optimizer = RingSends{mesh.pp, s}.ag(2 * static_cast<size_t>(mesh.pp), sizeof(float));
  return c;
}

}  // namespace

StagePlan plan_stage(const PlanRequest& r, const StrategyOptions& so, const Model& model, const Mesh& mesh, int s,
                     int64_t micro) {
  StagePlan st;
  const int64_t M = r.grad_accum;
  st.bytes = rank_bytes(so, model, mesh.dp);
  st.arena = model.activation_bytes_for(micro);
  st.arenas = mesh.pp > 1 ? pipe_slots(parse_pipe_schedule(r.run.pp_schedule), mesh.pp, s, static_cast<int>(M)) : 1;
  st.activations = static_cast<size_t>(st.arenas) * st.arena;
  st.comm = planned_comm(so, model, mesh.dp, 0, M);
  if (const auto* gpt = dynamic_cast<const Gpt*>(&model)) {
    const GptStage& g = gpt->stage();
    const int64_t blocks = (g.last < 0 ? gpt->config().layers : g.last) - g.first;
    st.comm += tensor_parallel_comm(*gpt, mesh, blocks, micro, M);
    st.comm += pipeline_comm(so, *gpt, mesh, s, micro, M);
    if (mesh.pp > 1) {
      const size_t wte = static_cast<size_t>(gpt->config().rows() * gpt->config().width);
      if (s == 0) st.pipeline = sizeof(float) * (wte + gpt->layout().units()[0].numel);
      if (s + 1 == mesh.pp) st.pipeline = sizeof(float) * 2 * wte;
    }
  }
  st.need = st.bytes.total() + st.activations + st.pipeline;
  return st;
}

}  // namespace dpt
