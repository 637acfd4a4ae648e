// One stage of a GPT pipeline (docs/pipeline.md): this rank holds blocks
// [first, last) of the model (parallel/pipeline_schedule.h chooses them),
// the embedding if it is the first stage, ln_f, the head and the loss if it
// is the last, and runs its part of every micro-batch in the schedule's
// order, receiving activations from the stage before it and gradients from
// the stage after it (MeshGroups' activation and gradient groups).
//
// The tied embedding. One process sums wte's gradient as the head's
// contribution first, then each token's embedding gradient onto it. Here the
// last stage keeps a copy of wte for its head (not a parameter: no optimizer
// state) and sums the head's contribution over the step's micro-batches;
// after its last backward it sends that to the first stage, which adds it
// into wte's gradient just before the embedding backward of the last
// micro-batch (at M = 1 exactly one process's order, so bitwise equal; at
// M > 1 the head's part is summed before the tokens' instead of
// interleaved). After the optimizer step the first stage sends wte's new
// values back in the compute type (bf16 in a bf16 run: the copy the head's
// GEMM reads): V x C values each way per step, what an all-reduce of the
// gradient between the two stages would move.
//
// Activations and their gradients cross a stage boundary on the residual
// stream, which a bf16 run keeps in fp32 (docs/precision.md): they travel
// in fp32 in either precision, so a boundary adds no rounding.
#pragma once

#include <memory>
#include <vector>

#include "comm/work.h"
#include "models/decoder.h"
#include "parallel/mesh.h"
#include "parallel/pipeline_schedule.h"
#include "tensor/flat_buffer.h"
#include "train/executor.h"
#include "train/pipeline_gather.h"

namespace dpt {

struct PipelineOptions {
  PipeSchedule schedule = PipeSchedule::OneFOneB;
  int micro_batches = 1;
  std::vector<DecoderStage> stages;  // every stage's blocks, in order
};

// The stages of the run's GPT: --pp-split, or balanced by parameters.
std::vector<DecoderStage> gpt_stages(const DecoderConfig& config, int pp, const std::string& split);

// What stage s's executor holds besides its strategy's bytes and its
// arenas: on the first stage wte's gradient from the head, the gathered
// embedding unit and, under bf16, the rounded copy of wte it sends; on the
// last the head's copy of wte (in the compute type) and its gradient. This
// TP rank's rows of wte. Training's memory check and `dpt plan` count them.
size_t pipeline_buffer_bytes(const Decoder& stage, int pp, int s);

class PipelineExecutor : public Executor {
 public:
  // model: this stage's Decoder; strategy: over groups.dp(). Collective over
  // the PP group: the last stage's copy of wte is filled from the first.
  PipelineExecutor(const Mesh& mesh, MeshGroups& groups, Decoder& model, Strategy& strategy, DataSource& data,
                   float loss_scale, PipelineOptions options);
  double run(int64_t step, StepBreakdown& t, Timeline* tl) override;
  double grad_norm_squared() override;
  void after_step() override;
  void save(const std::string& path, const SaveOptions& options) override;
  void gather_weights(float* whole) override {
    gather_pipeline_weights(mesh_, groups_, model_, strategy_, options_.stages, whole);
  }
  // Per micro-batch: forward, backward and the waits before each; the
  // wait at the end.
  size_t trace_spans() const override { return 4 * static_cast<size_t>(options_.micro_batches) + 1; }
  size_t activation_bytes() const override { return model_.arena_bytes_held(); }
  // The schedule and, per stage, its blocks, parameters, the activation
  // arenas it held (one per micro-batch in flight) and the last stage's
  // copy of wte with its gradient (gathered over the PP group).
  nlohmann::json detail() override;
  // Each batch through the stages: the last stage's statistics, zeros on
  // the others (evaluation's combine() sums every rank).
  const ForwardFn* eval_forward() override { return &eval_forward_; }

 private:
  // A stage's layout (its Decoder, never allocated, its tensors whole) for saving.
  Decoder stage_model(int s) const { return Decoder(model_.config(), options_.stages[static_cast<size_t>(s)]); }
  bool first() const { return mesh_.pp_rank == 0; }
  bool last() const { return mesh_.pp_rank == mesh_.pp - 1; }
  size_t wte_numel() const;
  // Sends (first stage) or receives (last stage) wte's current values.
  void sync_tied_weights();
  // Schedule entry k, a forward or a backward, timed into t (and tl). A
  // forward returns its micro-batch's loss (the last stage's; 0 elsewhere).
  double forward_op(size_t k, int64_t step, StepBreakdown& t, Timeline* tl);
  void backward_op(size_t k, int64_t step, StepBreakdown& t, Timeline* tl);
  // Every group this rank's collectives run in names `phase` in the ledger.
  void set_phase(const char* phase);
  size_t activation_elements() const {
    return static_cast<size_t>(batch_.B * batch_.T * model_.config().width);
  }

  Mesh mesh_;
  MeshGroups& groups_;
  Decoder& model_;
  Strategy& strategy_;
  DataSource& data_;
  float loss_scale_;
  PipelineOptions options_;
  std::vector<PipeOp> ops_;
  int slots_ = 1;
  Batch batch_;
  // The last stage: its copy of wte (in the compute type) and the head's
  // gradient for it (fp32); the first: the gradient received and, in a
  // bf16 run, wte rounded for sending (all V x C).
  FlatBuffer tied_w_, tied_g_;
  FlatBuffer embed_unit_;  // the first stage: its embedding unit, gathered
  // Sends in flight per slot: a slot's arena is not reused before they end.
  std::vector<std::shared_ptr<comm::Work>> sends_;
  // The gradient for the backward that follows a forward is received into
  // its slot while the forward computes: 1f1b's steady state (the micro-batch
  // it is for, -1 when none). The last stage's send of the head's part of
  // wte's gradient.
  std::shared_ptr<comm::Work> grad_recv_, tied_send_;
  int grad_recv_micro_ = -1;
  ForwardFn eval_forward_;
  std::vector<double> norm_parts_;  // the TP group's sums of squares
};

}  // namespace dpt
