// The planner's pieces without a run: its communication figures against
// WORKLOADS.md's table, and its verdicts against the memory check that
// `dpt train` applies (the same rank_bytes, the same test of fit).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "models/model.h"
#include "train/plan.h"
#include "train/train.h"

namespace dpt {
namespace {

std::unique_ptr<Model> gpt() {
  return make_model({{"dpt.model", "gpt"}, {"n_layer", "3"}, {"n_embd", "64"}, {"n_head", "2"}, {"block_size", "32"}});
}

StrategyOptions adamw(const std::string& name) {
  StrategyOptions so;
  so.strategy = name;
  so.optimizer.name = "adamw";
  return so;
}

TEST(PlannedComm, FollowsTheTable) {
  // WORKLOADS.md, per rank, Ψ bytes of gradients: DDP 2Ψ(N-1)/N, zero1 3,
  // zero2 2, zero3 3 (forward 1, backward 2) less the unit forward ends on,
  // kept for backward; the GPT's tied embedding is gathered once more in
  // each pass. Up to the ring's uneven chunks (a float per unit or bucket).
  auto model = gpt();
  const auto& units = model->layout().units();
  for (int n : {2, 3, 4}) {
    const double psi = 4.0 * static_cast<double>(model->param_count()) * (n - 1) / n;
    const double embed = 4.0 * static_cast<double>(units.front().numel) * (n - 1) / n;
    const double slack = 4.0 * 32;
    auto per_step = [&](const StrategyOptions& so) {
      return static_cast<double>(planned_comm(so, *model, n, 0, 1).per_step());
    };
    EXPECT_NEAR(per_step(adamw("ddp")), 2 * psi, slack) << n;
    EXPECT_NEAR(per_step(adamw("zero1")), 3 * psi, slack) << n;
    StrategyOptions scatter = adamw("zero1");
    scatter.zero_scatter = true;
    EXPECT_NEAR(per_step(scatter), 2 * psi, slack) << n;
    EXPECT_NEAR(per_step(adamw("zero2")), 2 * psi, slack) << n;
    const CommPlan z3 = planned_comm(adamw("zero3"), *model, n, 0, 1);
    EXPECT_NEAR(static_cast<double>(z3.forward), psi + embed, slack) << n;
    EXPECT_NEAR(static_cast<double>(z3.backward), 2 * psi, slack) << n;
    EXPECT_NEAR(static_cast<double>(z3.first_step), embed, slack) << n;
    // Gradient accumulation: zero3 gathers and reduce-scatters every micro-step.
    EXPECT_EQ(planned_comm(adamw("zero3"), *model, n, 0, 2).per_step(), 2 * z3.per_step()) << n;
    EXPECT_EQ(planned_comm(adamw("ddp"), *model, n, 0, 2).per_step(), planned_comm(adamw("ddp"), *model, n, 0, 1).per_step());
  }
  EXPECT_EQ(planned_comm(adamw("local"), *model, 1, 0, 1).per_step(), 0u);
}

TEST(Plan, VerdictsAreThoseOfTheMemoryCheck) {
  auto model = gpt();
  PlanRequest r;
  r.base = adamw("ddp");
  r.batch = 8;
  r.world = 2;
  r.ranks_here = 2;
  r.machine = {.gemm_gflops = 10, .copy_gbs = 2, .disk_write_gbs = 1, .disk_read_gbs = 1, .runtime_bytes = 0,
               .threads = 1};
  r.disk_free = uint64_t{1} << 50;  // the disk never decides here (OffloadRowsNeedTheirDisk)
  // Every row's need for the host, and one byte less: each row fits exactly
  // when the memory check lets its run start.
  r.available = size_t{1} << 40;
  std::vector<size_t> budgets;
  for (const PlanRow& row : make_plan(r, *model).rows) {
    budgets.push_back(2 * row.need);
    budgets.push_back(2 * row.need - 1);
  }
  for (size_t available : budgets) {
    r.available = available;
    const Plan plan = make_plan(r, *model);
    // 4 strategies x fp32, bf16 x checkpointing off, on, without offload and
    // with the optimizer's; the masters' offload in bf16 under zero1/2/3.
    ASSERT_EQ(plan.rows.size(), 16u + 16u + 6u);
    for (const PlanRow& row : plan.rows) {
      model->set_checkpoint_activations(row.point.checkpoint);
      model->set_precision(parse_precision(row.point.precision));
      StrategyOptions so = adamw(row.point.strategy.name());
      so.offload.what = parse_offload(row.point.offload);
      bool refused = false;
      try {
        check_fits(so, *model, model->activation_bytes_for(r.batch / r.world), r.world, r.ranks_here, available);
      } catch (const InputError&) {
        refused = true;
      }
      EXPECT_EQ(row.fits, !refused) << row.point.strategy << " " << row.point.precision
                                    << (row.point.checkpoint ? " +ckpt" : "") << " in " << available;
    }
    model->set_checkpoint_activations(false);
    model->set_precision(DType::F32);
    if (plan.best >= 0) {
      EXPECT_TRUE(plan.rows[static_cast<size_t>(plan.best)].fits);
    }
  }
}

// Offload rows: their state must fit the disk too (all the host's ranks'),
// their estimate pays the disk, and the plan turns to them only when what
// keeps everything in RAM does not fit.
TEST(Plan, OffloadRowsNeedTheirDiskAndServeWhenRamIsShort) {
  auto model = gpt();
  PlanRequest r;
  r.base = adamw("ddp");
  r.batch = 8;
  r.world = 2;
  r.ranks_here = 2;
  r.machine = {.gemm_gflops = 10, .copy_gbs = 2, .disk_write_gbs = 0.5, .disk_read_gbs = 1, .runtime_bytes = 0,
               .threads = 1};
  r.base.offload.chunk_bytes = 16 << 10;  // buffers well below this small model's state
  r.available = size_t{1} << 40;
  r.disk_free = 0;
  const Plan no_disk = make_plan(r, *model);
  uint64_t most = 0;
  size_t smallest_ram = SIZE_MAX, smallest_offload = SIZE_MAX;
  for (const PlanRow& row : no_disk.rows) {
    const bool offloaded = row.point.offload != "none";
    EXPECT_EQ(row.bytes.offloaded > 0, offloaded) << row_name(row.point);
    EXPECT_EQ(row.fits, !offloaded) << row_name(row.point);
    most = std::max<uint64_t>(most, row.bytes.offloaded);
    (offloaded ? smallest_offload : smallest_ram) = std::min(offloaded ? smallest_offload : smallest_ram, row.need);
    if (row.point.offload == "params") {
      EXPECT_EQ(row.point.precision, "bf16");
      EXPECT_NE(row.point.strategy, "ddp");
    }
    // The same row in RAM: the offload's estimate is slower by the disk
    // (the state read and written by both ranks) where that exceeds the sweep.
    if (offloaded) {
      const auto same = std::find_if(no_disk.rows.begin(), no_disk.rows.end(), [&](const PlanRow& o) {
        return o.point.offload == "none" && o.point.strategy == row.point.strategy &&
               o.point.precision == row.point.precision && o.point.checkpoint == row.point.checkpoint;
      });
      ASSERT_NE(same, no_disk.rows.end());
      EXPECT_LT(row.need, same->need) << row_name(row.point);
      const double disk = 2.0 * static_cast<double>(row.bytes.offloaded) * (1 / 0.5e9 + 1 / 1e9);
      EXPECT_DOUBLE_EQ(row.disk_s, disk) << row_name(row.point);
      EXPECT_DOUBLE_EQ(row.step_s, same->step_s - same->optimizer_s + std::max(row.optimizer_s, disk))
          << row_name(row.point);
    }
  }
  ASSERT_LT(smallest_offload, smallest_ram);
  ASSERT_GE(no_disk.best, 0);
  EXPECT_EQ(no_disk.rows[static_cast<size_t>(no_disk.best)].point.offload, "none");
  // Room on disk for every row's state on both ranks, and RAM for any
  // row: the plan keeps everything in RAM.
  r.disk_free = 2 * most;
  const Plan roomy = make_plan(r, *model);
  for (const PlanRow& row : roomy.rows) EXPECT_TRUE(row.fits) << row_name(row.point);
  EXPECT_EQ(roomy.rows[static_cast<size_t>(roomy.best)].point.offload, "none");
  // RAM for the smallest offload row only: that one, and the reason says
  // where its state goes.
  r.available = 2 * smallest_offload;
  const Plan tight = make_plan(r, *model);
  ASSERT_GE(tight.best, 0) << tight.reason;
  const PlanRow& best = tight.rows[static_cast<size_t>(tight.best)];
  EXPECT_NE(best.point.offload, "none");
  EXPECT_EQ(best.need, smallest_offload);
  EXPECT_NE(tight.reason.find("offloaded to"), std::string::npos) << tight.reason;
  EXPECT_NE(tight.reason.find("offloaded to disk"), std::string::npos) << tight.reason;  // the seed's verdict
}

}  // namespace
}  // namespace dpt
