// The lock-step split of a rank's comm wait (train/lockstep.h): the share a
// slower rank's forward and backward explain; the rest is communication.
#include "train/lockstep.h"

#include <gtest/gtest.h>

#include <vector>

#include "core/error.h"

namespace dpt {
namespace {

// Two ranks, three steps; rank 1 is slower by 3 ms on two steps and faster
// by 1 ms on one.
const std::vector<double> kBusy = {10.0, 10.0, 12.0,   // rank 0
                                   13.0, 13.0, 11.0};  // rank 1

TEST(Lockstep, TheFasterRanksWaitIsTheSlowerRanksLead) {
  // Rank 0 waited 3.5 ms on the steps where rank 1 was 3 ms behind, and
  // not at all when it was the slower one: 6 of its 7 ms.
  EXPECT_DOUBLE_EQ(slower_rank_share(kBusy, 2, 0, {3.5, 3.5, 0.0}), 6.0 / 7.0);
}

TEST(Lockstep, TheSlowestRankWaitsOnlyForCommunication) {
  // Rank 1 waited for rank 0 on the one step rank 0 was 1 ms behind: 1 of
  // its 2 ms; on the others its wait was communication.
  EXPECT_DOUBLE_EQ(slower_rank_share(kBusy, 2, 1, {0.5, 0.5, 1.0}), 0.5);
  EXPECT_DOUBLE_EQ(slower_rank_share({5.0, 4.0}, 2, 0, {0.25}), 0.0);
}

TEST(Lockstep, AWaitShorterThanTheLeadIsAllForTheSlowerRank) {
  // Collectives that overlapped the lead (a first bucket sent early) can
  // leave less wait than the busy times differ by: none of it is then
  // communication, and the share does not pass 1.
  EXPECT_DOUBLE_EQ(slower_rank_share(kBusy, 2, 0, {2.0, 2.0, 0.0}), 1.0);
}

TEST(Lockstep, TheSlowestOfManyRanksSetsTheLead) {
  const std::vector<double> busy = {1.0, 4.0, 2.0};  // three ranks, one step
  EXPECT_DOUBLE_EQ(slower_rank_share(busy, 3, 0, {4.0}), 0.75);
  EXPECT_DOUBLE_EQ(slower_rank_share(busy, 3, 2, {4.0}), 0.5);
}

TEST(Lockstep, NoWaitHasNoShare) { EXPECT_EQ(slower_rank_share(kBusy, 2, 0, {0.0, 0.0, 0.0}), 0.0); }

TEST(Lockstep, TheStragglerIsTheRankSlowestMostOften) {
  // Rank 1 is the slowest on two of three steps; the spreads are 3, 3, 1.
  const Straggler s = find_straggler(kBusy, 2);
  EXPECT_EQ(s.rank, 1);
  EXPECT_DOUBLE_EQ(s.share, 2.0 / 3.0);
  EXPECT_DOUBLE_EQ(s.spread_ms, 3.0);
  // Three ranks, two steps: rank 2 the slowest on both.
  const Straggler t = find_straggler({1.0, 2.0, 3.0, 1.0, 5.0, 4.0}, 3);
  EXPECT_EQ(t.rank, 2);
  EXPECT_DOUBLE_EQ(t.share, 1.0);
  EXPECT_DOUBLE_EQ(t.spread_ms, 4.0);  // the upper median of the spreads 4 and 3 (core/stats.h)
  EXPECT_EQ(find_straggler({}, 2).rank, -1);
}

TEST(Lockstep, EqualRanksHaveNoStraggler) {
  // A step where all were equal counts for nobody: rank 1 was slower on one
  // step of three; on two, nobody was.
  const Straggler s = find_straggler({2.0, 2.0, 2.0, 2.0, 2.0, 3.0}, 2);
  EXPECT_EQ(s.rank, 1);
  EXPECT_DOUBLE_EQ(s.share, 1.0 / 3.0);
  EXPECT_EQ(find_straggler({2.0, 2.0, 2.0, 2.0}, 2).rank, -1);
}

TEST(Lockstep, MismatchedSizesAreABug) {
  EXPECT_THROW(slower_rank_share(kBusy, 2, 0, {1.0, 1.0}), InternalError);
  EXPECT_THROW(slower_rank_share(kBusy, 2, 2, {1.0, 1.0, 1.0}), InternalError);
  EXPECT_THROW(find_straggler(kBusy, 4), InternalError);
}

}  // namespace
}  // namespace dpt
