// Checkpoints, resume and failures end to end, through `dpt launch` jobs:
//  - a resumed run ends with the parameters of an uninterrupted one, bit for
//    bit, at the same strategy and world size (MLP and GPT; DDP, ZeRO-1 and
//    ZeRO-3; with gradient accumulation);
//  - a checkpoint written by one strategy and world size resumes under
//    another, within the tolerance of DDP against one process;
//  - corrupt, truncated, missing and mismatched checkpoints are refused in
//    one sentence naming the file, before anything trains;
//  - a rank killed (SIGKILL) in forward, backward, the reduction, the
//    optimizer step or a checkpoint write ends the job within 10 s with a
//    sentence naming the failed collective, and the latest complete
//    checkpoint still resumes to the uninterrupted result;
//  - SIGTERM stops a job after its step with a checkpoint; dpt launch
//    --max-restarts brings a job whose rank was killed back to the
//    uninterrupted result.
//
// Registered by hand in tests/CMakeLists.txt (ctest names checkpoint_cli.*).
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../cli_run.h"
#include "../compare.h"
#include "io/safetensors.h"

namespace dpt {
namespace {

namespace fs = std::filesystem;
using test::dpt_bin;
using test::q;
using test::RunResult;

constexpr const char* kMlp = "--model mlp --sizes 784,29,13,10 --batch 64";
constexpr const char* kGpt = "--model gpt --layers 2 --width 32 --heads 2 --context 16 --batch 8";
constexpr const char* kQuiet = "--log-every 1000 --seed 5 --quiet";

class CheckpointCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = fs::temp_directory_path() / fmt::format("dpt_checkpoint_cli_{}", ::getpid());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }
  void SetUp() override {
    dir_ = root_ / ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::create_directories(dir_);
  }

  // `dpt launch -n <n> -- dpt train <args>` (n = 1: dpt train alone), one
  // thread per rank, the engine's settings from the environment removed.
  RunResult train(int n, const std::string& args, const std::string& env = "") const {
    const std::string base = fmt::format("env -u DPT_COMM_ALGO -u DPT_COMM_TRANSPORT -u DPT_COMM_CHECK -u DPT_FAULT "
                                         "OMP_NUM_THREADS=1 DPT_COMM_TIMEOUT=60 {} ",
                                         env);
    const std::string cmd = n == 1 ? fmt::format("{}{} train {} --threads 1", base, q(dpt_bin()), args)
                                   : fmt::format("{}{} launch -n {} -- {} train {}", base, q(dpt_bin()), n,
                                                 q(dpt_bin()), args);
    return test::run_shell(cmd, dir_, 120);
  }

  fs::path path(const std::string& name) const { return dir_ / name; }

  // Bitwise (tol 0), or within tol + tol * max|want| per tensor: dist_zero's
  // kGptLocalTol, the error of DDP against one process (AdamW carries the
  // summation order's rounding of a near-cancelling gradient into up to lr
  // of an update), 6 times below one step's lr of 3e-4.
  static void expect_same_weights(const fs::path& got, const fs::path& want, double tol) {
    const SafetensorsFile g = load_safetensors(got.string()), w = load_safetensors(want.string());
    ASSERT_EQ(g.tensors.size(), w.tensors.size());
    for (size_t i = 0; i < g.tensors.size(); ++i) {
      ASSERT_EQ(g.tensors[i].data.size(), w.tensors[i].data.size()) << g.tensors[i].name;
      if (tol == 0)
        EXPECT_TRUE(test::bitwise_equal(g.tensors[i].data.data(), w.tensors[i].data.data(), g.tensors[i].data.size()))
            << g.tensors[i].name;
      else
        EXPECT_TRUE(test::all_close(g.tensors[i].data.data(), w.tensors[i].data.data(), g.tensors[i].data.size(), tol,
                                    tol))
            << g.tensors[i].name;
    }
  }

  static inline fs::path root_;
  fs::path dir_;
};

// ------------------------------------------------------------ exact resume

struct ResumeCase {
  const char* model;
  const char* strategy;
  int grad_accum;
  const char* precision = "fp32";  // bf16: the checkpoint holds the fp32 masters
};

void PrintTo(const ResumeCase& c, std::ostream* os) {
  *os << c.model << " --strategy " << c.strategy << " --grad-accum " << c.grad_accum;
}

class ExactResume : public CheckpointCli, public ::testing::WithParamInterface<ResumeCase> {};

TEST_P(ExactResume, EqualsTheUninterruptedRunBitForBit) {
  const ResumeCase c = GetParam();
  const std::string common = fmt::format("{} {} --strategy {} --grad-accum {} --precision {} --steps 9", c.model,
                                         kQuiet, c.strategy, c.grad_accum, c.precision);
  // The run that checkpoints is the uninterrupted one: checkpoints read,
  // never change, the state.
  RunResult r = train(2, fmt::format("{} --checkpoint-dir {} --checkpoint-every 4 --save {}", common,
                                     q(path("ck")), q(path("full.safetensors"))));
  ASSERT_EQ(r.code, 0) << r.all();
  ASSERT_TRUE(fs::exists(path("ck/step-00000004/manifest.json")));
  ASSERT_TRUE(fs::exists(path("ck/step-00000008/manifest.json")));
  // From the first checkpoint (not the latest): 5 more steps.
  r = train(2, fmt::format("{} --resume {} --save {}", common, q(path("ck/step-00000004")),
                           q(path("resumed.safetensors"))));
  ASSERT_EQ(r.code, 0) << r.all();
  expect_same_weights(path("resumed.safetensors"), path("full.safetensors"), 0);
}

INSTANTIATE_TEST_SUITE_P(, ExactResume,
                         ::testing::Values(ResumeCase{kMlp, "ddp", 1}, ResumeCase{kMlp, "zero1", 2},
                                           ResumeCase{kMlp, "zero3", 1}, ResumeCase{kGpt, "ddp", 2},
                                           ResumeCase{kGpt, "zero1", 1}, ResumeCase{kGpt, "zero3", 2},
                                           ResumeCase{kGpt, "ddp", 1, "bf16"}, ResumeCase{kGpt, "zero1", 1, "bf16"},
                                           ResumeCase{kGpt, "zero3", 1, "bf16"}),
                         [](const auto& info) {
                           return fmt::format("{}_{}_accum{}_{}", std::string(info.param.model).substr(8, 3),
                                              info.param.strategy, info.param.grad_accum, info.param.precision);
                         });

// ------------------------------------------------------------ resharding

TEST_F(CheckpointCli, Zero3OnFourRanksResumesAsDdpOnTwoAndAsOneProcess) {
  const std::string common = fmt::format("{} {} --steps 10", kGpt, kQuiet);
  RunResult r = train(4, fmt::format("{} --strategy zero3 --checkpoint-dir {} --checkpoint-every 5", common,
                                     q(path("ck"))));
  ASSERT_EQ(r.code, 0) << r.all();
  const nlohmann::json manifest = nlohmann::json::parse(std::ifstream(path("ck/step-00000005/manifest.json")));
  EXPECT_EQ(manifest["world"], 4);
  EXPECT_EQ(manifest["files"].size(), 4u);
  r = train(2, fmt::format("{} --strategy ddp --save {}", common, q(path("ddp.safetensors"))));
  ASSERT_EQ(r.code, 0) << r.all();
  r = train(2, fmt::format("{} --strategy ddp --resume {} --save {}", common, q(path("ck/step-00000005")),
                           q(path("ddp_resumed.safetensors"))));
  ASSERT_EQ(r.code, 0) << r.all();
  expect_same_weights(path("ddp_resumed.safetensors"), path("ddp.safetensors"), 5e-5);
  r = train(1, fmt::format("{} --resume {} --save {}", common, q(path("ck/step-00000005")),
                           q(path("local_resumed.safetensors"))));
  ASSERT_EQ(r.code, 0) << r.all();
  expect_same_weights(path("local_resumed.safetensors"), path("ddp.safetensors"), 5e-5);
}

// ------------------------------------------------------------ hsdp

// 4 ranks: hsdp in 2 shard groups of 2, or of 1 under --pp 2 / --tp 2 (the
// data-parallel group is then 2 ranks).
class HsdpResume : public CheckpointCli, public ::testing::WithParamInterface<const char*> {};

// The first shard group writes a ZeRO-3-of-S checkpoint (S files, numbered
// among the writers); every group reads it back, and the run continues as
// if it had never stopped: weights and every logged loss bit for bit.
TEST_P(HsdpResume, OneReplicaWritesAndTheResumeEqualsTheUninterruptedRunBitForBit) {
  const std::string common =
      fmt::format("{} --seed 5 --quiet --log-every 1 --strategy hsdp {} --steps 9", kGpt, GetParam());
  RunResult r = train(4, fmt::format("{} --checkpoint-dir {} --checkpoint-every 4 --metrics-out {} --save {}", common,
                                     q(path("ck")), q(path("full.jsonl")), q(path("full.safetensors"))));
  ASSERT_EQ(r.code, 0) << r.all();
  const nlohmann::json manifest = nlohmann::json::parse(std::ifstream(path("ck/step-00000004/manifest.json")));
  EXPECT_EQ(manifest["strategy"], "hsdp");
  // 2 files: the first group's 2 ranks, or under --pp / --tp the first
  // group (of 1) of each stage or TP rank.
  EXPECT_EQ(manifest["world"], 2);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(path("ck/step-00000004"))) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"manifest.json", "rank-00000-of-00002.safetensors",
                                             "rank-00001-of-00002.safetensors"}));

  r = train(4, fmt::format("{} --resume {} --metrics-out {} --save {}", common, q(path("ck/step-00000004")),
                           q(path("resumed.jsonl")), q(path("resumed.safetensors"))));
  ASSERT_EQ(r.code, 0) << r.all();
  expect_same_weights(path("resumed.safetensors"), path("full.safetensors"), 0);
  const auto full = test::logged_losses(path("full")), resumed = test::logged_losses(path("resumed"));
  ASSERT_EQ(resumed.size(), 5u);  // steps 5 to 9
  for (const auto& [step, loss] : resumed) EXPECT_EQ(loss, full.at(step)) << "step " << step;
}

constexpr const char* kHsdpLayouts[] = {"--shard-group 2", "--shard-group 2 --precision bf16 --grad-accum 2",
                                        "--pp 2 --shard-group 1", "--tp 2 --shard-group 1"};
constexpr const char* kHsdpLayoutNames[] = {"groups_of_2", "bf16_accum2", "pp", "tp"};

INSTANTIATE_TEST_SUITE_P(, HsdpResume, ::testing::ValuesIn(kHsdpLayouts),
                         [](const auto& info) { return std::string(kHsdpLayoutNames[info.index]); });

// An hsdp checkpoint is read by every layout that reads ZeRO-3's, and hsdp
// reads theirs: all within DDP-against-one-process tolerance of the
// uninterrupted hsdp run.
TEST_F(CheckpointCli, HsdpCheckpointsResumeUnderOtherLayoutsAndTheirsUnderHsdp) {
  const std::string common = fmt::format("{} {} --steps 10", kGpt, kQuiet);
  const std::string hsdp = common + " --strategy hsdp --shard-group 2";
  RunResult r = train(4, fmt::format("{} --checkpoint-dir {} --checkpoint-every 5 --save {}", hsdp, q(path("hsdp")),
                                     q(path("hsdp.safetensors"))));
  ASSERT_EQ(r.code, 0) << r.all();
  const std::string from_hsdp = q(path("hsdp/step-00000005"));
  const std::vector<std::pair<int, std::string>> layouts = {
      {2, "--strategy zero3"}, {2, "--strategy ddp"}, {4, "--strategy zero3"}, {1, ""}};
  for (const auto& [n, layout] : layouts) {
    r = train(n, fmt::format("{} {} --resume {} --save {}", common, layout, from_hsdp, q(path("out.safetensors"))));
    ASSERT_EQ(r.code, 0) << r.all();
    expect_same_weights(path("out.safetensors"), path("hsdp.safetensors"), 5e-5);
  }
  r = train(2, fmt::format("{} --strategy zero3 --checkpoint-dir {} --checkpoint-every 5", common, q(path("zero3"))));
  ASSERT_EQ(r.code, 0) << r.all();
  // The same files as ZeRO-3 over one shard group's 2 ranks writes: the same tensors in each.
  for (const char* f : {"rank-00000-of-00002.safetensors", "rank-00001-of-00002.safetensors"}) {
    const SafetensorsFile a = load_safetensors(path("hsdp/step-00000005").string() + "/" + f),
                          b = load_safetensors(path("zero3/step-00000005").string() + "/" + f);
    ASSERT_EQ(a.tensors.size(), b.tensors.size()) << f;
    for (size_t i = 0; i < a.tensors.size(); ++i) {
      EXPECT_EQ(a.tensors[i].name, b.tensors[i].name) << f;
      EXPECT_EQ(a.tensors[i].data.size(), b.tensors[i].data.size()) << a.tensors[i].name;
    }
  }
  r = train(1, fmt::format("{} --checkpoint-dir {} --checkpoint-every 5", common, q(path("local"))));
  ASSERT_EQ(r.code, 0) << r.all();
  for (const char* ck : {"zero3/step-00000005", "local/step-00000005"}) {
    r = train(4, fmt::format("{} --resume {} --save {}", hsdp, q(path(ck)), q(path("out.safetensors"))));
    ASSERT_EQ(r.code, 0) << r.all();
    expect_same_weights(path("out.safetensors"), path("hsdp.safetensors"), 5e-5);
  }
}

// A rank killed in the middle of the checkpoint of step 6, a writer (1) or
// not (3): the job ends and step 3's checkpoint is the latest, intact.
class HsdpFault : public CheckpointCli, public ::testing::WithParamInterface<int> {};

TEST_P(HsdpFault, AKilledRankLeavesThePreviousCheckpoint) {
  const int rank = GetParam();
  const std::string common = fmt::format("{} {} --strategy hsdp --shard-group 2 --steps 8", kGpt, kQuiet);
  RunResult r = train(4, fmt::format("{} --checkpoint-dir {} --checkpoint-every 3", common, q(path("ck"))),
                      fmt::format("DPT_FAULT=checkpoint:6:{}", rank));
  EXPECT_NE(r.code, 0) << r.all();
  EXPECT_LT(r.seconds, 10.0) << r.all();
  EXPECT_NE(r.all().find(fmt::format("rank {} killed at checkpoint of step 6", rank)), std::string::npos) << r.all();
  EXPECT_EQ(test::read_file(path("ck/latest")), "step-00000003\n");
  EXPECT_FALSE(fs::exists(path("ck/step-00000006")));
  r = train(4, fmt::format("{} --resume {} --save {}", common, q(path("ck")), q(path("resumed.safetensors"))));
  ASSERT_EQ(r.code, 0) << r.all();
  r = train(4, fmt::format("{} --save {}", common, q(path("full.safetensors"))));
  ASSERT_EQ(r.code, 0) << r.all();
  expect_same_weights(path("resumed.safetensors"), path("full.safetensors"), 0);
}

INSTANTIATE_TEST_SUITE_P(, HsdpFault, ::testing::Values(1, 3),
                         [](const auto& info) { return fmt::format("rank{}", info.param); });

TEST_F(CheckpointCli, KeepsTheNewestAndPointsLatestAtTheLast) {
  RunResult r = train(2, fmt::format("{} {} --steps 9 --checkpoint-dir {} --checkpoint-every 2 --keep 2", kMlp, kQuiet,
                                     q(path("ck"))));
  ASSERT_EQ(r.code, 0) << r.all();
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(path("ck"))) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"latest", "step-00000006", "step-00000008"}));
  EXPECT_EQ(test::read_file(path("ck/latest")), "step-00000008\n");
}

// ------------------------------------------------------------ bad checkpoints

class BadCheckpoint : public CheckpointCli {
 protected:
  void SetUp() override {
    CheckpointCli::SetUp();
    RunResult r = train(2, fmt::format("{} {} --steps 5 --checkpoint-dir {} --checkpoint-every 2", kGpt, kQuiet,
                                       q(path("ck"))));
    ASSERT_EQ(r.code, 0) << r.all();
    shard_ = path("ck/step-00000002/rank-00001-of-00002.safetensors");
  }
  // Resuming fails like every user error: exit 1, one sentence naming `what`.
  void expect_refused(const std::string& what, const std::string& extra = "", const char* model = kGpt) const {
    const RunResult r = train(2, fmt::format("{} {} --steps 4 --resume {} {}", model, kQuiet,
                                             q(path("ck/step-00000002")), extra));
    EXPECT_NE(r.code, 0) << r.all();
    EXPECT_NE(r.err.find(what), std::string::npos) << "'" << what << "' not in: " << r.all();
    EXPECT_EQ(r.err.find("internal"), std::string::npos) << r.err;
  }
  fs::path shard_;
};

TEST_F(BadCheckpoint, AFlippedByteIsAChecksumMismatchNamingTheFile) {
  {
    std::fstream f(shard_, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-5, std::ios::end);
    f.put('\x7f');
  }
  expect_refused("rank-00001-of-00002.safetensors: checksum mismatch");
}

TEST_F(BadCheckpoint, ATruncatedShardIsNamed) {
  fs::resize_file(shard_, fs::file_size(shard_) - 100);
  expect_refused("rank-00001-of-00002.safetensors: ");
  expect_refused("truncated");
}

TEST_F(BadCheckpoint, AMissingShardIsNamed) {
  fs::remove(shard_);
  expect_refused("rank-00001-of-00002.safetensors: missing");
}

TEST_F(BadCheckpoint, AnotherModelIsRefused) {
  expect_refused("holds a model with n_layer=2, this run's has n_layer=3", "",
                 "--model gpt --layers 3 --width 32 --heads 2 --context 16 --batch 8");
}

// A GPT checkpoint resumed as the mlp said "the checkpoint holds a model with
// block_size=16, this run's has no block_size": a setting, not the model.
TEST_F(BadCheckpoint, AnotherFamilyIsRefusedNamingBoth) {
  expect_refused("the checkpoint holds a gpt model, and this run's is mlp", "", kMlp);
  expect_refused("the checkpoint holds a gpt model, and this run's is llama", "",
                 "--model llama --layers 2 --width 32 --heads 2 --kv-heads 1 --context 16 --batch 8");
}

TEST_F(BadCheckpoint, AnotherOptimizerIsRefused) { expect_refused("exp_avg", "--optimizer sgd"); }

TEST_F(BadCheckpoint, AManifestThatIsNotJsonIsRefused) {
  std::ofstream(path("ck/step-00000002/manifest.json")) << "{ not json";
  expect_refused("manifest.json: the manifest is not valid JSON");
}

// A directory where a file belongs: reading a directory as a stream threw
// std::ios_base::failure (exit 2, "basic_filebuf::underflow"), and a shard's
// size read as 0 bytes, "truncated".
TEST_F(BadCheckpoint, AManifestThatIsADirectoryIsRefused) {
  fs::remove(path("ck/step-00000002/manifest.json"));
  fs::create_directory(path("ck/step-00000002/manifest.json"));
  expect_refused("manifest.json: the checkpoint's manifest is not a file");
}

TEST_F(BadCheckpoint, AShardThatIsADirectoryIsNamed) {
  fs::remove(shard_);
  fs::create_directory(shard_);
  expect_refused("rank-00001-of-00002.safetensors: not a file");
}

TEST_F(BadCheckpoint, AFileIsNotACheckpointDirectory) {
  std::ofstream(path("weights.safetensors")) << "x";
  const RunResult r =
      train(1, fmt::format("{} {} --steps 4 --resume {}", kGpt, kQuiet, q(path("weights.safetensors"))));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("weights.safetensors: a file, not a checkpoint directory"), std::string::npos) << r.err;
}

TEST_F(BadCheckpoint, ANonexistentDirectoryIsRefused) {
  const RunResult r = train(1, fmt::format("{} {} --steps 4 --resume {}", kGpt, kQuiet, q(path("nowhere"))));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("nowhere: no such checkpoint directory"), std::string::npos) << r.err;
}

TEST_F(BadCheckpoint, LatestNamingAVanishedCheckpointFallsBackToTheNewestComplete) {
  ASSERT_EQ(test::read_file(path("ck/latest")), "step-00000004\n");
  fs::remove_all(path("ck/step-00000004"));  // as if killed while replacing it
  const RunResult r = train(2, fmt::format("{} --seed 5 --steps 6 --resume {}", kGpt, q(path("ck"))));
  EXPECT_EQ(r.code, 0) << r.all();
  EXPECT_NE(r.out.find("step-00000002 at step 2"), std::string::npos) << r.out;
}

// ------------------------------------------------------------ failures

class FaultMatrix : public CheckpointCli, public ::testing::WithParamInterface<const char*> {};

// Rank 1 is killed at `point` of step 7; checkpoints every 3 steps, so the
// latest complete one is step 6 (the kill inside the write of step 6's
// leaves step 3).
TEST_P(FaultMatrix, AKilledRankEndsTheJobAndTheLatestCheckpointResumes) {
  const std::string point = GetParam();
  const int step = point == "checkpoint" ? 6 : 7;
  const std::string common = fmt::format("{} {} --strategy zero3 --steps 10", kGpt, kQuiet);
  RunResult r = train(2, fmt::format("{} --checkpoint-dir {} --checkpoint-every 3", common, q(path("ck"))),
                      fmt::format("DPT_FAULT={}:{}:1", point, step));
  EXPECT_NE(r.code, 0) << r.all();
  EXPECT_LT(r.seconds, 10.0) << r.all();
  EXPECT_NE(r.all().find(fmt::format("rank 1 killed at {} of step {}", point, step)), std::string::npos) << r.all();
  EXPECT_NE(r.all().find("dpt[rank 0]: error: "), std::string::npos) << r.all();
  EXPECT_NE(r.all().find("rank 1 has exited"), std::string::npos) << r.all();
  EXPECT_EQ(test::read_file(path("ck/latest")), point == "checkpoint" ? "step-00000003\n" : "step-00000006\n");

  r = train(2, fmt::format("{} --resume {} --save {}", common, q(path("ck")), q(path("resumed.safetensors"))));
  ASSERT_EQ(r.code, 0) << r.all();
  r = train(2, fmt::format("{} --save {}", common, q(path("full.safetensors"))));
  ASSERT_EQ(r.code, 0) << r.all();
  expect_same_weights(path("resumed.safetensors"), path("full.safetensors"), 0);
}

INSTANTIATE_TEST_SUITE_P(, FaultMatrix, ::testing::Values("forward", "backward", "reduce", "optimizer", "checkpoint"));

// Polls `file` until a metrics line of step >= step appears (the stream is
// flushed per line), for at most 60 s.
bool wait_for_step(const fs::path& file, int step) {
  for (int i = 0; i < 600; ++i) {
    std::ifstream in(file);
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line, nullptr, false);
      if (!j.is_discarded() && j.value("step", 0) >= step) return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

TEST_F(CheckpointCli, SigtermStopsAfterTheStepWithACheckpointThatResumesExactly) {
  const fs::path metrics = path("metrics.jsonl");
  // Many steps: the signal lands long before the end.
  const std::string job = fmt::format(
      "{} launch -n 2 -- {} train {} --seed 5 --log-every 1 --steps 100000 --checkpoint-dir {} "
      "--metrics-out {} --save {}",
      q(dpt_bin()), q(dpt_bin()), kGpt, q(path("ck")), q(metrics), q(path("never.safetensors")));
  std::thread runner([&] {
    const RunResult r = test::run_shell("env OMP_NUM_THREADS=1 DPT_COMM_TIMEOUT=60 " + job, dir_, 120);
    EXPECT_NE(r.code, 0) << r.all();  // mpirun reports the ranks' 143 as a failure
    EXPECT_NE(r.out.find("stopped by signal 15 after step"), std::string::npos) << r.all();
  });
  ASSERT_TRUE(wait_for_step(metrics, 5));
  // The ranks get it, as from a scheduler's preemption (pattern: the ranks'
  // command lines start with the binary, mpirun's and dpt launch's do not).
  test::run_shell(fmt::format("pkill -TERM -f '^{} train .*{}'", dpt_bin(), path("ck").string()), dir_);
  runner.join();
  EXPECT_FALSE(fs::exists(path("never.safetensors")));  // a stopped run is not finished
  const std::string latest = test::read_file(path("ck/latest"));
  ASSERT_EQ(latest.rfind("step-", 0), 0u) << latest;
  const int stopped = std::stoi(latest.substr(5));
  ASSERT_GE(stopped, 5);

  // Resume and finish 3 steps later; the same as a run of that many steps.
  const std::string common = fmt::format("{} --seed 5 --quiet --log-every 1 --steps {}", kGpt, stopped + 3);
  RunResult r = train(2, fmt::format("{} --resume {} --metrics-out {} --save {}", common, q(path("ck")), q(metrics),
                                     q(path("resumed.safetensors"))));
  ASSERT_EQ(r.code, 0) << r.all();
  r = train(2, fmt::format("{} --save {}", common, q(path("full.safetensors"))));
  ASSERT_EQ(r.code, 0) << r.all();
  expect_same_weights(path("resumed.safetensors"), path("full.safetensors"), 0);
  // The metrics: every step once, in order, across the stop.
  std::ifstream in(metrics);
  int expect = 1;
  for (std::string line; std::getline(in, line); ++expect)
    EXPECT_EQ(nlohmann::json::parse(line)["step"], expect) << line;
  EXPECT_EQ(expect, stopped + 4);
}

TEST_F(CheckpointCli, ASecondSignalStopsAtOnce) {
  const fs::path metrics = path("metrics.jsonl");
  // One process, steps of W-GPT's size (tens of milliseconds at least): two
  // signals 0.1 s apart land within one step.
  // The shell writes its pid, then becomes dpt (exec keeps the pid).
  const std::string job = fmt::format("sh -c 'echo $$ > {}; exec {} train --model gpt --steps 100000 --log-every 1 "
                                      "--threads 1 --checkpoint-dir {} --metrics-out {}'",
                                      path("pid").string(), dpt_bin(), path("ck").string(), metrics.string());
  RunResult r;
  std::thread runner([&] { r = test::run_shell(job, dir_, 120); });
  ASSERT_TRUE(wait_for_step(metrics, 2));
  std::string pid = test::read_file(path("pid"));
  while (!pid.empty() && pid.back() == '\n') pid.pop_back();
  test::run_shell(fmt::format("kill -INT {0}; sleep 0.1; kill -INT {0}", pid), dir_);  // not merged into one
  runner.join();
  EXPECT_EQ(r.code, 130) << r.all();
  EXPECT_EQ(r.out.find("stopped by signal"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(path("ck/latest")));  // no checkpoint: it did not wait for one
}

TEST_F(CheckpointCli, LaunchRestartsAKilledJobFromItsLatestCheckpoint) {
  // Enough steps that the kill, at most 0.3 s after the first checkpoint,
  // lands mid-run on a fast CPU too (300 steps took 1.2 s on AVX-512, and the
  // job then ended before the kill).
  const std::string common = fmt::format("{} {} --strategy ddp --steps 1500", kGpt, kQuiet);
  const std::string job = fmt::format(
      "env OMP_NUM_THREADS=1 DPT_COMM_TIMEOUT=60 {} launch -n 2 --max-restarts 2 -- {} train {} --checkpoint-dir {} "
      "--checkpoint-every 200 --save {}",
      q(dpt_bin()), q(dpt_bin()), common, q(path("ck")), q(path("restarted.safetensors")));
  RunResult r;
  std::thread runner([&] { r = test::run_shell(job, dir_, 120); });
  for (int i = 0; i < 600 && !fs::exists(path("ck/latest")); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::this_thread::sleep_for(std::chrono::milliseconds(::getpid() % 300));  // somewhere in the steps after it
  test::run_shell(fmt::format("pkill -KILL -n -f '^{} train .*{}'", dpt_bin(), path("ck").string()), dir_);
  runner.join();
  ASSERT_EQ(r.code, 0) << r.all();
  EXPECT_NE(r.err.find("restart 1 of 2 from"), std::string::npos) << r.all();
  r = train(2, fmt::format("{} --save {}", common, q(path("full.safetensors"))));
  ASSERT_EQ(r.code, 0) << r.all();
  expect_same_weights(path("restarted.safetensors"), path("full.safetensors"), 0);
}

TEST_F(CheckpointCli, MaxRestartsWithoutCheckpointsIsRefused) {
  const RunResult r = test::run_shell(
      fmt::format("{} launch -n 2 --max-restarts 1 -- {} train {} --steps 2", q(dpt_bin()), q(dpt_bin()), kGpt), dir_,
      60);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("give the command a --checkpoint-dir"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace dpt
