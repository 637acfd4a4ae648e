// Two hosts on one machine (scripts/two_hosts.sh: a network namespace and a
// host name each, joined by a veth pair), 2 ranks on each, started the way a
// cluster starts them: `dpt launch --hostfile` (mpirun), whose rsh launcher
// reaches the second host through the script instead of ssh.
//
//   - the ring runs over shared memory inside a host and MPI between them;
//   - DDP and HSDP equal one process, and HSDP's shard group is the host
//     (refused when mpirun places ranks round robin, which the ring
//     follows, or when hosts hold 3 ranks and 1, where DDP still trains);
//   - a rank killed on one host ends every rank within 10 s, and the output
//     names the dead rank;
//   - a cut link ends every rank within the collective timeout (5 s) + 5 s,
//     each with one sentence naming the collective, the group and the peer,
//     and `dpt launch` itself within the timeout + 10 s, though mpirun
//     cannot reach the cut-off host's daemon to end the job;
//   - --max-restarts then restarts without waiting on the lost host, and
//     stops once the restarts, failing at setup, are used up.
//
// Each test makes its own pair of hosts (named after its pid, so concurrent
// runs never meet) and removes it on every exit path; a run killed before
// that leaves hosts that the next `two_hosts.sh up` removes. Where
// namespaces cannot be made (not root, no CAP_SYS_ADMIN) every test skips
// with the reason. Registered by hand in tests/CMakeLists.txt (ctest
// names two_hosts.*).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../cli_run.h"
#include "../compare.h"
#include "io/safetensors.h"

namespace dpt {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using test::dpt_bin;
using test::q;
using test::RunResult;

std::string script() { return std::string(DPT_SOURCE_DIR) + "/scripts/two_hosts.sh"; }

// A small GPT under SGD on a text of its own (--synthetic batches differ by
// rank, so they cannot be compared with one process): the sums' order is
// all that differs between 4 ranks and one process, so weights agree to a
// few ulps.
constexpr const char* kModel =
    "--model gpt --layers 2 --heads 2 --width 32 --context 16 --optimizer sgd --lr 0.05 --seed 5";

// A process that has exited (a zombie waiting for its parent counts).
bool gone(pid_t pid) {
  if (::kill(pid, 0) != 0) return true;
  std::ifstream stat(fmt::format("/proc/{}/stat", pid));
  std::string text((std::istreambuf_iterator<char>(stat)), {});
  const size_t paren = text.rfind(')');
  return paren == std::string::npos || text.compare(paren + 1, 3, " Z ") == 0;
}

class TwoHosts : public ::testing::Test {
 protected:
  void SetUp() override {
    const RunResult check = test::run_shell(q(script()) + " check", fs::temp_directory_path());
    if (check.code == 77) GTEST_SKIP() << check.out;
    ASSERT_EQ(check.code, 0) << check.all();
    name_ = fmt::format("dpt2h-{}", ::getpid());
    dir_ = fs::temp_directory_path() / name_;
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    write_text(dir_ / "text.txt");
    const RunResult up = sh(fmt::format("env TWO_HOSTS_OWNER={} {} up {}", ::getpid(), q(script()), name_), 30);
    ASSERT_EQ(up.code, 0) << up.all();
  }
  void TearDown() override {
    if (!name_.empty()) {
      const RunResult down = sh(fmt::format("{} down {}", q(script()), name_), 30);
      EXPECT_EQ(down.code, 0) << down.all();
    }
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  // 3000 words drawn from eight by a fixed linear congruential generator.
  static void write_text(const fs::path& file) {
    const char* words[] = {"alpha", "beta", "gamma", "delta", "ring", "host", "rank", "shard"};
    std::ofstream out(file);
    uint32_t x = 1;
    for (int i = 0; i < 3000; ++i) {
      x = x * 1664525u + 1013904223u;
      out << words[x >> 29] << ' ';
    }
  }

  // The model, its data and the optimizer, for every run.
  std::string model() const { return fmt::format("{} --data {}", kModel, q(dir_ / "text.txt")); }

  RunResult sh(const std::string& cmd, int limit_s) { return test::run_shell(cmd, fs::temp_directory_path(), limit_s); }

  // The shell command that runs `dpt train <args>` on 4 ranks, 2 per host,
  // from host a. Each rank runs dir_/rank.sh, which records its pid in
  // dir_/pid.<rank> and, with own_stderr, sends its stderr to dir_/err.<rank>
  // (a rank on host b cannot forward its output once the link is cut).
  std::string job(const std::string& args, const std::string& env = "", bool own_stderr = false) const {
    return on_hosts(fmt::format("{} launch -n 4 --hostfile \"$({} hostfile {})\" -- sh {}", q(dpt_bin()),
                                q(script()), name_, q(rank_script(args, own_stderr))),
                    env);
  }

  // The same by plain mpirun placing ranks round robin (--map-by node):
  // ranks 0 and 2 on host a, 1 and 3 on host b.
  std::string round_robin_job(const std::string& args) const {
    return on_hosts(fmt::format("mpirun -n 4 --allow-run-as-root --hostfile \"$({} hostfile {})\" --map-by node "
                                "--bind-to none -x OMP_NUM_THREADS=1 sh {}",
                                q(script()), name_, q(rank_script(args, false))));
  }

  // `launch` started on host a, with the engine's settings from the
  // environment removed and `env` (NAME=value ...) added.
  std::string on_hosts(const std::string& launch, const std::string& env = "") const {
    return fmt::format("env -u DPT_COMM_ALGO -u DPT_COMM_TRANSPORT -u DPT_COMM_CHECK -u OMP_NUM_THREADS {} "
                       "{} run {} -- {}",
                       env, q(script()), name_, launch);
  }

  // Writes dir_/rank.sh, what every rank runs (see job), and returns its path.
  fs::path rank_script(const std::string& args, bool own_stderr) const {
    const fs::path file = dir_ / "rank.sh";
    std::ofstream(file) << fmt::format("echo $$ > {}/pid.$OMPI_COMM_WORLD_RANK\nexec {} train {}{}\n",
                                       q(dir_), q(dpt_bin()), args,
                                       own_stderr ? fmt::format(" 2> {}/err.$OMPI_COMM_WORLD_RANK", q(dir_)) : "");
    return file;
  }

  // Trains on one process with the same global batch and saves to `file`.
  void one_process(const std::string& args, const fs::path& file) {
    const RunResult r = sh(fmt::format("{} train {} --quiet --save {}", q(dpt_bin()), args, q(file)), 120);
    ASSERT_EQ(r.code, 0) << r.all();
  }

  // Every tensor of `got` within 1e-5 of `want` (relative to its largest value).
  static void expect_same_weights(const fs::path& got, const fs::path& want) {
    const SafetensorsFile g = load_safetensors(got.string()), w = load_safetensors(want.string());
    ASSERT_EQ(g.tensors.size(), w.tensors.size());
    for (const NamedTensor& t : w.tensors) {
      const NamedTensor* o = g.find(t.name);
      ASSERT_NE(o, nullptr) << t.name;
      ASSERT_EQ(o->data.size(), t.data.size()) << t.name;
      EXPECT_TRUE(test::all_close(o->data.data(), t.data.data(), t.data.size(), 0.0, 1e-5)) << t.name;
    }
  }

  // The ranks' pids, once all four have started (or empty after limit_s).
  std::vector<pid_t> rank_pids(double limit_s) const {
    const auto until = Clock::now() + std::chrono::duration<double>(limit_s);
    while (Clock::now() < until) {
      std::vector<pid_t> pids;
      for (int r = 0; r < 4; ++r) {
        std::ifstream in(dir_ / fmt::format("pid.{}", r));
        pid_t p = 0;
        if (in >> p) pids.push_back(p);
      }
      if (pids.size() == 4) return pids;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return {};
  }

  // Seconds until every pid has exited, or limit_s if some have not.
  static double seconds_until_gone(const std::vector<pid_t>& pids, double limit_s) {
    const auto t0 = Clock::now();
    for (;;) {
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      bool all = true;
      for (pid_t p : pids) all = all && gone(p);
      if (all || s >= limit_s) return s;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  // Starts cmd in the background (stdout and stderr to dir_/job.out).
  pid_t start(const std::string& cmd) const {
    const std::string line = fmt::format("{} > {} 2>&1", cmd, q(dir_ / "job.out"));
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::execl("/bin/sh", "sh", "-c", line.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    return pid;
  }

  // The job's exit status, once it has ended; if it has not within limit_s
  // (mpirun waiting for a daemon it cannot reach), after `down` ends it.
  int finish(pid_t job_pid, double limit_s) {
    const auto until = Clock::now() + std::chrono::duration<double>(limit_s);
    int status = 0;
    while (Clock::now() < until) {
      if (::waitpid(job_pid, &status, WNOHANG) == job_pid) return status;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    sh(fmt::format("{} down {}", q(script()), name_), 30);
    ::waitpid(job_pid, &status, 0);
    return status;
  }

  // Waits until the job's output shows a training step (the ranks are past
  // their setup and inside the step's collectives).
  bool wait_for_training(double limit_s) const {
    const auto until = Clock::now() + std::chrono::duration<double>(limit_s);
    while (Clock::now() < until) {
      if (test::read_file(dir_ / "job.out").find("step 2/") != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }

  std::string name_;  // set once the hosts may exist
  fs::path dir_;
};

TEST_F(TwoHosts, RingIsSharedMemoryInsideAHostAndMpiBetweenDdpEqualsOneProcess) {
  const std::string args = fmt::format("{} --batch 8 --steps 3", model());
  one_process(args, dir_ / "one.safetensors");
  const RunResult r = sh(job(fmt::format("{} --strategy ddp --save {} --summary-out {}", args,
                                         q(dir_ / "ddp.safetensors"), q(dir_ / "ddp.json"))),
                         120);
  ASSERT_EQ(r.code, 0) << r.all();
  const std::string a = name_ + "-a", b = name_ + "-b";
  EXPECT_NE(r.out.find(fmt::format("ranks on 2 hosts ({}: 2, {}: 2); ring links: 2 shared memory, 2 MPI", a, b)),
            std::string::npos)
      << r.out;
  const nlohmann::json summary = nlohmann::json::parse(test::read_file(dir_ / "ddp.json"));
  const nlohmann::json& topology = summary.at("topology");
  EXPECT_EQ(topology.at("hosts"), nlohmann::json({a, a, b, b}));
  // The ring: 0 -> 1 inside a, 1 -> 2 across, 2 -> 3 inside b, 3 -> 0 across.
  const nlohmann::json want = nlohmann::json::parse(R"([
    {"from": 0, "to": 1, "transport": "shm"}, {"from": 1, "to": 2, "transport": "mpi"},
    {"from": 2, "to": 3, "transport": "shm"}, {"from": 3, "to": 0, "transport": "mpi"}])");
  EXPECT_EQ(topology.at("ring"), want) << topology.dump();
  expect_same_weights(dir_ / "ddp.safetensors", dir_ / "one.safetensors");
}

TEST_F(TwoHosts, HsdpShardGroupIsTheHostAndEqualsOneProcess) {
  const std::string args = fmt::format("{} --batch 8 --steps 3", model());
  one_process(args, dir_ / "one.safetensors");
  // No --shard-group: the default is the ranks of one host.
  const RunResult r = sh(job(fmt::format("{} --strategy hsdp --save {} --summary-out {}", args,
                                         q(dir_ / "hsdp.safetensors"), q(dir_ / "hsdp.json"))),
                         120);
  ASSERT_EQ(r.code, 0) << r.all();
  EXPECT_NE(r.out.find("sharded over 2 ranks"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("all-reduced across the 2 shard groups"), std::string::npos) << r.out;
  const nlohmann::json summary = nlohmann::json::parse(test::read_file(dir_ / "hsdp.json"));
  EXPECT_EQ(summary.at("hsdp").at("shard_group"), 2) << summary.dump();
  EXPECT_EQ(summary.at("hsdp").at("replicas"), 2) << summary.dump();
  expect_same_weights(dir_ / "hsdp.safetensors", dir_ / "one.safetensors");
}

TEST_F(TwoHosts, RanksPlacedRoundRobinRingFollowsHostsHsdpDefaultRefused) {
  const std::string args = fmt::format("{} --batch 8 --steps 1", model());
  RunResult r = sh(round_robin_job(fmt::format("{} --strategy ddp --summary-out {}", args, q(dir_ / "ddp.json"))), 120);
  ASSERT_EQ(r.code, 0) << r.all();
  // The ring orders ranks by host: 0 -> 2 inside a, 2 -> 1 across, 1 -> 3
  // inside b, 3 -> 0 across.
  const nlohmann::json want = nlohmann::json::parse(R"([
    {"from": 0, "to": 2, "transport": "shm"}, {"from": 2, "to": 1, "transport": "mpi"},
    {"from": 1, "to": 3, "transport": "shm"}, {"from": 3, "to": 0, "transport": "mpi"}])");
  const nlohmann::json summary = nlohmann::json::parse(test::read_file(dir_ / "ddp.json"));
  EXPECT_EQ(summary.at("topology").at("ring"), want) << summary.at("topology").dump();
  // Shard groups are consecutive ranks: here {0, 1} would span both hosts.
  r = sh(round_robin_job(fmt::format("{} --strategy hsdp", args)), 120);
  EXPECT_NE(r.code, 0) << r.all();
  EXPECT_NE(r.all().find(fmt::format("error: hsdp's default shard group is the ranks of one host, but ranks 0-1 "
                                     "span hosts {}-a and {}-b",
                                     name_, name_)),
            std::string::npos)
      << r.all();
}

// 3 ranks on host a, 1 on b. The rank alone on its host maps no shared
// memory but must still join the group's setup (it once skipped it, and
// the other three waited for it forever).
TEST_F(TwoHosts, HostsOfDifferentSizesTrainDdpAndRefuseHsdpsDefault) {
  std::ofstream(dir_ / "uneven") << "10.213.0.1 slots=3\n10.213.0.2 slots=1\n";
  const auto uneven = [&](const std::string& args) {
    return on_hosts(fmt::format("{} launch -n 4 --hostfile {} -- sh {}", q(dpt_bin()), q(dir_ / "uneven"),
                                q(rank_script(fmt::format("{} --batch 8 --steps 3 {}", model(), args), false))));
  };
  one_process(fmt::format("{} --batch 8 --steps 3", model()), dir_ / "one.safetensors");
  RunResult r = sh(uneven(fmt::format("--strategy ddp --save {}", q(dir_ / "ddp.safetensors"))), 120);
  ASSERT_EQ(r.code, 0) << r.all();
  EXPECT_NE(r.out.find(fmt::format("ranks on 2 hosts ({0}-a: 3, {0}-b: 1); ring links: 2 shared memory, 2 MPI",
                                   name_)),
            std::string::npos)
      << r.out;
  expect_same_weights(dir_ / "ddp.safetensors", dir_ / "one.safetensors");
  r = sh(uneven("--strategy hsdp"), 120);
  EXPECT_NE(r.code, 0) << r.all();
  EXPECT_NE(r.all().find(fmt::format("error: hsdp's default shard group is the ranks of one host, but host {0}-a "
                                     "has 3 and host {0}-b has 1: give --shard-group",
                                     name_)),
            std::string::npos)
      << r.all();
}

TEST_F(TwoHosts, RankKilledOnOneHostEndsEveryRankWithin10s) {
  const pid_t job_pid = start(job(fmt::format("{} --batch 8 --steps 100000 --log-every 1", model()),
                                  "DPT_COMM_TIMEOUT=60"));
  const std::vector<pid_t> pids = rank_pids(60);
  ASSERT_EQ(pids.size(), 4u) << test::read_file(dir_ / "job.out");
  ASSERT_TRUE(wait_for_training(60)) << test::read_file(dir_ / "job.out");
  ASSERT_EQ(::kill(pids[3], SIGKILL), 0);  // rank 3, on host b
  const double s = seconds_until_gone(pids, 30);
  const int status = finish(job_pid, 20);
  const std::string out = test::read_file(dir_ / "job.out");
  EXPECT_LE(s, 10.0) << out;
  EXPECT_NE(status, 0) << out;
  // The engine's survivors ("rank 3 has exited") or mpirun ("process rank 3
  // ... exited on signal 9") say which rank died.
  EXPECT_TRUE(out.find("rank 3 has exited") != std::string::npos ||
              out.find("process rank 3 ") != std::string::npos)
      << out;
  std::printf("every rank ended %.2f s after rank 3 was killed\n", s);
}

TEST_F(TwoHosts, CutLinkEndsEveryRankWithinTheTimeoutPlus5s) {
  const pid_t job_pid = start(job(fmt::format("{} --batch 8 --steps 100000 --log-every 1", model()),
                                  "DPT_COMM_TIMEOUT=5", true));
  const std::vector<pid_t> pids = rank_pids(60);
  ASSERT_EQ(pids.size(), 4u) << test::read_file(dir_ / "job.out");
  ASSERT_TRUE(wait_for_training(60)) << test::read_file(dir_ / "job.out");
  const RunResult cut = sh(fmt::format("{} cut {}", q(script()), name_), 10);
  ASSERT_EQ(cut.code, 0) << cut.all();
  const auto cut_at = Clock::now();
  const double s = seconds_until_gone(pids, 30);
  EXPECT_LE(s, 10.0) << test::read_file(dir_ / "job.out");
  // Each rank: one sentence naming the group, the collective and the peer:
  // the one it waited on past the deadline, or a neighbour on its own host
  // that timed out first and exited. (Lines from MPI itself, if any, are
  // not the engine's and are not counted.)
  const std::regex sentence(
      R"(dpt\[rank (\d)\]: error: world group: [a-z_]+ #\d+ of \d+ bytes )"
      R"((timed out after 5\.0 s waiting for rank \d \(host [a-z0-9-]+\) \(dead, unreachable, or not issuing )"
      R"(the same collective\)|failed: rank \d has exited))");
  int timed_out = 0;
  for (int r = 0; r < 4; ++r) {
    const std::string err = test::read_file(dir_ / fmt::format("err.{}", r));
    std::istringstream lines(err);
    int sentences = 0;
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("dpt", 0) != 0) continue;
      std::smatch m;
      EXPECT_TRUE(std::regex_match(line, m, sentence)) << "rank " << r << ": " << line;
      EXPECT_EQ(m.size() > 1 ? m[1].str() : "", std::to_string(r)) << line;
      ++sentences;
      timed_out += line.find("timed out") != std::string::npos;
    }
    EXPECT_EQ(sentences, 1) << "rank " << r << ":\n" << err;
    std::printf("%s", err.c_str());
  }
  EXPECT_GE(timed_out, 1) << "no rank timed out: the cut was not what ended the job";
  // mpirun cannot reach host b's daemon any more; dpt launch ends it (and
  // what it started here) on its own, non-zero. `down` ends it only when
  // that fails.
  const auto since_cut = [&] { return std::chrono::duration<double>(Clock::now() - cut_at).count(); };
  const int status = finish(job_pid, std::max(0.0, 15.0 - since_cut()));
  const double returned = since_cut();
  const std::string out = test::read_file(dir_ / "job.out");
  EXPECT_LE(returned, 15.0) << "dpt launch did not return by itself:\n" << out;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << status << "\n" << out;
  std::printf("every rank ended %.2f s after the link was cut (timeout 5 s); dpt launch returned after %.2f s:\n%s",
              s, returned, out.c_str());
}

// The same cut under --max-restarts 2: the first job is ended as above,
// and each restart fails at once (mpirun cannot start its daemon on host
// b: host a's end of the link is down), so dpt launch stops after the
// second, without waiting on the lost host at any point.
TEST_F(TwoHosts, CutLinkUnderMaxRestartsStopsWithoutWaitingOnTheLostHost) {
  // The ranks take the launcher's --checkpoint-dir (and the --resume it
  // adds on a restart) as arguments of their script.
  const fs::path rank_sh = dir_ / "restartable.sh";
  std::ofstream(rank_sh) << fmt::format("echo $$ > {}/pid.$OMPI_COMM_WORLD_RANK\nexec {} train {} \"$@\"\n", q(dir_),
                                        q(dpt_bin()),
                                        fmt::format("{} --batch 8 --steps 100000 --log-every 1", model()));
  const pid_t job_pid = start(on_hosts(
      fmt::format("{} launch -n 4 --hostfile \"$({} hostfile {})\" --max-restarts 2 -- sh {} --checkpoint-dir {} "
                  "--checkpoint-every 5",
                  q(dpt_bin()), q(script()), name_, q(rank_sh), q(dir_ / "ck")),
      "DPT_COMM_TIMEOUT=5"));
  const std::vector<pid_t> pids = rank_pids(60);
  ASSERT_EQ(pids.size(), 4u) << test::read_file(dir_ / "job.out");
  ASSERT_TRUE(wait_for_training(60)) << test::read_file(dir_ / "job.out");
  ASSERT_EQ(sh(fmt::format("{} cut {}", q(script()), name_), 10).code, 0);
  const auto cut_at = Clock::now();
  const int status = finish(job_pid, 25.0);
  const double returned = std::chrono::duration<double>(Clock::now() - cut_at).count();
  const std::string out = test::read_file(dir_ / "job.out");
  // The timeout, the 5 s given to mpirun and the 2 s before SIGKILL, then
  // two restarts that fail within a second or two each.
  EXPECT_LE(returned, 20.0) << out;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << status << "\n" << out;
  EXPECT_NE(out.find("restart 1 of 2"), std::string::npos) << out;
  EXPECT_NE(out.find("restart 2 of 2"), std::string::npos) << out;
  EXPECT_NE(out.find("and has used its 2 restarts"), std::string::npos) << out;
  std::printf("dpt launch gave up %.2f s after the link was cut:\n%s", returned, out.c_str());
}

}  // namespace
}  // namespace dpt
