// The lock-step split of a rank's comm wait (train/lockstep.h): the part a
// slower rank's forward and backward explain, and communication.
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
  // Rank 0 waited 3.25 ms on the steps where rank 1 was 3 ms behind, and
  // 0.5 ms when it was the slower one.
  const LockstepSplit s = lockstep_split(kBusy, 2, 0, {3.25, 3.25, 0.5});
  EXPECT_DOUBLE_EQ(s.slowest_ms, 3.0);
  EXPECT_DOUBLE_EQ(s.comm_ms, 0.25);
}

TEST(Lockstep, TheSlowestRankWaitsOnlyForCommunication) {
  const LockstepSplit s = lockstep_split(kBusy, 2, 1, {0.25, 0.25, 1.5});
  EXPECT_DOUBLE_EQ(s.slowest_ms, 0.0);
  EXPECT_DOUBLE_EQ(s.comm_ms, 0.25);
}

TEST(Lockstep, AWaitShorterThanTheLeadIsAllForTheSlowerRank) {
  // Collectives that overlapped the lead (a first bucket sent early) can
  // leave less wait than the busy times differ by: none of it is then
  // communication, and none goes negative.
  const LockstepSplit s = lockstep_split(kBusy, 2, 0, {2.0, 2.0, 0.0});
  EXPECT_DOUBLE_EQ(s.slowest_ms, 2.0);
  EXPECT_DOUBLE_EQ(s.comm_ms, 0.0);
}

TEST(Lockstep, TheSlowestOfManyRanksSetsTheLead) {
  const std::vector<double> busy = {1.0, 4.0, 2.0};  // three ranks, one step
  EXPECT_DOUBLE_EQ(lockstep_split(busy, 3, 0, {3.5}).slowest_ms, 3.0);
  EXPECT_DOUBLE_EQ(lockstep_split(busy, 3, 2, {3.5}).slowest_ms, 2.0);
  EXPECT_DOUBLE_EQ(lockstep_split(busy, 3, 2, {3.5}).comm_ms, 1.5);
}

TEST(Lockstep, MismatchedSizesAreABug) {
  EXPECT_THROW(lockstep_split(kBusy, 2, 0, {1.0, 1.0}), InternalError);
  EXPECT_THROW(lockstep_split(kBusy, 2, 2, {1.0, 1.0, 1.0}), InternalError);
}

}  // namespace
}  // namespace dpt
