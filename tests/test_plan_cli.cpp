// `dpt plan` against real runs: for every strategy, with and without
// activation checkpointing and offload, on 2 ranks, and for meshes (tp 2,
// pp 2 under both schedules, dp 2 x tp 2 zero3, pp 2 x dp 2 zero1), the
// bytes it plans per category are the bytes the run accounts (its summary's
// memory table, rank 0; every stage's arenas), and the bytes it plans to
// send are the ledger's; its predicted peak
// RSS is near the measured one; it probes the offload disk; bad input is one
// sentence and exit 1.
//
// Every job runs under `timeout` with one thread per rank.
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli_run.h"

namespace dpt {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::dpt_bin;
using test::q;
using test::RunResult;

struct Net {
  const char* name;
  std::string flags;  // model and batch, shared by plan and train
};
// A GPT whose embedding (vocabulary 2048) is larger than a block, so the
// pools take the "largest unit plus k of the second size" form; and a
// 3-layer MLP, whose pools take one buffer per unit (its optimizer: SGD
// with momentum).
const Net kGpt{"gpt", "--model gpt --layers 3 --width 64 --heads 2 --context 32 --vocab 2048 --batch 4"};
const Net kMlp{"mlp", "--model mlp --sizes 784,128,64,10 --batch 8"};
// A Llama configuration of the same sizes: grouped-query attention (4 query
// heads, 2 key/value heads of 16 channels: K and V half Q's rows), SwiGLU's
// three matrices of 96, RMSNorm, an untied head (the plan's meshes add a
// tied one).
const Net kLlama{"llama",
                 "--model llama --layers 3 --width 64 --heads 4 --kv-heads 2 --intermediate 96 --context 32 "
                 "--vocab 2048 --batch 4"};
constexpr int64_t kSteps = 3;  // only the last is logged (--log-every 100)

// A mesh run to hold against the plan (MeshRowsMatchRuns).
struct MeshCase {
  int ranks;
  const char* strategy;
  std::string flags;
  bool ckpt;
  const char* precision = "fp32";
  const char* offload = "none";
};

class PlanCliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / fmt::format("dpt_plan_cli_{}", ::getpid());
    fs::create_directories(dir_);
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  static RunResult dpt(const std::string& args, int limit_s = 120) {
    return test::run_shell(fmt::format("env -u DPT_COMM_ALGO -u DPT_COMM_TRANSPORT OMP_NUM_THREADS=1 {} {}",
                                       q(dpt_bin()), args),
                           dir_, limit_s);
  }

  // The plan as JSON, with rates given (nothing measured: the bytes do not
  // depend on them), by default with memory to spare.
  static json plan(const Net& net, const std::string& memory = "1T") {
    const RunResult r = dpt(fmt::format("plan {} --ranks 2 --json --gemm-gflops 10 --copy-gbs 2 --disk-gbs 1 "
                                        "--offload-dir {} --memory {}",
                                        net.flags, q(dir_), memory));
    EXPECT_EQ(r.code, 0) << r.err;
    return r.code == 0 ? json::parse(r.out) : json();
  }

  // A 2-rank synthetic run's summary (offload: its state in dir_).
  static json train(const Net& net, const std::string& strategy, bool ckpt, const std::string& precision = "fp32",
                    const std::string& offload = "none") {
    const fs::path summary = dir_ / fmt::format("{}_{}_{}_{}_{}.json", net.name, strategy, ckpt, precision, offload);
    const std::string offload_flags =
        offload == "none" ? "" : fmt::format("--offload {} --offload-dir {}", offload, q(dir_));
    const RunResult r = dpt(fmt::format("launch -n 2 -- {} train {} --strategy {} {} --precision {} {} --synthetic "
                                        "--steps {} --log-every 100 --threads 1 --quiet --summary-out {}",
                                        q(dpt_bin()), net.flags, strategy, ckpt ? "--checkpoint-activations" : "",
                                        precision, offload_flags, kSteps, q(summary)));
    EXPECT_EQ(r.code, 0) << r.all();
    return r.code == 0 ? json::parse(test::read_file(summary)) : json();
  }

  static void expect_mesh_row_matches(const std::string& model, const MeshCase& c);

  static inline fs::path dir_;
};

const json* find_row(const json& plan, const std::string& strategy, bool ckpt, const std::string& precision = "fp32",
                     const std::string& offload = "none") {
  for (const json& row : plan.at("rows"))
    if (row.at("strategy") == strategy && row.at("checkpoint_activations") == ckpt &&
        row.at("precision") == precision && row.at("offload") == offload)
      return &row;
  return nullptr;
}

class PlanMatchesRun : public PlanCliTest, public ::testing::WithParamInterface<std::tuple<const Net*, const char*>> {};

// The run's accounted bytes and its ledger against the plan's row.
void expect_row_matches(const json& row, const json& s, const std::string& what) {
  const json& got = s.at("bytes");
  const json& planned = row.at("bytes");
  for (const char* k : {"parameters", "gradients", "optimizer", "gathered", "scratch", "activations", "offloaded"})
    EXPECT_EQ(got.at(k).get<uint64_t>(), planned.at(k).get<uint64_t>()) << what << ": " << k;
  // The ledger: every step's bytes, the first step's extra gather, and the
  // logged last step's loss average and norm all-gather, over the steps
  // (integer division, as the run reports it); then by phase.
  const json& c = row.at("comm");
  auto u = [&](const char* k) { return c.at(k).get<uint64_t>(); };
  const uint64_t steps = kSteps;
  EXPECT_EQ(s.at("comm_bytes_per_step").get<uint64_t>(),
            (steps * u("per_step") + u("first_step") + u("logged_other") + u("logged_optimizer")) / steps)
      << what;
  const json& phase = s.at("comm_bytes_per_phase");
  auto got_phase = [&](const char* k) { return phase.contains(k) ? phase.at(k).get<uint64_t>() : uint64_t{0}; };
  EXPECT_EQ(got_phase("forward"), u("forward")) << what;
  EXPECT_EQ(got_phase("backward"), (steps * u("backward") + u("first_step")) / steps) << what;
  EXPECT_EQ(got_phase("optimizer"), (steps * u("optimizer") + u("logged_optimizer")) / steps) << what;
}

TEST_P(PlanMatchesRun, BytesPerCategoryAndPerStep) {
  const auto [net, strategy] = GetParam();
  const json p = plan(*net);
  ASSERT_FALSE(p.is_null());
  for (const char* precision : {"fp32", "bf16"})
    for (bool ckpt : {false, true}) {
      const std::string what = fmt::format("{} {} {}{}", net->name, strategy, precision, ckpt ? " +ckpt" : "");
      // The MLP's units are single layers: checkpointing drops nothing, so
      // the plan has no such row, and the run must account what the plain
      // row says.
      const json* row = find_row(p, strategy, ckpt && net != &kMlp, precision);
      ASSERT_NE(row, nullptr) << what;
      if (net == &kMlp) {
        EXPECT_EQ(find_row(p, strategy, true, precision), nullptr) << "a checkpointing row that changes nothing";
      }
      const json s = train(*net, strategy, ckpt, precision);
      ASSERT_FALSE(s.is_null()) << what;
      expect_row_matches(*row, s, what);
    }
}

// The ZeRO variants: zero1 reducing by reduce-scatter, zero2/3 with two
// micro-batches (reduce-scattered every micro-step, or accumulated locally
// and reduced once), zero3 keeping units from forward to backward; and
// reductions in bf16 (--reduce-dtype: bf16 copies of the gradients on the
// wire, half the bytes).
TEST_F(PlanCliTest, ZeroVariantsMatchRuns) {
  for (const auto& [strategy, flags] : std::vector<std::pair<std::string, std::string>>{
           {"zero1", "--zero-reduce scatter"},
           {"ddp", "--reduce-dtype bf16"},
           {"zero1", "--reduce-dtype bf16"},
           {"zero1", "--zero-reduce scatter --reduce-dtype bf16"},
           {"zero2", "--grad-accum 2 --reduce-dtype bf16"},
           {"zero3", "--grad-accum 2 --zero-accumulate local --reduce-dtype bf16"},
           {"zero2", "--grad-accum 2"},
           {"zero2", "--grad-accum 2 --zero-accumulate local"},
           {"zero3", "--grad-accum 2"},
           {"zero3", "--grad-accum 2 --zero-accumulate local"},
           {"zero3", "--reshard-after-forward false"}}) {
    const Net net{"variant", kGpt.flags + " " + flags};
    const std::string what = strategy + " " + flags;
    const json p = plan(net);
    ASSERT_FALSE(p.is_null()) << what;
    const json s = train(net, strategy, false);
    ASSERT_FALSE(s.is_null()) << what;
    expect_row_matches(*find_row(p, strategy, false), s, what);
  }
}

// Offload rows against offloaded runs: the state (and with params the fp32
// masters) in the file, the tier's chunk buffers in the optimizer figure;
// every strategy that offloads, both models, with checkpointing and bf16.
TEST_F(PlanCliTest, OffloadRowsMatchRuns) {
  struct Case {
    const Net* net;
    const char* strategy;
    bool ckpt;
    const char* precision;
    const char* offload;
  };
  for (const Case& c : {Case{&kGpt, "ddp", false, "fp32", "optimizer"}, Case{&kMlp, "zero2", false, "fp32", "optimizer"},
                        Case{&kGpt, "zero3", true, "bf16", "optimizer"}, Case{&kGpt, "zero1", false, "bf16", "params"},
                        Case{&kGpt, "zero3", true, "bf16", "params"}, Case{&kLlama, "zero3", true, "bf16", "params"}}) {
    const std::string what = fmt::format("{} {} {}{} +offload {}", c.net->name, c.strategy, c.precision,
                                         c.ckpt ? " +ckpt" : "", c.offload);
    const json p = plan(*c.net);
    ASSERT_FALSE(p.is_null()) << what;
    const json* row = find_row(p, c.strategy, c.ckpt, c.precision, c.offload);
    ASSERT_NE(row, nullptr) << what;
    EXPECT_GT(row->at("bytes").at("offloaded").get<uint64_t>(), 0u) << what;
    const json s = train(*c.net, c.strategy, c.ckpt, c.precision, c.offload);
    ASSERT_FALSE(s.is_null()) << what;
    expect_row_matches(*row, s, what);
  }
  // Masters leave RAM only where training lets them: bf16 and sharded.
  const json p = plan(kGpt);
  ASSERT_FALSE(p.is_null());
  for (const json& row : p.at("rows"))
    if (row.at("offload") == "params") {
      EXPECT_EQ(row.at("precision"), "bf16") << row.dump();
      EXPECT_NE(row.at("strategy"), "ddp") << row.dump();
    }
  EXPECT_NE(find_row(p, "ddp", false, "fp32", "optimizer"), nullptr);
  EXPECT_EQ(find_row(p, "ddp", false, "bf16", "params"), nullptr);
  EXPECT_EQ(find_row(p, "zero3", false, "fp32", "params"), nullptr);
}

// Without --disk-gbs the plan probes the offload directory's disk; a
// directory the tier would refuse is one sentence.
TEST_F(PlanCliTest, ProbesTheOffloadDisk) {
  const RunResult r =
      dpt(fmt::format("plan {} --ranks 2 --json --gemm-gflops 10 --copy-gbs 2 --offload-dir {}", kGpt.flags, q(dir_)));
  ASSERT_EQ(r.code, 0) << r.err;
  const json p = json::parse(r.out);
  EXPECT_GT(p.at("machine").at("disk_write_gbs").get<double>(), 0.0);
  EXPECT_GT(p.at("machine").at("disk_read_gbs").get<double>(), 0.0);
  EXPECT_EQ(p.at("offload_dir"), dir_.string());
  EXPECT_GT(p.at("disk_free").get<uint64_t>(), 0u);
  // The probe's file is unlinked at once: nothing is left behind.
  for (const auto& e : fs::directory_iterator(dir_))
    EXPECT_EQ(e.path().filename().string().rfind("dpt-disk-probe", 0), std::string::npos) << e.path();
  const json* row = find_row(p, "zero3", false, "fp32", "optimizer");
  ASSERT_NE(row, nullptr);
  EXPECT_GT(row->at("time").at("disk_s").get<double>(), 0.0);
}

INSTANTIATE_TEST_SUITE_P(Strategies, PlanMatchesRun,
                         ::testing::Combine(::testing::Values(&kGpt, &kMlp, &kLlama),
                                            ::testing::Values("ddp", "zero1", "zero2", "zero3")),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param)->name) + "_" + std::get<1>(info.param);
                         });

// The high-water mark a run reports, against the plan's prediction (its
// accounted bytes, the arena and the runtime), on W-GPT (3.3 M parameters,
// 2 sequences per rank): within 15% here, where the runtime's ~20 MiB is a
// quarter of the total (bench/plan_bench.py holds W-GPT-L to 10%).
TEST_F(PlanCliTest, PredictedPeakRssNearMeasured) {
  const Net wgpt{"wgpt", "--model gpt --batch 4"};
  const json p = plan(wgpt);
  ASSERT_FALSE(p.is_null());
  for (const char* strategy : {"ddp", "zero3"}) {
    const json s = train(wgpt, strategy, false);
    ASSERT_FALSE(s.is_null());
    const double measured = s.at("bytes").at("peak_rss").get<double>();
    const double predicted = find_row(p, strategy, false)->at("bytes").at("peak_rss").get<double>();
    EXPECT_NEAR(predicted / measured, 1.0, 0.15) << strategy << ": predicted " << predicted << ", measured " << measured;
  }
}

TEST_F(PlanCliTest, RecommendsFromTheMemoryGiven) {
  // Enough for anything: DDP moves the least, and its only rival on speed
  // is a sharded optimizer step; too little for DDP: a sharded strategy.
  const json roomy = plan(kGpt);
  ASSERT_FALSE(roomy.is_null());
  ASSERT_TRUE(roomy.at("recommended").is_number());
  for (const json& row : roomy.at("rows")) EXPECT_TRUE(row.at("fits").get<bool>());
  const json* ddp = find_row(roomy, "ddp", false);
  const json* zero3 = find_row(roomy, "zero3", false);
  // For 2 ranks: less than two DDP ranks need, more than two zero3 ranks.
  const uint64_t between = ddp->at("bytes").at("total").get<uint64_t>() + zero3->at("bytes").at("total").get<uint64_t>();
  const json tight = plan(kGpt, std::to_string(between));
  ASSERT_FALSE(tight.is_null());
  const json& best = tight.at("rows").at(tight.at("recommended").get<size_t>());
  EXPECT_NE(best.at("strategy"), "ddp");
  EXPECT_TRUE(best.at("fits").get<bool>());
  EXPECT_FALSE(find_row(tight, "ddp", false)->at("fits").get<bool>());
  EXPECT_TRUE(find_row(tight, "zero3", false)->at("fits").get<bool>());
  // The fastest that fits, up to the estimates' margin, and the reason
  // names every faster row that does not fit.
  const std::string reason = tight.at("reason");
  const double margin = tight.at("tie_margin").get<double>();
  const double best_s = best.at("time").at("step_s").get<double>();
  bool faster_too_big = false;
  for (const json& row : tight.at("rows")) {
    const double step_s = row.at("time").at("step_s").get<double>();
    const bool faster = step_s < best_s;
    if (row.at("fits").get<bool>()) {
      EXPECT_LE(best_s, step_s * (1.0 + margin)) << row.dump();
    } else if (faster) {
      faster_too_big = true;
      EXPECT_NE(reason.find(row.at("strategy").get<std::string>()), std::string::npos) << reason;
    }
  }
  EXPECT_EQ(reason.find("faster but too big") != std::string::npos, faster_too_big) << reason;
  const json none = plan(kGpt, "1M");
  ASSERT_FALSE(none.is_null());
  EXPECT_TRUE(none.at("recommended").is_null());
  EXPECT_NE(none.at("reason").get<std::string>().find("nothing fits"), std::string::npos);
}

// Meshes: the plan's row for a tp/pp/dp layout against a real run of it.
// The summary's bytes and ledger are rank 0's (stage 0, TP rank 0), so they
// are held to the plan's first stage; its "pipeline" section reports every
// stage's parameters and activation arenas, held to each planned stage,
// and the last stage's copy of wte and its gradient to that stage's
// pipeline buffers.
void PlanCliTest::expect_mesh_row_matches(const std::string& model, const MeshCase& c) {
  const std::string what = fmt::format("{} ranks {} {}{} {} offload {}", c.ranks, c.strategy, c.flags,
                                       c.ckpt ? " +ckpt" : "", c.precision, c.offload);
  SCOPED_TRACE(what);
  const RunResult planned = dpt(fmt::format("plan {} {} --ranks {} --json --gemm-gflops 10 --copy-gbs 2 "
                                            "--disk-gbs 1 --memory 1T",
                                            model, c.flags, c.ranks));
  ASSERT_EQ(planned.code, 0) << planned.err;
  const json p = json::parse(planned.out);
  const json* row = find_row(p, c.strategy, c.ckpt, c.precision, c.offload);
  ASSERT_NE(row, nullptr);
  const fs::path summary = dir_ / "mesh.json";
  const std::string offload =
      std::string(c.offload) == "none" ? "" : fmt::format("--offload {} --offload-dir {}", c.offload, q(dir_));
  const RunResult r = dpt(fmt::format("launch -n {} -- {} train {} {} --strategy {} {} --precision {} {} --synthetic "
                                      "--steps {} --log-every 100 --threads 1 --quiet --summary-out {}",
                                      c.ranks, q(dpt_bin()), model, c.flags, c.strategy,
                                      c.ckpt ? "--checkpoint-activations" : "", c.precision, offload, kSteps,
                                      q(summary)));
  ASSERT_EQ(r.code, 0) << r.all();
  const json s = json::parse(test::read_file(summary));
  const json& stages = row->at("stages");
  expect_row_matches(stages.at(0), s, what);
  if (!s.contains("pipeline")) {
    EXPECT_EQ(stages.size(), 1u);
    return;
  }
  const json& ran = s.at("pipeline").at("stages");
  ASSERT_EQ(ran.size(), stages.size());
  for (size_t k = 0; k < ran.size(); ++k) {
    const json &st = stages.at(k), &got = ran.at(k);
    EXPECT_EQ(got.at("arenas").get<int64_t>(), st.at("arenas").get<int64_t>()) << "stage " << k;
    EXPECT_EQ(got.at("arena_bytes").get<uint64_t>(), st.at("arena_bytes").get<uint64_t>()) << "stage " << k;
    EXPECT_EQ(got.at("activation_bytes").get<uint64_t>(), st.at("bytes").at("activations").get<uint64_t>())
        << "stage " << k;
    if (std::string(c.strategy) != "zero3") {  // replicated parameters: the stage's whole count
      // (in the compute type: under bf16 the masters count as optimizer state)
      const uint64_t width = std::string(c.precision) == "bf16" ? 2 : 4;
      EXPECT_EQ(width * got.at("params").get<uint64_t>(), st.at("bytes").at("parameters").get<uint64_t>())
          << "stage " << k;
    }
    if (k + 1 == ran.size()) {
      EXPECT_EQ(got.at("tied_copy_bytes").get<uint64_t>(), st.at("bytes").at("pipeline").get<uint64_t>());
    }
  }
  // The row is the stage that needs the most; the pipeline's bubble.
  uint64_t most = 0;
  for (const json& st : stages) most = std::max(most, st.at("bytes").at("total").get<uint64_t>());
  EXPECT_EQ(row->at("bytes").at("total").get<uint64_t>(), most);
  EXPECT_DOUBLE_EQ(row->at("bubble").get<double>(), s.at("pipeline").at("bubble_formula").get<double>());
}

TEST_F(PlanCliTest, MeshRowsMatchRuns) {
  const std::string model = kGpt.flags.substr(0, kGpt.flags.find(" --batch"));
  for (const MeshCase& c : {MeshCase{2, "local", "--batch 4 --tp 2 --micro-batches 2", false},
                            MeshCase{2, "local", "--batch 4 --tp 2 --micro-batches 2", true},
                            // vocabulary-parallel: wte's rows, the embedding's and the loss's sums
                            MeshCase{2, "local", "--batch 4 --tp 2 --micro-batches 2 --tp-embedding vocab", false},
                            MeshCase{8, "zero3", "--batch 4 --tp 2 --pp 2 --tp-embedding vocab", false},
                            MeshCase{2, "local", "--batch 4 --pp 2 --micro-batches 4 --pp-schedule gpipe", false},
                            MeshCase{2, "local", "--batch 4 --pp 2 --micro-batches 4 --pp-schedule 1f1b", false},
                            MeshCase{4, "zero3", "--batch 4 --tp 2", false},
                            MeshCase{4, "zero1", "--batch 4 --pp 2 --micro-batches 2", false},
                            MeshCase{4, "zero3", "--batch 4 --pp 2", false},
                            MeshCase{4, "zero3", "--batch 4 --pp 2 --micro-batches 2", false},
                            MeshCase{4, "zero3", "--batch 8 --pp 2 --micro-batches 4 --pp-schedule gpipe", false},
                            MeshCase{4, "zero3", "--batch 8 --pp 2 --micro-batches 4 --pp-schedule 1f1b", false},
                            // bf16 under --pp: the head's wte copy and its send in bf16.
                            MeshCase{2, "local", "--batch 4 --pp 2 --micro-batches 2", false, "bf16"},
                            MeshCase{4, "zero3", "--batch 4 --pp 2 --micro-batches 2", false, "bf16"},
                            MeshCase{4, "zero3", "--batch 4 --pp 2 --micro-batches 2", false, "bf16", "params"},
                            MeshCase{2, "local", "--batch 4 --pp 2 --micro-batches 2", false, "fp32", "optimizer"}})
    expect_mesh_row_matches(model, c);
}

// Schedules past 1F1B (docs/pipeline.md): several chunks per rank, each
// with the slots its list needs, and a split backward's arenas keeping
// each linear's output gradient and the norms' parameter gradients for W
// (over dead forward buffers, here partly beside them: B x T < C); the
// transfers the lists make (a V sends both ways, none between its two
// middle chunks).
TEST_F(PlanCliTest, MeshRowsMatchRunsUnderEverySchedule) {
  const std::string model = "--model gpt --layers 4 --width 64 --heads 2 --context 32 --vocab 2048";
  for (const MeshCase& c : {MeshCase{2, "local", "--batch 4 --pp 2 --micro-batches 4 --pp-schedule interleaved", false},
                            MeshCase{2, "local", "--batch 4 --pp 2 --micro-batches 4 --pp-schedule zb-h1", false},
                            // B x T >= C: W's keep entirely over dead forward buffers; and checkpointed.
                            MeshCase{2, "local", "--batch 8 --pp 2 --micro-batches 4 --pp-schedule zb-h1", false},
                            MeshCase{2, "local", "--batch 8 --pp 2 --micro-batches 4 --pp-schedule zb-h1", true},
                            MeshCase{2, "local", "--batch 4 --pp 2 --micro-batches 4 --pp-schedule zb-v", false},
                            MeshCase{2, "local", "--batch 4 --pp 2 --micro-batches 4 --pp-schedule zb-v", false, "bf16"},
                            MeshCase{4, "zero1", "--batch 8 --pp 2 --micro-batches 4 --pp-schedule zb-v", false}})
    expect_mesh_row_matches(model, c);
}

// ZB-H1 holds no more activation bytes than 1F1B on any rank (issue 32):
// the same arenas per rank, and what W keeps lies over forward buffers B
// leaves dead (docs/pipeline.md). W-GPT and W-LLAMA at pp 2, M = 8, the
// benchmark's shape (bench/pp_schedules_bench.py), fp32 and bf16, without
// checkpointing (with it, W still needs each block's linears' inputs,
// which 1F1B recomputes: docs/memory.md).
// The schedules' table (mesh.schedules): every schedule that runs at pp 2,
// M 8, each chunk's costs by FLOPs. The ordering the simulator must give:
// gpipe's and 1f1b's bubble alike, and each later schedule below 1f1b's
// (interleaved by v, zb-h1 by its W's, zb-v by both) on the ranks' mean.
TEST_F(PlanCliTest, SchedulesTableOrdersTheBubbles) {
  const RunResult r = dpt("plan --model gpt --layers 4 --heads 4 --width 256 --context 128 --batch 16 --ranks 2 "
                          "--pp 2 --micro-batches 8 --json --memory 1T");
  ASSERT_EQ(r.code, 0) << r.err;
  const json plan = json::parse(r.out);
  std::map<std::string, json> by;
  for (const json& s : plan.at("mesh").at("schedules")) by[s.at("schedule")] = s;
  ASSERT_EQ(by.size(), 5u);
  auto mean = [&](const char* name) { return by.at(name).at("idle_mean").get<double>(); };
  EXPECT_NEAR(by.at("gpipe").at("idle_rank0").get<double>(), by.at("1f1b").at("idle_rank0").get<double>(), 1e-12);
  EXPECT_GT(mean("1f1b"), 0.1);  // (pp - 1) / (M + pp - 1) = 1/9 balanced; the head's chunk adds to it
  EXPECT_LT(mean("interleaved"), 0.75 * mean("1f1b"));
  EXPECT_LT(mean("zb-h1"), mean("1f1b"));
  EXPECT_LT(mean("zb-v"), mean("zb-h1"));
  EXPECT_LT(mean("zb-v"), 0.05);
}

TEST_F(PlanCliTest, ZbH1HoldsNoMoreActivationsThan1f1b) {
  for (const std::string model : {"--model gpt --layers 4 --heads 4 --width 256 --context 128", "--model llama"}) {
    json rows[2];
    for (int i = 0; i < 2; ++i) {
      const RunResult r = dpt(fmt::format("plan {} --batch 16 --ranks 2 --pp 2 --micro-batches 8 --pp-schedule {} "
                                          "--json --memory 1T",
                                          model, i == 0 ? "1f1b" : "zb-h1"));
      ASSERT_EQ(r.code, 0) << r.err;
      rows[i] = json::parse(r.out);
    }
    for (const char* precision : {"fp32", "bf16"}) {
      SCOPED_TRACE(fmt::format("{} {}", model, precision));
      const json *one = find_row(rows[0], "local", false, precision), *zb = find_row(rows[1], "local", false, precision);
      ASSERT_NE(one, nullptr);
      ASSERT_NE(zb, nullptr);
      ASSERT_EQ(zb->at("stages").size(), 2u);
      for (size_t s = 0; s < 2; ++s) {
        const json &a = one->at("stages")[s], &b = zb->at("stages")[s];
        EXPECT_EQ(b.at("arenas"), a.at("arenas")) << "rank " << s;
        EXPECT_LE(b.at("bytes").at("activations").get<int64_t>(), a.at("bytes").at("activations").get<int64_t>())
            << "rank " << s;
      }
    }
  }
}

// The same for the Llama configuration: tp 2 (each rank 2 query heads and
// their key/value head, half of SwiGLU; both embedding modes, the untied
// head's rows split with the embedding's), both schedules, ZeRO-3 over
// dp 2, bf16; and the tied head under --pp 2, whose last stage holds the
// embedding's copy (the untied head's last stage holds none).
TEST_F(PlanCliTest, LlamaMeshRowsMatchRuns) {
  const std::string model = kLlama.flags.substr(0, kLlama.flags.find(" --batch"));
  for (const MeshCase& c : {MeshCase{2, "local", "--batch 4 --tp 2 --micro-batches 2", false},
                            MeshCase{2, "local", "--batch 4 --tp 2 --micro-batches 2", true},
                            MeshCase{2, "local", "--batch 4 --tp 2 --micro-batches 2 --tp-embedding vocab", false},
                            MeshCase{2, "local", "--batch 4 --pp 2 --micro-batches 4 --pp-schedule gpipe", false},
                            MeshCase{2, "local", "--batch 4 --pp 2 --micro-batches 4 --pp-schedule 1f1b", false},
                            MeshCase{4, "zero3", "--batch 4 --tp 2", false},
                            MeshCase{4, "zero3", "--batch 4 --pp 2 --micro-batches 2", false, "bf16"},
                            MeshCase{2, "local", "--batch 4 --pp 2 --micro-batches 2 --tie-embeddings", false},
                            MeshCase{4, "zero3", "--batch 4 --pp 2 --micro-batches 2 --tie-embeddings", false, "bf16"}})
    expect_mesh_row_matches(model, c);
}

// The plan's parameters for a Llama configuration are its formula's: the
// embedding and the untied head (V x C each), per block the two RMSNorm
// weights, q_proj (heads x head_dim rows), k_proj and v_proj (kv_heads x
// head_dim rows each: GQA's smaller K/V), o_proj, SwiGLU's gate, up and
// down (C x I each), the final norm; 4 bytes each, and as many gradient
// bytes; AdamW's two moments; the activations, the arena the decoder lays
// out for the run's batch (a run's summary). Tied: one V x C fewer.
TEST_F(PlanCliTest, LlamaPlanHoldsTheFormula) {
  const int64_t V = 2048, C = 64, L = 3, H = 4, KV = 2, D = 16, I = 96;
  const int64_t block = 2 * C + (H + 2 * KV) * D * C + H * D * C + 3 * C * I;
  for (const bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    const int64_t params = (tied ? 1 : 2) * V * C + L * block + C;
    const Net net{tied ? "llama_tied" : "llama", kLlama.flags + (tied ? " --tie-embeddings" : "")};
    const json p = plan(net);
    ASSERT_FALSE(p.is_null());
    EXPECT_EQ(p.at("params").get<int64_t>(), params);
    const json* row = find_row(p, "ddp", false);
    ASSERT_NE(row, nullptr);
    const json& bytes = row->at("bytes");
    EXPECT_EQ(bytes.at("parameters").get<int64_t>(), 4 * params);
    EXPECT_EQ(bytes.at("gradients").get<int64_t>(), 4 * params);
    EXPECT_EQ(bytes.at("optimizer").get<int64_t>(), 8 * params);  // AdamW's m and v
    const json s = train(net, "ddp", false);
    ASSERT_FALSE(s.is_null());
    EXPECT_EQ(s.at("params").get<int64_t>(), params);
    EXPECT_EQ(bytes.at("activations"), s.at("bytes").at("activations"));
  }
}

// --meshes: every tp x pp of the ranks that training runs for the model (the
// GPT has 2 heads and 3 blocks: tp 4 and pp 4 are not), each row the same
// as the plan of that mesh alone.
// The largest context per attention mode (train/plan_context.h), by the
// plan's own accounting: at that context the row fits, one token more it
// does not, each checked with `dpt plan --context`; and a 2-rank run at the
// fused mode's context trains while one token more is refused. The modes keep less per
// token in the order unfused, fused, fused + checkpointing, so each fits a
// longer context than the one before.
TEST_F(PlanCliTest, LargestContextFitsAndTheNextDoesNot) {
  const std::string llama =
      "--model llama --layers 3 --width 64 --heads 4 --kv-heads 2 --intermediate 96 --vocab 2048 --batch 4";
  auto plan_at = [&](const std::string& extra) {
    const RunResult r = dpt(fmt::format("plan {} {} --ranks 2 --json --gemm-gflops 10 --copy-gbs 2 --disk-gbs 1 "
                                        "--offload-dir {} --memory 64M",
                                        llama, extra, q(dir_)));
    EXPECT_EQ(r.code, 0) << r.err;
    return r.code == 0 ? json::parse(r.out) : json();
  };
  const json limits = plan_at("").at("largest_context");
  // The row's verdict in a plan at context T.
  auto fits = [&](const std::string& mode, int64_t T) {
    const json p = plan_at(fmt::format("--context {} --attention {} --strategy {}", T,
                                       mode == "unfused" ? "unfused" : "fused", limits.at("strategy").get<std::string>()));
    for (const json& row : p.at("rows"))
      if (row.at("precision") == limits.at("precision") && row.at("offload") == limits.at("offload") &&
          row.at("checkpoint_activations") == (mode == "fused+ckpt"))
        return row.at("fits").get<bool>();
    ADD_FAILURE() << "no row for " << mode << " at " << T;
    return false;
  };
  int64_t before = 0;
  for (const char* mode : {"unfused", "fused", "fused+ckpt"}) {
    SCOPED_TRACE(mode);
    const int64_t T = limits.at(mode).at("context").get<int64_t>();
    EXPECT_FALSE(limits.at(mode).at("capped").get<bool>());
    EXPECT_GT(T, before);
    EXPECT_TRUE(fits(mode, T));
    EXPECT_FALSE(fits(mode, T + 1));
    std::printf("[ measure  ] %s: largest context %lld\n", mode, static_cast<long long>(T));
    before = T;
  }
  // And training agrees: at the fused mode's context one step runs within
  // the same 64 MiB; one token more, its memory check refuses it.
  const int64_t T = limits.at("fused").at("context").get<int64_t>();
  auto train_at = [&](int64_t context) {
    return dpt(fmt::format("launch -n 2 -- {} train {} --context {} --strategy {} --precision {} --attention fused "
                           "--synthetic --steps 1 --threads 1 --quiet --memory-budget-mb 64",
                           q(dpt_bin()), llama, context, limits.at("strategy").get<std::string>(),
                           limits.at("precision").get<std::string>()));
  };
  const RunResult fits_run = train_at(T), refused = train_at(T + 1);
  EXPECT_EQ(fits_run.code, 0) << fits_run.all();
  EXPECT_NE(refused.code, 0);
  EXPECT_NE(refused.err.find("needs about"), std::string::npos) << refused.all();
}

TEST_F(PlanCliTest, MeshesPlansEveryLayoutTrainingRuns) {
  const std::string rates = " --ranks 4 --json --gemm-gflops 10 --copy-gbs 2 --disk-gbs 1 --memory 1T";
  const RunResult all = dpt("plan " + kGpt.flags + rates + " --meshes");
  ASSERT_EQ(all.code, 0) << all.err;
  const json plan = json::parse(all.out);
  std::map<std::tuple<int, int, int>, std::vector<json>> by_mesh;
  for (const json& row : plan.at("rows"))
    by_mesh[{row.at("tp").get<int>(), row.at("pp").get<int>(), row.at("cp").get<int>()}].push_back(row);
  // Context parallelism runs beside data, tensor and pipeline
  // parallelism: cp 2 and 4 divide the 32-token context into 4 and 8.
  const std::vector<std::tuple<int, int, int>> expected = {{1, 1, 1}, {1, 1, 2}, {1, 1, 4}, {1, 2, 1},
                                                           {1, 2, 2}, {2, 1, 1}, {2, 1, 2}, {2, 2, 1}};
  ASSERT_EQ(by_mesh.size(), expected.size());
  for (const auto& [tp, pp, cp] : expected) {
    SCOPED_TRACE(fmt::format("tp {} pp {} cp {}", tp, pp, cp));
    ASSERT_EQ(by_mesh.count(std::make_tuple(tp, pp, cp)), 1u);
    const RunResult one = dpt(fmt::format("plan {}{} --tp {} --pp {} --cp {}", kGpt.flags, rates, tp, pp, cp));
    ASSERT_EQ(one.code, 0) << one.err;
    const json alone = json::parse(one.out).at("rows");
    const std::vector<json>& rows = by_mesh[std::make_tuple(tp, pp, cp)];
    ASSERT_EQ(alone.size(), rows.size());
    // The bytes but the peak RSS, which adds each process's own runtime.
    auto held = [](json bytes) {
      bytes.erase("peak_rss");
      return bytes;
    };
    for (size_t i = 0; i < alone.size(); ++i) {
      EXPECT_EQ(held(rows[i].at("bytes")), held(alone.at(i).at("bytes")));
      EXPECT_EQ(rows[i].at("comm"), alone.at(i).at("comm"));
      EXPECT_EQ(rows[i].at("strategy"), alone.at(i).at("strategy"));
    }
  }
  test::expect_one_refusal(dpt("plan " + kGpt.flags + rates + " --meshes --tp 2"), "give it or --tp/--pp/--cp, not both");
}

// An impossible mesh is refused with training's own sentence.
TEST_F(PlanCliTest, ImpossibleMeshesAreRefused) {
  const std::string plan = "plan " + kGpt.flags + " --gemm-gflops 10 --copy-gbs 2 --disk-gbs 1 ";
  for (const auto& [args, says] : std::vector<std::pair<std::string, std::string>>{
           {"--ranks 3 --tp 2", "3 ranks do not split into --tp 2 x --pp 1"},
           {"--ranks 4 --tp 4", "--tp 4 does not divide the model's 2 attention heads"},
           {"--ranks 4 --pp 4", "--pp 4 needs at least one block per stage, and the model has 3"},
           {"--ranks 4 --tp 2 --micro-batches 3", "global batch 4 does not split into 2 data-parallel replicas x 3"},
           {"--ranks 2 --pp 2 --micro-batches 2 --grad-accum 4", "one setting under two names"},
           {"--ranks 4 --tp 2 --strategy local", "--strategy local trains one replica, not 2 data-parallel replicas"},
           {"--ranks 2 --strategy local", "--strategy local trains one process, not 2 ranks"},
           {"--ranks 2 --strategy hsdp", "unknown strategy 'hsdp' (expected local, ddp, zero1, zero2, zero3 or fsdp)"}}) {
    SCOPED_TRACE(args);
    test::expect_one_refusal(dpt(plan + args), says);
  }
  test::expect_one_refusal(dpt("plan --model mlp --ranks 2 --tp 2 --gemm-gflops 10 --copy-gbs 2 --disk-gbs 1"),
                           "the mlp model has none");
}

// More ranks on this host than the job has: clamped to the job, the plan
// answered for another host than the one asked about, without a word.
TEST_F(PlanCliTest, MoreRanksPerHostThanRanksIsRefused) {
  const std::string plan = "plan " + kGpt.flags + " --gemm-gflops 10 --copy-gbs 2 --disk-gbs 1 ";
  test::expect_one_refusal(dpt(plan + "--ranks 2 --ranks-per-host 4"),
                           "--ranks-per-host 4 is more than the job's 2 ranks: a host holds at most all of them");
  test::expect_one_refusal(dpt(plan + "--ranks-per-host 2"),
                           "--ranks-per-host 2 is more than the job's 1 rank (--ranks is not given)");
  EXPECT_EQ(dpt(plan + "--ranks 4 --ranks-per-host 4").code, 0);
  EXPECT_EQ(dpt(plan + "--ranks 4 --ranks-per-host 2").code, 0);
}

// --zero-accumulate with one micro-batch per step: rows of full gradients
// kept for nothing (as dpt train refuses it, FileKindsTest).
TEST_F(PlanCliTest, ZeroAccumulateWithOneMicroBatchIsRefused) {
  const std::string plan = "plan " + kGpt.flags + " --gemm-gflops 10 --copy-gbs 2 --disk-gbs 1 --ranks 2 ";
  test::expect_one_refusal(dpt(plan + "--zero-accumulate local"),
                           "--zero-accumulate sets how a sharded strategy keeps its gradients over --grad-accum's "
                           "micro-batches, and this run has one micro-batch per step");
  EXPECT_EQ(dpt(plan + "--zero-accumulate local --grad-accum 2").code, 0);
}

// A --pp-split with a final comma read as the counts before it, and an
// empty one as no split (balanced by parameters): both ran.
TEST_F(PlanCliTest, APpSplitMissingACountIsRefused) {
  const std::string plan = "plan " + kGpt.flags + " --gemm-gflops 10 --copy-gbs 2 --disk-gbs 1 --ranks 2 --pp 2 ";
  test::expect_one_refusal(dpt(plan + "--pp-split 1,2,"), "--pp-split '1,2,': '' is not a positive number of blocks");
  test::expect_one_refusal(dpt(plan + "--pp-split ''"), "--pp-split is empty");
  EXPECT_EQ(dpt(plan + "--pp-split 1,2").code, 0);
}

// --meshes over 7 ranks, whose batch of 16 no mesh splits: no row, and the
// reason dereferenced the smallest of no rows (a segmentation fault).
TEST_F(PlanCliTest, MeshesOfAWorldNoLayoutRunsIsTrainingsSentence) {
  test::expect_one_refusal(dpt("plan --model gpt --ranks 7 --meshes --gemm-gflops 10 --copy-gbs 2 --disk-gbs 1"),
                           "global batch 16 does not split into 7 ranks x 1 equal micro-batches");
}

// Degrees whose product passes an int: --tp 65536 --pp 65536 is 2^32, 0 as
// an int (a division by zero, SIGFPE); --pp 2 x --virtual-stages 2^30
// overflowed too (a segmentation fault).
TEST_F(PlanCliTest, HugeMeshDegreesAreRefusedNotOverflowed) {
  const std::string plan = "plan " + kGpt.flags + " --gemm-gflops 10 --copy-gbs 2 --disk-gbs 1 --ranks 2 ";
  test::expect_one_refusal(dpt(plan + "--tp 65536 --pp 65536"),
                           "2 ranks do not split into --tp 65536 x --pp 65536 (a multiple of 4294967296 is needed)");
  test::expect_one_refusal(dpt(plan + "--pp 2 --pp-schedule interleaved --virtual-stages 1073741824 --micro-batches 2"),
                           "--pp 2 x --virtual-stages 1073741824 needs at least one block per chunk, and the model has 3");
}

// 2^31 micro-batches of a batch of 4: the pipeline's program was built for
// them before the batch's split was checked (40 s, then "out of memory").
TEST_F(PlanCliTest, MicroBatchesTheBatchCannotHoldAreRefusedBeforeTheSchedule) {
  const RunResult r =
      dpt("plan " + kGpt.flags + " --gemm-gflops 10 --copy-gbs 2 --disk-gbs 1 --ranks 2 --pp 2 --micro-batches 2147483647",
          30);
  test::expect_one_refusal(r, "global batch 4 does not split into 1 data-parallel replicas x 2147483647 equal");
}

// CLI11's delimiter dropped empty items: "ddp,,zero1" and "ddp," planned
// as if whole, and an empty --strategy planned every strategy.
TEST_F(PlanCliTest, AStrategyListWithAnEmptyNameIsRefused) {
  const std::string plan = "plan " + kGpt.flags + " --gemm-gflops 10 --copy-gbs 2 --disk-gbs 1 --ranks 2 ";
  for (const char* list : {"ddp,,zero1", "ddp,", ",ddp", ""})
    test::expect_one_refusal(dpt(plan + "--strategy " + test::q(list)),
                             fmt::format("--strategy '{}': an empty name", list));
  const RunResult r = dpt(plan + "--strategy ddp,zero1 --strategy zero3 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  std::set<std::string> planned;
  const json plan_json = json::parse(r.out);
  for (const json& row : plan_json.at("rows")) planned.insert(row.at("strategy").get<std::string>());
  EXPECT_EQ(planned, (std::set<std::string>{"ddp", "zero1", "zero3"}));
}

TEST_F(PlanCliTest, BadInputIsOneSentenceAndExitOne) {
  for (const char* args : {"--model gpt --ranks 2 --strategy bogus", "--model gpt --ranks 0",
                           "--model gpt --ranks 2 --memory lots", "--model gpt --ranks 2 --memory -5G",
                           "--model gpt --ranks 2 --strategy local", "--model gpt --ranks 3 --batch 16",
                           "--ranks 2", "--model gpt --ranks 2 --offload-dir /nonexistent",
                           // read as no --memory (the default), and as 0 or 2^63 bytes (past size_t)
                           "--model gpt --ranks 2 --memory ''", "--model gpt --ranks 2 --memory 99999999999999999999T"}) {
    const RunResult r = dpt(fmt::format("plan {} --gemm-gflops 10 --copy-gbs 2 --disk-gbs 1", args));
    EXPECT_EQ(r.code, 1) << args << ": " << r.all();
    EXPECT_TRUE(r.out.empty()) << args << ": " << r.out;
    ASSERT_FALSE(r.err.empty()) << args;
    EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << args << ": " << r.err;
    EXPECT_EQ(r.err.rfind("dpt: error: ", 0), 0u) << args << ": " << r.err;
  }
}

}  // namespace
}  // namespace dpt
