// `dpt bench comm`: time and check the collectives (W-COMM), nccl-tests
// style. Run it under a launcher: dpt launch -n 2 -- build/dpt bench comm.
//
// For every algorithm, operation and size: warm-up runs, then timed runs,
// each one started right after a barrier so the ranks begin together. A run's
// time is the slowest rank's (an all_reduce Max over the per-rank times, as
// nccl-tests effectively reports); the table shows the median run. Then one
// checked run on inputs whose result is known in closed form, compared
// exactly, and the wrong elements counted over all ranks.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/process_group.h"
#include "comm/setup_deadline.h"
#include "core/error.h"
#include "core/membw.h"
#include "io/atomic_file.h"
#include "tools/commands.h"
#include "tools/flag_checks.h"

namespace dpt {

namespace {

using comm::ProcessGroup;
using Clock = std::chrono::steady_clock;

enum class Op { AllReduce, ReduceScatter, AllGather, Broadcast };

struct OpSpec {
  Op op;
  const char* name;
};
constexpr OpSpec kOps[] = {{Op::AllReduce, "all_reduce"},
                           {Op::ReduceScatter, "reduce_scatter"},
                           {Op::AllGather, "all_gather"},
                           {Op::Broadcast, "broadcast"}};

// nccl-tests' bus bandwidth factor: the fraction of the buffer each rank must
// send (and receive) over its busiest link with an optimal algorithm, so that
// busbw is comparable with the hardware's link bandwidth whatever n is.
double bus_factor(Op op, int n) {
  switch (op) {
    case Op::AllReduce: return 2.0 * (n - 1) / n;
    case Op::ReduceScatter:
    case Op::AllGather: return static_cast<double>(n - 1) / n;
    case Op::Broadcast: return 1.0;
  }
  return 1.0;
}

// "4096", "4K", "64KiB", "1M", "2G": binary units.
size_t parse_size(const std::string& s) {
  size_t i = 0;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
  std::string digits = s.substr(0, i), suffix = s.substr(i);
  for (auto& c : suffix) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  int shift = -1;
  if (suffix.empty() || suffix == "B")
    shift = 0;
  else if (suffix == "K" || suffix == "KIB")
    shift = 10;
  else if (suffix == "M" || suffix == "MIB")
    shift = 20;
  else if (suffix == "G" || suffix == "GIB")
    shift = 30;
  if (digits.empty() || digits.size() > 12 || shift < 0)
    throw InputError(fmt::format("--sizes: bad size '{}' (a number of bytes with an optional K, M or G)", s));
  const unsigned long long units = std::stoull(digits);
  if (units > (1ull << 40) >> shift) throw InputError(fmt::format("--sizes: {} is too large", s));
  const unsigned long long v = units << shift;
  if (v == 0 || v % 4 != 0)
    throw InputError(fmt::format("--sizes: {} is not a whole, non-zero number of fp32 elements", s));
  return static_cast<size_t>(v);
}

void issue(ProcessGroup& pg, Op op, float* buf, size_t count) {
  switch (op) {
    case Op::AllReduce: return pg.all_reduce(buf, count, DType::F32, comm::ReduceOp::Sum);
    case Op::ReduceScatter: return pg.reduce_scatter(buf, count, DType::F32, comm::ReduceOp::Sum);
    case Op::AllGather: return pg.all_gather(buf, count, DType::F32);
    case Op::Broadcast: return pg.broadcast(buf, count, DType::F32, 0);
  }
}

// Inputs with closed-form results, all small integers so every partial sum is
// exact in fp32 and the comparison can be exact. The patterns vary along the
// buffer with prime periods so a misplaced chunk shows.
//   all_reduce, reduce_scatter: rank r, element i = (r+1) + i%1021; the sum
//     is n(n+1)/2 + n*(i%1021) (reduce_scatter: checked on this rank's chunk)
//   all_gather: chunk c holds (c+1)*4096 + i%4093 from rank c; -1 elsewhere
//   broadcast: root 0 holds 1 + i%8191; -1 on the other ranks
float input_value(Op op, int rank, size_t i) {
  switch (op) {
    case Op::AllReduce:
    case Op::ReduceScatter: return static_cast<float>(rank + 1 + static_cast<int>(i % 1021));
    case Op::AllGather: return static_cast<float>((rank + 1) * 4096 + static_cast<int>(i % 4093));
    case Op::Broadcast: return static_cast<float>(1 + i % 8191);
  }
  return 0.0f;
}

// Elements of this rank's result that differ from the expected values.
int64_t checked_run(ProcessGroup& pg, Op op, float* buf, size_t count) {
  const int n = pg.size(), rank = pg.rank();
  const comm::Range mine = comm::chunk_range(count, n, rank);
  switch (op) {
    case Op::AllReduce:
    case Op::ReduceScatter:
      for (size_t i = 0; i < count; ++i) buf[i] = input_value(op, rank, i);
      break;
    case Op::AllGather:
      std::fill_n(buf, count, -1.0f);
      for (size_t i = mine.begin; i < mine.begin + mine.size; ++i) buf[i] = input_value(op, rank, i);
      break;
    case Op::Broadcast:
      for (size_t i = 0; i < count; ++i) buf[i] = rank == 0 ? input_value(op, 0, i) : -1.0f;
      break;
  }
  issue(pg, op, buf, count);

  int64_t wrong = 0;
  const float base = static_cast<float>(n * (n + 1) / 2);
  switch (op) {
    case Op::AllReduce:
      for (size_t i = 0; i < count; ++i)
        wrong += buf[i] != base + static_cast<float>(n * static_cast<int>(i % 1021));
      break;
    case Op::ReduceScatter:
      for (size_t i = mine.begin; i < mine.begin + mine.size; ++i)
        wrong += buf[i] != base + static_cast<float>(n * static_cast<int>(i % 1021));
      break;
    case Op::AllGather:
      for (int c = 0; c < n; ++c) {
        const comm::Range r = comm::chunk_range(count, n, c);
        for (size_t i = r.begin; i < r.begin + r.size; ++i) wrong += buf[i] != input_value(op, c, i);
      }
      break;
    case Op::Broadcast:
      for (size_t i = 0; i < count; ++i) wrong += buf[i] != input_value(op, 0, i);
      break;
  }
  return wrong;
}

// Sum of a count over ranks. Reductions are fp32, exact only below 2^24, so
// the count travels as two 16-bit halves; each sum stays exact for up to 256
// ranks and buffers below 2^40 elements.
int64_t sum_over_ranks(ProcessGroup& pg, int64_t local) {
  float parts[2] = {static_cast<float>(local >> 16), static_cast<float>(local & 0xffff)};
  pg.all_reduce(parts, 2, DType::F32, comm::ReduceOp::Sum);
  if (!std::isfinite(parts[0]) || !std::isfinite(parts[1]) || parts[0] < 0 || parts[1] < 0 ||
      parts[0] > 1e12f)
    return std::max<int64_t>(local, 1);  // the reduction itself came back wrong
  return (static_cast<int64_t>(parts[0]) << 16) + static_cast<int64_t>(parts[1]);
}

double median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (static_cast<double>(v[m - 1]) + v[m]);
}

// The --ops list, each name checked.
std::vector<OpSpec> parse_ops(const std::string& list) {
  std::vector<OpSpec> ops;
  for (const auto& name : split_list(list, "--ops", "name")) {
    auto it = std::find_if(std::begin(kOps), std::end(kOps), [&](const OpSpec& o) { return name == o.name; });
    if (it == std::end(kOps))
      throw InputError(fmt::format(
          "--ops: unknown operation '{}' (all_reduce, reduce_scatter, all_gather, broadcast)", name));
    ops.push_back(*it);
  }
  return ops;
}

// The --algo list, each name checked.
std::vector<comm::Algo> parse_algos(const std::string& list) {
  std::vector<comm::Algo> algos;
  for (const auto& name : split_list(list, "--algo", "name")) {
    if (name != "ring" && name != "mpi")
      throw InputError(fmt::format("--algo: unknown algorithm '{}' (ring, mpi)", name));
    algos.push_back(comm::parse_algo(name));
  }
  return algos;
}

// Microseconds one collective of `count` floats takes: the median over
// `iters` timed runs (after `warmup`) of the slowest rank's time.
double time_op(ProcessGroup& pg, Op op, float* buf, size_t count, int warmup, int iters) {
  std::fill_n(buf, count, 0.0f);  // sums of zeros stay zero, never inf
  for (int w = 0; w < warmup; ++w) issue(pg, op, buf, count);
  std::vector<float> us(static_cast<size_t>(iters));
  for (auto& t : us) {
    pg.barrier();
    const auto t0 = Clock::now();
    issue(pg, op, buf, count);
    t = static_cast<float>(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  pg.all_reduce(us.data(), us.size(), DType::F32, comm::ReduceOp::Max);
  return median(us);
}

// What the rows add up to: every row's JSON, the wrong elements over all
// rows, and whether any rank saw one.
struct Tally {
  nlohmann::json results = nlohmann::json::array();
  int64_t wrong = 0;
  bool failed = false;
};

// One row per operation and size on `data` (the group's buffer in `memory`,
// private or shared): timed, then checked; printed by rank 0 and tallied.
// In shared memory only all_reduce runs differently, so only it is timed.
void time_and_check(ProcessGroup& pg, const std::vector<OpSpec>& ops, const std::vector<size_t>& sizes, float* data,
                    const std::string& memory, const std::string& transport, int warmup, int iters, Tally& tally) {
  const int n = pg.size();
  const char* algo = comm::algo_name(pg.config().algo);
  for (const OpSpec& op : ops) {
    if (memory == "shared" && op.op != Op::AllReduce) continue;
    for (size_t bytes : sizes) {
      const size_t count = bytes / 4;
      const double time_us = time_op(pg, op.op, data, count, warmup, iters);
      const double algbw = static_cast<double>(bytes) / (time_us * 1e-6) / 1e9;
      const double busbw = algbw * bus_factor(op.op, n);

      const int64_t local_wrong = checked_run(pg, op.op, data, count);
      const int64_t wrong = sum_over_ranks(pg, local_wrong);
      tally.wrong += wrong;
      if (wrong > 0 || local_wrong > 0) tally.failed = true;

      if (pg.rank() == 0) {
        std::printf("  %14s  %4s  %7s  %11zu  %10zu  %10.2f  %11.3f  %11.3f  %6lld\n", op.name, algo, memory.c_str(),
                    bytes, count, time_us, algbw, busbw, static_cast<long long>(wrong));
        std::fflush(stdout);
      }
      tally.results.push_back({{"op", op.name},
                               {"algo", algo},
                               {"memory", memory},
                               {"transport", transport},
                               {"bytes", bytes},
                               {"count", count},
                               {"time_us", time_us},
                               {"algbw_gbs", algbw},
                               {"busbw_gbs", busbw},
                               {"wrong", wrong}});
    }
  }
}

}  // namespace

BenchCommCommand::BenchCommCommand(CLI::App& app) {
  CLI::App* bench = bench_subcommand(app);
  cmd_ = bench->add_subcommand("comm", "time and check collectives on every rank (run under dpt launch)");
  cmd_->add_option("--ops", ops_, "comma-separated: all_reduce, reduce_scatter, all_gather, broadcast")
      ->capture_default_str();
  cmd_->add_option("--algo", algos_, "comma-separated: ring (the engine's), mpi (MPI's own)")
      ->capture_default_str();
  cmd_->add_option("--memory", memory_,
                   "comma-separated: private (each rank's own buffer), shared (a shared window: the ring's "
                   "all_reduce runs in place; ranks on one host)")
      ->capture_default_str();
  cmd_->add_option("--sizes", sizes_, "comma-separated buffer sizes in bytes, K/M/G suffixes (binary)")
      ->capture_default_str();
  cmd_->add_option("--iters", iters_, "timed runs per size")
      ->check(number_check(1, 1e6, false, false, "between 1 and 1000000"))
      ->capture_default_str();
  cmd_->add_option("--warmup", warmup_, "untimed runs before them")
      ->check(number_check(0, 1e6, false, false, "between 0 and 1000000"))
      ->capture_default_str();
  cmd_->add_option("--transport", transport_,
                   "ring transport: auto, shm or mpi (default: DPT_COMM_TRANSPORT or auto)")
      ->check(CLI::IsMember({"auto", "shm", "mpi"}));
  cmd_->add_option("--timeout", timeout_s_,
                   "seconds before a stuck collective fails (default: DPT_COMM_TIMEOUT or 300)")
      ->check(positive_seconds());
  cmd_->add_option("--json", json_, "write the results here (rank 0)");
}

namespace {

// What the ring's links use: "shm+mpi" across hosts (collective).
std::string ring_transport(ProcessGroup& pg, comm::Algo algo) {
  if (algo == comm::Algo::Mpi) return "mpi";
  if (pg.size() == 1) return "self";
  bool shm = false, mpi = false;
  for (const ProcessGroup::Link& l : pg.ring_links()) (l.transport == "shm" ? shm : mpi) = true;
  return shm && mpi ? "shm+mpi" : shm ? "shm" : "mpi";
}

// The table's head: ranks, hosts, runs, the memcpy ceiling, the columns.
void print_bench_header(const ProcessGroup& pg, int iters, int warmup, const MemcpyBandwidth* membw) {
  const int n = pg.size();
  std::printf("# dpt bench comm: %d rank%s on", n, n == 1 ? "" : "s");
  std::vector<std::string> seen;
  for (const auto& h : pg.hosts())
    if (std::find(seen.begin(), seen.end(), h) == seen.end()) seen.push_back(h);
  for (const auto& h : seen) std::printf(" %s", h.c_str());
  std::printf("; %d timed runs after %d warm-up, median of the slowest rank's time\n", iters, warmup);
  if (membw)
    std::printf("# memcpy bandwidth (%zu MiB, best of 5): 1 thread %.1f GB/s, 2 threads %.1f GB/s\n",
                membw->bytes >> 20, membw->one_thread, membw->two_threads);
  std::printf("#\n# %14s  %4s  %7s  %11s  %10s  %10s  %11s  %11s  %6s\n", "op", "algo", "memory", "size(B)",
              "count", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong");
}

// One group's runs: every op and size in each memory (private buffers, or a
// shared window where the group can have one).
void run_memories(ProcessGroup& pg, comm::Algo algo, const std::vector<OpSpec>& ops, const std::vector<size_t>& sizes,
                  const std::vector<std::string>& memories, std::vector<float>& buf, int warmup, int iters,
                  Tally& tally) {
  const std::string transport = ring_transport(pg, algo);
  if (pg.rank() == 0) std::printf("# algo %s, transport %s\n", comm::algo_name(algo), transport.c_str());
  std::fflush(stdout);
  for (const std::string& memory : memories) {
    // Shared: a window every rank maps (collective); only all_reduce runs
    // differently there. Not every group can have one (MPI's algorithms,
    // ranks on several hosts): say so and go on.
    float* data = buf.data();
    std::shared_ptr<void> window;
    if (memory == "shared") {
      window = pg.shared_memory(buf.size() * sizeof(float));
      if (!window) {
        if (pg.rank() == 0) std::printf("# algo %s: no shared window here, memory shared skipped\n", comm::algo_name(algo));
        continue;
      }
      data = static_cast<float*>(window.get());
    }
    time_and_check(pg, ops, sizes, data, memory, transport, warmup, iters, tally);
  }
}

}  // namespace

int BenchCommCommand::run() {
  // Everything the user can get wrong is checked before MPI starts.
  const std::vector<OpSpec> ops = parse_ops(ops_);
  const std::vector<comm::Algo> algos = parse_algos(algos_);
  std::vector<size_t> sizes;
  for (const auto& s : split_list(sizes_, "--sizes", "size")) sizes.push_back(parse_size(s));
  const std::vector<std::string> memories = split_list(memory_, "--memory", "name");
  for (const auto& m : memories)
    if (m != "private" && m != "shared")
      throw InputError(fmt::format("--memory: unknown memory '{}' (private, shared)", m));
  comm::Config base = comm::Config::from_env();
  if (!transport_.empty()) base.transport = comm::parse_transport(transport_);
  if (timeout_s_ > 0)
    base.timeout = std::chrono::milliseconds(static_cast<int64_t>(std::ceil(timeout_s_ * 1000.0)));

  // The physical ceiling, measured by rank 0 alone before the others are
  // busy (they wait in MPI start-up meanwhile, sleeping rather than spinning).
  MemcpyBandwidth membw;
  const bool measure = comm::launcher_rank() == 0;
  if (measure) membw = measure_memcpy_bandwidth();

  const size_t max_count = *std::max_element(sizes.begin(), sizes.end()) / 4;
  std::vector<float> buf;  // allocated once, for the largest size, after MPI start-up

  Tally tally;
  nlohmann::json hosts;
  int world = 1;
  bool is_root = true;
  for (size_t a = 0; a < algos.size(); ++a) {
    comm::Config config = base;
    config.algo = algos[a];
    auto pg = ProcessGroup::create(config);
    world = pg->size();
    if (buf.empty()) buf.resize(max_count);  // zeroing faults the pages in
    is_root = pg->rank() == 0;
    hosts = pg->hosts();
    if (is_root && a == 0) print_bench_header(*pg, iters_, warmup_, measure ? &membw : nullptr);
    run_memories(*pg, config.algo, ops, sizes, memories, buf, warmup_, iters_, tally);
    pg.reset();  // one process group at a time
  }

  if (is_root && !json_.empty()) {
    nlohmann::json doc = {
        {"world", world},
        {"hosts", hosts},
        {"iters", iters_},
        {"warmup", warmup_},
        {"membw_gbs",
         {{"bytes", membw.bytes}, {"threads_1", membw.one_thread}, {"threads_2", membw.two_threads}}},
        {"results", tally.results}};
    AtomicFile f(json_);
    f.write(doc.dump(2) + "\n");
    f.commit();
  }
  if (tally.failed) {
    if (is_root)
      std::fprintf(stderr, "dpt: error: %lld wrong element%s in the checked runs\n",
                   static_cast<long long>(tally.wrong), tally.wrong == 1 ? "" : "s");
    return 1;
  }
  return 0;
}

}  // namespace dpt
