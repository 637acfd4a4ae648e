// Tensor parallelism for the GPT (Megatron-LM; docs/tensor_parallel.md): what
// the run needs besides the model's sliced layout and its two all-reduces
// per block each way (models/decoder.h): the refusals, the global gradient norm
// over the TP group, and saving the whole model from its slices.
#pragma once

#include <functional>
#include <string>

#include "comm/process_group.h"
#include "models/decoder.h"
#include "models/weights.h"
#include "parallel/mesh.h"
#include "parallel/strategy.h"
#include "tensor/flat_buffer.h"

namespace dpt {

// Refuses, in one sentence, resuming a checkpoint whose wte rows a
// vocabulary-parallel wte cannot split over tp ranks: a fresh run pads the
// rows to a multiple of tp, but a checkpoint holds no values for pad rows
// it did not have.
void check_vocab_rows(const DecoderConfig& c, int tp);

// Collective over g: the sum of every rank's value, added in rank order so
// every rank gets the same double. parts: g.size() doubles of scratch.
double sum_in_rank_order(comm::ProcessGroup& g, double mine, std::vector<double>& parts);

// Collective over tp: unit u of `whole` (the same stage as `model`, held
// whole: DecoderTp{}) into out, from this rank's values of its own unit u
// (`mine`): each sliced tensor all-gathered, one at a time, and put in its
// place. Tensors every TP rank holds whole are checked to be bitwise the
// same on all of them (InternalError naming the tensor otherwise): their
// gradients are the same by construction, so their updates must be too.
// scratch grows to what a tensor's gather needs.
void gather_slices(const Decoder& model, const Decoder& whole, comm::ProcessGroup& tp, int unit, const float* mine,
                   float* out, FlatBuffer& scratch);

// Collective over every rank: unit by unit, the whole tensors of each unit
// of `model`'s stage (the layout of Decoder(config, stage)) handed to
// take(u, values) on replica 0's ranks. Each unit is gathered over the DP
// group by the strategy, then replica 0's TP ranks gather its slices
// (gather_slices: no rank holds more than one unit of the whole model).
void gather_whole_units(Strategy& strategy, const Decoder& model, const Mesh& mesh, comm::ProcessGroup& tp,
                        const std::function<void(int, const float*)>& take);

// Collective over every rank: writes the whole model's PyTorch-named file
// from the slices (gather_whole_units); `lead` writes it.
void save_tensor_parallel(Strategy& strategy, const Decoder& model, const Mesh& mesh, comm::ProcessGroup& tp,
                          const std::string& path, const SaveOptions& options, bool lead);

}  // namespace dpt
