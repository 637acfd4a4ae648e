// Pipeline schedules as data (issue 32's first part): every rank's list of
// operations for one optimizer step, a validator of such lists, and a
// simulator of the bubble they leave. Pure functions: the executor that
// runs any list is the next step (train/pipeline_executor.h runs gpipe and
// 1f1b today, through pipe_ops).
//
// The model's blocks are cut into S = pp x v chunks, chunk c holding the
// c-th range of blocks; chunk 0 has the embedding, chunk S - 1 the head.
// An operation is one chunk's pass over one micro-batch:
//   F   forward;
//   BW  backward, input and weight gradients together (gpipe, 1f1b,
//       interleaved);
//   B   the input gradient alone (on the critical path: the previous chunk
//       waits for it);
//   W   the weight gradient alone, any time after its B (zero-bubble
//       schedules move it into the bubble).
// Placements: one chunk per rank (v = 1: chunk r on rank r); interleaved
// (rank r holds chunks r, r + pp, r + 2 pp, ...); V (v = 2: rank r holds
// chunks r and 2 pp - 1 - r, so the first and the last chunk are both on
// rank 0).
//
// Schedules (M micro-batches):
//   gpipe        every F, then every BW, in micro-batch order.
//   1f1b         pp - r - 1 forwards, then F and BW in turn, then the rest.
//   interleaved  Megatron-LM's interleaved 1F1B over v chunks per rank,
//                micro-batches in groups of pp (M a multiple of pp).
//   zb-h1        1f1b's order with each backward split: B where 1f1b has
//                BW, W deferred into what would be idle time, at most
//                1f1b's activations in flight (Qi et al., "Zero Bubble
//                Pipeline Parallelism", ICLR 2024, schedule ZB-H1).
//   zb-v         V placement, B before F before W wherever ready, at most
//                2 pp chunk activations in flight per rank (1f1b's peak in
//                blocks): the same paper's ZB-V idea, built greedily.
// Every schedule runs each chunk's BW (or W) in micro-batch order, so the
// weight gradients accumulate in the order one process sums them.
#pragma once

#include <string>
#include <vector>

namespace dpt {

struct PipeAction {
  enum Kind { F, B, W, BW };
  Kind kind = F;
  int chunk = 0;
  int micro = 0;
  bool operator==(const PipeAction&) const = default;
};
std::string pipe_action_name(const PipeAction& a);  // "F(chunk 2, micro 5)"

struct PipeProgram {
  std::string schedule;
  int pp = 1, v = 1, micro_batches = 1;
  std::vector<int> rank_of_chunk;               // [pp x v]
  std::vector<std::vector<PipeAction>> ranks;   // each rank's operations, in order
  int chunks() const { return static_cast<int>(rank_of_chunk.size()); }
};

// The names --pp-schedule takes, and a schedule's program. InputError, one
// sentence, for an unknown name or a shape it cannot run (interleaved with
// M not a multiple of pp, v < 2 for interleaved, v != 2 for zb-v).
std::vector<std::string> pipe_program_names();
PipeProgram pipe_program(const std::string& schedule, int pp, int v, int micro_batches);

// What a list implies, or why it cannot run.
struct PipeCheck {
  std::string error;            // empty when the program is valid
  std::vector<int> peak_held;   // per rank: chunk activations held at once (F done, its B not)
  std::vector<int> peak_w;      // per rank: micro-batch chunks waiting for their W at once
};
// Checks every chunk's F, and BW or B and W, appear once each on the
// chunk's rank; on each rank F before B (or BW) before W; every send (an
// F to the next chunk's rank, a B to the previous chunk's) has its
// receiving operation; and a run of the lists completes (no cycle of
// waits). The first problem found is one sentence naming the operation.
PipeCheck check_pipe_program(const PipeProgram& p);

// Per chunk costs of its operations and of a transfer between ranks (any
// unit); BW costs b + w.
struct PipeCosts {
  double f = 1.0, b = 1.0, w = 1.0, transfer = 0.0;
};
struct PipeSimulation {
  double step = 0.0;          // the last operation's end
  std::vector<double> idle;   // per rank: 1 - busy / step
};
// Runs the lists with the costs: an operation starts when its rank is free
// and its inputs have arrived. The program must be valid.
PipeSimulation simulate_pipe_program(const PipeProgram& p, const PipeCosts& costs);

}  // namespace dpt
