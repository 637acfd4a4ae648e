#include "optim/schedule.h"

#include <cmath>

#include "core/error.h"

namespace dpt {

float Schedule::at(int64_t step) const {
  if (warmup > 0 && step < warmup)
    return lr * static_cast<float>(step + 1) / static_cast<float>(warmup);
  if (kind == "constant") return lr;
  if (kind == "cosine") {
    int64_t span = total_steps - warmup;
    double progress = span > 0 ? static_cast<double>(step - warmup) / static_cast<double>(span) : 1.0;
    if (progress > 1.0) progress = 1.0;
    double c = 0.5 * (1.0 + std::cos(M_PI * progress));
    return static_cast<float>(min_lr + c * (lr - min_lr));
  }
  throw InputError(fmt::format("unknown schedule '{}' (expected constant or cosine)", kind));
}

}  // namespace dpt
