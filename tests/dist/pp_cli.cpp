// Pipeline parallelism end to end (docs/pipeline.md): `dpt train --pp` jobs
// under mpirun against one process with the same global batch and
// micro-batches, compared on the weights they save and the losses they log.
//
//   M = 1, no clipping: pp 2 and 3, gpipe and 1f1b, byte for byte (AdamW),
//     and the final evaluation's loss, computed through the stages, equal.
//     One process sums wte's gradient as the head's part, then each token's
//     embedding gradient; the last stage sends its head part to the first
//     before that stage's embedding backward, so every addition is one
//     process's, in its order.
//   M = 4: within 1e-6 after 10 steps. The first stage adds the head's part
//     of the whole step before its last embedding backward, where one
//     process interleaves it micro-batch by micro-batch: the sums differ in
//     rounding only. These runs use SGD with momentum: AdamW divides each
//     update by sqrt(v) + eps, so an element whose gradient is a
//     near-cancelling sum (c_attn's key biases: softmax ignores them) turns a
//     rounding difference of its terms into up to lr of its update (measured:
//     7.9e-7 absolute on a bias of max 3e-3 after 10 steps; dist_zero.cpp
//     says the same of ZeRO against DDP). With SGD the measured worst is
//     2.9e-7 (pp 2 and 3, both schedules); a missing or doubled head gradient, a
//     wrong loss scale or a micro-batch out of order moves weights by
//     orders of magnitude more.
//   M = 4 with --clip (pp 3): within 1e-6, the norm summed across stages.
//   pp 2 x dp 2 under zero1 and zero3 (4 ranks), M = 2: within 1e-5 (the
//     data-parallel sums add rounding of their own; measured 2.4e-7).
//   Impossible meshes: one sentence, exit 1, before any work.
//
// "Within r": per tensor, max|a - b| <= r x max|b|, and the same for every
// logged step's loss. Data: a generated text, so every world size sees the
// same sequences (--synthetic draws a batch per rank).
//
// Registered in tests/CMakeLists.txt (ctest names pp_cli.*).
#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../cli_run.h"
#include "corpus_runs.h"

namespace dpt {
namespace {

namespace fs = std::filesystem;
using test::q;
using test::read_file;
using test::RunResult;

// One thread everywhere: the kernels' row reductions split by thread, and
// one process would otherwise take all cores where a rank takes one.
constexpr const char* kGpt =
    "--model gpt --heads 2 --width 32 --context 16 --seed 3 --quiet --log-every 1 --threads 1";
constexpr const char* kSgd = "--optimizer sgd --lr 0.05 --momentum 0.9";

class PpCliTest : public test::CorpusRuns<PpCliTest> {
 protected:
  static void SetUpTestSuite() {
    make_folder("dpt_pp_cli", {"the", "pipe", "stage", "micro", "batch", "bubble", "send", "recv", "grad", "loss"});
  }

  // The final evaluation's loss (the held-out tail of the text).
  static double val_loss(const fs::path& stem) {
    return nlohmann::json::parse(read_file(stem.string() + ".json"))["val_loss"].get<double>();
  }

  static std::map<int64_t, double> losses(const fs::path& stem) { return test::logged_losses(stem); }

  // Per tensor and per loss a logs: max|a - b| <= r x max|b|.
  static void expect_within(const fs::path& a, const fs::path& b, double r) {
    const double worst = test::expect_tensors_within(a.string() + ".st", b.string() + ".st", r);
    test::expect_losses_within(a, b, r);
    EXPECT_LE(std::fabs(val_loss(a) - val_loss(b)), r * std::fabs(val_loss(b)));
    std::printf("[ measure  ] %s vs %s: worst tensor max|a-b|/max|b| %.3e\n", a.filename().c_str(),
                b.filename().c_str(), worst);
  }
};

TEST_F(PpCliTest, OneMicroBatchIsBitwiseOneProcess) {
  for (int pp : {2, 3}) {
    const std::string args = fmt::format("{} --layers {} --batch 4 --steps 3", kGpt, pp);
    const fs::path one = run_ok(1, fmt::format("one_l{}", pp), args);
    for (const char* schedule : {"gpipe", "1f1b"}) {
      SCOPED_TRACE(fmt::format("pp {} {}", pp, schedule));
      const fs::path piped = run_ok(pp, fmt::format("pp{}_{}_m1", pp, schedule),
                                    fmt::format("{} --pp {} --pp-schedule {}", args, pp, schedule));
      EXPECT_TRUE(read_file(piped.string() + ".st") == read_file(one.string() + ".st")) << "weights differ";
      EXPECT_EQ(losses(piped), losses(one));
      EXPECT_EQ(val_loss(piped), val_loss(one));  // evaluation through the stages
    }
  }
}

// --load: each stage reads its own tensors from the whole model's file.
TEST_F(PpCliTest, LoadedWeightsTrainAsInOneProcess) {
  const fs::path start = run_ok(1, "start", fmt::format("{} --layers 3 --batch 4 --steps 2", kGpt));
  const std::string args =
      fmt::format("{} --layers 3 --batch 4 --steps 3 --load {}", kGpt, q(start.string() + ".st"));
  const fs::path one = run_ok(1, "one_loaded", args);
  const fs::path piped = run_ok(3, "pp3_loaded", args + " --pp 3");
  EXPECT_TRUE(read_file(piped.string() + ".st") == read_file(one.string() + ".st")) << "weights differ";
  EXPECT_FALSE(read_file(start.string() + ".st") == read_file(one.string() + ".st")) << "the run trained nothing";
}

TEST_F(PpCliTest, FourMicroBatchesWithinOneProcess) {
  for (int pp : {2, 3}) {
    const std::string args =
        fmt::format("{} {} --layers 3 --batch 8 --micro-batches 4 --steps 10", kGpt, kSgd);
    const fs::path one = pp == 2 ? run_ok(1, "one_m4", args) : dir_ / "one_m4";
    for (const char* schedule : {"gpipe", "1f1b"}) {
      SCOPED_TRACE(fmt::format("pp {} {}", pp, schedule));
      expect_within(run_ok(pp, fmt::format("pp{}_{}_m4", pp, schedule),
                           fmt::format("{} --pp {} --pp-schedule {}", args, pp, schedule)),
                    one, 1e-6);
    }
  }
}

// Clipping across stages: the norm is each stage's sum of squares summed
// over the stages, so every rank scales by the same factor (--clip 0.5
// engages from the first step: the norm starts near 1.3).
TEST_F(PpCliTest, ClippingAcrossStagesWithinOneProcess) {
  const std::string args =
      fmt::format("{} {} --layers 3 --batch 8 --micro-batches 4 --steps 10 --clip 0.5", kGpt, kSgd);
  const fs::path one = run_ok(1, "one_clip", args);
  expect_within(run_ok(3, "pp3_clip", args + " --pp 3"), one, 1e-6);
}

TEST_F(PpCliTest, PipelineTimesDataParallelWithinOneProcess) {
  const std::string args = fmt::format("{} {} --layers 2 --batch 8 --micro-batches 2 --steps 10", kGpt, kSgd);
  const fs::path one = run_ok(1, "one_dp", args);
  for (const char* strategy : {"zero1", "zero3"}) {
    SCOPED_TRACE(strategy);
    const fs::path piped =
        run_ok(4, fmt::format("pp2_dp2_{}", strategy), fmt::format("{} --pp 2 --strategy {}", args, strategy));
    expect_within(piped, one, 1e-5);
  }
}

// HSDP over each stage's DP group (docs/zero.md): pp 2 x dp 4 in shard
// groups of 2, so each stage has two shard groups (ZeRO-3 inside) and two
// replica groups (the shards' all-reduce), at 8 ranks, M = 2, 1f1b: within
// 1e-5 of one process (measured 2.9e-7). HSDP completes its reductions at
// fixed points of the program (docs/zero.md "Ordering"), which the
// pipeline's sends and receives on their own groups do not move: 0 hangs in
// 36 runs of 8 ranks (fp32 and bf16, M = 4 and 8, both schedules).
TEST_F(PpCliTest, PipelineTimesHsdpWithinOneProcess) {
  const std::string args = fmt::format("{} {} --layers 2 --batch 8 --micro-batches 2 --steps 10", kGpt, kSgd);
  const fs::path piped = run_ok(8, "pp2_dp4_hsdp", args + " --pp 2 --strategy hsdp --shard-group 2");
  const nlohmann::json hsdp = nlohmann::json::parse(read_file(piped.string() + ".json"))["hsdp"];
  EXPECT_EQ(hsdp["shard_group"], 2) << hsdp;
  EXPECT_EQ(hsdp["replicas"], 2) << hsdp;
  expect_within(piped, run_ok(1, "one_hsdp", args), 1e-5);
}

// Offload (docs/memory.md): each stage's ranks stream their stage's
// optimizer state (--offload optimizer) or also their fp32 masters
// (--offload params: bf16, a sharded strategy) through a file of their own,
// in 4 KiB chunks; the arithmetic is the same, so the weights equal the
// runs without offload byte for byte. The summary (rank 0: the first stage)
// counts the state as offloaded, and the files are gone after the run.
TEST_F(PpCliTest, OffloadEqualsThePipelineWithout) {
  const fs::path off = dir_ / "off";
  fs::create_directories(off);
  const std::string to = fmt::format(" --offload-dir {} --offload-chunk-mb 0.004", q(off));
  const std::string args = fmt::format("{} --layers 3 --batch 8 --micro-batches 2 --steps 5 --pp 2", kGpt);
  const fs::path ram = run_ok(2, "pp2_ram", args);
  const fs::path moved = run_ok(2, "pp2_offload_optimizer", args + " --offload optimizer" + to);
  EXPECT_TRUE(read_file(moved.string() + ".st") == read_file(ram.string() + ".st")) << "optimizer offload differs";
  const auto bytes = [](const fs::path& stem) {
    return nlohmann::json::parse(read_file(stem.string() + ".json"))["bytes"];
  };
  EXPECT_EQ(bytes(moved)["offloaded"], bytes(ram)["optimizer"]);
  EXPECT_GT(bytes(ram)["optimizer"].get<int64_t>(), 0);

  const std::string sharded = args + " --strategy zero3 --precision bf16";
  const fs::path ram16 = run_ok(4, "pp2_dp2_zero3_bf16_ram", sharded);
  const fs::path params = run_ok(4, "pp2_dp2_zero3_bf16_offload_params", sharded + " --offload params" + to);
  EXPECT_TRUE(read_file(params.string() + ".st") == read_file(ram16.string() + ".st")) << "params offload differs";
  // The masters, m and v: a bf16 sharded run's whole optimizer category.
  EXPECT_EQ(bytes(params)["offloaded"], bytes(ram16)["optimizer"]);
  EXPECT_TRUE(fs::is_empty(off)) << "an offload file was left behind";
}

// bf16 (docs/precision.md): each stage computes with bf16 copies of its
// weights and the last stage's head with a bf16 copy of wte, rounded from
// the fp32 masters as one process rounds its own. At M = 1 every rounding
// and every addition is one process's: byte for byte (AdamW), and not the
// fp32 run's weights.
TEST_F(PpCliTest, Bf16OneMicroBatchIsBitwiseOneProcess) {
  for (int pp : {2, 3}) {
    SCOPED_TRACE(fmt::format("pp {}", pp));
    const std::string args = fmt::format("{} --layers {} --batch 4 --steps 3", kGpt, pp);
    const fs::path one = run_ok(1, fmt::format("one_bf16_l{}", pp), args + " --precision bf16");
    const fs::path piped = run_ok(pp, fmt::format("pp{}_bf16_m1", pp), fmt::format("{} --precision bf16 --pp {}", args, pp));
    EXPECT_TRUE(read_file(piped.string() + ".st") == read_file(one.string() + ".st")) << "weights differ";
    EXPECT_EQ(losses(piped), losses(one));
    EXPECT_EQ(val_loss(piped), val_loss(one));
    const fs::path fp32 = run_ok(1, fmt::format("one_fp32_l{}", pp), args);
    EXPECT_FALSE(read_file(fp32.string() + ".st") == read_file(one.string() + ".st")) << "bf16 computed in fp32";
  }
}

// bf16 at M = 4 (the head's part of wte's gradient summed before the
// tokens', as in fp32): within 1e-6 (measured 1.3e-7).
TEST_F(PpCliTest, Bf16FourMicroBatchesWithinOneProcess) {
  const std::string args =
      fmt::format("{} {} --layers 3 --batch 8 --micro-batches 4 --steps 10 --precision bf16", kGpt, kSgd);
  expect_within(run_ok(2, "pp2_bf16_m4", args + " --pp 2"), run_ok(1, "one_bf16_m4", args), 1e-6);
}

// pp 2 x dp 2 under zero3 in bf16 (units gathered in bf16 over each
// stage's DP group): at M = 1 the pipeline adds nothing to the data-parallel
// sums, so byte for byte dp 2 without the pipeline, and within 1e-2 of one
// process, as the tensor-parallel bf16 runs are (tests/dist/tp_cli.cpp): the
// data-parallel sum adds in another order than one process, and a master
// that differs in its last fp32 bit can round to another bf16 compute copy,
// a bf16 ulp that later steps carry on (measured 3.8e-7 on one build and
// 7.5e-5 on the next, whose LayerNorm sums its rows in SIMD lanes; at M > 1
// 1.1e-4; docs/precision.md measures the same of DDP against one process).
TEST_F(PpCliTest, Bf16PipelineTimesZero3IsDataParallelsSums) {
  const std::string args =
      fmt::format("{} {} --layers 2 --batch 8 --steps 10 --precision bf16 --strategy zero3", kGpt, kSgd);
  const fs::path piped = run_ok(4, "pp2_dp2_zero3_bf16", args + " --pp 2");
  const fs::path dp = run_ok(2, "dp2_zero3_bf16", args);
  EXPECT_TRUE(read_file(piped.string() + ".st") == read_file(dp.string() + ".st")) << "weights differ";
  EXPECT_EQ(losses(piped), losses(dp));
  expect_within(piped, run_ok(1, "one_bf16_dp", fmt::format("{} {} --layers 2 --batch 8 --steps 10 --precision bf16",
                                                            kGpt, kSgd)),
                1e-2);
}

// What a stage sends in bf16, by the ledger of rank 0 (the first stage, one
// replica): the activations are the residual stream, which bf16 keeps in
// fp32 (M x B x T x C x 4 bytes in the forward, as in an fp32 run), and
// wte's new values after each step go to the last stage's head as its
// bf16 compute copy (V x C x 2 bytes, half of fp32's), with the gradient
// norm's all-gather (one double) in the optimizer phase.
TEST_F(PpCliTest, Bf16SendsActivationsInFp32AndTheHeadsWteInBf16) {
  constexpr uint64_t M = 2, B = 2, T = 16, C = 32, V = 256, norm = 8;
  for (const char* precision : {"fp32", "bf16"}) {
    SCOPED_TRACE(precision);
    const fs::path stem = run_ok(2, fmt::format("ledger_{}", precision),
                                 fmt::format("{} --layers 2 --batch 4 --micro-batches 2 --steps 3 --pp 2 --precision {}",
                                             kGpt, precision));
    const nlohmann::json phases = nlohmann::json::parse(read_file(stem.string() + ".json"))["comm_bytes_per_phase"];
    const uint64_t wte_bytes = std::string(precision) == "bf16" ? 2 : 4;
    EXPECT_EQ(phases["forward"].get<uint64_t>(), M * B * T * C * 4) << phases;
    EXPECT_EQ(phases["backward"].get<uint64_t>(), 0u) << phases;  // the first stage sends no gradient
    EXPECT_EQ(phases["optimizer"].get<uint64_t>(), V * C * wte_bytes + norm) << phases;
  }
}

// Checkpoints (docs/checkpoints.md): each stage's ranks write their
// stage's pieces, named by the whole model's parameters, into one
// checkpoint whose manifest lists the whole model. Resumed at step 5 of 10
// under the same layout: byte for byte the uninterrupted run (the last
// stage's copy of wte is taken from the first stage after the resume).
// Resumed by one process, and one process's checkpoint at pp 2, at pp 3 and
// at pp 2 x dp 2 under zero3: within 1e-5 of one process (M = 2, SGD; see
// the top).
TEST_F(PpCliTest, CheckpointsResumeAtAnyLayout) {
  const std::string args = fmt::format("{} {} --layers 3 --batch 8 --micro-batches 2 --steps 10", kGpt, kSgd);
  const std::string ckpt = " --checkpoint-every 5 --checkpoint-dir ";
  const fs::path pp2 = run_ok(2, "pp2_ckpt_full", args + " --pp 2" + ckpt + q(dir_ / "ck_pp2"));
  const fs::path one = run_ok(1, "one_ckpt_full", args + ckpt + q(dir_ / "ck_one"));
  const nlohmann::json manifest =
      nlohmann::json::parse(read_file(dir_ / "ck_pp2" / "step-00000005" / "manifest.json"));
  EXPECT_EQ(manifest["parameters"].size(), 2u + 3 * 12 + 2);  // wte, wpe, 3 blocks, ln_f
  const std::string from_pp2 = " --resume " + q(dir_ / "ck_pp2" / "step-00000005");
  const std::string from_one = " --resume " + q(dir_ / "ck_one" / "step-00000005");
  const fs::path resumed = run_ok(2, "pp2_resumed", args + " --pp 2" + from_pp2);
  EXPECT_TRUE(read_file(resumed.string() + ".st") == read_file(pp2.string() + ".st")) << "pp 2 resumed differs";
  const auto all = losses(pp2), again = losses(resumed);
  EXPECT_EQ(again.begin()->first, 6);
  for (const auto& [step, loss] : again) EXPECT_EQ(loss, all.at(step)) << "step " << step;
  expect_within(run_ok(1, "one_from_pp2", args + from_pp2), one, 1e-5);
  expect_within(run_ok(2, "pp2_from_one", args + " --pp 2" + from_one), one, 1e-5);
  expect_within(run_ok(3, "pp3_from_one", args + " --pp 3" + from_one), one, 1e-5);
  expect_within(run_ok(4, "pp2_dp2_zero3_from_one", args + " --pp 2 --strategy zero3" + from_one), one, 1e-5);
}

// Activations held, as the summary reports them per stage: gpipe keeps
// all M micro-batches' arenas on every stage, 1f1b at most pp - s on stage
// s; parameters: each stage its blocks (the first the embedding, the last
// ln_f and a copy of wte outside the parameters), summing to the model.
TEST_F(PpCliTest, ActivationsHeldPerStage) {
  const std::string args = fmt::format("{} --layers 3 --batch 8 --micro-batches 4 --steps 2 --pp 3", kGpt);
  const int64_t whole = 256 * 32 + 16 * 32 + 3 * (12 * 32 * 32 + 13 * 32) + 2 * 32;
  for (const char* schedule : {"gpipe", "1f1b"}) {
    SCOPED_TRACE(schedule);
    const fs::path summary = dir_ / fmt::format("summary_{}.json", schedule);
    const RunResult r = train(3, fmt::format("{} --pp-schedule {} --summary-out {}", args, schedule, q(summary)));
    ASSERT_EQ(r.code, 0) << r.err;
    const nlohmann::json j = nlohmann::json::parse(read_file(summary));
    const nlohmann::json& p = j["pipeline"];
    ASSERT_EQ(p["stages"].size(), 3u) << p;
    // A pipeline's stages wait for each other by design: no lock-step
    // split of that wait (train/lockstep.h).
    EXPECT_FALSE(j.contains("lockstep"));
    for (const auto& rank : j["ranks"]) EXPECT_FALSE(rank.contains("comm_wait_slower_rank_ms")) << rank;
    int64_t params = 0;
    for (int s = 0; s < 3; ++s) {
      const nlohmann::json& st = p["stages"][static_cast<size_t>(s)];
      const int64_t held = std::string(schedule) == "gpipe" ? 4 : 3 - s;
      EXPECT_EQ(st["arenas"].get<int64_t>(), held) << st;
      EXPECT_EQ(st["activation_bytes"].get<int64_t>(), held * st["arena_bytes"].get<int64_t>()) << st;
      EXPECT_EQ(st["first_block"].get<int64_t>(), s) << st;
      EXPECT_EQ(st["tied_copy_bytes"].get<int64_t>(), s == 2 ? 2 * 256 * 32 * 4 : 0) << st;
      params += st["params"].get<int64_t>();
    }
    EXPECT_EQ(params, whole);
  }
}

// The trace's pipeline picture: every rank (stage) has each micro-batch's
// forward and backward of each traced step, in its schedule's order (1f1b
// on 3 stages, M = 4: stage 0 fills with 2 forwards, stage 2 alternates).
TEST_F(PpCliTest, TraceShowsEachStagesMicroBatches) {
  const fs::path trace = dir_ / "trace.json";
  const RunResult r = train(3, fmt::format("{} --layers 3 --batch 8 --micro-batches 4 --steps 3 --pp 3 "
                                           "--pp-schedule 1f1b --trace-out {} --trace-steps 1",
                                           kGpt, q(trace)));
  ASSERT_EQ(r.code, 0) << r.err;
  std::map<int, std::string> order;  // pid -> "F0 F1 B0 ..."
  const nlohmann::json events = nlohmann::json::parse(read_file(trace))["traceEvents"];
  for (const auto& e : events) {
    if (e["ph"] != "X" || !e["args"].contains("micro_batch")) continue;
    const std::string name = e["name"];
    if (!name.starts_with("forward") && !name.starts_with("backward")) continue;
    order[e["pid"].get<int>()] += fmt::format("{}{} ", name[0] == 'f' ? 'F' : 'B', e["args"]["micro_batch"].get<int>());
    EXPECT_EQ(e["args"]["chunk"], e["pid"]) << name;  // one chunk per rank: chunk r on rank r
  }
  EXPECT_EQ(order[0], "F0 F1 F2 B0 F3 B1 B2 B3 ");
  EXPECT_EQ(order[1], "F0 F1 B0 F2 B1 F3 B2 B3 ");
  EXPECT_EQ(order[2], "F0 B0 F1 B1 F2 B2 F3 B3 ");
}

TEST_F(PpCliTest, ImpossibleMeshesAreRefused) {
  struct Case {
    int ranks;
    std::string args, says;
  };
  const std::string gpt = fmt::format("{} --layers 2 --batch 4 --steps 2", kGpt);
  const std::vector<Case> cases = {
      {3, gpt + " --pp 2", "3 ranks do not split into --tp 1 x --pp 2"},
      {3, gpt + " --pp 3", "--pp 3 needs at least one block per stage, and the model has 2"},
      {2, gpt + " --pp 2 --micro-batches 3", "global batch 4 does not split into 1 data-parallel replicas x 3"},
      {2, gpt + " --pp 2 --pp-split 2,1", "--pp-split '2,1' must give 2 stages' blocks summing to the model's 2"},
      {2, gpt + " --pp 2 --pp-split 1,x", "'x' is not a positive number of blocks"},
      {2, gpt + " --pp 2 --micro-batches 2 --grad-accum 4", "are one setting under two names"},
      {2, "--model mlp --batch 4 --steps 2 --pp 2", "the mlp model has none"},
      {2, gpt + " --pp 2 --strategy dp", "--strategy dp keeps its replicas in threads of one process and does not run with --pp 2"},
      // Stage 1 needs 2.6 MiB for the host's 2 ranks (its head's wte copy and gradient
      // included), stage 0 less: every rank says stage 1's sentence. (With the
      // unfused attention's probabilities, whose bytes these figures count.)
      {2, fmt::format("{} --layers 3 --batch 8 --steps 2 --pp 2 --memory-budget-mb 2 --attention unfused", kGpt),
       "needs about 1.3 MiB per rank (2.6 MiB for the 2 ranks on this host) but 2.0 MiB is available"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.args);
    test::expect_one_refusal(train(c.ranks, c.args), c.says);
  }
}

}  // namespace
}  // namespace dpt
