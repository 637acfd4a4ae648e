// The mesh's layout and the pipeline's schedules and splits: pure functions
// (parallel/mesh.h, parallel/pipeline_schedule.h), checked without ranks.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "parallel/mesh.h"
#include "parallel/pipe_program.h"
#include "parallel/pipeline_schedule.h"

namespace dpt {
namespace {

TEST(Mesh, MegatronLayoutPipelineOutermost) {
  // 8 ranks, pp 2: ranks 0-3 are stage 0 (replicas 0-3), 4-7 stage 1.
  for (int rank = 0; rank < 8; ++rank) {
    const Mesh m = Mesh::layout(8, rank, 1, 2);
    EXPECT_EQ(m.dp, 4);
    EXPECT_EQ(m.pp_rank, rank / 4);
    EXPECT_EQ(m.dp_rank, rank % 4);
    EXPECT_EQ(m.tp_rank, 0);
    EXPECT_EQ(m.rank_of(m.tp_rank, m.dp_rank, m.pp_rank), rank);
  }
}

TEST(Mesh, MegatronLayoutTensorParallelInnermost) {
  // 8 ranks, tp 2 x pp 2: pairs of adjacent ranks share a slice group,
  // replicas next, stages outermost.
  for (int rank = 0; rank < 8; ++rank) {
    const Mesh m = Mesh::layout(8, rank, 2, 2);
    EXPECT_EQ(m.dp, 2);
    EXPECT_EQ(m.tp_rank, rank % 2);
    EXPECT_EQ(m.dp_rank, rank / 2 % 2);
    EXPECT_EQ(m.pp_rank, rank / 4);
    EXPECT_EQ(m.rank_of(m.tp_rank, m.dp_rank, m.pp_rank), rank);
  }
}

TEST(Mesh, ImpossibleMeshesAreRefused) {
  EXPECT_THROW(Mesh::layout(3, 0, 1, 2), InputError);  // 3 ranks, 2 stages
  EXPECT_THROW(Mesh::layout(4, 0, 3, 1), InputError);  // 4 ranks, tp 3
  EXPECT_THROW(Mesh::layout(4, 0, 1, 0), InputError);
  try {
    Mesh::layout(6, 0, 1, 4);
    FAIL() << "6 ranks into 4 stages";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), "6 ranks do not split into --tp 1 x --pp 4 (a multiple of 4 is needed)");
  }
}

// gpipe and 1f1b as lists: every micro-batch forward once and backward
// once, its backward after its forward, backwards in micro-batch order; the
// arenas the slot table gives never shared by two micro-batches in flight,
// and as many as the most in flight.
void check_schedule(const std::string& name, int pp, int stage, int M) {
  SCOPED_TRACE(testing::Message() << name << " pp " << pp << " stage " << stage << " M " << M);
  const PipeProgram p = pipe_program(name, pp, 1, M);
  const std::vector<PipeAction>& ops = p.ranks[static_cast<size_t>(stage)];
  ASSERT_EQ(ops.size(), 2u * static_cast<size_t>(M));
  const PipeSlots slots = pipe_slot_table(p, stage);
  ASSERT_EQ(slots.chunks, std::vector<int>{stage});
  std::vector<int> forwarded, backwarded;
  std::set<int> in_flight;
  size_t most = 0;
  for (const PipeAction& a : ops) {
    if (a.kind == PipeAction::F) {
      for (int other : in_flight) EXPECT_NE(slots.of[0][static_cast<size_t>(other)], slots.of[0][static_cast<size_t>(a.micro)]);
      forwarded.push_back(a.micro);
      in_flight.insert(a.micro);
    } else {
      EXPECT_EQ(a.kind, PipeAction::BW);
      EXPECT_TRUE(in_flight.count(a.micro)) << "backward " << a.micro << " before its forward";
      backwarded.push_back(a.micro);
      in_flight.erase(a.micro);
    }
    most = std::max(most, in_flight.size());
  }
  std::vector<int> order(static_cast<size_t>(M));
  for (int m = 0; m < M; ++m) order[static_cast<size_t>(m)] = m;
  EXPECT_EQ(forwarded, order);
  EXPECT_EQ(backwarded, order);
  EXPECT_EQ(most, static_cast<size_t>(pipe_arenas(p, stage)));
}

TEST(PipeSchedule, EveryStageEveryMicroBatch) {
  for (const char* s : {"gpipe", "1f1b"})
    for (int pp : {2, 3, 4})
      for (int stage = 0; stage < pp; ++stage)
        for (int M : {1, 2, 3, 4, 8}) check_schedule(s, pp, stage, M);
}

TEST(PipeSchedule, SlotsHeld) {
  EXPECT_EQ(pipe_arenas(pipe_program("gpipe", 4, 1, 8), 0), 8);
  EXPECT_EQ(pipe_arenas(pipe_program("gpipe", 4, 1, 8), 3), 8);
  for (int s = 0; s < 4; ++s) EXPECT_EQ(pipe_arenas(pipe_program("1f1b", 4, 1, 8), s), 4 - s);
  EXPECT_EQ(pipe_arenas(pipe_program("1f1b", 4, 1, 2), 0), 2);  // fewer micro-batches than stages
  // 1f1b on the first of 3 stages: 2 forwards to fill, then alternate.
  std::string seq;
  const PipeProgram p = pipe_program("1f1b", 3, 1, 4);
  for (const PipeAction& a : p.ranks[0]) {
    seq += a.kind == PipeAction::F ? 'F' : 'B';
    seq += std::to_string(a.micro);
    seq += ' ';
  }
  EXPECT_EQ(seq, "F0 F1 F2 B0 F3 B1 B2 B3 ");
}

TEST(PipeSchedule, Bubble) {
  EXPECT_DOUBLE_EQ(pipe_bubble(2, 8), 1.0 / 9.0);
  EXPECT_DOUBLE_EQ(pipe_bubble(4, 1), 0.75);
}

TEST(PipeSplit, BalancedByParameters) {
  // Equal blocks and no extras: as even as can be.
  EXPECT_EQ(pipe_split("", 2, 4, 0, 10, 0), (std::vector<int64_t>{2, 2}));
  const std::vector<int64_t> seven = pipe_split("", 3, 7, 0, 10, 0);  // any split whose largest is 3
  EXPECT_EQ(*std::max_element(seven.begin(), seven.end()), 3);
  EXPECT_EQ(seven[0] + seven[1] + seven[2], 7);
  // A heavy embedding (two blocks' worth) moves blocks off the first stage.
  EXPECT_EQ(pipe_split("", 2, 6, 20, 10, 0), (std::vector<int64_t>{2, 4}));
  // A heavy head moves them off the last.
  EXPECT_EQ(pipe_split("", 2, 6, 0, 10, 20), (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(pipe_split("3,1", 2, 4, 0, 10, 0), (std::vector<int64_t>{3, 1}));
}

TEST(PipeSplit, ImpossibleSplitsAreRefused) {
  EXPECT_THROW(pipe_split("", 3, 2, 0, 10, 0), InputError);     // fewer blocks than stages
  EXPECT_THROW(pipe_split("2,1", 2, 4, 0, 10, 0), InputError);  // does not sum to the blocks
  EXPECT_THROW(pipe_split("4", 2, 4, 0, 10, 0), InputError);    // one count for two stages
  EXPECT_THROW(pipe_split("4,0", 2, 4, 0, 10, 0), InputError);  // an empty stage
  EXPECT_THROW(pipe_split("2,a", 2, 4, 0, 10, 0), InputError);
  EXPECT_THROW(pipe_split("2,,2", 3, 4, 0, 10, 0), InputError);
}

}  // namespace
}  // namespace dpt
