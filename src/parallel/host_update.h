// ZeRO-Offload's update for a model on a GPU (`--offload optimizer` with
// `--device cuda`; docs/gpu.md, "Offload from GPU memory"): the optimizer
// state lives off the GPU (page-locked host memory, or the offload file),
// and so does an fp32 copy of the parameters the update writes; each step
// the gradients come down, the CPU cores run the same update the GPU would
// have run, and the new parameters (and a bf16 run's compute copy) go back
// up. No step is delayed: the next forward sees this step's parameters, as
// without offload.
#pragma once

#include <cstddef>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "device/kernels.h"
#include "device/pinned.h"
#include "optim/optimizer.h"

namespace dpt {

class HostUpdate {
 public:
  // For an optimizer over n parameters of a model whose buffers are on the
  // device `k` computes on. Host buffers are pinned for the device
  // (Kernels::pinned_alloc); the bf16 copy's at the first step that asks
  // for one.
  HostUpdate(const Kernels& k, size_t n);

  // One update of the n device parameters at `params` from the device
  // gradients `grads` (zeroed after it with GradsAfter::Zeroed), writing
  // the device bf16 copy `copy16` when given. `opt`'s tier is on the host.
  void step(Optimizer& opt, float* params, float* grads, bf16* copy16, float lr, GradsAfter after);
  // The device parameters were written outside the update (a checkpoint
  // read, a broadcast): the next step reads them down again first.
  void stale() { synced_ = false; }

  // Page-locked host bytes: the fp32 parameters, the gradients' landing
  // buffer and the bf16 copy's (not the optimizer state: its tier's).
  size_t host_bytes() const;
  // Per step so far: bytes down and up, and the seconds of each part.
  nlohmann::json detail() const;

 private:
  const Kernels& k_;
  size_t n_;
  Pinned<float> params_;  // the fp32 parameters the update writes
  Pinned<float> grads_;
  Pinned<bf16> copy16_;
  bool synced_ = false;  // params_ holds the device's parameters
  double down_s_ = 0, update_s_ = 0, up_s_ = 0;
  size_t down_bytes_ = 0, up_bytes_ = 0;
  int steps_ = 0;
};

// A strategy's offload detail (the summary's `offload`): its tier's, with
// the host updates' under "host_update" (bytes and seconds per step, summed
// over them: a ZeRO rank has one per shard); null pointers are skipped, and
// without any update it is the tier's alone.
nlohmann::json with_host_updates(nlohmann::json tier_detail, const std::vector<const HostUpdate*>& hosts);

}  // namespace dpt
