// Pipeline schedules as data (parallel/pipe_program.h): the five schedules'
// lists are valid, run each chunk's gradients in micro-batch order, hold
// what their formulas say, and leave the bubble the simulator predicts;
// the validator refuses hand-made bad lists with a sentence naming the
// operation.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "core/error.h"
#include "parallel/pipe_program.h"
#include "parallel/pipeline_schedule.h"

namespace dpt {
namespace {

using Kind = PipeAction::Kind;

int chunks_of(const std::string& s) { return s == "interleaved" || s == "zb-v" ? 2 : 1; }

// Every chunk's BW (or W) runs its micro-batches in order.
void expect_gradients_in_order(const PipeProgram& p) {
  std::vector<int> next(static_cast<size_t>(p.chunks()), 0);
  for (const auto& ops : p.ranks)
    for (const PipeAction& a : ops)
      if (a.kind == Kind::BW || a.kind == Kind::W) {
        EXPECT_EQ(a.micro, next[static_cast<size_t>(a.chunk)]++) << p.schedule << " " << pipe_action_name(a);
      }
}

TEST(PipeProgram, GpipeAnd1f1bOrders) {
  // gpipe: every forward, then every backward; 1f1b: pp - r - 1 forwards to
  // fill, then one of each in turn, then the rest.
  for (int pp = 1; pp <= 4; ++pp)
    for (int M = 1; M <= 8; ++M)
      for (int r = 0; r < pp; ++r) {
        std::vector<PipeAction> gpipe, one;
        for (int m = 0; m < M; ++m) gpipe.push_back({Kind::F, r, m});
        for (int m = 0; m < M; ++m) gpipe.push_back({Kind::BW, r, m});
        const int warm = std::min(pp - r - 1, M);
        for (int m = 0; m < warm; ++m) one.push_back({Kind::F, r, m});
        for (int m = 0; m < M - warm; ++m) {
          one.push_back({Kind::F, r, warm + m});
          one.push_back({Kind::BW, r, m});
        }
        for (int m = M - warm; m < M; ++m) one.push_back({Kind::BW, r, m});
        EXPECT_EQ(pipe_program("gpipe", pp, 1, M).ranks[static_cast<size_t>(r)], gpipe) << pp << " " << M << " " << r;
        EXPECT_EQ(pipe_program("1f1b", pp, 1, M).ranks[static_cast<size_t>(r)], one) << pp << " " << M << " " << r;
      }
}

TEST(PipeProgram, EveryScheduleIsValidAndSumsInMicroBatchOrder) {
  for (int pp : {2, 3, 4})
    for (int M : {pp, 2 * pp, 8})
      for (const std::string& name : pipe_program_names()) {
        SCOPED_TRACE(name + " pp " + std::to_string(pp) + " M " + std::to_string(M));
        if (name == "interleaved" && M % pp != 0) {
          EXPECT_THROW(pipe_program(name, pp, 2, M), InputError);
          continue;
        }
        const PipeProgram p = pipe_program(name, pp, chunks_of(name), M);
        const PipeCheck check = check_pipe_program(p);
        EXPECT_EQ(check.error, "");
        expect_gradients_in_order(p);
        const PipeCheck one = check_pipe_program(pipe_program("1f1b", pp, 1, M));
        for (int r = 0; r < pp; ++r) {
          const auto ri = static_cast<size_t>(r);
          EXPECT_EQ(one.peak_held[ri], std::min(M, pp - r)) << "1f1b rank " << r;
          // Chunk activations held, counted in 1f1b's stage-sized units.
          const int blocks_held = name == "zb-v" || name == "interleaved" ? (check.peak_held[ri] + 1) / 2
                                                                          : check.peak_held[ri];
          if (name == "zb-h1" || name == "zb-v") {
            EXPECT_LE(blocks_held, one.peak_held[0]) << "rank " << r;
          }
          if (name == "zb-h1") {
            EXPECT_LE(check.peak_held[ri], one.peak_held[ri]) << "rank " << r;
          }
        }
      }
}

TEST(PipeProgram, SimulatedBubbleMatchesTheFormulasAndZeroBubbleBeats1f1b) {
  const int pp = 2, M = 8;
  const PipeCosts stage{1.0, 1.0, 1.0, 0.0, {}}, chunk{0.5, 0.5, 0.5, 0.0, {}};  // a chunk is half a stage
  const double one = simulate_pipe_program(pipe_program("1f1b", pp, 1, M), stage).idle[0];
  EXPECT_NEAR(one, pipe_bubble(pp, M), 1e-12);
  EXPECT_NEAR(simulate_pipe_program(pipe_program("gpipe", pp, 1, M), stage).idle[0], pipe_bubble(pp, M), 1e-12);
  const double inter = simulate_pipe_program(pipe_program("interleaved", pp, 2, M), chunk).idle[0];
  EXPECT_NEAR(inter, (pp - 1.0) / (2.0 * M + pp - 1.0), 1e-12);
  // The greedy builder's ZB-H1 leaves 0.69 of 1f1b's bubble here (the
  // paper's hand-made ZB-H1 about a third, with B = W): the last stage runs
  // its final W after its final B, which the first stage then waits on.
  const double h1 = simulate_pipe_program(pipe_program("zb-h1", pp, 1, M), stage).idle[0];
  EXPECT_LT(h1, 0.75 * one);
  const double v = simulate_pipe_program(pipe_program("zb-v", pp, 2, M), chunk).idle[0];
  EXPECT_LT(v, 0.05);
  std::printf("[ measure  ] pp 2 M 8 rank 0 idle: 1f1b %.3f interleaved %.3f zb-h1 %.3f zb-v %.3f\n", one, inter, h1,
              v);
}

// Chunks of their own costs: gpipe at pp 2 with the second stage twice as
// slow leaves the first idle for half its step and more.
TEST(PipeProgram, PerChunkCosts) {
  const PipeProgram p = pipe_program("gpipe", 2, 1, 4);
  PipeCosts k;
  k.chunk = {{1.0, 1.0, 1.0}, {2.0, 2.0, 2.0}};
  const PipeSimulation sim = simulate_pipe_program(p, k);
  // Stage 1: F0 at 1, then 4 F of 2 and 4 BW of 4: ends at 25; stage 0 busy 4 + 8.
  EXPECT_DOUBLE_EQ(sim.step, 1.0 + 8.0 + 16.0 + 2.0);
  EXPECT_DOUBLE_EQ(sim.idle[0], 1.0 - 12.0 / sim.step);
  EXPECT_DOUBLE_EQ(sim.idle[1], 1.0 - 24.0 / sim.step);
}

// The zero-bubble builders given the chunks' costs: still valid, in
// micro-batch order and within 1f1b's memory, and never a longer simulated
// step under those costs than the unit-cost list. With B and W dearer than
// F and a heavier head chunk (W-LLAMA's measured ratios) the V's list built
// from them leaves less idle than the unit one (rank 0 / rank 1: 0.0% /
// 3.2% against 2.3% / 5.4%).
TEST(PipeProgram, ZeroBubbleBuiltFromTheChunksCosts) {
  for (int pp : {2, 3, 4})
    for (int M : {pp, 2 * pp, 8})
      for (const std::string name : {"zb-h1", "zb-v"}) {
        SCOPED_TRACE(name + " pp " + std::to_string(pp) + " M " + std::to_string(M));
        const int v = chunks_of(name);
        PipeCosts k;
        k.transfer = 0.01;
        for (int c = 0; c < pp * v; ++c)
          k.chunk.push_back(c == pp * v - 1 ? std::array<double, 3>{2.15, 2.55, 2.12} : std::array<double, 3>{2.0, 2.3, 2.1});
        const PipeProgram built = pipe_program(name, pp, v, M, k), unit = pipe_program(name, pp, v, M);
        const PipeCheck check = check_pipe_program(built), unit_check = check_pipe_program(unit);
        EXPECT_EQ(check.error, "");
        expect_gradients_in_order(built);
        for (int r = 0; r < pp; ++r) {
          EXPECT_LE(check.peak_held[static_cast<size_t>(r)], unit_check.peak_held[static_cast<size_t>(r)]) << r;
        }
        EXPECT_LE(simulate_pipe_program(built, k).step, simulate_pipe_program(unit, k).step);
      }
  PipeCosts k;
  k.chunk = {{2.0, 2.3, 2.1}, {2.0, 2.3, 2.1}, {2.0, 2.3, 2.1}, {2.15, 2.55, 2.12}};
  const PipeSimulation built = simulate_pipe_program(pipe_program("zb-v", 2, 2, 8, k), k);
  const PipeSimulation unit = simulate_pipe_program(pipe_program("zb-v", 2, 2, 8), k);
  EXPECT_LT(built.step, unit.step);
  std::printf("[ measure  ] zb-v pp 2 M 8, W-LLAMA's chunk costs: idle %.3f / %.3f from them, %.3f / %.3f unit\n",
              built.idle[0], built.idle[1], unit.idle[0], unit.idle[1]);
}

TEST(PipeProgram, ValidatorRefusesBadListsNamingTheOperation) {
  PipeProgram early = pipe_program("1f1b", 2, 1, 2);
  auto& r0 = early.ranks[0];
  std::rotate(r0.begin(), r0.end() - 1, r0.end());  // rank 0's last BW first
  EXPECT_EQ(check_pipe_program(early).error, "rank 0 runs BW(chunk 0, micro 1) before its forward");

  PipeProgram unmatched = pipe_program("gpipe", 2, 1, 2);
  std::erase_if(unmatched.ranks[1], [](const PipeAction& a) { return a.micro == 0; });  // chunk 1's micro-batch 0
  EXPECT_EQ(check_pipe_program(unmatched).error,
            "F(chunk 0, micro 0) sends its output to rank 1, which has no F(chunk 1, micro 0) to receive it");

  // Rank 0 waits for micro-batch 0's gradient before it sends micro-batch
  // 1's forward, which rank 1 runs before that gradient's backward.
  PipeProgram cycle = pipe_program("gpipe", 2, 1, 2);
  cycle.ranks[0] = {{Kind::F, 0, 0}, {Kind::BW, 0, 0}, {Kind::F, 0, 1}, {Kind::BW, 0, 1}};
  cycle.ranks[1] = {{Kind::F, 1, 0}, {Kind::F, 1, 1}, {Kind::BW, 1, 0}, {Kind::BW, 1, 1}};
  EXPECT_NE(check_pipe_program(cycle).error.find("waits forever"), std::string::npos) << check_pipe_program(cycle).error;

  // Messages of one kind between two ranks are received in the order sent
  // (all the same size: out of order they would be read silently into the
  // wrong micro-batch).
  PipeProgram crossed = pipe_program("gpipe", 2, 1, 2);
  crossed.ranks[1] = {{Kind::F, 1, 1}, {Kind::BW, 1, 1}, {Kind::F, 1, 0}, {Kind::BW, 1, 0}};
  EXPECT_EQ(check_pipe_program(crossed).error,
            "rank 0 receives for BW(chunk 0, micro 0) out of the order rank 1 sends in (gradients are received in "
            "the order they are sent)");

  PipeProgram no_w = pipe_program("zb-h1", 2, 1, 2);
  for (auto& ops : no_w.ranks) std::erase_if(ops, [](const PipeAction& a) { return a.kind == Kind::W; });
  EXPECT_NE(check_pipe_program(no_w).error.find("needs one BW, or one B and one W"), std::string::npos);
}

// Each micro-batch's activations stay in their slot from its F to its BW
// (or W): the slots a rank needs are the most in flight, per chunk.
TEST(PipeProgram, SlotTable) {
  const PipeProgram h1 = pipe_program("zb-h1", 2, 1, 8);
  EXPECT_TRUE(pipe_splits_backward(h1));
  EXPECT_FALSE(pipe_splits_backward(pipe_program("interleaved", 2, 2, 8)));
  for (int r = 0; r < 2; ++r) {
    const PipeSlots t = pipe_slot_table(h1, r);
    // In flight from F to W: 1f1b's window plus the W's deferred.
    int held = 0, most = 0;
    for (const PipeAction& a : h1.ranks[static_cast<size_t>(r)]) {
      held += a.kind == Kind::F ? 1 : a.kind == Kind::W ? -1 : 0;
      most = std::max(most, held);
    }
    EXPECT_EQ(t.count[0], most) << "rank " << r;
    EXPECT_EQ(pipe_arenas(h1, r), most);
  }
  // zb-v: rank 0 holds chunks 0 and 3 of 4, each with slots of its own.
  const PipeSlots v = pipe_slot_table(pipe_program("zb-v", 2, 2, 4), 0);
  EXPECT_EQ(v.chunks, (std::vector<int>{0, 3}));
  EXPECT_EQ(v.local(3), 1);
  EXPECT_EQ(pipe_arenas(pipe_program("zb-v", 2, 2, 4), 0), v.count[0] + v.count[1]);
}

TEST(PipeProgram, RefusesShapesItCannotRun) {
  EXPECT_THROW(pipe_program("interleaved", 2, 1, 4), InputError);
  EXPECT_THROW(pipe_program("zb-v", 2, 3, 4), InputError);
  EXPECT_THROW(pipe_program("1f1b", 2, 2, 4), InputError);
  EXPECT_THROW(pipe_program("zb-x", 2, 1, 4), InputError);
}

}  // namespace
}  // namespace dpt
