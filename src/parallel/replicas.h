// Replicated-model helpers of the data-parallel strategies.
#pragma once

#include <cstdint>

#include "comm/process_group.h"
#include "models/model.h"
#include "optim/optimizer.h"

namespace dpt {

// Compares every rank's parameter hash with rank 0's; throws InternalError
// naming the first rank that differs. `step` is for the message.
void verify_replicas(const Model& model, comm::ProcessGroup& pg, int64_t step);
// The same for a replicated buffer (a mixed-precision run's bf16 copies).
void verify_replicas(const void* data, size_t bytes, comm::ProcessGroup& pg, int64_t step);

// Collective: every rank's chunk (comm::chunk_range) of each state tensor
// of `opt` copied to every other rank, as an all-gather would, but through
// the optimizer's tier in pieces of at most `piece` elements, so offloaded
// state never needs RAM of its size. After a replicated strategy's resume.
void gather_optimizer_state(Optimizer& opt, comm::ProcessGroup& pg, size_t piece = size_t{1} << 20);

}  // namespace dpt
