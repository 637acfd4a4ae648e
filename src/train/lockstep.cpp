#include "train/lockstep.h"

#include <algorithm>

#include "core/error.h"
#include "core/stats.h"

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

Straggler find_straggler(const std::vector<double>& work, int ranks) {
  DPT_CHECK(ranks > 0 && work.size() % static_cast<size_t>(ranks) == 0, "{} work times over {} ranks", work.size(),
            ranks);
  const size_t steps = work.size() / static_cast<size_t>(ranks);
  if (steps == 0) return {};
  std::vector<size_t> slowest_on(static_cast<size_t>(ranks), 0);
  std::vector<double> spread(steps);
  for (size_t s = 0; s < steps; ++s) {
    int slowest = 0;
    double lo = work[s], hi = work[s];
    for (int q = 1; q < ranks; ++q) {
      const double b = work[static_cast<size_t>(q) * steps + s];
      if (b > hi) hi = b, slowest = q;
      lo = std::min(lo, b);
    }
    if (hi > lo) ++slowest_on[static_cast<size_t>(slowest)];
    spread[s] = hi - lo;
  }
  const auto most = std::max_element(slowest_on.begin(), slowest_on.end());
  if (*most == 0) return {.spread_ms = median(std::move(spread))};
  return {static_cast<int>(most - slowest_on.begin()), static_cast<double>(*most) / static_cast<double>(steps),
          median(std::move(spread))};
}

}  // namespace dpt
