// A run's checkpoint glue: resuming from one, writing one when due or when a
// signal stops the run, and what a checkpoint records of the run.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "comm/process_group.h"
#include "models/model.h"
#include "parallel/strategy.h"
#include "train/checkpoint.h"
#include "train/data_source.h"
#include "train/train.h"

namespace dpt {

// What a checkpoint of the state after `step` steps says of the run. (Its
// world, the ranks that write files, is write_checkpoint's to count.)
CheckpointInfo checkpoint_info(const TrainOptions& o, const Model& model, const DataSource& data, int64_t step);

// Loads the checkpoint into the strategy, moves the data to where it
// stood, and tells the user what continues. Returns the step to start at.
int64_t resume_from(const std::string& path, const CheckpointInfo& saved, const TrainOptions& o, Model& model,
                    Strategy& strategy, DataSource& data, comm::ProcessGroup& pg, int64_t steps, TrainResult& r);

// Writes a checkpoint of the state after `done` steps and counts its time
// and bytes in r. Returns its path.
std::string checkpoint_now(const TrainOptions& o, const Model& model, Strategy& strategy, const DataSource& data,
                           comm::ProcessGroup& pg, int64_t done, TrainResult& r);

// With checkpoints on, after `done` steps: every rank learns of a signal
// any rank got, and a checkpoint is written when one is due or a signal
// came. Returns the checkpoint's path when a signal stops the run here.
std::optional<std::string> checkpoint_or_stop(const TrainOptions& o, const Model& model, Strategy& strategy,
                                              const DataSource& data, comm::ProcessGroup& pg, int64_t done,
                                              int64_t steps, TrainResult& r);

}  // namespace dpt
