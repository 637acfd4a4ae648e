#include "parallel/strategy.h"

#include <algorithm>
#include <vector>

#include "comm/types.h"
#include "core/error.h"
#include "optim/file_tier.h"
#include "parallel/replicated.h"
#include "parallel/zero.h"

namespace dpt {

Prefetch parse_prefetch(const std::string& s) {
  if (s == "none") return Prefetch::None;
  if (s == "forward") return Prefetch::Forward;
  if (s == "backward") return Prefetch::Backward;
  if (s == "both") return Prefetch::Both;
  throw InputError(fmt::format("unknown prefetch '{}' (expected none, forward, backward or both)", s));
}

const char* prefetch_name(Prefetch p) {
  static const char* kNames[] = {"none", "forward", "backward", "both"};
  return kNames[static_cast<int>(p)];
}

namespace {
int zero_stage(const std::string& name) {
  if (name == "zero1") return 1;
  if (name == "zero2") return 2;
  if (name == "zero3" || name == "fsdp") return 3;
  return 0;
}
}  // namespace

std::string default_strategy(int world) { return world > 1 ? "ddp" : "local"; }

std::unique_ptr<Strategy> make_strategy(const StrategyOptions& options, Model& model, comm::ProcessGroup& pg,
                                        const StrategyInit& init) {
  if (options.name == "local") {
    if (pg.size() > 1)
      throw InputError(fmt::format("--strategy local trains one process, but {} ranks were launched; use ddp",
                                   pg.size()));
    return std::make_unique<LocalStrategy>(options, model, pg, init);
  }
  if (options.name == "ddp") return std::make_unique<DdpStrategy>(options, model, pg, init);
  if (const int stage = zero_stage(options.name)) return std::make_unique<ZeroStrategy>(options, model, pg, init, stage);
  throw InputError(fmt::format("unknown strategy '{}' (expected local, ddp, zero1, zero2, zero3 or fsdp)", options.name));
}

MemoryBytes estimate_bytes(const StrategyOptions& options, const Model& model, int world) {
  const Layout& layout = model.layout();
  size_t shard = 0, max_unit = 0;  // rank 0's shard: the largest
  for (const Unit& u : layout.units()) {
    shard += comm::chunk_range(u.numel, world, 0).size;
    max_unit = std::max(max_unit, u.numel);
  }
  const size_t f = sizeof(float), full = layout.numel() * f;
  const size_t state_per_element = options.optimizer.name == "adamw" ? 2 * f : f;
  const int stage = zero_stage(options.name);
  // Mixed precision (docs/precision.md): bf16 compute copies are the
  // parameters; the fp32 masters count with the optimizer state.
  const bool mixed = model.precision() == DType::BF16;
  const size_t owned = stage == 0 ? layout.numel() : shard;  // elements this rank steps
  MemoryBytes b;
  if (mixed)
    b.parameters = (stage == 3 ? shard : layout.numel()) * sizeof(bf16);
  else
    b.parameters = stage == 3 ? shard * f : full;
  b.gradients = stage <= 1 ? full : shard * f + (options.accumulate_locally ? full : 0);
  b.optimizer = owned * state_per_element + (mixed ? owned * f : 0);
  // zero.cpp's pools: gradient scratch grows to at most kGradBuffers (3)
  // largest units; at most two units are gathered at once (the open one and
  // the prefetched or kept next one), in buffers of their own sizes, so at
  // most two buffers of each size; without resharding every unit stays
  // gathered: the whole model. A gathered bf16 unit takes half as many
  // floats, rounded up.
  if (stage >= 2 && !options.accumulate_locally) b.scratch = 3 * max_unit * f;
  auto gathered_bytes = [&](size_t n) { return (mixed ? (n + 1) / 2 : n) * f; };
  size_t bf16_units = 0;  // every unit's bf16 copy, in floats rounded up
  for (const Unit& u : layout.units()) bf16_units += (u.numel + 1) / 2 * f;
  // --reduce-dtype bf16: the bf16 copies the reductions run on. DDP's
  // buckets (and zero1's) have one for the whole gradient buffer; a
  // reduce-scatter's lives while it is in flight: with unit scratch at most
  // as many as there are scratch buffers (half their bytes), with full
  // gradients possibly every unit at once.
  if (options.ddp.reduce_dtype == DType::BF16 && stage <= 1 && !(stage == 1 && options.zero_scatter))
    b.scratch += layout.numel() * sizeof(bf16);
  else if (options.ddp.reduce_dtype == DType::BF16 && stage >= 1)
    b.scratch += b.scratch > 0 ? 3 * (max_unit + 1) / 2 * f : bf16_units;
  if (stage == 3) {
    std::vector<size_t> sizes;
    size_t all_units = 0;
    for (const Unit& u : layout.units()) {
      sizes.push_back(u.numel);
      all_units += gathered_bytes(u.numel);
    }
    std::sort(sizes.begin(), sizes.end());
    sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
    size_t two_each = 0;
    for (size_t n : sizes) two_each += 2 * gathered_bytes(n);
    b.gathered = options.reshard_after_forward ? std::min(all_units, two_each) : all_units;
  }
  apply_offload(b, options, model, world, owned * state_per_element);
  return b;
}

// --offload optimizer: the state goes to a file (optim/file_tier.h) and RAM
// keeps the tier's chunk buffers, sized for the longest span an optimizer
// covers (the whole model when replicated, a unit's chunk under ZeRO). The
// fp32 masters of mixed precision stay in RAM (--offload params: not yet).
void apply_offload(MemoryBytes& b, const StrategyOptions& options, const Model& model, int world,
                   size_t state_bytes) {
  if (options.offload.what.empty()) return;
  size_t longest = model.layout().numel();
  if (zero_stage(options.name) > 0) {
    longest = 0;
    for (const Unit& u : model.layout().units()) longest = std::max(longest, comm::chunk_range(u.numel, world, 0).size);
  }
  const size_t tensors = options.optimizer.name == "adamw" ? 2 : 1;
  b.offloaded = state_bytes;
  b.optimizer = b.optimizer - state_bytes + offload_buffer_bytes(tensors, longest, options.offload.chunk_bytes);
}

namespace {
// "15.7 GiB", "38.2 MiB": GiB from 1 GiB up, so small models read sensibly.
std::string human_bytes(size_t bytes) {
  const double b = static_cast<double>(bytes);
  return b >= double(1u << 30) ? fmt::format("{:.1f} GiB", b / double(1u << 30))
                               : fmt::format("{:.1f} MiB", b / double(1u << 20));
}
}  // namespace

void check_fits(const StrategyOptions& options, const Model& model, size_t activation_bytes, int world,
                int ranks_here, size_t available) {
  const size_t here = static_cast<size_t>(ranks_here);
  auto need = [&](const std::string& name) {
    StrategyOptions s = options;
    s.name = name;
    return estimate_bytes(s, model, world).total() + activation_bytes;
  };
  const size_t mine = need(options.name);
  if (mine * here <= available) return;
  std::string advice = "no strategy fits: add ranks on other hosts, or shrink the model or batch";
  for (const char* name : {"ddp", "zero1", "zero2", "zero3"})
    if (need(name) * here <= available) {
      advice = fmt::format("--strategy {} would fit (about {} per rank)", name, human_bytes(need(name)));
      break;
    }
  throw InputError(fmt::format("--strategy {} needs about {} per rank ({} for the {} rank{} on this host) but {} is "
                               "available; {}",
                               options.name, human_bytes(mine), human_bytes(mine * here), here, here == 1 ? "" : "s",
                               human_bytes(available), advice));
}

}  // namespace dpt
