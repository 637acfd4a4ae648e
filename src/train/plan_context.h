// The largest context a plan row fits at, per attention mode (issue 35):
// `dpt plan` answers "how long a sequence can this model train at, with
// these ranks and this batch" for the unfused layer (B x heads x T x T
// probabilities kept per block), the fused one (B x heads x T log-sum-exps)
// and the fused one with activation checkpointing (one block's arena).
//
// Not a formula of its own: each candidate context is planned as `dpt plan
// --context T` would plan it (make_plan on the model built at that
// context, so the learned position table and every arena count too), and
// the row's verdict is the plan's fits. The largest context is the largest
// T that fits with T + 1 not fitting (a need that grows with T: searched by
// doubling, then bisecting).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/plan.h"

namespace dpt {

struct ContextLimit {
  std::string mode;     // "unfused", "fused", "fused+ckpt"
  int64_t context = 0;  // the largest that fits; 0: not even one token
  bool capped = false;  // fits at kMaxPlannedContext: the search stopped there
};

inline constexpr int64_t kMaxPlannedContext = int64_t{1} << 20;

// For the row at `point` (its strategy, precision, offload and mesh; the
// mode sets attention and checkpointing): the modes the run's device runs
// (fused on the CPU only). A model without a context (the MLP): empty.
std::vector<ContextLimit> largest_contexts(const PlanRequest& r, const PlanPoint& point);

// Whether the row at `point` fits at context T under `mode`, by make_plan.
bool fits_at_context(const PlanRequest& r, const PlanPoint& point, const std::string& mode, int64_t T);

nlohmann::json context_limits_json(const PlanPoint& point, const std::vector<ContextLimit>& limits);

}  // namespace dpt
