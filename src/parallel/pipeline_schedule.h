// What each pipeline stage does in one optimizer step, and which blocks it
// holds: pure functions of the mesh and the flags, shared by the training
// loop and its tests.
//
// Schedules (M micro-batches, pp stages, stage s counted from 0):
//   gpipe  every forward, then every backward, in micro-batch order: M
//          micro-batches' activations held on every stage.
//   1f1b   pp - s - 1 forwards to fill the pipeline, then one forward and
//          one backward in turn, then the remaining backwards: at most
//          pp - s micro-batches held on stage s.
// Both run the backwards in micro-batch order, so the last backward of a
// step is micro-batch M - 1's on every stage (the gradient reductions start
// there, and the tied embedding's exchange waits for it).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dpt {

enum class PipeSchedule { GPipe, OneFOneB };
PipeSchedule parse_pipe_schedule(const std::string& s);  // throws InputError
const char* pipe_schedule_name(PipeSchedule s);          // "gpipe", "1f1b"

struct PipeOp {
  bool forward = true;
  int micro = 0;  // the micro-batch, 0 .. M - 1
};
std::vector<PipeOp> pipe_ops(PipeSchedule schedule, int pp, int stage, int micro_batches);

// Activation arenas stage s holds (micro-batches in flight at most), and
// the one micro-batch m uses: M for gpipe, min(M, pp - s) for 1f1b.
int pipe_slots(PipeSchedule schedule, int pp, int stage, int micro_batches);
inline int pipe_slot(int micro, int slots) { return micro % slots; }

// The idle fraction of a perfectly balanced pipeline: (pp - 1) / (M + pp - 1).
double pipe_bubble(int pp, int micro_batches);

// Blocks per stage: `split` as given (--pp-split "2,1,1": it must list pp
// counts of at least 1 summing to `layers`), or, when empty, the
// contiguous split whose largest stage holds the fewest parameters, counting
// the embedding (`embed` parameters) on the first stage and the head (`head`)
// on the last, each block `block` parameters. Throws InputError, one
// sentence, for a split that cannot be.
std::vector<int64_t> pipe_split(const std::string& split, int pp, int64_t layers, int64_t embed, int64_t block,
                                int64_t head);

}  // namespace dpt
