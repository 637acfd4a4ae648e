// Pipeline schedules as data: every rank's list of operations for one
// optimizer step, a validator of such lists, and a simulator of the bubble
// they leave. Pure functions; train/pipeline_executor.h runs any valid list.
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
// The zero-bubble lists are built by running them: with `costs` given
// (each chunk's F, B and W and the transfer), the builder runs with them
// and with unit costs and keeps the list of the shorter simulated step
// under `costs` (the greedy choice is a heuristic: either can win; a tie
// keeps the unit one). The training run gives its chunks' FLOPs
// (train/pipeline_executor.h: pipe_chunk_costs).
// Every schedule runs each chunk's BW (or W) in micro-batch order, so the
// weight gradients accumulate in the order one process sums them.
#pragma once

#include <array>
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

// Per chunk costs of its operations and of a transfer between ranks (any
// unit); BW costs b + w. `chunk` (when not empty: one {f, b, w} per chunk)
// gives each chunk its own (chunks differ: the embedding's, the head's).
struct PipeCosts {
  double f = 1.0, b = 1.0, w = 1.0, transfer = 0.0;
  std::vector<std::array<double, 3>> chunk;
};
double pipe_cost_of(const PipeAction& a, const PipeCosts& costs);

// The names --pp-schedule takes, and a schedule's program. InputError, one
// sentence, for an unknown name or a shape it cannot run (interleaved with
// M not a multiple of pp, v < 2 for interleaved, v != 2 for zb-v).
std::vector<std::string> pipe_program_names();
PipeProgram pipe_program(const std::string& schedule, int pp, int v, int micro_batches,
                         const PipeCosts& costs = {});
// Chunks per rank for --virtual-stages v (0: the schedule's own: 2 for
// interleaved and zb-v, 1 for the rest).
int pipe_virtual_stages(const std::string& schedule, int v);

// What a list implies, or why it cannot run.
struct PipeCheck {
  std::string error;            // empty when the program is valid
  std::vector<int> peak_held;   // per rank: chunk activations held at once (F done, its B not)
  std::vector<int> peak_w;      // per rank: micro-batch chunks waiting for their W at once
};
// Checks every chunk's F, and BW or B and W, appear once each on the
// chunk's rank; on each rank F before B (or BW) before W; every send (an
// F to the next chunk's rank, a B to the previous chunk's) has its
// receiving operation; the messages from one rank to another of one kind
// (activations, gradients) are received in the order they are sent (a
// link delivers them in order, and they are all the same size: a
// mismatch would be read silently into the wrong micro-batch); and a run
// of the lists completes (no cycle of waits). The first problem found is
// one sentence naming the operation.
PipeCheck check_pipe_program(const PipeProgram& p);

// The idle fraction of a balanced pipeline under the program, by formula
// where the schedule has one: (pp - 1) / (M + pp - 1) for gpipe and 1f1b,
// (pp - 1) / (v M + pp - 1) for interleaved; for the zero-bubble ones the
// simulator's, with F, B and W of equal cost and free transfers (rank 0's).
double pipe_bubble_of(const PipeProgram& p);

// The message an operation sends to, or receives from, another rank: kind
// 0 an F's output for the next chunk, kind 1 a B's (or BW's) input
// gradient for the previous one; none (peer -1) when that chunk is on the
// operation's own rank (passed by copying) or there is none.
struct PipeMessage {
  int kind = -1, peer = -1;
  explicit operator bool() const { return peer >= 0; }
};
PipeMessage pipe_send(const PipeProgram& p, const PipeAction& a);
PipeMessage pipe_receive(const PipeProgram& p, const PipeAction& a);

// Whether the program splits backwards into B and W (zb-h1, zb-v).
bool pipe_splits_backward(const PipeProgram& p);

// Where a rank keeps each micro-batch's activations: the rank's chunks in
// increasing order (`chunks`), and for local chunk i the arena slot of each
// micro-batch (of[i][m]: the lowest slot free when its F runs; a slot is
// free again after the micro-batch's BW or W) and the slots it needs
// (count[i]). free_at[i][m]: the index in the rank's list of the operation
// after which of[i][m] was last freed (-1: never used before).
struct PipeSlots {
  std::vector<int> chunks;
  std::vector<std::vector<int>> of, free_at;
  std::vector<int> count;
  int local(int chunk) const;  // the index of a chunk of this rank in chunks
};
PipeSlots pipe_slot_table(const PipeProgram& p, int rank);
// The arenas a rank holds, over all its chunks (one chunk per rank: gpipe
// M, 1f1b min(M, pp - r), zb-h1 its F-to-W window).
int pipe_arenas(const PipeProgram& p, int rank);

struct PipeSimulation {
  double step = 0.0;          // the last operation's end
  std::vector<double> idle;   // per rank: 1 - busy / step
};
// Runs the lists with the costs: an operation starts when its rank is free
// and its inputs have arrived. The program must be valid.
PipeSimulation simulate_pipe_program(const PipeProgram& p, const PipeCosts& costs);

}  // namespace dpt
