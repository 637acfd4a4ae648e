// --offload optimizer end to end, through `dpt train` and `dpt launch` jobs:
//  - the saved weights equal a run without offload byte for byte (MLP/SGD
//    and GPT/AdamW; local, DDP, ZeRO-1, ZeRO-3; gradient accumulation; bf16
//    mixed precision, whose fp32 masters stay in RAM), with
//    chunks of 4 KiB so every span is streamed in many chunks;
//  - the summary accounts the state as offloaded and the optimizer's RAM
//    as the chunk buffers;
//  - the offload file is open (unlinked) while the job runs and nothing is
//    left in the directory after a normal end, a SIGTERM and a killed peer;
//  - a checkpoint written with offload (of the state, or with --offload
//    params of the fp32 masters too) resumes, with or without it, to the
//    uninterrupted run's weights bit for bit;
//  - bad flags are refused in one sentence with exit status 1.
//
// Registered by hand in tests/CMakeLists.txt (ctest names offload_cli.*).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../cli_run.h"

namespace dpt {
namespace {

namespace fs = std::filesystem;
using test::dpt_bin;
using test::q;
using test::RunResult;

constexpr const char* kMlp = "--model mlp --sizes 784,29,13,10 --batch 64";
constexpr const char* kGpt = "--model gpt --layers 2 --width 32 --heads 2 --context 16 --batch 8";
constexpr const char* kQuiet = "--log-every 1000 --seed 5 --quiet --synthetic";

class OffloadCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = fs::temp_directory_path() / fmt::format("dpt_offload_cli_{}", ::getpid());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }
  void SetUp() override {
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    for (char& c : name)
      if (c == '/') c = '_';
    dir_ = root_ / name;
    fs::create_directories(dir_ / "off");
  }

  // `dpt launch -n <n> -- dpt train <args>` (n = 1: dpt train alone).
  RunResult train(int n, const std::string& args, const std::string& env = "") const {
    const std::string base = fmt::format("env -u DPT_COMM_ALGO -u DPT_COMM_TRANSPORT -u DPT_FAULT OMP_NUM_THREADS=1 "
                                         "DPT_COMM_TIMEOUT=60 {} ",
                                         env);
    const std::string cmd = n == 1 ? fmt::format("{}{} train {} --threads 1", base, q(dpt_bin()), args)
                                   : fmt::format("{}{} launch -n {} -- {} train {}", base, q(dpt_bin()), n,
                                                 q(dpt_bin()), args);
    return test::run_shell(cmd, dir_, 120);
  }
  // Small chunks: every span in many chunks, cut inside parameters.
  std::string offload() const {
    return fmt::format("--offload optimizer --offload-dir {} --offload-chunk-mb 0.004", q(dir_ / "off"));
  }
  fs::path path(const std::string& name) const { return dir_ / name; }
  bool offload_dir_empty() const { return fs::is_empty(dir_ / "off"); }

  static inline fs::path root_;
  fs::path dir_;
};

// ------------------------------------------------------------ same weights

struct Case {
  const char* model;
  const char* strategy;
  int grad_accum;
  const char* extra = "";  // more flags for both runs
};

class SameWeights : public OffloadCli, public ::testing::WithParamInterface<Case> {};

TEST_P(SameWeights, AsWithoutOffloadByteForByte) {
  const Case c = GetParam();
  const int n = std::string(c.strategy) == "local" ? 1 : 2;
  const std::string common = fmt::format("{} {} --strategy {} --grad-accum {} --steps 4 {}", c.model, kQuiet,
                                         c.strategy, c.grad_accum, c.extra);
  RunResult r = train(n, fmt::format("{} --save {}", common, q(path("ram.safetensors"))));
  ASSERT_EQ(r.code, 0) << r.all();
  r = train(n, fmt::format("{} {} --save {} --summary-out {}", common, offload(), q(path("off.safetensors")),
                           q(path("summary.json"))));
  ASSERT_EQ(r.code, 0) << r.all();
  EXPECT_EQ(test::read_file(path("off.safetensors")), test::read_file(path("ram.safetensors")));
  EXPECT_TRUE(offload_dir_empty());

  const auto s = nlohmann::json::parse(std::ifstream(path("summary.json")));
  const size_t params = s["params"], per_element = std::string(c.model) == kMlp ? 4 : 8;
  const size_t offloaded = s["bytes"]["offloaded"];
  if (n == 1 || std::string(c.strategy) == "ddp")
    EXPECT_EQ(offloaded, params * per_element);  // every replica keeps all of it
  else
    EXPECT_NEAR(static_cast<double>(offloaded), params * per_element / 2.0, 64.0);  // rank 0's shard
  if (std::string(c.extra).empty())
    EXPECT_EQ(s["bytes"]["optimizer"], s["offload"]["ram_bytes"]);
  else  // bf16: the fp32 masters stay in RAM, counted with the optimizer
    EXPECT_GT(s["bytes"]["optimizer"].get<size_t>(), s["offload"]["ram_bytes"].get<size_t>());
  EXPECT_LT(s["bytes"]["optimizer"].get<size_t>(), offloaded);
  EXPECT_GE(s["offload"]["file_bytes"].get<size_t>(), offloaded);
  EXPECT_EQ(s["offload"]["read_bytes"].get<size_t>(), s["offload"]["written_bytes"].get<size_t>());
  EXPECT_GE(s["offload"]["read_bytes"].get<size_t>(), 4 * offloaded);  // 4 steps, whole blocks
}

INSTANTIATE_TEST_SUITE_P(, SameWeights,
                         ::testing::Values(Case{kMlp, "local", 1}, Case{kMlp, "ddp", 1}, Case{kMlp, "zero1", 1},
                                           Case{kMlp, "zero3", 1}, Case{kGpt, "local", 1}, Case{kGpt, "ddp", 1},
                                           Case{kGpt, "zero1", 1}, Case{kGpt, "zero3", 2},
                                           Case{kGpt, "ddp", 1, "--precision bf16"},
                                           Case{kGpt, "zero3", 1, "--precision bf16"}),
                         [](const auto& info) {
                           return fmt::format("{}_{}_accum{}{}", std::string(info.param.model).substr(8, 3),
                                              info.param.strategy, info.param.grad_accum,
                                              std::string(info.param.extra).empty() ? "" : "_bf16");
                         });

// ------------------------------------------------------------ master weights

// --offload params: the fp32 masters are one more tensor of each shard's
// state in the file; RAM keeps their bf16 copies. The same arithmetic, so
// the same bytes as the run that keeps them in RAM.
class MastersOffloaded : public OffloadCli, public ::testing::WithParamInterface<Case> {};

TEST_P(MastersOffloaded, AsInRamByteForByte) {
  const Case c = GetParam();
  const std::string common = fmt::format("{} {} --strategy {} --grad-accum {} --steps 4 --precision bf16", c.model,
                                         kQuiet, c.strategy, c.grad_accum);
  RunResult r = train(2, fmt::format("{} --save {} --summary-out {}", common, q(path("ram.safetensors")),
                                     q(path("ram.json"))));
  ASSERT_EQ(r.code, 0) << r.all();
  const std::string params = fmt::format("--offload params --offload-dir {} --offload-chunk-mb 0.004", q(dir_ / "off"));
  r = train(2, fmt::format("{} {} --save {} --summary-out {}", common, params, q(path("off.safetensors")),
                           q(path("off.json"))));
  ASSERT_EQ(r.code, 0) << r.all();
  EXPECT_EQ(test::read_file(path("off.safetensors")), test::read_file(path("ram.safetensors")));
  EXPECT_TRUE(offload_dir_empty());
  const auto ram = nlohmann::json::parse(std::ifstream(path("ram.json")));
  const auto off = nlohmann::json::parse(std::ifstream(path("off.json")));
  const size_t n = off["params"];
  // Rank 0's shard: the state (AdamW's m and v, SGD's momentum) and the
  // master, all in the file; the optimizer's RAM is the tier's chunk buffers.
  const double per_element = std::string(c.model) == kMlp ? 8.0 : 12.0;
  EXPECT_NEAR(off["bytes"]["offloaded"].get<double>(), n * per_element / 2.0, 64.0);
  EXPECT_EQ(off["bytes"]["optimizer"], off["offload"]["ram_bytes"]);
  EXPECT_EQ(off["bytes"]["parameters"], ram["bytes"]["parameters"]);  // the bf16 copies stay
  EXPECT_NEAR(ram["bytes"]["optimizer"].get<double>(), n * per_element / 2.0, 64.0);
}

INSTANTIATE_TEST_SUITE_P(, MastersOffloaded,
                         ::testing::Values(Case{kGpt, "zero1", 1}, Case{kGpt, "zero2", 2}, Case{kGpt, "zero3", 1},
                                           Case{kGpt, "zero3", 2}, Case{kMlp, "zero3", 1}),
                         [](const auto& info) {
                           return fmt::format("{}_{}_accum{}", std::string(info.param.model).substr(8, 3),
                                              info.param.strategy, info.param.grad_accum);
                         });

// ------------------------------------------------------------ resume

class Resume : public OffloadCli, public ::testing::WithParamInterface<Case> {};

// DDP reads its chunk of the state and gathers the rest through the tier;
// ZeRO-3 reads its shard into it.
TEST_P(Resume, EqualsTheUninterruptedRunBitForBit) {
  const Case c = GetParam();
  const std::string common =
      fmt::format("{} {} --strategy {} --grad-accum {} --steps 9", c.model, kQuiet, c.strategy, c.grad_accum);
  RunResult r = train(2, fmt::format("{} --save {}", common, q(path("full.safetensors"))));
  ASSERT_EQ(r.code, 0) << r.all();
  r = train(2, fmt::format("{} {} --checkpoint-dir {} --checkpoint-every 4", common, offload(), q(path("ck"))));
  ASSERT_EQ(r.code, 0) << r.all();
  for (const char* with : {"off", "ram"}) {
    r = train(2, fmt::format("{} {} --resume {} --save {}", common, std::string(with) == "off" ? offload() : "",
                             q(path("ck/step-00000004")), q(path(fmt::format("{}.safetensors", with)))));
    ASSERT_EQ(r.code, 0) << r.all();
    EXPECT_EQ(test::read_file(path(fmt::format("{}.safetensors", with))), test::read_file(path("full.safetensors")))
        << "resumed " << (std::string(with) == "off" ? "with" : "without") << " offload";
  }
  EXPECT_TRUE(offload_dir_empty());
}

INSTANTIATE_TEST_SUITE_P(, Resume, ::testing::Values(Case{kMlp, "ddp", 1}, Case{kGpt, "zero3", 2}),
                         [](const auto& info) {
                           return fmt::format("{}_{}_accum{}", std::string(info.param.model).substr(8, 3),
                                              info.param.strategy, info.param.grad_accum);
                         });

// --offload params: the checkpoint's parameters are the fp32 masters, read
// out of and written into the tier. The run that keeps its masters in RAM
// and the one that offloads them write the same rank files byte for byte,
// and either checkpoint resumes, with offload or without, to the
// uninterrupted run's weights bit for bit.
class ResumeMastersOffloaded : public OffloadCli, public ::testing::WithParamInterface<const char*> {};

TEST_P(ResumeMastersOffloaded, EqualsTheUninterruptedRunBitForBit) {
  const std::string common =
      fmt::format("{} {} --strategy {} --precision bf16 --steps 9", kGpt, kQuiet, GetParam());
  const std::string params = fmt::format("--offload params --offload-dir {} --offload-chunk-mb 0.004", q(dir_ / "off"));
  // Checkpoints read, never change, the state: both runs are uninterrupted.
  RunResult r = train(2, fmt::format("{} --checkpoint-dir {} --checkpoint-every 4 --save {}", common,
                                     q(path("ck_ram")), q(path("full.safetensors"))));
  ASSERT_EQ(r.code, 0) << r.all();
  r = train(2, fmt::format("{} {} --checkpoint-dir {} --checkpoint-every 4", common, params, q(path("ck_off"))));
  ASSERT_EQ(r.code, 0) << r.all();
  for (const char* file : {"rank-00000-of-00002.safetensors", "rank-00001-of-00002.safetensors"}) {
    const std::string ram = test::read_file(path("ck_ram/step-00000004") / file);
    EXPECT_FALSE(ram.empty()) << file;
    EXPECT_TRUE(test::read_file(path("ck_off/step-00000004") / file) == ram) << file << " differs";
  }
  const std::pair<const char*, bool> resumes[] = {{"ck_off", true}, {"ck_off", false}, {"ck_ram", true}};
  for (const auto& [from, offloaded] : resumes) {
    const std::string what = fmt::format("{} resumed {} offload", from, offloaded ? "with" : "without");
    r = train(2, fmt::format("{} {} --resume {} --save {}", common, offloaded ? params : "",
                             q(path(from) / "step-00000004"), q(path("resumed.safetensors"))));
    ASSERT_EQ(r.code, 0) << what << "\n" << r.all();
    EXPECT_TRUE(test::read_file(path("resumed.safetensors")) == test::read_file(path("full.safetensors")))
        << what << ": other weights than the uninterrupted run's";
  }
  EXPECT_TRUE(offload_dir_empty());
}

INSTANTIATE_TEST_SUITE_P(, ResumeMastersOffloaded, ::testing::Values("zero1", "zero3"));

// ------------------------------------------------------------ the file's life

// Polls `file` until a metrics line of step >= step appears, for at most 60 s.
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

// The offload files the processes running `pattern` hold open: one line
// "<size> <link target>" per file, from /proc/<pid>/fd.
std::string open_offload_files(const std::string& pattern, const fs::path& off, const fs::path& scratch) {
  const std::string pids = test::run_shell(fmt::format("pgrep -f {}", q(pattern)), scratch).out;
  std::string out;
  std::istringstream in(pids);
  for (std::string pid; in >> pid;) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator("/proc/" + pid + "/fd", ec)) {
      const std::string target = fs::read_symlink(e.path(), ec).string();
      if (!ec && target.rfind(off.string() + "/dpt-offload-rank", 0) == 0)
        out += fmt::format("{} {}\n", fs::file_size(e.path(), ec), target);
    }
  }
  return out;
}

TEST_F(OffloadCli, TheFileIsOpenWhileTheJobRunsAndGoneAfterSigterm) {
  const fs::path metrics = path("metrics.jsonl");
  const std::string job =
      fmt::format("{} launch -n 2 -- {} train {} --seed 5 --log-every 1 --steps 100000 --strategy zero3 {} "
                  "--checkpoint-dir {} --metrics-out {}",
                  q(dpt_bin()), q(dpt_bin()), kGpt, offload(), q(path("ck")), q(metrics));
  std::thread runner([&] {
    const RunResult r = test::run_shell("env OMP_NUM_THREADS=1 DPT_COMM_TIMEOUT=60 " + job, dir_, 120);
    EXPECT_NE(r.out.find("stopped by signal 15 after step"), std::string::npos) << r.all();
  });
  ASSERT_TRUE(wait_for_step(metrics, 3));
  const std::string pattern = fmt::format("^{} train .*{}", dpt_bin(), path("ck").string());
  const std::string files = open_offload_files(pattern, dir_ / "off", dir_);
  // One per rank, unlinked from the start, with the shard's state in it.
  EXPECT_EQ(std::count(files.begin(), files.end(), '\n'), 2) << files;
  EXPECT_NE(files.find("rank0-"), std::string::npos) << files;
  EXPECT_NE(files.find("rank1-"), std::string::npos) << files;
  EXPECT_EQ(std::count(files.begin(), files.end(), '('), 2) << files;  // "(deleted)"
  EXPECT_EQ(files.find("\n0 "), std::string::npos) << files;
  EXPECT_NE(files.rfind("0", 0), 0u) << files;
  EXPECT_TRUE(offload_dir_empty());
  test::run_shell(fmt::format("pkill -TERM -f {}", q(pattern)), dir_);
  runner.join();
  EXPECT_TRUE(fs::exists(path("ck/latest")));
  EXPECT_TRUE(offload_dir_empty());
  EXPECT_EQ(open_offload_files(pattern, dir_ / "off", dir_), "");
}

TEST_F(OffloadCli, AKilledPeerLeavesNoFileBehind) {
  const RunResult r = train(2, fmt::format("{} {} --strategy zero3 --steps 6 {}", kGpt, kQuiet, offload()),
                            "DPT_FAULT=optimizer:3:1");
  EXPECT_NE(r.code, 0) << r.all();
  EXPECT_NE(r.all().find("rank 1 killed at optimizer of step 3"), std::string::npos) << r.all();
  EXPECT_NE(r.all().find("rank 1 has exited"), std::string::npos) << r.all();
  EXPECT_TRUE(offload_dir_empty());
}

// ------------------------------------------------------------ bad flags

TEST_F(OffloadCli, BadFlagsAreRefusedInOneSentence) {
  std::ofstream(path("a_file")) << "x";
  const std::pair<std::string, std::string> cases[] = {
      {"--offload optimizer", "--offload optimizer needs --offload-dir DIR"},
      {fmt::format("--offload optimizer --offload-dir {}", q(path("nowhere"))), "nowhere: no such directory"},
      {fmt::format("--offload optimizer --offload-dir {}", q(path("a_file"))), "a_file: not a directory"},
      {"--offload gradients --offload-dir /tmp", "--offload"},
      {"--offload params --offload-dir /tmp", "needs --precision bf16"},
      {"--offload params --offload-dir /tmp --precision bf16", "needs a sharded strategy"},
      {fmt::format("--offload-dir {}", q(dir_ / "off")), "--offload-dir is given without --offload optimizer"},
      {"--offload optimizer --offload-dir /tmp --offload-chunk-mb 0", "--offload-chunk-mb"},
      {"--offload optimizer --offload-dir /tmp --strategy dp", "--strategy dp offloads nothing"},
  };
  for (const auto& [flags, sentence] : cases) {
    const RunResult r = train(1, fmt::format("{} {} --steps 1 {}", kGpt, kQuiet, flags));
    EXPECT_EQ(r.code, 1) << flags << "\n" << r.all();
    EXPECT_NE(r.err.find(sentence), std::string::npos) << flags << "\n" << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << flags << "\n" << r.err;
  }
  // Under a launcher too, before anything is allocated.
  const RunResult r =
      train(2, fmt::format("{} {} --steps 1 --offload optimizer --offload-dir {}", kGpt, kQuiet, q(path("nowhere"))));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("]: error: --offload-dir"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("nowhere: no such directory"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace dpt
