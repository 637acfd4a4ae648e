// A job that goes wrong on purpose, for tests/dist/test_dist_failure.cpp.
//
//   mpirun -n 3 dist_failure --mode die|skip|mismatch|late|none [--timeout-ms 3000] [--shared] [--p2p]
//
// Every rank runs five all_reduces; the third is where rank 1 misbehaves:
//   die       rank 1 exits (_exit(0)) before it
//   skip      rank 1 skips it, sleeps 20 s and exits 0
//   mismatch  rank 1 issues an all_gather of the same count instead, with
//             the order check on (config.check_order)
//   late      rank 1 never joins: it sleeps 20 s before the group's set-up
//             and exits 0, so the others wait in the set-up
//   none      nobody misbehaves
// --shared: the data lives in a shared window (ProcessGroup::shared_memory),
// so the all_reduces run in place (exit 2 where the group has no window).
// --p2p: instead of all_reduces, rank 1 sends to rank 0, which receives
// (and checks the values): on one host the receiver sleeps on the link's
// futex (comm/shm_transport.h) and must still notice a sender that died.
// A rank that catches an error prints "rank R: <what()>" on stderr and
// leaves with _exit(1) (MPI finalisation could hang with a dead peer); a rank
// that saw none prints "rank R: no error" and exits 0.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "comm/process_group.h"
#include "comm/setup_deadline.h"

namespace {

[[noreturn]] void usage(const char* msg) {
  std::fprintf(stderr, "dist_failure: %s\nusage: dist_failure --mode die|skip|mismatch|late|none [--timeout-ms N] [--shared] [--p2p]\n", msg);
  std::exit(2);
}

struct Options {
  std::string mode;
  long timeout_ms = 3000;
  bool shared = false, p2p = false;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--mode" && i + 1 < argc) {
      o.mode = argv[++i];
    } else if (a == "--timeout-ms" && i + 1 < argc) {
      char* end = nullptr;
      o.timeout_ms = std::strtol(argv[++i], &end, 10);
      if (*end != '\0' || o.timeout_ms <= 0) usage("--timeout-ms needs a positive integer");
    } else if (a == "--shared") {
      o.shared = true;
    } else if (a == "--p2p") {
      o.p2p = true;
    } else {
      usage(("unknown argument '" + a + "'").c_str());
    }
  }
  if (o.mode != "die" && o.mode != "skip" && o.mode != "mismatch" && o.mode != "none" && o.mode != "late")
    usage("--mode is required");
  return o;
}

// The five operations, rank 1 misbehaving at the third as o.mode says.
void run_ops(dpt::comm::ProcessGroup& pg, float* data, size_t count, int rank, const Options& o) {
  for (int op = 1; op <= 5; ++op) {
    for (size_t i = 0; i < count; ++i) data[i] = static_cast<float>(rank + op);
    if (op == 3 && rank == 1) {
      if (o.mode == "die") {
        _exit(0);
      } else if (o.mode == "skip") {
        std::this_thread::sleep_for(std::chrono::seconds(20));
        _exit(0);
      } else if (o.mode == "mismatch") {
        pg.all_gather(data, count, dpt::DType::F32);
        continue;
      }
    }
    if (!o.p2p) {
      pg.all_reduce(data, count, dpt::DType::F32, dpt::comm::ReduceOp::Sum);
    } else if (rank == 1) {
      pg.send(data, count, dpt::DType::F32, 0);
    } else if (rank == 0) {
      pg.recv(data, count, dpt::DType::F32, 1);
      for (size_t i = 0; i < count; ++i)
        if (data[i] != static_cast<float>(1 + op)) throw std::runtime_error("received the wrong values");
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  int rank = dpt::comm::launcher_rank();  // for messages before the group exists
  if (o.mode == "late" && rank == 1) {
    // A rank that never joins: the others wait in the group's set-up.
    std::this_thread::sleep_for(std::chrono::seconds(20));
    _exit(0);
  }
  try {
    dpt::comm::Config config = dpt::comm::Config::from_env();
    config.timeout = std::chrono::milliseconds(o.timeout_ms);
    if (o.mode == "mismatch") config.check_order = true;
    auto pg = dpt::comm::ProcessGroup::create(config);
    rank = pg->rank();
    if (pg->size() < 2 && o.mode != "none") {
      std::fprintf(stderr, "rank %d: mode %s needs at least two ranks\n", rank, o.mode.c_str());
      std::fflush(nullptr);
      _exit(2);
    }
    constexpr size_t kCount = 1000;
    std::vector<float> own(kCount);
    std::shared_ptr<void> window = o.shared ? pg->shared_memory(kCount * sizeof(float)) : nullptr;
    if (o.shared && !window) {
      std::fprintf(stderr, "rank %d: --shared, but this group has no shared window\n", rank);
      std::fflush(nullptr);
      _exit(2);
    }
    run_ops(*pg, window ? static_cast<float*>(window.get()) : own.data(), kCount, rank, o);
    std::fprintf(stderr, "rank %d: no error\n", rank);
    std::fflush(nullptr);
    pg.reset();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    std::fflush(nullptr);
    _exit(1);
  }
}
