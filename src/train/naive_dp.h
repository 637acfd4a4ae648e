// Naive data parallelism in one process (--strategy dp; train/naive_dp.cpp):
// a training loop of its own, kept to be measured against DDP.
#pragma once

#include "train/train.h"

namespace dpt {

TrainResult run_dp_training(const TrainOptions& opts);

}  // namespace dpt
