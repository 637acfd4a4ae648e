// Multi-rank tests of the communication layer (src/comm/process_group.h).
//
// Run under a launcher, one process per rank:
//   DPT_COMM_ALGO=ring mpirun -n 3 dist_comm
// Every rank runs every test in the same order, so each test issues the same
// collectives on every rank whatever its checks find (EXPECT, never ASSERT,
// between collectives: an early return on one rank would desynchronise the
// group). Ranks other than 0 print only their failures; at the end the ranks
// agree (all_reduce Max of a failure flag) so every rank exits non-zero when
// any rank failed.
//
// Values are chosen so every expected result is exact in fp32: rank r holds
// (r + 1) * ((i % 5) + 1) at element i, so the sum over n ranks is
// n(n+1)/2 * ((i % 5) + 1) and the max n * ((i % 5) + 1).
#include <gtest/gtest.h>

#include "compare.h"
#include "dist_main.h"
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include "comm/agree.h"
#include "comm/process_group.h"
#include "core/dot_rate.h"

namespace {

using dpt::DType;
using dpt::InputError;
using dpt::comm::Algo;
using dpt::comm::chunk_range;
using dpt::comm::OpStats;
using dpt::comm::ProcessGroup;
using dpt::comm::Range;
using dpt::comm::ReduceOp;
using dpt::comm::Work;

ProcessGroup* g_pg = nullptr;
ProcessGroup& pg() { return *g_pg; }
int world() { return g_pg->size(); }
int me() { return g_pg->rank(); }
bool ring() { return g_pg->config().algo == Algo::Ring; }

constexpr size_t kBig = (size_t{1} << 20) + 3;
constexpr float kGuard = -777.25f;      // one element past `count`: must survive
constexpr uint16_t kGuard16 = 0xBEEF;

float contrib(int r, size_t i) { return static_cast<float>(r + 1) * static_cast<float>(i % 5 + 1); }
float sum_over_ranks(size_t i) {
  const int n = world();
  return static_cast<float>(n * (n + 1) / 2) * static_cast<float>(i % 5 + 1);
}
float max_over_ranks(size_t i) { return static_cast<float>(world()) * static_cast<float>(i % 5 + 1); }

// count elements of this rank's contribution, then one guard element.
std::vector<float> contribution(size_t count) {
  std::vector<float> v(count + 1, kGuard);
  for (size_t i = 0; i < count; ++i) v[i] = contrib(me(), i);
  return v;
}

// Checks got[i] against expected(i) for i in [begin, end): exact when
// rel_tol == 0; a non-finite value never matches. One failure message
// (count, first mismatch) however many elements differ.
template <class T, class F>
::testing::AssertionResult matches(const T* got, size_t begin, size_t end, F expected,
                                   double rel_tol = 0.0) {
  size_t bad = 0, first = 0;
  double first_got = 0, first_want = 0;
  for (size_t i = begin; i < end; ++i) {
    const double g = static_cast<double>(got[i]), w = static_cast<double>(expected(i));
    // Never a NaN or an infinity, on either side (tests/compare.h).
    const bool ok = rel_tol == 0.0 ? got[i] == static_cast<T>(expected(i)) && dpt::test::finite_pair(g, w)
                                   : dpt::test::near(g, w, rel_tol * std::fabs(w));
    if (!ok) {
      if (bad++ == 0) first = i, first_got = g, first_want = w;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "rank " << me() << ": " << bad << " of " << (end - begin)
                                       << " elements in [" << begin << ", " << end
                                       << ") differ; first at " << first << ": got " << first_got
                                       << ", expected " << first_want;
}

std::string count_name(const ::testing::TestParamInfo<size_t>& info) {
  return fmt::format("n{}", info.param);
}

// Ledger entry for one op in a difference (zero when absent).
OpStats entry(const std::map<std::string, OpStats>& d, const std::string& op) {
  auto it = d.find(op);
  return it == d.end() ? OpStats{} : it->second;
}

// Every rank's (bytes_sent, bytes_recv), gathered as raw bytes: each rank's
// chunk is two uint64 = four fp32-sized elements, which all_gather moves
// without looking at them. Issues one all_gather (outside any measured
// interval).
std::vector<uint64_t> gather_bytes(const OpStats& s) {
  const int n = world();
  std::vector<uint64_t> all(2 * static_cast<size_t>(n), 0);
  all[2 * static_cast<size_t>(me())] = s.bytes_sent;
  all[2 * static_cast<size_t>(me()) + 1] = s.bytes_recv;
  pg().all_gather(all.data(), 4 * static_cast<size_t>(n), DType::F32);
  return all;
}

// ---------------------------------------------------------------- the group

TEST(Group, RanksHostsTransports) {
  EXPECT_GE(world(), 1);
  EXPECT_GE(me(), 0);
  EXPECT_LT(me(), world());
  EXPECT_EQ(pg().hosts().size(), static_cast<size_t>(world()));
  EXPECT_EQ(pg().transport_to(me()), "self");
  const char* env = std::getenv("DPT_COMM_ALGO");
  if (env) {
    EXPECT_EQ(pg().config().algo, dpt::comm::parse_algo(env));
  }
  bool one_host = true;
  for (const auto& h : pg().hosts()) one_host = one_host && h == pg().hosts()[0];
  // One host (mpirun on this machine): ring peers go through shared memory
  // unless DPT_COMM_TRANSPORT=mpi says otherwise.
  const auto transport = pg().config().transport;
  if (ring() && one_host && transport != dpt::comm::Transport::Shm) {
    const char* want = transport == dpt::comm::Transport::Mpi ? "mpi" : "shm";
    for (int p = 0; p < world(); ++p) {
      if (p == me()) continue;
      EXPECT_EQ(pg().transport_to(p), want) << "peer " << p;
    }
  }
}

// Each rank times its own core for --bf16-gemm auto; a job takes rank 0's
// figure, so every rank widens its bf16 GEMMs or none does (here each rank
// is first given another figure, as cores timed apart would give).
TEST(Group, EveryRankTakesRankZerosBf16DotRate) {
  const double own = dpt::bf16_dot_over_fma();
  dpt::set_bf16_dot_over_fma(0.5 + me());
  dpt::comm::agree_on_bf16_dot_rate(pg());
  EXPECT_EQ(dpt::bf16_dot_over_fma(), 0.5);
  dpt::set_bf16_dot_over_fma(own);
}

// ------------------------------------------------- collectives over all sizes

class Collective : public ::testing::TestWithParam<size_t> {};

TEST_P(Collective, AllReduceSum) {
  const size_t count = GetParam();
  auto v = contribution(count);
  pg().all_reduce(v.data(), count, DType::F32, ReduceOp::Sum);
  EXPECT_TRUE(matches(v.data(), 0, count, sum_over_ranks));
  EXPECT_EQ(v[count], kGuard) << "wrote past count";
}

TEST_P(Collective, AllReduceAvg) {
  const size_t count = GetParam();
  auto v = contribution(count);
  pg().all_reduce(v.data(), count, DType::F32, ReduceOp::Avg);
  auto avg = [](size_t i) { return static_cast<double>(sum_over_ranks(i)) / world(); };
  EXPECT_TRUE(matches(v.data(), 0, count, avg, 1e-6));
  EXPECT_EQ(v[count], kGuard) << "wrote past count";
}

TEST_P(Collective, AllReduceMax) {
  const size_t count = GetParam();
  auto v = contribution(count);
  pg().all_reduce(v.data(), count, DType::F32, ReduceOp::Max);
  EXPECT_TRUE(matches(v.data(), 0, count, max_over_ranks));
  EXPECT_EQ(v[count], kGuard) << "wrote past count";
}

TEST_P(Collective, ReduceScatterSum) {
  const size_t count = GetParam();
  auto v = contribution(count);
  pg().reduce_scatter(v.data(), count, DType::F32, ReduceOp::Sum);
  const Range c = chunk_range(count, world(), me());
  EXPECT_TRUE(matches(v.data(), c.begin, c.begin + c.size, sum_over_ranks));
  EXPECT_EQ(v[count], kGuard) << "wrote past count";
}

// bf16 sums (--reduce-dtype bf16): the contributions are small integers,
// exact in bf16, and so are their sums: the result must be exact.
std::vector<dpt::bf16> contribution_bf16(size_t count) {
  const auto f = contribution(count);
  std::vector<dpt::bf16> v(count + 1);
  for (size_t i = 0; i <= count; ++i) v[i] = dpt::to_bf16(f[i]);
  return v;
}

std::vector<float> widened(const std::vector<dpt::bf16>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = dpt::to_f32(v[i]);
  return f;
}

TEST_P(Collective, AllReduceSumBF16) {
  const size_t count = GetParam();
  auto v = contribution_bf16(count);
  pg().all_reduce(v.data(), count, DType::BF16, ReduceOp::Sum);
  const auto f = widened(v);
  EXPECT_TRUE(matches(f.data(), 0, count, sum_over_ranks));
  EXPECT_EQ(f[count], dpt::to_f32(dpt::to_bf16(kGuard))) << "wrote past count";
}

TEST_P(Collective, ReduceScatterSumBF16) {
  const size_t count = GetParam();
  auto v = contribution_bf16(count);
  pg().reduce_scatter(v.data(), count, DType::BF16, ReduceOp::Sum);
  const auto f = widened(v);
  const Range c = chunk_range(count, world(), me());
  EXPECT_TRUE(matches(f.data(), c.begin, c.begin + c.size, sum_over_ranks));
  EXPECT_EQ(f[count], dpt::to_f32(dpt::to_bf16(kGuard))) << "wrote past count";
}

TEST_P(Collective, AllGatherF32) {
  const size_t count = GetParam();
  const int n = world();
  std::vector<float> v(count + 1, -1.0f);
  v[count] = kGuard;
  std::vector<int> owner(count);
  for (int r = 0; r < n; ++r) {
    const Range c = chunk_range(count, n, r);
    for (size_t i = c.begin; i < c.begin + c.size; ++i) owner[i] = r;
  }
  auto want = [&](size_t i) { return static_cast<float>(owner[i]) * 1e4f + static_cast<float>(i % 97); };
  const Range mine = chunk_range(count, n, me());
  for (size_t i = mine.begin; i < mine.begin + mine.size; ++i) v[i] = want(i);
  pg().all_gather(v.data(), count, DType::F32);
  EXPECT_TRUE(matches(v.data(), 0, count, want));
  EXPECT_EQ(v[count], kGuard) << "wrote past count";
}

// bf16-sized elements: all_gather moves bytes, so arbitrary bit patterns
// (NaNs and denormals included) arrive unchanged.
uint16_t pattern16(int r, size_t i) {
  return static_cast<uint16_t>((static_cast<uint32_t>(r) * 40503u + static_cast<uint32_t>(i) * 2654435761u) >> 7);
}

TEST_P(Collective, AllGatherBF16) {
  const size_t count = GetParam();
  const int n = world();
  std::vector<uint16_t> v(count + 1, 0);
  v[count] = kGuard16;
  std::vector<int> owner(count);
  for (int r = 0; r < n; ++r) {
    const Range c = chunk_range(count, n, r);
    for (size_t i = c.begin; i < c.begin + c.size; ++i) owner[i] = r;
  }
  const Range mine = chunk_range(count, n, me());
  for (size_t i = mine.begin; i < mine.begin + mine.size; ++i) v[i] = pattern16(me(), i);
  pg().all_gather(v.data(), count, DType::BF16);
  EXPECT_TRUE(matches(v.data(), 0, count, [&](size_t i) { return pattern16(owner[i], i); }));
  EXPECT_EQ(v[count], kGuard16) << "wrote past count";
}

INSTANTIATE_TEST_SUITE_P(Counts, Collective,
                         ::testing::Values(size_t{0}, size_t{1}, size_t{2}, size_t{7}, size_t{1000}, kBig),
                         count_name);

// ---------------------------------------- rooted and point-to-point, small

class Rooted : public ::testing::TestWithParam<size_t> {};

TEST_P(Rooted, BroadcastFromEveryRoot) {
  const size_t count = GetParam();
  for (int root = 0; root < world(); ++root) {
    auto want = [root](size_t i) { return static_cast<float>(root) * 1000.0f + static_cast<float>(i % 101) + 0.5f; };
    std::vector<float> v(count + 1, -1.0f);
    v[count] = kGuard;
    if (me() == root)
      for (size_t i = 0; i < count; ++i) v[i] = want(i);
    pg().broadcast(v.data(), count, DType::F32, root);
    EXPECT_TRUE(matches(v.data(), 0, count, want)) << "root " << root;
    EXPECT_EQ(v[count], kGuard) << "root " << root << ": wrote past count";
  }
}

TEST_P(Rooted, BroadcastBF16FromEveryRoot) {
  const size_t count = GetParam();
  for (int root = 0; root < world(); ++root) {
    std::vector<uint16_t> v(count + 1, 0);
    v[count] = kGuard16;
    if (me() == root)
      for (size_t i = 0; i < count; ++i) v[i] = pattern16(root + 17, i);
    pg().broadcast(v.data(), count, DType::BF16, root);
    EXPECT_TRUE(matches(v.data(), 0, count, [root](size_t i) { return pattern16(root + 17, i); }))
        << "root " << root;
    EXPECT_EQ(v[count], kGuard16) << "root " << root << ": wrote past count";
  }
}

TEST_P(Rooted, ReduceSumToEveryRoot) {
  const size_t count = GetParam();
  for (int root = 0; root < world(); ++root) {
    auto v = contribution(count);
    pg().reduce(v.data(), count, DType::F32, ReduceOp::Sum, root);
    if (me() == root) {
      EXPECT_TRUE(matches(v.data(), 0, count, sum_over_ranks)) << "root " << root;
    }
    EXPECT_EQ(v[count], kGuard) << "root " << root << ": wrote past count";
  }
}

TEST_P(Rooted, ReduceMaxToEveryRoot) {
  const size_t count = GetParam();
  for (int root = 0; root < world(); ++root) {
    auto v = contribution(count);
    pg().reduce(v.data(), count, DType::F32, ReduceOp::Max, root);
    if (me() == root) {
      EXPECT_TRUE(matches(v.data(), 0, count, max_over_ranks)) << "root " << root;
    }
    EXPECT_EQ(v[count], kGuard) << "root " << root << ": wrote past count";
  }
}

// Ring exchange: rank r sends to r+1 (async) and receives from r-1.
// Rank r sends to r+1 (async) and receives from r-1; the ledger has one
// send of B bytes sent and one recv of B bytes received.
void send_recv_ring(size_t count) {
  const int n = world();
  const int to = (me() + 1) % n, from = (me() + n - 1) % n;
  auto value = [](int r, size_t i) { return static_cast<float>(r) * 1e5f + static_cast<float>(i % 1013); };
  std::vector<float> out(count), in(count + 1, -1.0f);
  for (size_t i = 0; i < count; ++i) out[i] = value(me(), i);
  in[count] = kGuard;
  const auto before = pg().ledger().snapshot();
  auto send = pg().send_async(out.data(), count, DType::F32, to);
  pg().recv(in.data(), count, DType::F32, from);
  send->wait();
  const auto d = dpt::comm::difference(pg().ledger().snapshot(), before);
  EXPECT_TRUE(send->is_completed());
  EXPECT_TRUE(matches(in.data(), 0, count, [&](size_t i) { return value(from, i); }));
  EXPECT_EQ(in[count], kGuard) << "wrote past count";
  EXPECT_EQ(entry(d, "send").count, 1);
  EXPECT_EQ(entry(d, "recv").count, 1);
  EXPECT_EQ(entry(d, "send").bytes_sent, count * 4);
  EXPECT_EQ(entry(d, "recv").bytes_recv, count * 4);
}

TEST_P(Rooted, SendRecvRing) {
  if (world() < 2) GTEST_SKIP() << "needs two ranks";
  send_recv_ring(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Counts, Rooted,
                         ::testing::Values(size_t{0}, size_t{1}, size_t{2}, size_t{7}, size_t{1000}),
                         count_name);

// Messages of several pipeline pieces (1 MiB) and shared-memory slots, with a
// short last piece: one root each, to keep the run short.
TEST(Big, BroadcastPipelined) {
  const size_t count = kBig;
  const int root = 1 % world();
  auto want = [](size_t i) { return static_cast<float>(i % 8191) * 0.25f; };
  std::vector<float> v(count + 1, -1.0f);
  v[count] = kGuard;
  if (me() == root)
    for (size_t i = 0; i < count; ++i) v[i] = want(i);
  pg().broadcast(v.data(), count, DType::F32, root);
  EXPECT_TRUE(matches(v.data(), 0, count, want));
  EXPECT_EQ(v[count], kGuard) << "wrote past count";
}

TEST(Big, BroadcastBF16OddBytes) {
  const size_t count = (size_t{1} << 19) + 1;  // 1 MiB + 2 bytes
  const int root = world() - 1;
  std::vector<uint16_t> v(count + 1, 0);
  v[count] = kGuard16;
  if (me() == root)
    for (size_t i = 0; i < count; ++i) v[i] = pattern16(5, i);
  pg().broadcast(v.data(), count, DType::BF16, root);
  EXPECT_TRUE(matches(v.data(), 0, count, [](size_t i) { return pattern16(5, i); }));
  EXPECT_EQ(v[count], kGuard16) << "wrote past count";
}

TEST(Big, ReduceSumPipelined) {
  const size_t count = kBig;
  const int root = world() / 2;
  auto v = contribution(count);
  pg().reduce(v.data(), count, DType::F32, ReduceOp::Sum, root);
  if (me() == root) {
    EXPECT_TRUE(matches(v.data(), 0, count, sum_over_ranks));
  }
  EXPECT_EQ(v[count], kGuard) << "wrote past count";
}

// A message larger than the transport's buffering (shared memory: 8 slots of
// 64 KiB) completes only once the receiver's communication thread reaches the
// matching recv: the comm thread runs sends and receives one at a time, in
// issue order, so the ring exchange above is only safe for small messages.
// Large ones go in matched order: rank 0 sends to rank 1, then rank 1 back.
TEST(Big, SendRecvPair) {
  if (world() < 2) GTEST_SKIP() << "needs two ranks";
  const size_t count = kBig;
  auto value = [](int r, size_t i) { return static_cast<float>(r) * 1e5f + static_cast<float>(i % 1013); };
  std::vector<float> out(count), in(count + 1, -1.0f);
  in[count] = kGuard;
  if (me() <= 1) {
    const int peer = 1 - me();
    for (size_t i = 0; i < count; ++i) out[i] = value(me(), i);
    const auto before = pg().ledger().snapshot();
    if (me() == 0) {
      pg().send(out.data(), count, DType::F32, peer);
      pg().recv(in.data(), count, DType::F32, peer);
    } else {
      pg().recv(in.data(), count, DType::F32, peer);
      pg().send(out.data(), count, DType::F32, peer);
    }
    const auto d = dpt::comm::difference(pg().ledger().snapshot(), before);
    EXPECT_TRUE(matches(in.data(), 0, count, [&](size_t i) { return value(peer, i); }));
    EXPECT_EQ(in[count], kGuard) << "wrote past count";
    EXPECT_EQ(entry(d, "send").bytes_sent, count * 4);
    EXPECT_EQ(entry(d, "recv").bytes_recv, count * 4);
  }
}

// ------------------------------------------------------ ordering and Work

TEST(Async, FiveAllReducesWaitedInReverse) {
  constexpr int kOps = 5;
  std::vector<std::vector<float>> bufs(kOps);
  std::vector<std::shared_ptr<Work>> works;
  for (int k = 0; k < kOps; ++k) {
    const size_t count = 1000 + 37 * static_cast<size_t>(k);
    bufs[k].assign(count + 1, kGuard);
    for (size_t i = 0; i < count; ++i) bufs[k][i] = contrib(me(), i) * static_cast<float>(k + 1);
    works.push_back(pg().all_reduce_async(bufs[k].data(), count, DType::F32, ReduceOp::Sum));
  }
  // The communication thread runs them in issue order: once the last is
  // done, every earlier one is too.
  works[kOps - 1]->wait();
  for (int k = 0; k < kOps - 1; ++k) EXPECT_TRUE(works[k]->is_completed()) << "op " << k;
  for (int k = kOps - 1; k >= 0; --k) {
    works[k]->wait();
    const size_t count = bufs[k].size() - 1;
    EXPECT_TRUE(matches(bufs[k].data(), 0, count,
                        [k](size_t i) { return sum_over_ranks(i) * static_cast<float>(k + 1); }))
        << "op " << k;
    EXPECT_EQ(bufs[k][count], kGuard) << "op " << k << ": wrote past count";
  }
}

TEST(Async, WorkCompletesWithoutError) {
  auto v = contribution(64);
  auto w = pg().all_reduce_async(v.data(), 64, DType::F32, ReduceOp::Sum);
  w->wait();
  EXPECT_TRUE(w->is_completed());
  EXPECT_EQ(w->error(), nullptr);
  EXPECT_NO_THROW(w->wait());  // a second wait returns at once
  EXPECT_TRUE(matches(v.data(), 0, 64, sum_over_ranks));

  auto b = pg().barrier_async();
  b->wait();
  EXPECT_TRUE(b->is_completed());
  EXPECT_EQ(b->error(), nullptr);
}

// Rank 0 enters the barrier 300 ms late: nobody leaves it before rank 0
// arrives.
TEST(Async, BarrierWaitsForTheLastRank) {
  pg().barrier();
  const auto t0 = std::chrono::steady_clock::now();
  if (me() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  pg().barrier();
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (world() > 1) {
    EXPECT_GE(ms, 100.0) << "left the barrier before rank 0 entered it";
  }
}

// ----------------------------------------------------------------- ledger

// Ledger cases: which count to use, given the number of ranks.
struct LedgerCase {
  const char* name;
  size_t (*count)(int n);
};
const LedgerCase kLedgerCases[] = {
    {"zero", [](int) { return size_t{0}; }},
    {"one", [](int) { return size_t{1}; }},
    {"seven", [](int) { return size_t{7}; }},
    {"thousand_per_rank", [](int n) { return 1000 * static_cast<size_t>(n); }},
    {"mib_divisible", [](int n) { return ((size_t{1} << 20) / static_cast<size_t>(n)) * static_cast<size_t>(n); }},
    {"mib_plus_3", [](int) { return kBig; }},
};

class LedgerTest : public ::testing::TestWithParam<LedgerCase> {
 protected:
  // Runs `op` and returns the ledger difference for `name` on this rank.
  template <class F>
  OpStats measure(const std::string& name, F op) {
    const auto before = pg().ledger().snapshot();
    op();
    const auto after = pg().ledger().snapshot();
    return entry(dpt::comm::difference(after, before), name);
  }
  // Checks one op's byte counts: `per_rank` (when the count divides) and
  // `total` (over ranks, always); Mpi: the count only.
  void check(const char* op, size_t count, const OpStats& s, uint64_t per_rank, uint64_t total) {
    EXPECT_EQ(s.count, 1) << op;
    EXPECT_GE(s.seconds, 0.0) << op;
    const auto all = gather_bytes(s);  // every rank joins, whatever the algo
    if (!ring()) return;
    const int n = world();
    if (count % static_cast<size_t>(n) == 0) {
      EXPECT_EQ(s.bytes_sent, per_rank) << op << " count " << count;
      EXPECT_EQ(s.bytes_recv, per_rank) << op << " count " << count;
    }
    uint64_t sent = 0, recv = 0;
    for (int r = 0; r < n; ++r) sent += all[2 * static_cast<size_t>(r)], recv += all[2 * static_cast<size_t>(r) + 1];
    EXPECT_EQ(sent, total) << op << " count " << count << ": bytes sent over all ranks";
    EXPECT_EQ(recv, total) << op << " count " << count << ": bytes received over all ranks";
  }
};

TEST_P(LedgerTest, AllReduce) {
  const int n = world();
  const size_t count = GetParam().count(n);
  const uint64_t B = count * 4, nn = static_cast<uint64_t>(n);
  auto v = contribution(count);
  auto s = measure("all_reduce", [&] { pg().all_reduce(v.data(), count, DType::F32, ReduceOp::Sum); });
  check("all_reduce", count, s, 2 * B * (nn - 1) / nn, 2 * (nn - 1) * B);
}

TEST_P(LedgerTest, ReduceScatter) {
  const int n = world();
  const size_t count = GetParam().count(n);
  const uint64_t B = count * 4, nn = static_cast<uint64_t>(n);
  auto v = contribution(count);
  auto s = measure("reduce_scatter", [&] { pg().reduce_scatter(v.data(), count, DType::F32, ReduceOp::Sum); });
  check("reduce_scatter", count, s, B * (nn - 1) / nn, (nn - 1) * B);
}

TEST_P(LedgerTest, AllGather) {
  const int n = world();
  const size_t count = GetParam().count(n);
  const uint64_t B = count * 4, nn = static_cast<uint64_t>(n);
  auto v = contribution(count);
  auto s = measure("all_gather", [&] { pg().all_gather(v.data(), count, DType::F32); });
  check("all_gather", count, s, B * (nn - 1) / nn, (nn - 1) * B);
}

// A pipelined chain: every rank but the last forwards the B bytes; the split
// between ranks is the implementation's, the total is not.
TEST_P(LedgerTest, Broadcast) {
  const int n = world();
  const size_t count = GetParam().count(n);
  const uint64_t B = count * 4, nn = static_cast<uint64_t>(n);
  auto v = contribution(count);
  const int root = n - 1;
  auto s = measure("broadcast", [&] { pg().broadcast(v.data(), count, DType::F32, root); });
  EXPECT_EQ(s.count, 1);
  const auto all = gather_bytes(s);
  if (!ring()) return;
  uint64_t sent = 0, recv = 0;
  for (int r = 0; r < n; ++r) sent += all[2 * static_cast<size_t>(r)], recv += all[2 * static_cast<size_t>(r) + 1];
  EXPECT_EQ(sent, (nn - 1) * B) << "bytes sent over all ranks";
  EXPECT_EQ(recv, (nn - 1) * B) << "bytes received over all ranks";
  EXPECT_EQ(all[2 * static_cast<size_t>(root) + 1], 0u) << "the root receives nothing";
}

INSTANTIATE_TEST_SUITE_P(Counts, LedgerTest, ::testing::ValuesIn(kLedgerCases),
                         [](const ::testing::TestParamInfo<LedgerCase>& info) { return std::string(info.param.name); });

TEST(Ledger, CountsOtherOps) {
  std::vector<float> v(100, 1.0f);
  auto count_of = [](const char* op, auto fn) {
    const auto before = pg().ledger().snapshot();
    fn();
    return entry(dpt::comm::difference(pg().ledger().snapshot(), before), op).count;
  };
  EXPECT_EQ(count_of("reduce", [&] { pg().reduce(v.data(), 100, DType::F32, ReduceOp::Sum, 0); }), 1);
  EXPECT_EQ(count_of("barrier", [&] { pg().barrier(); }), 1);
}

// ---------------------------------------------------------- bad arguments

// Each is rejected with InputError, by the *_async call or by wait(), and
// leaves the group usable.
TEST(BadArguments, RootsAndPeersOutOfRange) {
  const int n = world();
  std::vector<float> v(8, 1.0f);
  EXPECT_THROW(pg().broadcast(v.data(), 8, DType::F32, n), InputError);
  EXPECT_THROW(pg().broadcast(v.data(), 8, DType::F32, -1), InputError);
  EXPECT_THROW(pg().reduce(v.data(), 8, DType::F32, ReduceOp::Sum, n), InputError);
  EXPECT_THROW(pg().reduce(v.data(), 8, DType::F32, ReduceOp::Sum, -1), InputError);
  EXPECT_THROW(pg().send(v.data(), 8, DType::F32, n), InputError);
  EXPECT_THROW(pg().send(v.data(), 8, DType::F32, -1), InputError);
  EXPECT_THROW(pg().recv(v.data(), 8, DType::F32, n), InputError);
  EXPECT_THROW(pg().recv(v.data(), 8, DType::F32, -1), InputError);
  EXPECT_THROW(pg().send(v.data(), 8, DType::F32, me()), InputError);

  auto ok = contribution(8);
  EXPECT_NO_THROW(pg().all_reduce(ok.data(), 8, DType::F32, ReduceOp::Sum));
  EXPECT_TRUE(matches(ok.data(), 0, 8, sum_over_ranks));
}

// bf16 reductions sum only (process_group.h).
TEST(BadArguments, ReductionOfBF16) {
  std::vector<uint16_t> v(8, 0);
  EXPECT_THROW(pg().all_reduce(v.data(), 8, DType::BF16, ReduceOp::Avg), InputError);
  EXPECT_THROW(pg().reduce_scatter(v.data(), 8, DType::BF16, ReduceOp::Max), InputError);
  auto ok = contribution(8);
  EXPECT_NO_THROW(pg().all_reduce(ok.data(), 8, DType::F32, ReduceOp::Max));
  EXPECT_TRUE(matches(ok.data(), 0, 8, max_over_ranks));
}

// ------------------------------------------------ shared windows, in place

// A window exists exactly where the in-place all-reduce can work: a ring
// group of several ranks on one host linked by shared memory (and no
// DPT_COMM_IN_PLACE=0).
bool window_expected() {
  if (world() < 2 || !ring() || !pg().config().in_place) return false;
  for (int p = 0; p < world(); ++p)
    if (p != me() && pg().transport_to(p) != "shm") return false;
  return true;
}

TEST(InPlace, WindowOnlyWhereItCanWork) {
  auto w = pg().shared_memory(4096);
  EXPECT_EQ(w != nullptr, window_expected());
  if (w) {
    // Zero-filled, and ours to write.
    const float* f = static_cast<const float*>(w.get());
    EXPECT_TRUE(std::all_of(f, f + 1024, [](float x) { return x == 0.0f; }));
  }
}

// Values whose sums round differently in different orders (for n > 2), so
// "bitwise the ring's result" says the in-place sum adds in the ring's order.
float inexact(int r, size_t i) { return std::sin(0.37f * static_cast<float>(i) + 1.3f * static_cast<float>(r)) * 1e3f; }

struct InPlaceCase {
  const char* name;
  size_t count, offset;  // elements, and where in the window they start
};
const InPlaceCase kInPlaceCases[] = {
    {"one", 1, 0}, {"seven_at_3", 7, 3}, {"thousand_at_17", 1000, 17}, {"mib_plus_3_at_5", kBig, 5}};

class InPlaceTest : public ::testing::TestWithParam<InPlaceCase> {
 protected:
  // The same reduction on a private buffer (the ring) and in a window (in
  // place, between guard elements): bitwise equal results, the same ledger
  // bytes on every rank. T is float or bf16.
  template <class T>
  void compare(DType dtype, ReduceOp op, const char* name = "all_reduce") {
    const auto [label, count, offset] = GetParam();
    const std::string what = name;
    const size_t es = sizeof(T);
    auto window = pg().shared_memory((offset + count + 1) * es);
    if (!window) GTEST_SKIP() << "no shared window in this group (every rank skips alike)";
    T* in_window = static_cast<T*>(window.get());
    std::vector<T> ring_result(count);
    const Range mine = chunk_range(count, world(), me());
    for (size_t i = 0; i < count; ++i) {
      float x = dtype == DType::BF16 ? std::round(inexact(me(), i)) : inexact(me(), i);
      // An all-gather starts from each rank's own chunk only.
      if (what == "all_gather" && (i < mine.begin || i >= mine.begin + mine.size)) x = -1.0f;
      if constexpr (std::is_same_v<T, float>) {
        ring_result[i] = in_window[offset + i] = x;
      } else {
        ring_result[i] = in_window[offset + i] = dpt::to_bf16(x);
      }
    }
    const T guard = in_window[offset + count];  // zero: the window starts zeroed
    for (size_t i = 0; i < offset; ++i) in_window[i] = guard;
    auto issue = [&](T* data) {
      if (what == "all_reduce") pg().all_reduce(data, count, dtype, op);
      if (what == "reduce_scatter") pg().reduce_scatter(data, count, dtype, op);
      if (what == "all_gather") pg().all_gather(data, count, dtype);
    };
    const auto before = pg().ledger().snapshot();
    issue(ring_result.data());
    const auto middle = pg().ledger().snapshot();
    issue(in_window + offset);
    const auto after = pg().ledger().snapshot();
    // A reduce-scatter's result is this rank's chunk (the rest is scratch).
    const size_t from = what == "reduce_scatter" ? mine.begin : 0;
    const size_t to = what == "reduce_scatter" ? mine.begin + mine.size : count;
    EXPECT_EQ(std::memcmp(ring_result.data() + from, in_window + offset + from, (to - from) * es), 0)
        << "rank " << me() << ": the in-place " << what << " differs from the ring's";
    for (size_t i = 0; i < offset; ++i) EXPECT_EQ(std::memcmp(&in_window[i], &guard, es), 0) << "wrote before";
    EXPECT_EQ(std::memcmp(&in_window[offset + count], &guard, es), 0) << "wrote past count";
    const OpStats by_ring = entry(dpt::comm::difference(middle, before), what);
    const OpStats in_place = entry(dpt::comm::difference(after, middle), what);
    EXPECT_EQ(in_place.count, 1);
    EXPECT_EQ(in_place.bytes_sent, by_ring.bytes_sent) << what;
    EXPECT_EQ(in_place.bytes_recv, by_ring.bytes_recv) << what;
  }
};

TEST_P(InPlaceTest, ReduceScatterSumIsTheRingsBitwise) { compare<float>(DType::F32, ReduceOp::Sum, "reduce_scatter"); }
TEST_P(InPlaceTest, ReduceScatterAvgIsTheRingsBitwise) { compare<float>(DType::F32, ReduceOp::Avg, "reduce_scatter"); }
TEST_P(InPlaceTest, ReduceScatterBF16IsTheRingsBitwise) {
  compare<dpt::bf16>(DType::BF16, ReduceOp::Sum, "reduce_scatter");
}
TEST_P(InPlaceTest, AllGatherIsTheRings) { compare<float>(DType::F32, ReduceOp::Sum, "all_gather"); }
TEST_P(InPlaceTest, AllGatherBF16IsTheRings) { compare<dpt::bf16>(DType::BF16, ReduceOp::Sum, "all_gather"); }
TEST_P(InPlaceTest, SumIsTheRingsBitwise) { compare<float>(DType::F32, ReduceOp::Sum); }
TEST_P(InPlaceTest, AvgIsTheRingsBitwise) { compare<float>(DType::F32, ReduceOp::Avg); }
TEST_P(InPlaceTest, MaxIsTheRingsBitwise) { compare<float>(DType::F32, ReduceOp::Max); }
TEST_P(InPlaceTest, SumBF16IsTheRingsBitwise) { compare<dpt::bf16>(DType::BF16, ReduceOp::Sum); }

INSTANTIATE_TEST_SUITE_P(Counts, InPlaceTest, ::testing::ValuesIn(kInPlaceCases),
                         [](const ::testing::TestParamInfo<InPlaceCase>& info) { return std::string(info.param.name); });

// Two windows and private buffers in flight together, waited in reverse:
// the windows' own counts of collectives keep them apart.
TEST(InPlace, TwoWindowsAndTheRingInterleaved) {
  const size_t count = 100003;
  auto a = pg().shared_memory(count * sizeof(float));
  auto b = pg().shared_memory(count * sizeof(float));
  if (!a || !b) GTEST_SKIP() << "no shared window in this group";
  float* fa = static_cast<float*>(a.get());
  float* fb = static_cast<float*>(b.get());
  auto p = contribution(count);
  for (size_t i = 0; i < count; ++i) fa[i] = fb[i] = contrib(me(), i);
  std::vector<std::shared_ptr<Work>> works;
  for (int round = 0; round < 3; ++round) {
    works.push_back(pg().all_reduce_async(fa, count, DType::F32, ReduceOp::Max));
    works.push_back(pg().all_reduce_async(p.data(), count, DType::F32, ReduceOp::Max));
    works.push_back(pg().all_reduce_async(fb, count, DType::F32, ReduceOp::Max));
  }
  for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->wait();
  EXPECT_TRUE(matches(fa, 0, count, max_over_ranks));
  EXPECT_TRUE(matches(fb, 0, count, max_over_ranks));
  EXPECT_TRUE(matches(p.data(), 0, count, max_over_ranks));
}

// ---------------------------------------------------------- subgroups

// Even and odd ranks: each group's collectives see its members only.
TEST(Split, EvenAndOddRanksFormTwoGroups) {
  auto g = pg().split(me() % 2, me(), "parity");
  const int members = (world() - me() % 2 + 1) / 2;
  EXPECT_EQ(g->name(), "parity");
  EXPECT_EQ(g->size(), members);
  EXPECT_EQ(g->rank(), me() / 2);
  std::vector<int> want_world;
  for (int r = me() % 2; r < world(); r += 2) want_world.push_back(r);
  EXPECT_EQ(g->world_ranks(), want_world);

  // The sum of (world rank + 1) over the members, on a buffer of odd size.
  std::vector<float> v(kBig, static_cast<float>(me() + 1));
  g->all_reduce(v.data(), v.size(), DType::F32, ReduceOp::Sum);
  float want = 0;
  for (int r : want_world) want += static_cast<float>(r + 1);
  EXPECT_TRUE(matches(v.data(), 0, v.size(), [&](size_t) { return want; }));

  // all_gather: each member's world rank in its chunk.
  std::vector<float> all(static_cast<size_t>(g->size()) * 3, -1.0f);
  for (size_t i = 0; i < 3; ++i) all[static_cast<size_t>(g->rank()) * 3 + i] = static_cast<float>(me());
  g->all_gather(all.data(), all.size(), DType::F32);
  EXPECT_TRUE(matches(all.data(), 0, all.size(),
                      [&](size_t i) { return static_cast<float>(want_world[i / 3]); }));

  // Its traffic is in its own ledger, not the parent's.
  const auto before = pg().ledger().snapshot();
  const auto child_before = g->ledger().snapshot();
  float one = 1.0f;
  g->all_reduce(&one, 1, DType::F32, ReduceOp::Sum);
  EXPECT_EQ(entry(dpt::comm::difference(g->ledger().snapshot(), child_before), "all_reduce").count, 1);
  EXPECT_EQ(entry(dpt::comm::difference(pg().ledger().snapshot(), before), "all_reduce").count, 0);
}

// The key orders a group: here the reverse of the world's.
TEST(Split, KeyOrdersTheRanks) {
  auto g = pg().split(0, world() - me(), "reversed");
  EXPECT_EQ(g->size(), world());
  EXPECT_EQ(g->rank(), world() - 1 - me());
  std::vector<float> v(1000, static_cast<float>(me()));
  g->broadcast(v.data(), v.size(), DType::F32, 0);  // group rank 0 = world rank n - 1
  EXPECT_TRUE(matches(v.data(), 0, v.size(), [&](size_t) { return static_cast<float>(world() - 1); }));
}

// A group of one per rank: collectives are no-ops, as in a world of one.
TEST(Split, OneRankGroups) {
  auto g = pg().split(me(), 0, "self");
  EXPECT_EQ(g->size(), 1);
  EXPECT_EQ(g->rank(), 0);
  EXPECT_EQ(g->world_ranks(), std::vector<int>{me()});
  float x = 3.0f;
  g->all_reduce(&x, 1, DType::F32, ReduceOp::Sum);
  EXPECT_EQ(x, 3.0f);
}

// A child of a child; then the parent and both children with collectives
// in flight at once (ring algorithm: each group has its own links and
// thread). Under Algo::Mpi a blocking MPI call holds the process's MPI lock,
// so groups take turns there (process_group.h).
TEST(Split, NestedGroupsRunBesideTheirParent) {
  auto a = pg().split(me() % 2, me(), "a");
  auto b = a->split(0, -a->rank(), "b");
  EXPECT_EQ(b->size(), a->size());
  EXPECT_EQ(b->rank(), a->size() - 1 - a->rank());
  std::vector<float> w = contribution(kBig), x(kBig, 1.0f), y(kBig, 2.0f);
  if (ring()) {
    auto ww = pg().all_reduce_async(w.data(), kBig, DType::F32, ReduceOp::Sum);
    auto wx = a->all_reduce_async(x.data(), kBig, DType::F32, ReduceOp::Sum);
    auto wy = b->all_reduce_async(y.data(), kBig, DType::F32, ReduceOp::Sum);
    wy->wait();
    wx->wait();
    ww->wait();
  } else {
    pg().all_reduce(w.data(), kBig, DType::F32, ReduceOp::Sum);
    a->all_reduce(x.data(), kBig, DType::F32, ReduceOp::Sum);
    b->all_reduce(y.data(), kBig, DType::F32, ReduceOp::Sum);
  }
  EXPECT_TRUE(matches(w.data(), 0, kBig, sum_over_ranks));
  EXPECT_TRUE(matches(x.data(), 0, kBig, [&](size_t) { return static_cast<float>(a->size()); }));
  EXPECT_TRUE(matches(y.data(), 0, kBig, [&](size_t) { return 2.0f * static_cast<float>(b->size()); }));
}

TEST(Split, NegativeColorIsRefused) { EXPECT_THROW(pg().split(-1, 0, "bad"), InputError); }

}  // namespace

int main(int argc, char** argv) {
  std::unique_ptr<ProcessGroup> group;
  try {
    group = ProcessGroup::create();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dist_comm: cannot create the process group: %s\n", e.what());
    return 1;
  }
  g_pg = group.get();
  const int rc = dpt::test::run_all_ranks(argc, argv, *group,
                                          std::string("dist_comm (") + dpt::comm::algo_name(group->config().algo) + ")");
  g_pg = nullptr;
  group.reset();
  return rc;
}
