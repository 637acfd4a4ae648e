// One pipeline rank of a decoder (docs/pipeline.md): this rank holds one
// or more chunks of consecutive blocks (parallel/pipe_program.h places
// them; pipe_stages chooses their blocks), the embedding if it has chunk 0,
// the final norm, the head and the loss if it has the last chunk, and runs
// its list of operations (F, BW, or B and W, of a chunk on a micro-batch)
// in the schedule's order: it receives activations from the previous
// chunk's rank and gradients from the next one's, and passes them between
// two chunks of its own by copying. Every list is validated before the
// first step (check_pipe_program): an invalid one is refused in one sentence.
//
// Links. A process group runs its operations one at a time in issue order
// and a send ends only when it is received, so two ranks that send to each
// other on one group can wait on each other forever. With one chunk per
// rank activations only go from rank r to r + 1 and gradients from r to
// r - 1, one group each (MeshGroups). With several, the pipeline wraps from
// the last rank to the first (interleaved) or turns back (V), so every
// direction of every pair of ranks that exchange, and each kind
// (activations, gradients), gets a group of its own: a link carries one
// rank's sends to one other rank, in the order the validator checked.
//
// The tied embedding. One process sums wte's gradient as the head's
// contribution first, then each token's embedding gradient onto it. Here the
// head's rank computes with a copy of wte (not a parameter: no optimizer
// state) and sums the head's contribution over the step's micro-batches in
// a buffer of its own; after its last backward it sends that to rank 0 (or
// hands it over, when a V puts both ends on rank 0), which adds it into
// wte's gradient just before the embedding backward of the last micro-batch
// (at M = 1 exactly one process's order, so bitwise equal; at M > 1 the
// head's part is summed before the tokens' instead of interleaved). After
// the optimizer step rank 0 sends wte's new values back in the compute
// type (bf16 in a bf16 run: the copy the head's GEMM reads): V x C values
// each way per step, what an all-reduce of the gradient between the two
// ranks would move.
//
// Activations and their gradients cross a chunk boundary on the residual
// stream, which a bf16 run keeps in fp32 (docs/precision.md): they travel
// in fp32 in either precision, so a boundary adds no rounding.
#pragma once

#include <memory>
#include <vector>

#include "comm/work.h"
#include "models/decoder.h"
#include "parallel/mesh.h"
#include "parallel/pipe_program.h"
#include "tensor/flat_buffer.h"
#include "train/executor.h"
#include "train/pipeline_gather.h"

namespace dpt {

struct PipelineOptions {
  PipeProgram program;               // every rank's operations
  std::vector<DecoderStage> stages;  // every rank's chunks, by pp rank
};

// Every rank's chunks of the run's decoder under `program`: blocks per
// chunk from --pp-split (one count per chunk), or balanced by parameters
// (the embedding counted with chunk 0, the head with the last).
std::vector<DecoderStage> pipe_stages(const DecoderConfig& config, const PipeProgram& program,
                                      const std::string& split);
// Each chunk's F, B and W in FLOPs per token (its blocks', the head's on
// the last; the embedding's lookups are free): what the zero-bubble
// builders schedule by (transfers free).
PipeCosts pipe_chunk_costs(const DecoderConfig& config, int chunks, int v, const std::string& split,
                           bool checkpoint);
// The run's program: --pp-schedule, --virtual-stages, --pp and its
// micro-batches (InputError, one sentence, for one that cannot be); zb-h1
// and zb-v built with pipe_chunk_costs.
struct TrainOptions;
PipeProgram run_program(const TrainOptions& o, int pp);

// What a rank's executor holds besides its strategy's bytes and its
// arenas: on rank 0 (the embedding's) wte's gradient from the head, the
// gathered embedding unit and, under bf16, the rounded copy of wte it
// sends; on the head's rank (if another) the head's copy of wte (in the
// compute type) and its gradient. This TP rank's rows of wte. Training's
// memory check and `dpt plan` count them.
size_t pipeline_buffer_bytes(const Decoder& stage, int pp);

// Every schedule that runs at pp and M for this decoder, with the idle
// fraction the simulator predicts on rank 0 (and its mean over the ranks)
// from costs by FLOPs (pipe_chunk_costs, blocks balanced by parameters):
// per token and block, F = 2 G + 4 T a, B = 2 G + 8 T a (attention's
// backward is all input gradient), W = 2 G, G the block's GEMM parameters
// and a the attention width; the head 2 V C each; transfers free.
struct ScheduleIdle {
  std::string schedule;
  int v = 1;
  double idle_first = 0.0, idle_mean = 0.0;
};
std::vector<ScheduleIdle> pipe_schedule_idles(const DecoderConfig& config, int pp, int micro_batches);

// The activation arenas a rank holds at most under `program`: per chunk,
// the slots it needs (pipe_slot_table) times its arena for micro-batches of
// `micro` (with what a split backward keeps for W).
size_t pipeline_activation_bytes(const Decoder& stage, const PipeProgram& program, int rank, int64_t micro);

class PipelineExecutor : public Executor {
 public:
  // model: this rank's Decoder; strategy: over groups.dp(). Collective over
  // the PP group: the links are made, the head's copy of wte is filled.
  // InputError, one sentence, for a program that cannot run.
  PipelineExecutor(const Mesh& mesh, MeshGroups& groups, Decoder& model, Strategy& strategy, DataSource& data,
                   float loss_scale, PipelineOptions options);
  ~PipelineExecutor() override;
  double run(int64_t step, StepBreakdown& t, Timeline* tl) override;
  double grad_norm_squared() override;
  void after_step() override;
  void save(const std::string& path, const SaveOptions& options) override;
  void gather_weights(float* whole) override {
    gather_pipeline_weights(mesh_, groups_, model_, strategy_, options_.stages, whole);
  }
  // Per operation: its compute and the wait before it; the wait at the end.
  size_t trace_spans() const override { return 2 * ops_.size() + 1; }
  size_t activation_bytes() const override { return model_.arena_bytes_held(); }
  // The schedule and, per rank, its chunks, parameters, the activation
  // arenas it held and the head's copy of wte with its gradient (gathered
  // over the PP group); the measured cost of each kind of operation (F, B,
  // W, BW: the mean over ranks and steps after the first, ms per chunk and
  // micro-batch) and each rank's idle fraction, measured (its waits over
  // its operations and waits) beside the simulator's prediction from those
  // costs (parallel/pipe_program.h, transfers counted as free).
  nlohmann::json detail() override;
  // Each batch through the chunks in order: the last chunk's statistics,
  // zeros on the other ranks (evaluation's combine() sums every rank).
  const ForwardFn* eval_forward() override { return &eval_forward_; }

 private:
  // A direction of one kind between two ranks (kind 0: activations, 1:
  // their gradients): its group and the peer's rank in it.
  struct Link {
    comm::ProcessGroup* group = nullptr;
    int peer = -1;
  };
  Link link(int kind, int from, int to);
  void make_links();
  int me() const { return mesh_.pp_rank; }
  bool first() const { return me() == 0; }
  int rank_of(int chunk) const { return program_.rank_of_chunk[static_cast<size_t>(chunk)]; }
  int chunks() const { return program_.chunks(); }
  bool holds_head() const { return me() == head_rank_; }
  size_t wte_numel() const;
  // Rank 0 gathers wte and sends it (or hands it) to the head's copy.
  void sync_tied_weights();
  // Operation k of this rank's list, timed into t (and tl). A forward
  // returns its micro-batch's loss (the last chunk's; 0 elsewhere).
  double forward_op(size_t k, int64_t step, StepBreakdown& t, Timeline* tl);
  void backward_op(size_t k, int64_t step, StepBreakdown& t, Timeline* tl);  // B or BW
  void weights_op(size_t k, int64_t step, StepBreakdown& t, Timeline* tl);   // W
  // Makes operation k's arena the model's current one.
  void use(size_t k);
  size_t arena(size_t k) const;
  // Where operation k's input comes from another rank: its receive, posted
  // early (while the operation before computes) where its buffer is free.
  void post_receive(size_t k);
  void wait_receive(size_t k);
  // Waits for a send to be received and, in a timed step, notes how long
  // the transfer took (the simulator's transfer cost in the summary).
  void finish_send(std::shared_ptr<comm::Work>& w);
  // The mean of those transfers (0 without any).
  double mean_transfer_ms() const;
  void set_phase(const char* phase);
  // A stage boundary's B x T x C floats (this CP rank's rows of the sequences).
  size_t activation_elements(const Batch& b) const {
    return static_cast<size_t>(b.B * model_.local_rows(b.T) * model_.config().width);
  }

  Mesh mesh_;
  MeshGroups& groups_;
  Decoder& model_;
  Strategy& strategy_;
  DataSource& data_;
  float loss_scale_;
  PipelineOptions options_;
  const PipeProgram& program_;
  std::vector<PipeAction> ops_;  // this rank's list
  PipeSlots slots_;
  int head_rank_ = 0;
  std::vector<std::unique_ptr<comm::ProcessGroup>> link_groups_;
  std::vector<Link> links_;  // [kind][from][to] (several chunks per rank)
  std::vector<Batch> batches_;  // the step's micro-batches, read as the rank's first chunk needs them
  std::vector<char> have_batch_;
  // The head's copy of wte (in the compute type) and the head's gradient
  // for it (fp32); on rank 0: the gradient received and, in a bf16 run, wte
  // rounded for sending (all V x C).
  FlatBuffer tied_w_, tied_g_;
  FlatBuffer embed_unit_;  // rank 0: its embedding unit, gathered
  // Sends in flight per arena: an arena is not reused before they end.
  std::vector<std::shared_ptr<comm::Work>> sends_;
  std::vector<std::shared_ptr<comm::Work>> recvs_;  // per operation, posted early
  std::shared_ptr<comm::Work> tied_send_;
  ForwardFn eval_forward_;
  std::vector<double> norm_parts_;  // the TP group's sums of squares
  // Timing after the first step: per kind of operation (F, B, W, BW) its
  // total ms and count; the rank's waits and its operations' ms.
  void time_op(const PipeAction& a, double busy_ms, double wait_ms);
  std::vector<double> op_ms_, op_count_;  // [kind x chunk]
  double waited_ms_ = 0.0, busy_ms_ = 0.0;
  double transfer_ms_ = 0.0;  // the timed sends' transfers, summed
  int64_t transfers_ = 0;
  bool timing_ = false;  // this step counts
  int64_t first_step_ = -1;
};

}  // namespace dpt
