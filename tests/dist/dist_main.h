// What every multi-rank GoogleTest program (run under mpirun) shares: every
// rank runs every test; ranks other than 0 print only their failures,
// prefixed with the rank; at the end the ranks agree (an all-reduce of a
// failure flag) so every rank exits non-zero if any rank failed.
#pragma once

#include <unistd.h>

#include <cstdio>

#include <gtest/gtest.h>

#include "comm/agree.h"
#include "comm/process_group.h"

namespace dpt::test {

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
                   r.line_number(), r.message());
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed())
      std::fprintf(stderr, "[rank %d] FAILED %s.%s\n", rank_, info.test_suite_name(), info.name());
  }

 private:
  int rank_;
};

// Runs all tests on this rank of `group` and returns the exit status every
// rank agrees on. `label` names the program and its settings in the last line.
inline int run_all_ranks(int argc, char** argv, comm::ProcessGroup& group, const std::string& label) {
  ::testing::InitGoogleTest(&argc, argv);
  if (group.rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(group.rank()));
  }
  comm::agree_on_bf16_dot_rate(group);  // one bf16 GEMM path on every rank, as dpt train takes
  const int rc = RUN_ALL_TESTS();
  float failed = rc != 0 ? 1.0f : 0.0f;
  try {
    group.all_reduce(&failed, 1, DType::F32, comm::ReduceOp::Max);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: rank %d: final agreement failed: %s\n", label.c_str(), group.rank(), e.what());
    std::fflush(nullptr);
    _exit(1);
  }
  if (group.rank() == 0) {
    std::printf("%s, %d ranks: %s\n", label.c_str(), group.size(),
                failed == 0.0f ? "all tests passed" : "FAILED on at least one rank");
    std::fflush(stdout);
  }
  return failed == 0.0f ? 0 : 1;
}

}  // namespace dpt::test
