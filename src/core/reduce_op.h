// How a collective combines the ranks' values. A plain type of its own, below
// everything that names it: the communication layer (comm/) and the device
// backends that run collectives (device/cuda_backend.h) both take it.
#pragma once

namespace dpt {

enum class ReduceOp { Sum, Avg, Max };

}  // namespace dpt
