// plan_stage: what one rank of a mesh holds and sends per step (train/plan.h).
// The bytes held are the strategy's over the DP group (rank_bytes on the
// stage's sliced model, as training builds it) plus the activation arenas
// its schedule keeps; the bytes sent are the strategy's (planned_comm over
// the DP group) plus what the mesh adds, collective by collective as
// models/decoder_passes.cpp (through the TP group's reduce, train/rank_setup.cpp),
// parallel/tensor_parallel.cpp and train/pipeline_executor.cpp issue them.
#include "core/dtype.h"
#include "models/decoder.h"
#include "parallel/catalog.h"
#include "parallel/rank_bytes.h"
#include "train/pipeline_executor.h"
#include "train/plan.h"

namespace dpt {

namespace {

// The tensor-parallel all-reduces of one step: per micro-batch, each block
// sums its attention's and its MLP's row-parallel outputs in forward and the
// column-parallel input gradients in backward, B x T x C floats each; with
// checkpointing backward runs each block's forward again, its two sums
// included. With a vocabulary-parallel embedding (nn/vocab_parallel.h) the
// embedding stage sums its lookups (B x T x C) in forward, and the head's
// stage its loss's row maxima (B x T) and its exponential sums with the
// target logits (2 x B x T) in forward and the head's input gradient
// (B x T x C) in backward. A logged step adds the gradient norm's sum over
// the TP group (a double per rank, as two floats).
CommPlan tensor_parallel_comm(const Decoder& decoder, const Mesh& mesh, int64_t blocks, int64_t micro, int64_t M) {
  CommPlan c;
  if (mesh.tp == 1) return c;
  const RingSends tp{mesh.tp, 0};
  const auto rows = static_cast<size_t>(micro * decoder.local_rows(decoder.config().context));  // this CP rank's
  const size_t n = rows * static_cast<size_t>(decoder.config().width);
  const auto Mu = static_cast<uint64_t>(M);
  const uint64_t per_block = Mu * static_cast<uint64_t>(blocks) * tp.ar(n, sizeof(float));
  c.forward = 2 * per_block;
  c.backward = (decoder.checkpoint_activations() ? 4 : 2) * per_block;
  if (decoder.vocab_parallel()) {
    if (decoder.stage().embed) c.forward += Mu * tp.ar(n, sizeof(float));
    if (decoder.stage().head) {
      c.forward += Mu * (tp.ar(rows, sizeof(float)) + tp.ar(2 * rows, sizeof(float)));
      c.backward += Mu * tp.ar(n, sizeof(float));
    }
  }
  // Sequence parallelism: each all-reduce becomes a reduce-scatter and an
  // all-gather (the same bytes in fp32; a bf16 run gathers the norms'
  // outputs in bf16, half of them), plus per micro-batch ln_f's output
  // gathered for the head (forward), the embedding output's gradient
  // gathered (backward), and every norm's weight (and bias) gradient summed
  // over the group (backward: 2 per block and ln_f).
  if (decoder.sequence_parallel(static_cast<int64_t>(rows))) {
    const auto C = static_cast<size_t>(decoder.config().width);
    const size_t norm = (decoder.config().norm == NormKind::LayerNorm ? 2 : 1) * C;
    const size_t e = dtype_size(decoder.precision());  // the gathered norms' outputs
    const uint64_t block_forward =
        2 * static_cast<uint64_t>(blocks) * (tp.rs(n, sizeof(float)) + tp.ag(n, e));
    c.forward += Mu * (block_forward + tp.ag(n, e)) - 2 * per_block;
    c.backward += Mu * (tp.ag(n, sizeof(float)) +
                        static_cast<uint64_t>(2 * blocks + 1) * tp.ar(norm, sizeof(float)));
    if (decoder.checkpoint_activations()) c.backward += Mu * block_forward - 2 * per_block;
  }
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
CommPlan pipeline_comm(const StrategyOptions& so, const Decoder& decoder, const Mesh& mesh, int s, int64_t micro,
                       const PipeProgram& program) {
  CommPlan c;
  if (mesh.pp == 1) return c;
  const DecoderConfig& cfg = decoder.config();
  const uint64_t boundary = sizeof(float) * static_cast<uint64_t>(micro * decoder.local_rows(cfg.context) * cfg.width);
  const uint64_t wte = sizeof(float) * static_cast<uint64_t>(decoder.wte_rows() * cfg.width);  // this TP rank's rows
  // Each forward whose next chunk is on another rank sends its output,
  // each backward whose previous chunk is sends its input's gradient.
  const int head = program.rank_of_chunk.back();
  for (const PipeAction& a : program.ranks[static_cast<size_t>(s)])
    if (const PipeMessage m = pipe_send(program, a)) (m.kind == 0 ? c.forward : c.backward) += boundary;
  // A tied embedding's gradient goes back to rank 0, its new values
  // forward to the head's rank (an untied head shares nothing; nor does a
  // head on rank 0).
  if (decoder.tied() && s == head && head != 0) c.backward += wte;
  if (decoder.tied() && s == 0) {
    // The head's copy goes in the compute type (bf16: the rounded masters).
    if (head != 0) c.optimizer += wte / sizeof(float) * dtype_size(decoder.precision());
    if (so.strategy->zero_stage == 3 && mesh.dp_cp() > 1)
      c.optimizer += RingSends{mesh.dp_cp(), 0}.ag(decoder.layout().units()[0].numel, sizeof(float));
  }
  // The loss's broadcast from the head's rank: all but the rank before it send.
  if (s != (head + mesh.pp - 1) % mesh.pp) c.backward += 2 * sizeof(float);
  c.logged_optimizer = RingSends{mesh.pp, s}.ag(2 * static_cast<size_t>(mesh.pp), sizeof(float));
  return c;
}

// zero3 on a pipeline stage (parallel/zero.cpp): a unit a forward ends on
// is kept when the unit next in the recorded order is that same unit, so a
// backward that follows a forward directly (any micro-batch's) skips its
// first gather; every forward frees what the last pass kept. The backward
// order is recorded until the first forward that follows a backward: when
// that covers several backwards, the recorded order goes on past a
// backward's end with the first unit of the next, which is prefetched
// there, and wasted when a forward or the step's end comes next.
struct PipeOp {  // a rank's forward or backward of a micro-batch
  bool forward = true;
  int micro = 0;
};
struct KeptGathers {
  uint64_t skipped = 0, wasted = 0;              // per step, once recorded
  uint64_t skipped_first = 0, wasted_first = 0;  // in the first step
};
KeptGathers kept_gathers(const std::vector<PipeOp>& ops, Prefetch prefetch) {
  KeptGathers k;
  size_t recorded_backwards = 0;
  bool seen_backward = false, recorded = false;
  for (const PipeOp& op : ops) {
    if (op.forward && seen_backward) break;
    if (!op.forward) {
      seen_backward = true;
      ++recorded_backwards;
    }
  }
  const bool prefetches = prefetch == Prefetch::Both || prefetch == Prefetch::Backward;
  seen_backward = false;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].forward) {
      recorded = recorded || seen_backward;
      continue;
    }
    seen_backward = true;
    const bool after_forward = i > 0 && ops[i - 1].forward;
    const bool before_forward = i + 1 == ops.size() || ops[i + 1].forward;
    const bool waste = prefetches && recorded_backwards > 1 && before_forward;
    k.skipped += after_forward;
    k.wasted += waste;
    k.skipped_first += recorded && after_forward;
    k.wasted_first += recorded && waste;
  }
  return k;
}

}  // namespace

StagePlan plan_stage(const PlanRequest& r, const StrategyOptions& so, const Model& model, const Mesh& mesh, int s,
                     int64_t micro) {
  StagePlan st;
  const int64_t M = r.grad_accum;
  st.bytes = rank_bytes(so, model, mesh.dp_cp());
  st.arena = model.activation_bytes_for(micro);
  const PipeProgram program = run_program(r.run, std::max(mesh.pp, 1));
  st.arenas = mesh.pp > 1 ? pipe_arenas(program, s) : 1;
  st.activations = static_cast<size_t>(st.arenas) * st.arena;
  if (const auto* d = dynamic_cast<const Decoder*>(&model); d && mesh.pp > 1)
    st.activations = pipeline_activation_bytes(*d, program, s, micro);
  st.comm = planned_comm(so, model, mesh.dp_cp(), 0, M);
  if (mesh.pp > 1 && so.strategy->zero_stage == 3 && so.reshard_after_forward) {
    // planned_comm counts a forward and its backward back to back: each
    // backward's first unit is the one its forward kept. A stage
    // interleaves its micro-batches instead (kept_gathers counts how).
    const std::vector<int> order = model.unit_order();
    const uint64_t last = RingSends{mesh.dp_cp(), 0}.ag(model.layout().units()[static_cast<size_t>(order.back())].numel,
                                                   dtype_size(model.precision()));
    std::vector<PipeOp> ops;  // the rank's forwards and backwards (a W opens its units again: not counted)
    for (const PipeAction& a : program.ranks[static_cast<size_t>(s)])
      if (a.kind != PipeAction::W) ops.push_back({a.kind == PipeAction::F, a.micro});
    const KeptGathers k = kept_gathers(ops, so.prefetch);
    st.comm.backward += static_cast<uint64_t>(M) * last - k.skipped * last + k.wasted * last;
    st.comm.first_step = (k.skipped - k.skipped_first - k.wasted + k.wasted_first) * last;
  }
  if (const auto* decoder = dynamic_cast<const Decoder*>(&model)) {
    int64_t blocks = 0;
    for (const BlockRange& c : decoder->stage().chunks)
      blocks += (c.last < 0 ? decoder->config().layers : c.last) - c.first;
    st.comm += tensor_parallel_comm(*decoder, mesh, blocks, micro, M);
    st.comm += pipeline_comm(so, *decoder, mesh, s, micro, program);
    st.pipeline = pipeline_buffer_bytes(*decoder, mesh.pp);
    if (mesh.cp > 1) st.comm += context_traffic(*decoder, blocks, micro, M);
  }
  st.need = st.bytes.total() + st.activations + st.pipeline;
  return st;
}

}  // namespace dpt
