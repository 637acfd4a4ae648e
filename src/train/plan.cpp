#include "train/plan.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>

#include <fmt/format.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/membw.h"
#include "core/threads.h"
#include "nn/gemm.h"
#include "parallel/catalog.h"
#include "parallel/rank_bytes.h"

namespace dpt {

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
  auto need = [&](const StrategyRecord& strategy) {
    StrategyOptions s = options;
    s.strategy = strategy;
    return rank_bytes(s, model, world).total() + activation_bytes;
  };
  const size_t mine = need(*options.strategy);
  if (fits_on_host(mine, ranks_here, available)) return;
  std::string advice =
      "no strategy fits as configured: `dpt plan` with these flags lists what fits with bf16, activation "
      "checkpointing or offload; or add ranks on other hosts, or shrink the model or batch";
  for (const StrategyRecord* s : data_parallel_strategies())
    if (fits_on_host(need(*s), ranks_here, available)) {
      advice = fmt::format("--strategy {} would fit (about {} per rank)", s->name, human_bytes(need(*s)));
      break;
    }
  // A need just over what is available would read "20.0 GiB ... but 20.0
  // GiB": then both in MiB, where they differ.
  std::string per_rank = human_bytes(mine), host = human_bytes(mine * here), have = human_bytes(available);
  if (host == have) {
    auto mib = [](size_t b) { return fmt::format("{:.1f} MiB", static_cast<double>(b) / double(1u << 20)); };
    per_rank = mib(mine), host = mib(mine * here), have = mib(available);
  }
  throw InputError(fmt::format("--strategy {} needs about {} per rank ({} for the {} rank{} on this host) but {} is "
                               "available; {}",
                               options.strategy.name(), per_rank, host, here, here == 1 ? "" : "s", have, advice));
}

MachineRates measure_machine(int threads, int ranks_here) {
  MachineRates m;
  m.threads = std::max(1, threads);
  const int before = dpt::threads();
  set_threads(m.threads);
  // 0.15 s each: enough runs that a host's passing sag seldom sets the peak.
  m.gemm_gflops = measure_gemm_gflops(DType::F32, 0.15);
  // bf16 inputs, on the backend in use: widened to fp32 where the CPU has no
  // bf16 kernels (slower than fp32), native where it has (faster).
  m.gemm_bf16_gflops = measure_gemm_gflops(DType::BF16, 0.15);
  set_threads(before);
  // The host's ranks copy at once (their collectives, their optimizer
  // steps): each gets its share of what that many threads copy together.
  const int n = std::max(1, ranks_here);
  m.copy_gbs = measure_memcpy_gbs(size_t{64} << 20, n) / n;
  return m;
}

}  // namespace dpt
