// The planner's pieces without a run: its communication figures against
// WORKLOADS.md's table, and its verdicts against the memory check that
// `dpt train` applies (the same rank_bytes, the same test of fit).
#include <gtest/gtest.h>

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
  so.name = name;
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
  r.machine = {.gemm_gflops = 10, .copy_gbs = 2, .runtime_bytes = 0, .threads = 1};
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
    ASSERT_EQ(plan.rows.size(), 16u);  // 4 strategies x fp32, bf16 x checkpointing off, on
    for (const PlanRow& row : plan.rows) {
      model->set_checkpoint_activations(row.point.checkpoint);
      model->set_precision(parse_precision(row.point.precision));
      bool refused = false;
      try {
        check_fits(adamw(row.point.strategy), *model, model->activation_bytes_for(r.batch / r.world), r.world,
                   r.ranks_here, available);
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

}  // namespace
}  // namespace dpt
