// Lock-step ranks: how much of a rank's wait for its gradient reductions is
// the wait for a slower rank, and how much is communication.
//
// A data-parallel step ends in a collective that no rank can finish before
// the slowest rank has arrived at it. Each rank is busy from leaving the
// last step's reduction to arriving at this one's (the update, whatever ran
// between the steps, data, forward and backward: StepBreakdown::busy_ms).
// The ranks leave every collective together, so a rank busy for b_r while
// the slowest rank was busy for max_q b_q idles about max_q b_q - b_r at the
// reduction, however fast the network: load imbalance (a slower or busier
// core, a longer batch), not communication. (A lead already waited out at
// a collective on the way, a ZeRO gather, is in both ranks' busy times and
// no longer between them.) Per step, of this rank's comm wait w:
//   for the slower rank = min(w, max_q b_q - b_r)
//   communication       = w - that
// The summary splits the comm wait's median in the proportion of the two
// parts' totals over the steps (the last kLockstepSteps of them), so the
// parts add up to the median the step breakdown shows (medians of the
// parts would not), and a few long waits weigh as much as they cost.
#pragma once

#include <cstddef>
#include <vector>

namespace dpt {

// The share of this rank's comm wait, in total over the steps, that was the
// wait for a slower rank (0 when it never waited). busy: every rank's
// per-step busy times, rank after rank (ranks x steps, the same steps on
// every rank); waits: this rank's comm waits over the same steps.
double slower_rank_share(const std::vector<double>& busy, int ranks, int rank, const std::vector<double>& waits);

// Who held the others up, over the same steps, from every rank's work per
// step (its busy time less its waits at gathers: under ZeRO the lead is
// waited out there, so busy times end up level): the rank that worked
// longest on the most steps (steps where all were equal count for nobody;
// rank -1 when every step was such), on how many, and the median over the
// steps of the spread between the longest and the shortest work (what lock
// step cost the fastest rank that step). A rank that is the slowest on
// nearly every step is a straggler: a slower or busier machine, or a core
// shared with something else.
struct Straggler {
  int rank = -1;             // -1: none
  double share = 0.0;        // of the steps, this rank was the slowest
  double spread_ms = 0.0;    // median of (longest - shortest work)
};
Straggler find_straggler(const std::vector<double>& work, int ranks);

// Whether a run's ranks get the split: more than one rank, every rank
// meeting the others only at the reductions of the same data-parallel
// group, and phases timed as they run. Not under --pp (a pipeline's stages
// wait for each other by design: its bubble), nor --tp (a tensor-parallel
// group's ranks also meet inside forward and backward, and belong to
// different reductions), nor on a GPU (the host's clock sees kernels
// queued, not run: backward's work lands in the comm wait).
inline bool lockstep_split_made(int world, int tp, int pp, bool on_cpu) {
  return world > 1 && tp == 1 && pp == 1 && on_cpu;
}

// The most steps whose busy times the ranks exchange at the end of a run:
// the last ones (a long run's every step would be megabytes per rank).
inline constexpr size_t kLockstepSteps = 4096;

}  // namespace dpt
