#include "train/lockstep.h"

#include <algorithm>

#include "core/error.h"

namespace dpt {

double slower_rank_share(const std::vector<double>& busy, int ranks, int rank, const std::vector<double>& waits) {
  const size_t steps = waits.size();
  DPT_CHECK(ranks > 0 && rank >= 0 && rank < ranks && busy.size() == steps * static_cast<size_t>(ranks),
            "lock-step split of {} busy times over {} ranks and {} steps", busy.size(), ranks, steps);
  double for_slower = 0.0, waited = 0.0;
  for (size_t s = 0; s < steps; ++s) {
    double most = 0.0;
    for (int q = 0; q < ranks; ++q) most = std::max(most, busy[static_cast<size_t>(q) * steps + s]);
    const double behind = most - busy[static_cast<size_t>(rank) * steps + s];
    for_slower += std::min(waits[s], behind);
    waited += waits[s];
  }
  return waited > 0.0 ? for_slower / waited : 0.0;
}

}  // namespace dpt
