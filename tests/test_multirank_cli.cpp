// `dpt launch` end to end, from one test process: the mpirun line it builds
// (--dry-run), real 2-rank jobs through it (bench comm, DDP training), naive
// DP without a launcher, and a rank killed mid-training (the job must end,
// non-zero, with an error that names the collective, not hang).
//
// Every job runs under `timeout`, so a hang fails the test instead of
// stalling the run; ranks use one thread each (the machine may have 2 cores).
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
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
using test::read_file;
using test::RunResult;

bool has(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

// MLP of --sizes 784,64,10: two Linear layers, weights and biases.
constexpr const char* kSizes = "784,64,10";
constexpr int64_t kParams = 784 * 64 + 64 + 64 * 10 + 10;
const std::multiset<int64_t> kTensorNumels = {784 * 64, 64, 64 * 10, 10};

class MultirankCliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / fmt::format("dpt_multirank_cli_{}", ::getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  // Runs the shell command line `cmd` (under `timeout`, killed after
  // `limit_s`), capturing stdout, stderr, the exit code and the wall time.
  static RunResult sh(const std::string& cmd, int limit_s = 60) { return test::run_shell(cmd, dir_, limit_s); }

  // `dpt <args>`, with the engine's settings from the test's own environment
  // removed so they cannot change what is checked. `env` is what env(1)
  // gets before the command: "-u NAME" options first, then NAME=value.
  static constexpr const char* kOneThread = "OMP_NUM_THREADS=1";
  static RunResult dpt(const std::string& args, const std::string& env = kOneThread, int limit_s = 60) {
    return sh(fmt::format("env -u DPT_COMM_ALGO -u DPT_COMM_TRANSPORT -u DPT_COMM_TIMEOUT -u DPT_COMM_CHECK "
                          "{} {} {}",
                          env, q(dpt_bin()), args),
              limit_s);
  }

  // `dpt launch -n 2 -- dpt <args>`.
  static RunResult launch2(const std::string& args, int limit_s = 60) {
    return dpt(fmt::format("launch -n 2 -- {} {}", q(dpt_bin()), args), kOneThread, limit_s);
  }

  // The one line `dpt launch --dry-run` prints, without its newline.
  static std::string dry_run(const std::string& args, const std::string& env = kOneThread) {
    SCOPED_TRACE("dpt launch " + args);
    RunResult r = dpt("launch --dry-run " + args, env);
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.err, "");
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
    if (!r.out.empty() && r.out.back() == '\n') r.out.pop_back();
    return r.out;
  }

  static std::vector<std::string> words(const std::string& line) {
    std::istringstream in(line);
    return {std::istream_iterator<std::string>(in), {}};
  }

  // Checks the summary j of a DDP run of the kSizes MLP on 2 ranks and
  // returns its buckets' sizes.
  static std::vector<int64_t> check_ddp_summary(const json& j) {
    EXPECT_EQ(j["world"], 2);
    EXPECT_EQ(j["strategy"], "ddp");
    EXPECT_EQ(j["params"], kParams);
    EXPECT_TRUE(j["ranks"].is_array());
    EXPECT_EQ(j["ranks"].size(), 2u);
    for (const auto& rank : j["ranks"]) {
      EXPECT_GT(rank["step_ms"].get<double>(), 0.0) << rank;
      // The comm wait's split (train/lockstep.h): two parts of it, each at
      // least 0, adding up to it.
      for (const char* part : {"comm_wait_slower_rank_ms", "comm_wait_communicating_ms"})
        EXPECT_GE(rank[part].get<double>(), 0.0) << rank;
      EXPECT_NEAR(rank["comm_wait_slower_rank_ms"].get<double>() + rank["comm_wait_communicating_ms"].get<double>(),
                  rank["comm_wait_ms"].get<double>(), 1e-9)
          << rank;
    }
    // A ring all-reduce sends 2(N-1)/N of the gradients, all of them for
    // N = 2; the loss of the last step (one float) adds a few bytes.
    const auto grad_bytes = static_cast<int64_t>(kParams * 4);
    const auto sent = j["comm_bytes_per_step"].get<int64_t>();
    EXPECT_GE(sent, grad_bytes);
    EXPECT_LE(sent, grad_bytes + 16);
    // The buckets tile the flat gradient buffer exactly.
    std::vector<std::pair<int64_t, int64_t>> ranges;  // (offset, numel)
    std::vector<int64_t> numels;
    EXPECT_FALSE(j["ddp"]["buckets"].empty());
    for (const auto& b : j["ddp"]["buckets"]) {
      ranges.emplace_back(b["offset"].get<int64_t>(), b["numel"].get<int64_t>());
      numels.push_back(b["numel"].get<int64_t>());
    }
    std::sort(ranges.begin(), ranges.end());
    int64_t next = 0;
    for (const auto& [offset, numel] : ranges) {
      EXPECT_EQ(offset, next);
      EXPECT_GT(numel, 0);
      next = offset + numel;
    }
    EXPECT_EQ(next, kParams);
    return numels;
  }

  static inline fs::path dir_;
};

// ---------------------------------------------------------------- dry run

TEST_F(MultirankCliTest, DryRunPrintsTheMpirunLine) {
  const std::string line = dry_run("-n 2 -- /bin/echo hi");
  const auto w = words(line);
  ASSERT_GE(w.size(), 3u) << line;
  EXPECT_EQ(fs::path(w[0]).filename(), "mpirun") << line;
  EXPECT_EQ(w[1], "-n") << line;
  EXPECT_EQ(w[2], "2") << line;
  EXPECT_TRUE(has(line, " -n 2 ")) << line;
  if (::geteuid() == 0) EXPECT_TRUE(has(line, " --allow-run-as-root ")) << line;
  else EXPECT_FALSE(has(line, "--allow-run-as-root")) << line;
  EXPECT_TRUE(has(line, " --bind-to none ")) << line;
  EXPECT_FALSE(has(line, "--bind-to core")) << line;
  EXPECT_TRUE(has(line, " --mca orte_allowed_exit_without_sync 1 ")) << line;
  // dpt() sets OMP_NUM_THREADS=1, so the launcher passes it on as it is.
  EXPECT_TRUE(has(line, " -x OMP_NUM_THREADS ")) << line;
  EXPECT_TRUE(line.ends_with(" /bin/echo hi")) << line;
  // Ranks that fit in the cores: no oversubscription (one always fits).
  EXPECT_FALSE(has(dry_run("-n 1 -- /bin/echo hi"), "--oversubscribe"));
  // DPT_COMM_TIMEOUT is not in the environment: not forwarded.
  EXPECT_FALSE(has(line, "DPT_COMM_TIMEOUT")) << line;
}

TEST_F(MultirankCliTest, DryRunSetsOmpThreadsWhenUnset) {
  const std::string line = dry_run("-n 2 -- /bin/echo hi", "-u OMP_NUM_THREADS");
  EXPECT_TRUE(has(line, " -x OMP_NUM_THREADS=")) << line;
  // cores / ranks, at least 1.
  const auto pos = line.find("OMP_NUM_THREADS=");
  ASSERT_NE(pos, std::string::npos);
  EXPECT_GE(std::atoi(line.c_str() + pos + 16), 1) << line;
}

TEST_F(MultirankCliTest, DryRunForwardsDptVariables) {
  const std::string line = dry_run("-n 2 -- /bin/echo hi", "OMP_NUM_THREADS=1 DPT_COMM_TIMEOUT=7");
  EXPECT_TRUE(has(line, " -x DPT_COMM_TIMEOUT ")) << line;
  EXPECT_FALSE(has(line, "DPT_COMM_TIMEOUT=")) << line;  // by name: the value travels in the environment
  EXPECT_TRUE(line.ends_with(" /bin/echo hi")) << line;
}

TEST_F(MultirankCliTest, DryRunOversubscribesPastTheCores) {
  const std::string line = dry_run("-n 64 -- /bin/echo hi");
  EXPECT_TRUE(has(line, " -n 64 ")) << line;
  EXPECT_TRUE(has(line, " --oversubscribe ")) << line;
  // 64 ranks share the cores: one thread each.
  EXPECT_TRUE(has(dry_run("-n 64 -- /bin/echo hi", "-u OMP_NUM_THREADS"), " -x OMP_NUM_THREADS=1 "));
}

// Thread teams that oversubscribe the cores sleep while they wait (OpenMP's
// spinning workers would fight over the cores); a policy the user set is
// passed on as it is; teams that fit keep OpenMP's default.
TEST_F(MultirankCliTest, DryRunLetsOversubscribedTeamsSleep) {
  const int cpus = static_cast<int>(std::thread::hardware_concurrency());
  const std::string crowded = dry_run(fmt::format("-n 2 -- /bin/echo train --threads {}", cpus),
                                      "-u OMP_WAIT_POLICY OMP_NUM_THREADS=1");
  EXPECT_TRUE(has(crowded, " -x OMP_WAIT_POLICY=PASSIVE ")) << crowded;
  const std::string by_env = dry_run("-n 2 -- /bin/echo hi", fmt::format("-u OMP_WAIT_POLICY OMP_NUM_THREADS={}", cpus));
  EXPECT_TRUE(has(by_env, " -x OMP_WAIT_POLICY=PASSIVE ")) << by_env;
  const std::string fits = dry_run("-n 1 -- /bin/echo hi", "-u OMP_WAIT_POLICY OMP_NUM_THREADS=1");
  EXPECT_FALSE(has(fits, "OMP_WAIT_POLICY")) << fits;
  const std::string chosen = dry_run("-n 2 -- /bin/echo train --threads 64", "OMP_WAIT_POLICY=ACTIVE");
  EXPECT_TRUE(has(chosen, " -x OMP_WAIT_POLICY ")) << chosen;
  EXPECT_FALSE(has(chosen, "PASSIVE")) << chosen;
}

TEST_F(MultirankCliTest, DryRunBindCore) {
  const std::string line = dry_run("-n 2 --bind core -- /bin/echo hi");
  EXPECT_TRUE(has(line, " --bind-to core ")) << line;
  EXPECT_FALSE(has(line, "--bind-to none")) << line;
}

TEST_F(MultirankCliTest, LaunchWithoutCommandIsAUserError) {
  for (const char* args : {"launch -n 2 --", "launch -n 2 --dry-run --", "launch -n 2"}) {
    SCOPED_TRACE(args);
    RunResult r = dpt(args);
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_TRUE(r.err.starts_with("dpt: error: ")) << r.err;
    EXPECT_TRUE(has(r.err, "no command")) << r.err;
    EXPECT_EQ(r.out, "");
  }
}

TEST_F(MultirankCliTest, LaunchOfZeroRanksFails) {
  for (const char* args : {"launch -n 0 --dry-run -- /bin/echo hi", "launch -n 0 -- /bin/echo hi"}) {
    SCOPED_TRACE(args);
    RunResult r = dpt(args);
    EXPECT_NE(r.code, 0) << r.err;
    EXPECT_GT(r.code, 0);
    EXPECT_LT(r.code, 128);  // an error, not a crash
    EXPECT_TRUE(has(r.err, "-n")) << r.err;
    EXPECT_FALSE(has(r.out, "/bin/echo")) << r.out;  // nothing launched or printed
  }
}

// mpirun -n 99999 forked ranks onto a 2-core host for a minute and did not
// stop at SIGTERM; a missing or non-executable program was mpirun's boxed
// paragraph and status 132 or 134, as if a rank had crashed.
TEST_F(MultirankCliTest, LaunchRefusesTooManyRanksPerSlotAndAMissingProgram) {
  const RunResult many = dpt("launch -n 99999 -- /bin/echo hi");
  EXPECT_EQ(many.code, 1) << many.err;
  EXPECT_TRUE(many.err.starts_with("dpt: error: -n 99999 puts 99999 ranks on this host of ")) << many.err;
  EXPECT_TRUE(has(many.err, "more than 64 per slot")) << many.err;
  EXPECT_EQ(many.out, "");
  const fs::path hosts = dir_ / "two_hosts";
  std::ofstream(hosts) << "a slots=1\nb slots=2\n";
  const RunResult spread = dpt(fmt::format("launch -n 300 --hostfile {} --dry-run -- /bin/echo hi", q(hosts)));
  EXPECT_EQ(spread.err, "dpt: error: -n 300 puts 150 ranks on host a of 1 slot, more than 64 per slot (each rank is "
                        "a process with its own memory and threads); give fewer ranks, or hosts in a --hostfile\n");
  for (const auto& [program, says] : std::vector<std::pair<std::string, std::string>>{
           {"/nonexistent/prog", "/nonexistent/prog: no such program"},
           {"no_such_program_xyz", "no_such_program_xyz: no such program on PATH"},
           {"/etc/passwd", "/etc/passwd: not an executable file"}}) {
    const RunResult r = dpt("launch -n 2 -- " + program);
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_EQ(r.err, "dpt: error: " + says + "\n");
  }
}

// ---------------------------------------------------------------- errors once

// Lines of `text` that hold `what`.
int count_lines(const std::string& text, const std::string& what) {
  std::istringstream in(text);
  int n = 0;
  for (std::string line; std::getline(in, line);) n += has(line, what);
  return n;
}

// Open MPI's own text on a failed job, which dpt launch leaves out.
void expect_no_mpirun_text(const std::string& err) {
  for (const char* text : {"Primary job", "mpirun detected", "Per user-direction", "-----", "abort is already"})
    EXPECT_FALSE(has(err, text)) << text << " in:\n" << err;
}

// A line without its host: mpirun read "slots=2" as a host's name and
// answered with a boxed parse error.
TEST_F(MultirankCliTest, AHostfileLineWithoutItsHostIsRefused) {
  std::ofstream(dir_ / "no_host") << "slots=2\n";
  const RunResult no_host = dpt(fmt::format("launch -n 2 --hostfile {} -- /bin/echo hi", q(dir_ / "no_host")));
  EXPECT_EQ(no_host.err, fmt::format("dpt: error: {}:1: 'slots=2' is not a host name: a line starts with the host\n",
                                     (dir_ / "no_host").string()));
  EXPECT_EQ(no_host.code, 1);
}

// A launch inside a launched job: mpirun's "does not support recursive
// calls" banner from every rank, then "rank 0 exited with status 1".
TEST_F(MultirankCliTest, LaunchInsideALaunchedJobIsOneSentence) {
  const RunResult r = dpt(fmt::format("launch -n 2 -- {} launch -n 2 -- /bin/echo hi", q(dpt_bin())));
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_TRUE(has(r.err, "dpt launch runs here as a rank of an mpirun job of 2 ranks")) << r.err;
  EXPECT_FALSE(has(r.err, "recursive")) << r.err;
  EXPECT_EQ(count_lines(r.err, "error:"), 1) << r.err;
}

// A bad mesh, and the other checks train makes before it builds anything,
// are refused by the launcher in train's own sentence, once, before any
// rank starts: no "dpt[rank N]" (which a rank would print), no mpirun text,
// in well under a second of MPI start-up.
TEST_F(MultirankCliTest, LaunchRefusesWhatTrainWouldBeforeAnyRankStarts) {
  const std::string train = q(dpt_bin()) + " train --synthetic --steps 2 --threads 1 --quiet";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"-n 4 -- " + train + " --model gpt --tp 3", "4 ranks do not split into --tp 3 x --pp 1 (a multiple of 3 is needed)"},
      {"-n 2 -- " + train + " --model mlp --pp 2", "--pp splits a transformer's blocks into stages; the mlp model has none"},
      {"-n 3 -- " + train + " --model mlp --batch 16", "global batch 16 does not split into 3 ranks x 1 equal micro-batches"},
      {"-n 2 -- " + train + " --model mlp --shard-group 2", "--shard-group is hsdp's; --strategy ddp has no shard groups"},
      {"-n 2 -- " + train + " --model mlp --strategy zero2 --no-overlap",
       "--no-overlap shapes DDP's gradient buckets, and --strategy zero2 reduces in none"},
      {"-n 2 -- " + train + " --model mlp --strategy zero1 --zero-reduce scatter --bucket-mb 2",
       "--bucket-mb shapes DDP's gradient buckets, and --strategy zero1 --zero-reduce scatter reduces in none"},
      // The default on 2 ranks is ddp, and the launcher names it.
      {"-n 2 -- " + train + " --model mlp --prefetch none",
       "--prefetch sets when a sharded strategy gathers its next unit's parameters, and the default strategy (ddp: 2 "
       "data-parallel ranks) does not read it (only zero3 or hsdp does)"},
      {"-n 2 -- " + train + " --model mlp --strategy zero2 --zero-accumulate local",
       "--zero-accumulate sets how a sharded strategy keeps its gradients over --grad-accum's micro-batches, and this "
       "run has one micro-batch per step"},
      {"-n 2 -- " + train + " --model mlp --bogus", "The following argument was not expected: --bogus"},
      // --dry-run checks too: it answers whether the job would start.
      {"-n 4 --dry-run -- " + train + " --model gpt --tp 3", "4 ranks do not split into --tp 3 x --pp 1"},
  };
  for (const auto& [args, says] : cases) {
    SCOPED_TRACE(args);
    const RunResult r = dpt("launch " + args);
    EXPECT_EQ(r.code, 1) << r.all();
    EXPECT_TRUE(r.err.starts_with("dpt: error: " + says)) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_EQ(r.out, "");
    EXPECT_LT(r.seconds, 5.0);
  }
}

// Every rank says the same sentence and exits 1: shown once, exit 1, none of
// mpirun's text; --verbose shows each rank's line and mpirun's text.
TEST_F(MultirankCliTest, FailureEveryRankReportsAlikeIsShownOnce) {
  const std::string job =
      "-- sh -c 'echo \"dpt[rank $OMPI_COMM_WORLD_RANK]: error: the same on every rank\" >&2; sleep 1; exit 1'";
  RunResult r = dpt("launch -n 2 " + job);
  EXPECT_EQ(r.code, 1) << r.all();
  EXPECT_EQ(count_lines(r.err, "error: the same on every rank"), 1) << r.err;
  EXPECT_EQ(r.err, r.err.starts_with("dpt[rank 0]") ? "dpt[rank 0]: error: the same on every rank\n"
                                                    : "dpt[rank 1]: error: the same on every rank\n");
  expect_no_mpirun_text(r.err);
  r = dpt("launch -n 2 --verbose " + job);
  EXPECT_EQ(r.code, 1) << r.all();
  EXPECT_EQ(count_lines(r.err, "dpt[rank 0]: error: the same on every rank"), 1) << r.err;
  EXPECT_EQ(count_lines(r.err, "dpt[rank 1]: error: the same on every rank"), 1) << r.err;
  EXPECT_TRUE(has(r.err, "Primary job  terminated normally, but 1 process returned")) << r.err;
}

// The same from training: rank 0 cannot create the checkpoint directory
// (its parent is a file) and every rank stops with rank 0's sentence.
TEST_F(MultirankCliTest, TrainingFailureOnEveryRankIsShownOnce) {
  std::ofstream(dir_ / "a_file") << "x";
  const std::string train = fmt::format("train --model mlp --synthetic --steps 3 --sizes {} --threads 1 --quiet "
                                        "--checkpoint-every 1 --checkpoint-dir {}",
                                        kSizes, q(dir_ / "a_file" / "ck"));
  const std::string says = "cannot create the checkpoint directory: Not a directory";
  RunResult r = launch2(train);
  EXPECT_EQ(r.code, 1) << r.all();
  EXPECT_EQ(count_lines(r.err, says), 1) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_TRUE(r.err.starts_with("dpt[rank ")) << r.err;
  expect_no_mpirun_text(r.err);
  EXPECT_EQ(r.out, "");
  // Each rank said it (both print before mpirun notices the first exit).
  r = dpt(fmt::format("launch -n 2 --verbose -- {} {}", q(dpt_bin()), train));
  EXPECT_EQ(r.code, 1) << r.all();
  EXPECT_EQ(count_lines(r.err, says), 2) << r.err;
}

// A rank that exits without a word: dpt launch names it and its status,
// in one line, and passes the status on. (mpirun does not always print the
// banner that names the rank: 3 runs in 20 here. The line then says so.)
TEST_F(MultirankCliTest, RankThatExitsSilentlyIsNamed) {
  const RunResult r = dpt("launch -n 2 -- sh -c 'if [ $OMPI_COMM_WORLD_RANK = 1 ]; then exit 3; fi; sleep 5'");
  EXPECT_EQ(r.code, 3) << r.all();
  EXPECT_TRUE(r.err == "dpt launch: rank 1 exited with status 3\n" ||
              r.err == "dpt launch: a rank exited with status 3; mpirun did not say which (--verbose shows its text)\n")
      << r.err;
  EXPECT_LT(r.seconds, 5.0) << "mpirun ends rank 0 when rank 1 fails";
}

// ---------------------------------------------------------------- real jobs

TEST_F(MultirankCliTest, BenchCommOnTwoRanks) {
  const fs::path f = dir_ / "bench.json";
  RunResult r = launch2("bench comm --sizes 4K,64K --iters 2 --warmup 1 --json " + q(f));
  ASSERT_EQ(r.code, 0) << r.all();
  ASSERT_TRUE(fs::exists(f)) << r.all();
  const json j = json::parse(read_file(f));
  EXPECT_EQ(j["world"], 2);
  ASSERT_TRUE(j["results"].is_array());
  ASSERT_FALSE(j["results"].empty());
  std::set<std::string> ops, algos;
  std::set<std::tuple<std::string, std::string, std::string, int64_t>> seen;
  for (const auto& res : j["results"]) {
    SCOPED_TRACE(res.dump());
    EXPECT_EQ(res["wrong"], 0);
    EXPECT_GT(res["busbw_gbs"].get<double>(), 0.0);
    const auto bytes = res["bytes"].get<int64_t>();
    EXPECT_TRUE(bytes == 4096 || bytes == 65536);
    ops.insert(res["op"].get<std::string>());
    algos.insert(res["algo"].get<std::string>());
    seen.emplace(res["op"].get<std::string>(), res["algo"].get<std::string>(), res["memory"].get<std::string>(),
                 bytes);
  }
  EXPECT_EQ(ops, (std::set<std::string>{"all_reduce", "reduce_scatter", "all_gather", "broadcast"}));
  EXPECT_EQ(algos, (std::set<std::string>{"ring", "mpi"}));
  // Every operation, algorithm and size in private memory, once each, and
  // the ring's all_reduce in a shared window (checked exactly like the
  // others); MPI's algorithms have no shared window.
  for (int64_t bytes : {4096, 65536}) {
    EXPECT_TRUE(seen.count({"all_reduce", "ring", "shared", bytes}));
    EXPECT_FALSE(seen.count({"all_reduce", "mpi", "shared", bytes}));
  }
  EXPECT_EQ(seen.size(), 4u * 2u * 2u + 2u);
  EXPECT_EQ(j["results"].size(), 4u * 2u * 2u + 2u);
}

TEST_F(MultirankCliTest, DdpTrainOnTwoRanks) {
  const fs::path f = dir_ / "ddp.json";
  RunResult r = launch2(fmt::format("train --model mlp --synthetic --steps 4 --sizes {} --comm-algo ring "
                                    "--threads 1 --quiet --summary-out {}",
                                    kSizes, q(f)));
  ASSERT_EQ(r.code, 0) << r.all();
  EXPECT_EQ(r.out, "");  // --quiet, on both ranks
  const json j = json::parse(read_file(f));
  EXPECT_EQ(j["steps"], 4);
  EXPECT_EQ(j["ddp"]["per_param"], false);
  // Both ranks on this host: the gradients live in a shared window.
  EXPECT_EQ(j["ddp"]["in_place"], true);
  EXPECT_NE(j["strategy_detail"].get<std::string>().find("all-reduced in place"), std::string::npos);
  const auto numels = check_ddp_summary(j);
  // 200 KB of gradients: fewer buckets than tensors.
  EXPECT_LT(numels.size(), kTensorNumels.size());
}

// A rank made slower (DPT_STRAGGLE sleeps 30 ms in each of its forwards),
// either one: the other rank's comm wait is the wait for it, and the
// lock-step split says so, not communication; the slow rank itself hardly
// waits for anybody (a loaded host may still delay the other on a step).
TEST_F(MultirankCliTest, StragglerShowsAsTheOtherRanksWait) {
  for (int straggler : {0, 1}) {
    SCOPED_TRACE(fmt::format("straggler: rank {}", straggler));
    const fs::path f = dir_ / fmt::format("ddp_straggler{}.json", straggler);
    RunResult r = dpt(fmt::format("launch -n 2 -- {} train --model mlp --synthetic --steps 12 --sizes {} "
                                  "--threads 1 --summary-out {}",
                                  q(dpt_bin()), kSizes, q(f)),
                      fmt::format("{} DPT_STRAGGLE={}:30", kOneThread, straggler));
    ASSERT_EQ(r.code, 0) << r.all();
    EXPECT_TRUE(has(r.out, "waiting for a slower rank")) << r.out;
    const json j = json::parse(read_file(f));
    // The straggler, named.
    EXPECT_TRUE(has(r.out, fmt::format("lock-step: rank {} was the slowest", straggler))) << r.out;
    EXPECT_EQ(j["lockstep"]["slowest_rank"], straggler) << j["lockstep"];
    EXPECT_GT(j["lockstep"]["slowest_share"].get<double>(), 0.8) << j["lockstep"];
    EXPECT_GT(j["lockstep"]["spread_ms"].get<double>(), 20.0) << j["lockstep"];
    const json& ranks = j["ranks"];
    ASSERT_EQ(ranks.size(), 2u);
    const json& slow = ranks[static_cast<size_t>(straggler)];
    const json& fast = ranks[static_cast<size_t>(1 - straggler)];
    EXPECT_GT(slow["forward_ms"].get<double>(), 30.0) << slow;
    EXPECT_GT(fast["comm_wait_slower_rank_ms"].get<double>(), 20.0) << fast;
    EXPECT_LT(fast["comm_wait_communicating_ms"].get<double>(), 10.0) << fast;
    EXPECT_LT(slow["comm_wait_slower_rank_ms"].get<double>(), 5.0) << slow;
  }
}

// Under ZeRO-3 the ranks also meet at every unit's parameter gather: a
// straggler's lead is waited out there (the fast rank's gather wait), and
// the reduction after backward finds the ranks level, so the split does
// not charge its wait to the slower rank.
TEST_F(MultirankCliTest, StragglerUnderZero3IsWaitedForAtTheGathers) {
  const fs::path f = dir_ / "zero3_straggler.json";
  RunResult r = dpt(fmt::format("launch -n 2 -- {} train --model mlp --synthetic --steps 12 --sizes {} "
                                "--threads 1 --strategy zero3 --summary-out {}",
                                q(dpt_bin()), kSizes, q(f)),
                    fmt::format("{} DPT_STRAGGLE=1:30", kOneThread));
  ASSERT_EQ(r.code, 0) << r.all();
  const json j = json::parse(read_file(f));
  const json& fast = j["ranks"][0];
  EXPECT_GT(fast["gather_wait_ms"].get<double>(), 20.0) << fast;
  EXPECT_LT(fast["comm_wait_slower_rank_ms"].get<double>(), 5.0) << fast;
  EXPECT_EQ(j["lockstep"]["slowest_rank"], 1) << j["lockstep"];
}

// DPT_COMM_IN_PLACE=0: the same run through the ring's slots, and it says so.
TEST_F(MultirankCliTest, DdpTrainThroughTheSlotsWhenInPlaceIsOff) {
  const fs::path f = dir_ / "ddp_slots.json";
  RunResult r = dpt(fmt::format("launch -n 2 -- {} train --model mlp --synthetic --steps 4 --sizes {} --comm-algo ring "
                                "--threads 1 --quiet --summary-out {}",
                                q(dpt_bin()), kSizes, q(f)),
                    std::string(kOneThread) + " DPT_COMM_IN_PLACE=0");
  ASSERT_EQ(r.code, 0) << r.all();
  const json j = json::parse(read_file(f));
  EXPECT_EQ(j["ddp"]["in_place"], false);
  EXPECT_EQ(j["strategy_detail"].get<std::string>().find("in place"), std::string::npos);
  check_ddp_summary(j);
}

TEST_F(MultirankCliTest, DdpTrainPerParamOnTwoRanks) {
  const fs::path f = dir_ / "ddp_per_param.json";
  RunResult r = launch2(fmt::format("train --model mlp --synthetic --steps 4 --sizes {} --comm-algo ring "
                                    "--per-param --threads 1 --quiet --summary-out {}",
                                    kSizes, q(f)));
  ASSERT_EQ(r.code, 0) << r.all();
  const json j = json::parse(read_file(f));
  EXPECT_EQ(j["ddp"]["per_param"], true);
  const auto numels = check_ddp_summary(j);
  // One "bucket" per parameter tensor.
  EXPECT_EQ(numels.size(), kTensorNumels.size());
  EXPECT_EQ(std::multiset<int64_t>(numels.begin(), numels.end()), kTensorNumels);
}

// --trace-out: the timeline of the last steps, every rank's compute and
// communication, in Chrome's trace format.
struct Span {
  double start, end;
};
struct RankSteps {
  // step -> phase name ("forward", ...) -> spans; all_reduce spans by bucket.
  std::map<int64_t, std::map<std::string, std::vector<Span>>> phases;
  std::map<int64_t, std::map<int, Span>> all_reduce;
};

std::map<int, RankSteps> read_trace(const fs::path& f, std::map<int, std::string>* names) {
  std::map<int, RankSteps> ranks;
  const json trace = json::parse(read_file(f));
  for (const auto& e : trace["traceEvents"]) {
    const int pid = e["pid"].get<int>();
    if (e["ph"] == "M") {
      if (e["name"] == "process_name") (*names)[pid] = e["args"]["name"].get<std::string>();
      continue;
    }
    EXPECT_EQ(e["ph"], "X") << e;
    const Span span{e["ts"].get<double>(), e["ts"].get<double>() + e["dur"].get<double>()};
    const int64_t step = e["args"]["step"].get<int64_t>();
    const std::string name = e["name"].get<std::string>();
    if (name.starts_with("all_reduce")) {
      EXPECT_EQ(e["tid"], 1) << e;
      const int bucket = e["args"]["bucket"].get<int>();
      EXPECT_EQ(name, fmt::format("all_reduce bucket {}", bucket));
      EXPECT_EQ(ranks[pid].all_reduce[step].count(bucket), 0u) << "bucket " << bucket << " twice in step " << step;
      ranks[pid].all_reduce[step][bucket] = span;
    } else {
      EXPECT_EQ(e["tid"], 0) << e;
      ranks[pid].phases[step][name].push_back(span);
    }
  }
  return ranks;
}

// Checks the trace of a 2-rank DDP run of `steps` steps whose last `traced`
// were recorded, against the buckets of its summary.
void check_ddp_trace(const fs::path& trace, const json& summary, int64_t steps, int64_t traced, bool overlap) {
  std::map<int, std::string> names;
  const auto ranks = read_trace(trace, &names);
  ASSERT_EQ(ranks.size(), 2u);
  EXPECT_EQ(names[0], "rank 0");
  EXPECT_EQ(names[1], "rank 1");
  const size_t buckets = summary["ddp"]["buckets"].size();
  ASSERT_GT(buckets, 1u);
  constexpr double kSlack = 2.0;  // us: timestamps are rounded by the JSON writer
  for (const auto& [pid, r] : ranks) {
    SCOPED_TRACE(fmt::format("rank {}", pid));
    ASSERT_EQ(r.phases.size(), static_cast<size_t>(traced));
    EXPECT_EQ(r.phases.begin()->first, steps - traced);
    for (const auto& [step, phases] : r.phases) {
      SCOPED_TRACE(fmt::format("step {}", step));
      for (const char* p : {"data", "forward", "backward", "comm wait", "optimizer"})
        ASSERT_EQ(phases.count(p) ? phases.at(p).size() : 0u, 1u) << p;
      // One thread: data, forward, backward, wait, optimizer in order.
      const Span d = phases.at("data")[0], f = phases.at("forward")[0], b = phases.at("backward")[0],
                 w = phases.at("comm wait")[0], o = phases.at("optimizer")[0];
      EXPECT_LE(d.end, f.start + kSlack);
      EXPECT_LE(f.end, b.start + kSlack);
      EXPECT_LE(b.end, w.start + kSlack);
      EXPECT_LE(w.end, o.start + kSlack);
      // Every bucket's all-reduce ran in this step, after forward, and was
      // over before the optimizer (which waits for them).
      ASSERT_EQ(r.all_reduce.at(step).size(), buckets);
      for (const auto& [bucket, a] : r.all_reduce.at(step)) {
        EXPECT_GE(a.start + kSlack, b.start) << "bucket " << bucket;
        EXPECT_LE(a.end, o.start + kSlack) << "bucket " << bucket;
        if (!overlap) {
          EXPECT_GE(a.start + kSlack, b.end) << "bucket " << bucket << " ran before backward ended";
        }
      }
    }
  }
  // The ranks' clocks line up: an all-reduce cannot end on one rank before
  // it has begun on the other.
  for (const auto& [step, mine] : ranks.at(0).all_reduce)
    for (const auto& [bucket, a] : mine) {
      const Span other = ranks.at(1).all_reduce.at(step).at(bucket);
      EXPECT_LE(a.start, other.end + kSlack) << "step " << step << " bucket " << bucket;
      EXPECT_LE(other.start, a.end + kSlack) << "step " << step << " bucket " << bucket;
    }
}

TEST_F(MultirankCliTest, TraceShowsEveryRanksStepsAndBuckets) {
  for (const bool overlap : {true, false}) {
    SCOPED_TRACE(overlap ? "overlap" : "--no-overlap");
    const fs::path trace = dir_ / "trace.json", summary = dir_ / "trace_summary.json";
    // 64 KiB buckets: the 200 KB of gradients make four.
    RunResult r = launch2(fmt::format("train --model mlp --synthetic --steps 7 --sizes {} --threads 1 --quiet "
                                      "--first-bucket-mb 0.0625 --bucket-mb 0.0625 --trace-out {} --trace-steps 3 "
                                      "--summary-out {}{}",
                                      kSizes, q(trace), q(summary), overlap ? "" : " --no-overlap"));
    ASSERT_EQ(r.code, 0) << r.all();
    check_ddp_trace(trace, json::parse(read_file(summary)), 7, 3, overlap);
  }
}

// Held-out windows split unevenly: 5 windows over 2 ranks of 2 sequences
// each are 3 + 2, so rank 0 needs two forward passes and rank 1 one. Under
// ZeRO-3 every forward gathers parameters with every rank, so rank 1 must
// run a second pass too (its result not counted); before it did, rank 0
// waited in that gather until the collective timeout. The loss is the one
// process's, over the same 5 windows.
TEST_F(MultirankCliTest, Zero3EvaluatesAnUnevenShareOfWindowsInStep) {
  const fs::path text = dir_ / "uneven.txt", one = dir_ / "uneven_one.json", two = dir_ / "uneven_two.json";
  {
    std::ofstream f(text);
    for (int i = 0; i < 400; ++i) f << "every rank runs as many passes as the others " << i << "\n";
  }
  const std::string gpt = fmt::format("train --model gpt --layers 1 --width 16 --heads 2 --context 16 --batch 4 "
                                      "--steps 2 --quiet --data {} --eval-windows 5",
                                      q(text));
  RunResult a = dpt(fmt::format("{} --summary-out {}", gpt, q(one)));
  ASSERT_EQ(a.code, 0) << a.all();
  RunResult b = launch2(fmt::format("{} --strategy zero3 --summary-out {}", gpt, q(two)), 30);
  ASSERT_EQ(b.code, 0) << b.all();
  const json s1 = json::parse(read_file(one)), s2 = json::parse(read_file(two));
  EXPECT_NEAR(s2["val_loss"].get<double>(), s1["val_loss"].get<double>(), 1e-5 * s1["val_loss"].get<double>());
}

TEST_F(MultirankCliTest, TraceOfOneProcessHasNoCommunication) {
  const fs::path trace = dir_ / "trace_local.json";
  RunResult r = dpt(fmt::format("train --model mlp --synthetic --steps 3 --sizes {} --quiet --trace-out {} "
                                "--trace-steps 5",
                                kSizes, q(trace)));
  ASSERT_EQ(r.code, 0) << r.all();
  std::map<int, std::string> names;
  const auto ranks = read_trace(trace, &names);
  ASSERT_EQ(ranks.size(), 1u);
  const RankSteps& r0 = ranks.at(0);
  EXPECT_EQ(r0.phases.size(), 3u);  // all three steps: fewer than --trace-steps
  EXPECT_TRUE(r0.all_reduce.empty());
  for (const auto& [step, phases] : r0.phases) {
    EXPECT_EQ(phases.count("comm wait"), 0u);
    EXPECT_EQ(phases.count("backward"), 1u);
  }
}

TEST_F(MultirankCliTest, TraceOfNaiveDpIsAUserError) {
  RunResult r = dpt(fmt::format("train --model mlp --synthetic --steps 2 --sizes {} --strategy dp --quiet "
                                "--trace-out {}",
                                kSizes, q(dir_ / "dp_trace.json")));
  EXPECT_EQ(r.code, 1) << r.all();
  EXPECT_TRUE(has(r.err, "--trace-out records training across ranks, not --strategy dp")) << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "dp_trace.json"));
}

TEST_F(MultirankCliTest, LocalStrategyUnderLauncherIsAnError) {
  RunResult r = launch2("train --model mlp --synthetic --steps 2 --sizes 784,64,10 --threads 1 --quiet "
                        "--strategy local");
  EXPECT_NE(r.code, 0) << r.all();
  EXPECT_LT(r.seconds, 55.0);
  EXPECT_TRUE(has(r.all(), "error: --strategy local")) << r.all();
  // The launcher's own output (issue 30): refused by dpt launch before any
  // rank starts (the local record's refusal), once, so no rank names it.
  EXPECT_TRUE(has(r.all(), "dpt: error: --strategy local trains one process, but 2 ranks were launched")) << r.all();
  EXPECT_FALSE(has(r.all(), "dpt[rank ")) << r.all();
}

TEST_F(MultirankCliTest, NaiveDpWithoutLauncher) {
  const fs::path f = dir_ / "dp.json";
  RunResult r = dpt(fmt::format("train --model mlp --synthetic --steps 3 --sizes {} --strategy dp --dp-replicas 2 "
                                "--quiet --summary-out {}",
                                kSizes, q(f)));
  ASSERT_EQ(r.code, 0) << r.all();
  EXPECT_EQ(r.out, "");
  const json j = json::parse(read_file(f));
  EXPECT_EQ(j["strategy"], "dp");
  EXPECT_EQ(j["replicas"], 2);
  EXPECT_EQ(j["world"], 1);
}

TEST_F(MultirankCliTest, DpUnderLauncherIsAnError) {
  RunResult r = launch2("train --model mlp --synthetic --steps 2 --sizes 784,64,10 --threads 1 --quiet "
                        "--strategy dp --dp-replicas 2");
  EXPECT_NE(r.code, 0) << r.all();
  EXPECT_TRUE(has(r.all(), "--strategy dp runs in one process")) << r.all();
}

// Only hsdp has shard groups; the flag elsewhere is refused before anything
// is built, whether the strategy is named or the launcher's default.
TEST_F(MultirankCliTest, ShardGroupOutsideHsdpIsRefused) {
  const std::string train = "train --model mlp --synthetic --steps 2 --sizes 784,64,10 --threads 1 --quiet ";
  RunResult r = launch2(train + "--shard-group 2");
  EXPECT_NE(r.code, 0) << r.all();
  EXPECT_TRUE(has(r.all(), "--shard-group is hsdp's; --strategy ddp has no shard groups")) << r.all();
  r = dpt(train + "--strategy dp --dp-replicas 2 --shard-group 1");
  EXPECT_NE(r.code, 0) << r.all();
  EXPECT_TRUE(has(r.all(), "--shard-group is hsdp's; --strategy dp has no shard groups")) << r.all();
}

// ---------------------------------------------------------------- failure

// Rank 1 is killed (SIGKILL, no chance to say goodbye) 6 s into a training
// run far too long to finish (thousands of steps a second; 6 s leaves MPI
// start-up far behind); rank 0 is in or between its gradient all-reduces and
// must notice: the job ends in seconds (at worst after rank 0's 20 s
// collective timeout), non-zero, with an error that names the collective.
// (Not more steps: training reserves its per-step timing vectors up front.)
TEST_F(MultirankCliTest, RankKilledMidTrainingEndsTheJob) {
  const std::string train = fmt::format("train --model mlp --synthetic --steps 1000000 --sizes {} --threads 1 "
                                        "--quiet --comm-timeout 20",
                                        kSizes);
  // The dpt path reaches the per-rank shell as $1, so no nested quoting.
  const std::string script = fmt::format(
      "if [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then exec timeout -s KILL 6 \"$1\" {0}; else exec \"$1\" {0}; fi",
      train);
  RunResult r = dpt(fmt::format("launch -n 2 -- sh -c '{}' sh {}", script, q(dpt_bin())), kOneThread, 90);
  const std::string out = r.all();
  // Non-zero: mpirun passes on the status of the first rank that failed
  // (137 for rank 1's SIGKILL, or rank 0's 1). A hang would show as the
  // 90 s `timeout` ending it.
  EXPECT_NE(r.code, 0) << out;
  EXPECT_LT(r.seconds, 60.0) << "a hang, ended by timeout:\n" << out;
  EXPECT_TRUE(has(out, "rank 1 has exited") || has(out, "timed out")) << out;
  EXPECT_TRUE(has(out, "dpt[rank 0]: error: world group: all_reduce #")) << out;
}

}  // namespace
}  // namespace dpt
