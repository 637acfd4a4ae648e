// Lock-step ranks: how much of a rank's wait for its gradient reductions is
// the wait for a slower rank, and how much is communication.
//
// A data-parallel step ends in a collective that no rank can finish before
// the slowest rank has arrived at it. A rank whose forward and backward took
// b_r while the slowest rank's took max_q b_q idles about max_q b_q - b_r
// there, however fast the network: load imbalance (a slower or busier core,
// a longer batch), not communication. Per step, of this rank's comm wait w:
//   for the slowest = min(w, max_q b_q - b_r)
//   communication   = w - for the slowest
// Steps start together (the last one ended in a collective every rank left
// together), so the busy times, each measured from its rank's own step
// start, are comparable across ranks. The summary splits the comm wait's
// median in the proportion of the two parts' totals over the steps, so the
// parts add up to the median the step breakdown shows (medians of the
// parts would not).
#pragma once

#include <cstddef>
#include <vector>

namespace dpt {

// The share of this rank's comm wait, in total over the steps, that was the
// wait for a slower rank (0 when it never waited). busy: every rank's
// per-step busy times, rank after rank (ranks x steps, the same steps on
// every rank); waits: this rank's comm waits over the same steps.
double slower_rank_share(const std::vector<double>& busy, int ranks, int rank, const std::vector<double>& waits);

// The most steps whose busy times the ranks exchange at the end of a run:
// the last ones (a long run's every step would be megabytes per rank).
inline constexpr size_t kLockstepSteps = 4096;

}  // namespace dpt
