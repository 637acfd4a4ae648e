// The whole model's weights gathered from a pipeline's stages into memory,
// for training's samples (Executor::gather_weights, train/sample.h). Kept
// apart from the pipeline executor, which calls it with its own state.
#pragma once

#include <vector>

#include "models/decoder.h"
#include "parallel/mesh.h"
#include "parallel/strategy.h"

namespace dpt {

// Collective over every rank of the mesh: each stage's parameters gathered
// over its data-parallel group (and its slices over its TP group), then
// replica 0's stages (their TP rank 0) send theirs to the first stage's,
// which is rank 0 of the job and places them in `whole` (the layout of
// Decoder(config); nullptr on every other rank). `model`: this rank's
// stage; `stages`: every stage's blocks, in order. What
// PipelineExecutor::save writes, in memory.
void gather_pipeline_weights(const Mesh& mesh, MeshGroups& groups, const Decoder& model, Strategy& strategy,
                             const std::vector<DecoderStage>& stages, float* whole);

}  // namespace dpt
