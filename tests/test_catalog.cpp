// The strategy catalog (parallel/catalog.h): a strategy is one class and one
// record. This file defines a strategy of its own, registers it through the
// catalog alone, and checks that the training loop and the planner take it:
// it trains bitwise as the strategy it wraps, and its plan row shows its own
// bytes.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "core/error.h"
#include "models/model.h"
#include "parallel/catalog.h"
#include "parallel/rank_bytes.h"
#include "parallel/replicated.h"
#include "train/plan.h"
#include "train/rank_setup.h"
#include "train/run_checks.h"
#include "train/train.h"

namespace dpt {
namespace {

namespace fs = std::filesystem;

// DDP that reduces every bucket after backward (no overlap), and holds a
// staging buffer of its own, which it accounts: a strategy whose bytes are
// not any built-in strategy's.
constexpr size_t kStaging = size_t{1} << 20;

class SyncDdp : public DdpStrategy {
 public:
  SyncDdp(const StrategyOptions& options, Model& model, comm::ProcessGroup& pg, const StrategyInit& init)
      : DdpStrategy(without_overlap(options), model, pg, init), staging_(kStaging) {}
  std::string describe() const override { return "sync-ddp: " + DdpStrategy::describe(); }
  MemoryBytes bytes() const override {
    MemoryBytes b = DdpStrategy::bytes();
    b.scratch += staging_.size();
    return b;
  }

 private:
  static StrategyOptions without_overlap(StrategyOptions o) {
    o.ddp.overlap = false;
    return o;
  }
  std::vector<char> staging_;
};

const StrategyRecord& sync_ddp() {
  static const StrategyRecord& r = [] {
    StrategyRecord rec;
    rec.name = "sync-ddp";
    rec.help = "sync-ddp (a test's)";
    rec.fits_because = [](bool) { return std::string("a test strategy fits"); };
    rec.formula = [](const StrategyOptions&, int n) { return fmt::format("a test's all-reduce over N = {}", n); };
    rec.make = [](const StrategyOptions& o, Model& m, comm::ProcessGroup& pg, const StrategyInit& init) {
      return std::make_unique<SyncDdp>(o, m, pg, init);
    };
    rec.bytes = [](const StrategyOptions& o, const Model& m, int world, int rank) {
      MemoryBytes b = sharded_bytes(o, m, world, rank, 0, true);
      b.scratch += kStaging;
      return b;
    };
    rec.traffic = [](const StrategyOptions& o, const Model& m, int world, int rank, int64_t) {
      return bucket_traffic(o, m, world, rank);
    };
    return register_strategy(std::move(rec));
  }();
  return r;
}

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

TrainOptions gpt_run(const std::string& strategy, const fs::path& save) {
  TrainOptions o;
  o.model = "gpt";
  o.hparams = {{"n_layer", "2"}, {"n_embd", "32"}, {"n_head", "2"}, {"block_size", "16"}};
  o.synthetic = true;
  o.steps = 6;
  o.batch = 4;
  o.grad_accum = 2;
  o.strategy = strategy;
  o.save = save.string();
  o.quiet = true;
  return o;
}

TEST(Catalog, NamesAreParsedOnceIntoRecords) {
  EXPECT_EQ(StrategyRef("fsdp"), StrategyRef("zero3"));
  EXPECT_EQ(StrategyRef("zero2")->zero_stage, 2);
  EXPECT_TRUE(StrategyRef("dp")->in_threads());
  EXPECT_TRUE(StrategyRef("local")->trains_one_replica());
  EXPECT_TRUE(StrategyRef("hsdp")->shard_groups);
  try {
    StrategyRef bad("zero4");
    FAIL() << "zero4 was taken";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown strategy 'zero4' (expected local, ddp, zero1"), std::string::npos)
        << e.what();
  }
  StrategyRecord again;
  again.name = "ddp";
  EXPECT_THROW(register_strategy(std::move(again)), InputError);
}

TEST(Catalog, ARegisteredStrategyTrainsAsTheOneItWraps) {
  const StrategyRecord& mine = sync_ddp();
  EXPECT_NE(strategy_help().find("sync-ddp (a test's)"), std::string::npos);
  const fs::path dir = fs::temp_directory_path() / ("dpt_catalog_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  TrainOptions ddp = gpt_run("ddp", dir / "ddp.safetensors");
  ddp.ddp.overlap = false;  // what SyncDdp runs
  const TrainResult wrapped = run_training(ddp);
  const TrainResult r = run_training(gpt_run(mine.name, dir / "mine.safetensors"));
  EXPECT_EQ(r.final_loss, wrapped.final_loss);
  EXPECT_EQ(read_bytes(dir / "mine.safetensors"), read_bytes(dir / "ddp.safetensors"));
  EXPECT_EQ(r.memory.scratch, wrapped.memory.scratch + kStaging);  // what the strategy accounts
  fs::remove_all(dir);
}

TEST(Catalog, ARegisteredStrategyHasItsOwnPlanRow) {
  const StrategyRecord& mine = sync_ddp();
  TrainOptions o = gpt_run(mine.name, "");
  apply_defaults(o);
  auto model = make_model(model_hparams(o));
  PlanRequest r;
  r.run = o;
  r.base = strategy_options(o);
  r.strategies = {StrategyRef(mine), StrategyRef("ddp")};
  r.batch = o.batch;
  r.world = 2;
  r.ranks_here = 2;
  r.machine = {.gemm_gflops = 10, .copy_gbs = 2, .disk_write_gbs = 1, .disk_read_gbs = 1, .runtime_bytes = 0,
               .threads = 1};
  r.available = size_t{1} << 40;
  r.disk_free = uint64_t{1} << 50;
  const Plan plan = make_plan(r, *model);
  const PlanRow* own = nullptr;
  const PlanRow* ddp = nullptr;
  for (const PlanRow& row : plan.rows)
    if (row.point.precision == "fp32" && !row.point.checkpoint && row.point.offload == "none")
      (row.point.strategy == StrategyRef(mine) ? own : ddp) = &row;
  ASSERT_TRUE(own && ddp);
  EXPECT_EQ(row_name(own->point), "sync-ddp");
  EXPECT_EQ(own->bytes.scratch, ddp->bytes.scratch + kStaging);
  EXPECT_EQ(own->bytes.parameters, ddp->bytes.parameters);
  EXPECT_EQ(own->comm.per_step(), ddp->comm.per_step());
}

}  // namespace
}  // namespace dpt
