// DDP's work after backward on one host, four ways, measured on two
// processes sharing memory (issue 36: is the SGD update fused into the
// in-place all-reduce the lever that closes DDP's gap to two independent
// processes?). W-MLP's 1,863,690 parameters, SGD with momentum, one thread
// per process; between steps each process streams a 24 MiB working set
// (its forward and backward) and adds into its own gradients.
//
//   today     the in-place all-reduce (each rank sums its half of both
//             gradient blocks and writes the sum into both), then every
//             rank updates the whole model from its own block
//   owner     each rank sums its half, updates it, and writes parameters
//             and momentum into both ranks' copies (the update fused into
//             the all-reduce; the state stays replicated)
//   sharded   as owner, but the momentum stays with its owner (ZeRO-1's
//             state), only parameters go to both
//   summing   no all-reduce: each rank's update reads both gradient blocks
//             for every element, then zeroes its own after a barrier
//
//   build/bench/update_fusion [steps] > bench/results/update_fusion.json
// Prints one JSON object: each way's median ms per step on rank 0 (the time
// from the gradients being final to the step being done, barriers
// included).
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "process_barrier.h"

namespace {

constexpr size_t kParams = 1863690;
constexpr float kLr = 1e-3f, kMomentum = 0.9f;

struct Shared {  // both ranks' blocks, in memory both processes map
  ProcessBarrier barrier;
  float *g[2], *p[2], *m[2];
};

enum Way { Today, Owner, Sharded, Summing };
const char* const kNames[] = {"today", "owner", "sharded", "summing"};

void after_backward(Way way, Shared& s, int rank) {
  const size_t n = kParams, lo = rank == 0 ? 0 : n / 2, hi = rank == 0 ? n / 2 : n;
  float *g0 = s.g[0], *g1 = s.g[1], *P = s.p[rank], *M = s.m[rank];
  switch (way) {
    case Today:
      for (size_t i = lo; i < hi; ++i) g0[i] = g1[i] = g0[i] + g1[i];
      s.barrier.wait();
      for (size_t i = 0; i < n; ++i) {
        const float b = kMomentum * M[i] + s.g[rank][i];
        M[i] = b;
        P[i] -= kLr * b;
        s.g[rank][i] = 0.0f;
      }
      return;
    case Owner:
    case Sharded:
      for (size_t i = lo; i < hi; ++i) {
        const float b = kMomentum * M[i] + (g0[i] + g1[i]);
        const float q = P[i] - kLr * b;
        if (way == Owner) s.m[0][i] = s.m[1][i] = b;
        else M[i] = b;
        s.p[0][i] = s.p[1][i] = q;
        g0[i] = g1[i] = 0.0f;
      }
      s.barrier.wait();
      return;
    case Summing:
      for (size_t i = 0; i < n; ++i) {
        const float b = kMomentum * M[i] + (g0[i] + g1[i]);
        M[i] = b;
        P[i] -= kLr * b;
      }
      s.barrier.wait();
      std::memset(s.g[rank], 0, n * sizeof(float));
      return;
  }
}

double median_ms(Way way, Shared& s, int rank, int steps) {
  std::vector<float> work(size_t{6} << 20, 1.0f);  // 24 MiB
  std::vector<double> ms;
  for (int step = 0; step < steps; ++step) {
    float sum = 0.0f;
    for (size_t i = 0; i < work.size(); i += 16) sum += (work[i] += 1.0f);
    for (size_t i = 0; i < kParams; ++i) s.g[rank][i] += 1e-3f * static_cast<float>(i & 7) + sum * 1e-12f;
    s.barrier.wait();
    const auto t0 = std::chrono::steady_clock::now();
    after_backward(way, s, rank);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::nth_element(ms.begin(), ms.begin() + steps / 2, ms.end());
  return ms[static_cast<size_t>(steps / 2)];
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 300;
  if (steps < 1) {
    std::fprintf(stderr, "update_fusion: steps must be a positive number, not '%s'\n", argv[1]);
    return 1;
  }
  const size_t bytes = 4096 + 6 * kParams * sizeof(float);
  void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    std::perror("update_fusion: mmap");
    return 1;
  }
  std::memset(mem, 0, bytes);
  auto* s = new (mem) Shared;
  float* base = reinterpret_cast<float*>(static_cast<char*>(mem) + 4096);
  for (int r = 0; r < 2; ++r) {
    s->g[r] = base + (0 + r) * kParams;
    s->p[r] = base + (2 + r) * kParams;
    s->m[r] = base + (4 + r) * kParams;
  }
  const pid_t child = fork();
  if (child < 0) {
    std::perror("update_fusion: fork");
    return 1;
  }
  const int rank = child == 0 ? 1 : 0;
  double result[4];
  for (int w = 0; w < 4; ++w) result[w] = median_ms(static_cast<Way>(w), *s, rank, steps);
  if (rank == 1) _exit(0);
  waitpid(child, nullptr, 0);
  std::printf("{\"params\": %zu, \"steps\": %d, \"ms_per_step_rank0\": {", kParams, steps);
  for (int w = 0; w < 4; ++w) std::printf("%s\"%s\": %.4f", w ? ", " : "", kNames[w], result[w]);
  std::printf("}}\n");
  return 0;
}
