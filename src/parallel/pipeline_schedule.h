// Pipeline helpers shared by the schedules (parallel/pipe_program.h) and
// the plan: the textbook bubble and the blocks each chunk holds.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dpt {

// The idle fraction of a perfectly balanced pipeline: (pp - 1) / (M + pp - 1).
double pipe_bubble(int pp, int micro_batches);

// Blocks per chunk (a stage, or one of a rank's v chunks under virtual
// stages: `pp` counts all chunks here): `split` as given (--pp-split "2,1,1": it must list pp
// counts of at least 1 summing to `layers`), or, when empty, the
// contiguous split whose largest stage holds the fewest parameters, counting
// the embedding (`embed` parameters) on the first stage and the head (`head`)
// on the last, each block `block` parameters. Throws InputError, one
// sentence, for a split that cannot be.
std::vector<int64_t> pipe_split(const std::string& split, int pp, int64_t layers, int64_t embed, int64_t block,
                                int64_t head, int v = 1);

}  // namespace dpt
