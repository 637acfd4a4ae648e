// Failure handling of the communication layer, end to end: runs
// tests/dist/dist_failure.cpp under mpirun with one rank misbehaving and
// checks that the job ends (no hang: the deadline is 3 s), non-zero, with an
// error that names the operation and its sequence number. Sequence numbers
// count collectives from 0 in issue order, so the third is "#2"; errors read
// "all_reduce #2 of 4000 bytes timed out ..." (src/comm/peer.cpp).
//
// Lives in tests/dist/ (not tests/test_*.cpp): registered by hand in
// tests/CMakeLists.txt.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <string>

#ifndef DIST_FAILURE_BIN
#error "DIST_FAILURE_BIN must name the dist_failure program"
#endif
#ifndef MPIRUN
#error "MPIRUN must name mpirun"
#endif

namespace {

struct JobResult {
  int status = -1;  // exit status, or 128 + signal
  double seconds = 0;
  std::string output;  // stdout and stderr together
};

// Runs `cmd` through the shell with stderr folded into stdout. `timeout`
// guards against a hang turning into a stuck test run.
JobResult run_job(const std::string& cmd) {
  JobResult r;
  const std::string full = "timeout -k 5 90 " + cmd + " 2>&1";
  const auto t0 = std::chrono::steady_clock::now();
  FILE* p = popen(full.c_str(), "r");
  if (!p) {
    r.output = "popen failed";
    return r;
  }
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  const int st = pclose(p);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (WIFEXITED(st)) r.status = WEXITSTATUS(st);
  else if (WIFSIGNALED(st)) r.status = 128 + WTERMSIG(st);
  return r;
}

// orte_allowed_exit_without_sync: by default Open MPI's mpirun kills the
// whole job as soon as one rank exits without MPI_Finalize (the dying rank of
// mode die), before the survivors can notice and report; with it, the job
// still ends (and mpirun exits non-zero) once a survivor exits non-zero.
std::string mpirun(int ranks, const std::string& env, const std::string& args) {
  return std::string(MPIRUN) + " --allow-run-as-root --oversubscribe --mca orte_allowed_exit_without_sync 1 -n " +
         std::to_string(ranks) + " " + env + " " + DIST_FAILURE_BIN + " " + args;
}

std::string algo_env(const std::string& algo) { return "-x DPT_COMM_ALGO=" + algo + " -x OMP_NUM_THREADS=1"; }

bool has(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

class Failure : public ::testing::TestWithParam<const char*> {};

TEST_P(Failure, RankDiesBeforeThirdCollective) {
  const JobResult r = run_job(mpirun(3, algo_env(GetParam()), "--mode die --timeout-ms 3000"));
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_LT(r.seconds, 30.0) << r.output;
  EXPECT_TRUE(has(r.output, ": all_reduce #2 of 4000 bytes")) << r.output;
}

TEST_P(Failure, RankSkipsThirdCollective) {
  const JobResult r = run_job(mpirun(3, algo_env(GetParam()), "--mode skip --timeout-ms 3000"));
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_LT(r.seconds, 30.0) << r.output;
  EXPECT_TRUE(has(r.output, ": all_reduce #2 of 4000 bytes")) << r.output;
}

TEST_P(Failure, RankNeverJoinsTheSetUp) {
  const JobResult r = run_job(mpirun(3, algo_env(GetParam()), "--mode late --timeout-ms 3000"));
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_LT(r.seconds, 15.0) << r.output;  // rank 1 sleeps 20 s: the deadline, not its exit, ends the job
  EXPECT_TRUE(has(r.output, "error: world group: the set-up's")) << r.output;
  EXPECT_TRUE(has(r.output, "did not finish within 3 s: a rank never joined")) << r.output;
}

TEST_P(Failure, RanksIssueDifferentCollectives) {
  const JobResult r = run_job(mpirun(3, algo_env(GetParam()), "--mode mismatch --timeout-ms 3000"));
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_LT(r.seconds, 30.0) << r.output;
  EXPECT_TRUE(has(r.output, "collective #2 differs across ranks")) << r.output;
  EXPECT_TRUE(has(r.output, "all_reduce of 1000 F32")) << r.output;
  EXPECT_TRUE(has(r.output, "all_gather of 1000 F32")) << r.output;
  EXPECT_FALSE(has(r.output, "no error")) << r.output;
}

TEST_P(Failure, NoneWhenNobodyMisbehaves) {
  const JobResult r = run_job(mpirun(3, algo_env(GetParam()), "--mode none --timeout-ms 3000"));
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_LT(r.seconds, 30.0) << r.output;
  for (int rank = 0; rank < 3; ++rank)
    EXPECT_TRUE(has(r.output, "rank " + std::to_string(rank) + ": no error")) << r.output;
}

INSTANTIATE_TEST_SUITE_P(Algo, Failure, ::testing::Values("ring", "mpi"),
                         [](const ::testing::TestParamInfo<const char*>& info) { return std::string(info.param); });

// The in-place all-reduce (data in a shared window) waits on its peers in
// its own loop: a dead or missing rank ends it just the same.
TEST(InPlaceFailure, RankDiesBeforeThirdCollective) {
  const JobResult r = run_job(mpirun(3, algo_env("ring"), "--mode die --timeout-ms 3000 --shared"));
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_LT(r.seconds, 30.0) << r.output;
  EXPECT_TRUE(has(r.output, ": all_reduce #2 of 4000 bytes failed: rank 1 has exited")) << r.output;
}

TEST(InPlaceFailure, RankSkipsThirdCollective) {
  const JobResult r = run_job(mpirun(3, algo_env("ring"), "--mode skip --timeout-ms 3000 --shared"));
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_LT(r.seconds, 30.0) << r.output;
  EXPECT_TRUE(has(r.output, ": all_reduce #2 of 4000 bytes timed out after 3.0 s waiting for rank 1")) << r.output;
}

TEST(InPlaceFailure, NoneWhenNobodyMisbehaves) {
  const JobResult r = run_job(mpirun(3, algo_env("ring"), "--mode none --timeout-ms 3000 --shared"));
  EXPECT_EQ(r.status, 0) << r.output;
  for (int rank = 0; rank < 3; ++rank)
    EXPECT_TRUE(has(r.output, "rank " + std::to_string(rank) + ": no error")) << r.output;
}

// Point to point on one host: rank 0's receive sleeps on the link's futex
// (comm/shm_transport.h) while rank 1 computes; when rank 1 dies instead of
// sending, the receiver's health check after each sleep (at most 10 ms)
// still finds it within its 100 ms cadence: the job ends in seconds, long
// before the 60 s deadline, naming the receive. And with nobody dying the
// five messages arrive with their values.
TEST(P2pFailure, AReceiverAsleepOnTheLinkSeesItsSenderDie) {
  const JobResult r = run_job(mpirun(2, algo_env("ring"), "--mode die --timeout-ms 60000 --p2p"));
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_LT(r.seconds, 30.0) << r.output;
  EXPECT_TRUE(has(r.output, "recv #2 of 4000 bytes failed: rank 1 has exited")) << r.output;
  const JobResult ok = run_job(mpirun(2, algo_env("ring"), "--mode none --timeout-ms 60000 --p2p"));
  EXPECT_EQ(ok.status, 0) << ok.output;
  EXPECT_TRUE(has(ok.output, "rank 0: no error")) << ok.output;
}

TEST(FailureConfig, UnknownAlgorithmIsAClearError) {
  const JobResult r = run_job(mpirun(1, "-x DPT_COMM_ALGO=foo", "--mode none --timeout-ms 3000"));
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_LT(r.seconds, 30.0) << r.output;
  EXPECT_TRUE(has(r.output, "'foo'")) << r.output;
}

}  // namespace
