// What lock-step alone costs two processes on one host (issue 36: DDP is
// judged against a pair of independent processes; how much of the gap is
// the lock-step itself, with no communication at all?).
//
// Two processes each run W-MLP's rank step at DDP's per-rank batch (128 of
// the global 256; 784 -> 1024 -> 1024 -> 10, ReLU, SGD with momentum 0.9,
// one thread each) through the engine's own kernels (linear, ReLU,
// cross-entropy, sgd_update), four ways, taking turns in each round:
//
//   free      the pair: both run, never waiting for each other
//   lockstep  both run, and meet at a barrier after backward every step,
//             where DDP's all-reduce stands (no bytes are exchanged)
//   reduced   lockstep, and the gradients summed as DDP's in-place
//             all-reduce on one host sums them: both ranks' gradients in
//             memory both map, each rank sums its half into both blocks,
//             a second barrier, then each updates from its own block
//   alone     rank 0 runs, rank 1 waits (one process on the host)
//
//   build/bench/lockstep_ceiling [steps] [rounds] > bench/results/lockstep_ceiling.json
//
// Prints one JSON object: per way and round, each rank's samples/s and rank
// 0's milliseconds per step in forward, backward, the barrier and the
// update; the medians over the rounds; and lockstep / free and reduced /
// free: the ceilings a DDP of this step could reach against the pair on
// this host, without communication and with its all-reduce's sums.
// (The pair's gradients are private memory, as each process of
// bench/ddp_bench.py's pair has them; reduced's are shared, as DDP's.)
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/threads.h"
#include "nn/activations.h"
#include "nn/cross_entropy.h"
#include "nn/linear.h"
#include "nn/update.h"
#include "tensor/flat_buffer.h"
#include "process_barrier.h"

namespace {

constexpr int64_t kBatch = 128, kIn = 784, kHidden = 1024, kOut = 10;
constexpr float kLr = 0.05f, kMomentum = 0.9f;
using Clock = std::chrono::steady_clock;

enum Way { Free, Lockstep, Reduced, Alone };
constexpr int kNumWays = 4;
const char* const kWays[] = {"free", "lockstep", "reduced", "alone"};
enum Phase { Forward, Backward, Wait, Reduce, Update };
constexpr int kNumPhases = 5;
const char* const kPhases[] = {"forward", "backward", "barrier", "sums", "update"};

struct Result {  // one rank's run of one way
  double samples_per_s = 0;
  double ms[kNumPhases] = {};  // per step, by Phase
};

struct Shared {
  ProcessBarrier barrier;
  Result results[2];
  float* grads[2];  // each rank's gradients for Reduced, in this mapping
};

dpt::FlatBuffer floats(int64_t n) { return dpt::FlatBuffer(static_cast<size_t>(n)); }

// One rank's model, gradients, momentum and activations.
struct Mlp {
  // The flat parameter vector: W1, b1, W2, b2, W3, b3, as the engine's
  // layout puts them; grads and momentum alike.
  static constexpr int64_t kSizes[6] = {kHidden * kIn, kHidden, kHidden * kHidden, kHidden, kOut * kHidden, kOut};
  static constexpr int64_t count() {
    int64_t n = 0;
    for (int64_t s : kSizes) n += s;
    return n;
  }
  dpt::FlatBuffer p = floats(count()), g = floats(count()), m = floats(count());
  dpt::FlatBuffer x = floats(kBatch * kIn), h1 = floats(kBatch * kHidden), h2 = floats(kBatch * kHidden);
  dpt::FlatBuffer logits = floats(kBatch * kOut);  // then the probabilities, then their gradient
  dpt::FlatBuffer d1 = floats(kBatch * kHidden), d2 = floats(kBatch * kHidden);
  std::vector<int32_t> labels = std::vector<int32_t>(kBatch);

  float* grad = g.f32();  // the gradients in use: g, or a block in shared memory

  static float* part(float* base, int i) {
    int64_t at = 0;
    for (int j = 0; j < i; ++j) at += kSizes[j];
    return base + at;
  }
  float* param(int i) { return part(p.f32(), i); }
  explicit Mlp(uint64_t seed) {
    dpt::Rng rng(seed);
    for (int64_t i = 0; i < count(); ++i) p.f32()[i] = 0.05f * (2.0f * rng.uniform() - 1.0f);
    for (int64_t i = 0; i < kBatch * kIn; ++i) x.f32()[i] = rng.uniform();
    for (auto& l : labels) l = static_cast<int32_t>(rng.below(kOut));
  }
  void forward() {
    dpt::linear_forward(h1.f32(), x.f32(), param(0), param(1), kBatch, kIn, kHidden);
    dpt::relu_forward(h1.f32(), h1.f32(), kBatch * kHidden);
    dpt::linear_forward(h2.f32(), h1.f32(), param(2), param(3), kBatch, kHidden, kHidden);
    dpt::relu_forward(h2.f32(), h2.f32(), kBatch * kHidden);
    dpt::linear_forward(logits.f32(), h2.f32(), param(4), param(5), kBatch, kHidden, kOut);
    dpt::cross_entropy_forward(logits.f32(), logits.f32(), labels.data(), kBatch, kOut, nullptr);
  }
  void backward() {
    float* dlogits = logits.f32();  // the mean loss's gradient, over the probabilities
    dpt::cross_entropy_backward(dlogits, dlogits, labels.data(), kBatch, kOut, 1.0f / kBatch);
    dpt::linear_backward(d2.f32(), part(grad, 4), part(grad, 5), dlogits, h2.f32(), param(4), kBatch, kHidden, kOut);
    dpt::relu_backward(d2.f32(), d2.f32(), h2.f32(), kBatch * kHidden);
    dpt::linear_backward(d1.f32(), part(grad, 2), part(grad, 3), d2.f32(), h1.f32(), param(2), kBatch, kHidden,
                         kHidden);
    dpt::relu_backward(d1.f32(), d1.f32(), h1.f32(), kBatch * kHidden);
    dpt::linear_backward(static_cast<float*>(nullptr), part(grad, 0), part(grad, 1), d1.f32(), x.f32(), param(0),
                         kBatch, kIn, kHidden);
  }
  void update(bool first) {
    dpt::sgd_update(p.f32(), grad, m.f32(), static_cast<size_t>(count()), kLr, kMomentum, 0.0f, first, true);
  }
};

double since(Clock::time_point& t) {
  const auto now = Clock::now();
  const double ms = std::chrono::duration<double, std::milli>(now - t).count();
  t = now;
  return ms;
}

Result run(Way way, Mlp& mlp, Shared& shared, int rank, int steps) {
  Result r;
  ProcessBarrier& barrier = shared.barrier;
  mlp.grad = way == Reduced ? shared.grads[rank] : mlp.g.f32();
  barrier.wait();  // both start together
  if (way == Alone && rank == 1) {
    barrier.wait_sleeping();  // until rank 0 is done, leaving the host to it
    return r;
  }
  const auto start = Clock::now();
  for (int step = 0; step < steps; ++step) {
    auto t = Clock::now();
    mlp.forward();
    r.ms[Forward] += since(t);
    mlp.backward();
    r.ms[Backward] += since(t);
    if (way != Free && way != Alone) barrier.wait();
    r.ms[Wait] += since(t);
    if (way == Reduced) {  // each rank's half of the sums, into both blocks
      const int64_t n = Mlp::count(), lo = rank == 0 ? 0 : n / 2, hi = rank == 0 ? n / 2 : n;
      float *g0 = shared.grads[0], *g1 = shared.grads[1];
      for (int64_t i = lo; i < hi; ++i) g0[i] = g1[i] = g0[i] + g1[i];
      barrier.wait();
      r.ms[Reduce] += since(t);
    }
    mlp.update(step == 0);
    r.ms[Update] += since(t);
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  r.samples_per_s = steps * kBatch / seconds;
  for (double& ms : r.ms) ms /= steps;
  if (way == Alone) barrier.wait();
  return r;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

bool positive(const char* arg, int& out) {
  char* end = nullptr;
  const long v = std::strtol(arg, &end, 10);
  if (end == arg || *end != '\0' || v < 1 || v > 1000000) return false;
  out = static_cast<int>(v);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 300, rounds = 5;
  if ((argc > 1 && !positive(argv[1], steps)) || (argc > 2 && !positive(argv[2], rounds))) {
    std::fprintf(stderr, "lockstep_ceiling: steps and rounds are whole numbers from 1 to 1000000\n");
    return 1;
  }
  const size_t grad_bytes = static_cast<size_t>(Mlp::count()) * sizeof(float);
  const size_t bytes = 4096 + 2 * grad_bytes;
  void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    std::perror("lockstep_ceiling: mmap");
    return 1;
  }
  static_assert(sizeof(Shared) <= 4096);
  auto* shared = new (mem) Shared;
  for (int r = 0; r < 2; ++r)  // zero, as the mapping is
    shared->grads[r] = reinterpret_cast<float*>(static_cast<char*>(mem) + 4096 + static_cast<size_t>(r) * grad_bytes);
  const pid_t child = fork();
  if (child < 0) {
    std::perror("lockstep_ceiling: fork");
    return 1;
  }
  const int rank = child == 0 ? 1 : 0;
  dpt::set_threads(1);
  Mlp mlp(1 + static_cast<uint64_t>(rank));
  for (Way w : {Free, Reduced}) run(w, mlp, *shared, rank, 20);  // warm-up: pages touched, kernels picked
  std::vector<Result> results[kNumWays][2];
  for (int round = 0; round < rounds; ++round)
    for (int w = 0; w < kNumWays; ++w) {
      shared->results[rank] = run(static_cast<Way>(w), mlp, *shared, rank, steps);
      shared->barrier.wait();  // both results written
      results[w][0].push_back(shared->results[0]);
      results[w][1].push_back(shared->results[1]);
      shared->barrier.wait();  // both read before the next way writes
    }
  if (rank == 1) _exit(0);
  waitpid(child, nullptr, 0);

  std::string out = "{\"workload\": \"W-MLP rank step, batch 128 of 256, one thread per process\", \"steps\": " +
                    std::to_string(steps) + ", \"rounds\": " + std::to_string(rounds) + ", \"ways\": {";
  double both[kNumWays] = {};
  for (int w = 0; w < kNumWays; ++w) {
    std::vector<double> total, phase[kNumPhases];
    std::string per_round, phases;
    for (int i = 0; i < rounds; ++i) {
      const Result &a = results[w][0][static_cast<size_t>(i)], &b = results[w][1][static_cast<size_t>(i)];
      total.push_back(a.samples_per_s + b.samples_per_s);
      for (int p = 0; p < kNumPhases; ++p) phase[p].push_back(a.ms[p]);
      char buf[96];
      std::snprintf(buf, sizeof buf, "%s[%.1f, %.1f]", i ? ", " : "", a.samples_per_s, b.samples_per_s);
      per_round += buf;
    }
    for (int p = 0; p < kNumPhases; ++p) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%s\"%s\": %.3f", p ? ", " : "", kPhases[p], median(phase[p]));
      phases += buf;
    }
    both[w] = median(total);
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.1f", both[w]);
    out += std::string(w ? ", " : "") + "\"" + kWays[w] + "\": {\"samples_per_s_by_round_rank\": [" + per_round +
           "], \"samples_per_s_both\": " + buf + ", \"rank0_ms_per_step\": {" + phases + "}}";
  }
  char tail[256];
  std::snprintf(tail, sizeof tail,
                "}, \"lockstep_over_free\": %.4f, \"reduced_over_free\": %.4f, \"free_over_twice_alone\": %.4f}\n",
                both[Lockstep] / both[Free], both[Reduced] / both[Free], both[Free] / (2 * both[Alone]));
  out += tail;
  std::fputs(out.c_str(), stdout);
  return 0;
}
