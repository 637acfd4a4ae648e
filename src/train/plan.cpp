#include "train/plan.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <set>

#include <fmt/format.h>

#include "comm/types.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/gemm_peak.h"
#include "core/membw.h"
#include "core/threads.h"
#include "nn/gemm.h"
#include "parallel/rank_bytes.h"
#include "parallel/reducer.h"

namespace dpt {

uint64_t RingSends::rs(size_t m, size_t es) const { return es * (m - comm::chunk_range(m, world, rank).size); }
uint64_t RingSends::ag(size_t m, size_t es) const {
  return es * (m - comm::chunk_range(m, world, (rank + 1) % world).size);
}

CommPlan& CommPlan::operator+=(const CommPlan& o) {
  forward += o.forward;
  backward += o.backward;
  optimizer += o.optimizer;
  first_step += o.first_step;
  logged_other += o.logged_other;
  logged_optimizer += o.logged_optimizer;
  return *this;
}

namespace {

// zero3's all-gathers of one micro-step (units of `es` bytes an element),
// from the order the model opens its units. Resharding, every opening
// gathers, except that backward's first unit is forward's last, kept (once
// the order is recorded: c.first_step). Without it, a unit gathered in
// forward stays until backward, and only a unit opened again in backward
// (after its first backward use freed it) is gathered there.
void zero3_gathers(const StrategyOptions& o, const Model& model, const RingSends& ring, size_t es, uint64_t micro,
                   CommPlan& c) {
  const auto& units = model.layout().units();
  const std::vector<int> fwd = model.unit_order();
  const std::vector<int> bwd(fwd.rbegin(), fwd.rend());
  auto ag = [&](int u) { return ring.ag(units[static_cast<size_t>(u)].numel, es); };
  uint64_t f = 0, b = 0;
  if (o.reshard_after_forward) {
    for (int u : fwd) f += ag(u);
    for (int u : bwd) b += ag(u);
    b -= ag(fwd.back());
    c.first_step = ag(fwd.back());
  } else {
    std::set<int> seen;
    for (int u : fwd)
      if (seen.insert(u).second) f += ag(u);
    seen.clear();
    for (int u : bwd)
      if (!seen.insert(u).second) b += ag(u);
  }
  c.forward += micro * f;
  c.backward += micro * b;
}

}  // namespace

CommPlan planned_comm(const StrategyOptions& o, const Model& model, int world, int rank, int64_t grad_accum) {
  CommPlan c;
  if (world < 2) return c;
  const RingSends ring{world, rank};
  const Layout& layout = model.layout();
  // Reductions move --reduce-dtype (bf16: half the bytes); parameter
  // all-gathers move the compute copies (bf16 under mixed precision).
  const size_t red = dtype_size(o.ddp.reduce_dtype), par = dtype_size(model.precision());
  uint64_t rs = 0, ag = 0, buckets = 0;
  for (const Unit& u : layout.units()) {
    rs += ring.rs(u.numel, red);
    ag += ring.ag(u.numel, par);
  }
  for (const Bucket& b : Reducer::assign(layout, o.ddp)) buckets += ring.ar(b.numel, red);
  const uint64_t micro = static_cast<uint64_t>(grad_accum);
  // Full gradients are reduced once, on the last micro-step; unit
  // gradients in scratch every micro-step.
  const uint64_t scattered = o.accumulate_locally ? rs : micro * rs;
  const int stage = zero_stage(o.name);
  switch (stage) {
    case 0:
      c.backward = buckets;
      break;
    case 1:
      c.backward = o.zero_scatter ? rs : buckets;
      c.optimizer = ag;  // the updated shards, all-gathered after the step
      break;
    case 2:
      c.backward = scattered;
      c.optimizer = ag;
      break;
    default:
      c.backward = scattered;
      zero3_gathers(o, model, ring, par, micro, c);
  }
  c.logged_other = ring.ar(1, sizeof(float));
  // Every rank's sum of squares, a double each, gathered as two floats.
  c.logged_optimizer = stage > 0 ? ring.ag(2 * static_cast<size_t>(world), sizeof(float)) : 0;
  return c;
}

size_t host_available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  size_t kib = 0;
  while (in >> key) {
    if (key == "MemAvailable:") {
      in >> kib;
      return kib * 1024;
    }
    in.ignore(1 << 10, '\n');
  }
  return 0;
}

int ranks_on_host(int world) {
  if (const char* v = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE")) return std::max(1, std::atoi(v));
  return world;
}

bool fits_on_host(size_t per_rank, int ranks_here, size_t available) {
  return per_rank * static_cast<size_t>(std::max(1, ranks_here)) <= available;
}

std::string human_bytes(size_t bytes) {
  const double b = static_cast<double>(bytes);
  return b >= double(1u << 30) ? fmt::format("{:.1f} GiB", b / double(1u << 30))
                               : fmt::format("{:.1f} MiB", b / double(1u << 20));
}

void check_fits(const StrategyOptions& options, const Model& model, size_t activation_bytes, int world,
                int ranks_here, size_t available) {
  const size_t here = static_cast<size_t>(ranks_here);
  auto need = [&](const std::string& name) {
    StrategyOptions s = options;
    s.name = name;
    return rank_bytes(s, model, world).total() + activation_bytes;
  };
  const size_t mine = need(options.name);
  if (fits_on_host(mine, ranks_here, available)) return;
  std::string advice = "no strategy fits: add ranks on other hosts, or shrink the model or batch";
  for (const std::string& name : data_parallel_strategies())
    if (fits_on_host(need(name), ranks_here, available)) {
      advice = fmt::format("--strategy {} would fit (about {} per rank)", name, human_bytes(need(name)));
      break;
    }
  throw InputError(fmt::format("--strategy {} needs about {} per rank ({} for the {} rank{} on this host) but {} is "
                               "available; {}",
                               options.name, human_bytes(mine), human_bytes(mine * here), here, here == 1 ? "" : "s",
                               human_bytes(available), advice));
}

MachineRates measure_machine(int threads, int ranks_here) {
  MachineRates m;
  m.threads = std::max(1, threads);
  const int before = dpt::threads();
  set_threads(m.threads);
  m.gemm_gflops = measure_gemm_gflops();
  // bf16 inputs, on the backend in use: widened to fp32 where the CPU has no
  // bf16 kernels (slower than fp32), native where it has (faster).
  m.gemm_bf16_gflops = measure_gemm_gflops(DType::BF16);
  set_threads(before);
  // The host's ranks copy at once (their collectives, their optimizer
  // steps): each gets its share of what that many threads copy together.
  const int n = std::max(1, ranks_here);
  m.copy_gbs = measure_memcpy_gbs(size_t{64} << 20, n) / n;
  return m;
}

}  // namespace dpt
