// Learning-rate schedules: constant, or linear warm-up then cosine decay to
// min_lr (the GPT-2/nanoGPT schedule).
#pragma once

#include <cstdint>
#include <string>

namespace dpt {

struct Schedule {
  std::string kind = "constant";  // "constant" or "cosine"
  float lr = 0.05f;
  float min_lr = 0.0f;   // cosine: the rate reached at total_steps
  int64_t warmup = 0;    // steps of linear warm-up from lr/warmup to lr
  int64_t total_steps = 1;

  // The rate for step (0-based).
  float at(int64_t step) const;
};

}  // namespace dpt
