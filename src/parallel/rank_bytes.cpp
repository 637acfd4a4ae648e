#include "parallel/rank_bytes.h"

#include <algorithm>
#include <numeric>

#include "comm/types.h"
#include "optim/file_tier.h"
#include "parallel/catalog.h"

namespace dpt {

namespace {
// Units a zero3 rank holds gathered at once: the open one and the next
// (prefetched, or the one forward ends on, kept for backward).
constexpr size_t kGatheredAtOnce = 2;
// Unit gradients a zero2/3 backward holds at once before it waits for a
// reduce-scatter to give a buffer back: the unit being computed, one being
// reduced, and a third: another reduction in flight, or the GPT's tied
// embedding waiting for its second contribution.
constexpr size_t kGradBuffers = 3;

// The cheapest set of buffers from which a BufferPool (smallest free buffer
// that fits) can serve any k units at a time without growing, for units of
// these sizes, among three that always can:
//   - k buffers of the largest unit: anything fits anywhere;
//   - the largest unit's, and k of the second largest size: the k - 1 other
//     units held beside a request never take all k smaller buffers, so no
//     smaller unit ever takes the largest one's;
//   - one buffer per unit, at its size: by induction from the smallest size,
//     a unit always finds a free buffer of its own size.
std::vector<size_t> pool_for(size_t k, std::vector<size_t> sizes) {
  std::sort(sizes.begin(), sizes.end(), std::greater<>());
  if (sizes.empty()) return {};
  const size_t largest = sizes[0], second = sizes.size() > 1 ? sizes[1] : 0;
  std::vector<size_t> each_largest(k, largest), largest_and_second(1, largest);
  largest_and_second.insert(largest_and_second.end(), k, second);
  auto sum = [](const std::vector<size_t>& v) { return std::accumulate(v.begin(), v.end(), size_t{0}); };
  std::vector<size_t> best = sizes;
  for (const auto* c : {&each_largest, &largest_and_second})
    if (sum(*c) < sum(best)) best = *c;
  return best;
}

size_t bytes_of(const std::vector<size_t>& buffers) {
  return sizeof(float) * std::accumulate(buffers.begin(), buffers.end(), size_t{0});
}
}  // namespace

namespace {
// A bf16 unit in a pool of float buffers takes half as many, rounded up.
std::vector<size_t> halves(std::vector<size_t> v) {
  for (size_t& n : v) n = (n + 1) / 2;
  return v;
}

// Unit gradients in scratch: a unit a pass opens twice holds its gradients
// from its first backward opening to its last, so it gets a buffer of its
// own (the GPT's tied embedding is backward's first unit: it takes that
// buffer before any other unit asks); the other units share the rest, k at
// a time.
std::vector<size_t> grad_scratch(const Model& model, const std::vector<size_t>& sizes) {
  std::vector<int> opened(sizes.size(), 0);
  for (int u : model.unit_order()) ++opened[static_cast<size_t>(u)];
  std::vector<size_t> own, others;
  for (size_t u = 0; u < sizes.size(); ++u) (opened[u] > 1 ? own : others).push_back(sizes[u]);
  const size_t k = std::max<size_t>(2, kGradBuffers - std::min(kGradBuffers, own.size()));
  const std::vector<size_t> shared = pool_for(k, others);
  own.insert(own.end(), shared.begin(), shared.end());
  return own;
}
}  // namespace

ZeroPools zero_pools(const StrategyOptions& options, const Model& model) {
  const int stage = options.strategy->zero_stage;
  std::vector<size_t> sizes;
  for (const Unit& u : model.layout().units()) sizes.push_back(u.numel);
  ZeroPools p;
  // Without resharding every unit stays gathered from its forward to its
  // backward: one buffer each. Mixed precision gathers bf16 units.
  if (stage == 3) {
    p.gathered = options.reshard_after_forward ? pool_for(kGatheredAtOnce, sizes) : sizes;
    if (model.precision() == DType::BF16) p.gathered = halves(p.gathered);
  }
  // Accumulating locally (or zero1), unit gradients are reduced from the
  // full buffer.
  if (stage >= 2 && !options.accumulate_locally) p.scratch = grad_scratch(model, sizes);
  // --reduce-dtype bf16: each reduce-scatter in flight has a bf16 copy of
  // its unit; from scratch buffers, at most one per scratch buffer; from the
  // full gradients, possibly every unit at once.
  const bool scattered = stage >= 2 || (stage == 1 && options.zero_scatter);
  if (scattered && options.ddp.reduce_dtype == DType::BF16) p.wire = halves(p.scratch.empty() ? sizes : p.scratch);
  return p;
}

size_t optimizer_state_bytes(const OptimizerConfig& config, size_t n) {
  return sizeof(float) * state_floats(config) * n;
}

MemoryBytes rank_bytes(const StrategyOptions& options, const Model& model, int world, int rank) {
  return options.strategy->bytes(options, model, world, rank);
}

MemoryBytes sharded_bytes(const StrategyOptions& options, const Model& model, int world, int rank, int stage,
                          bool buckets) {
  const Layout& layout = model.layout();
  size_t shard = 0;
  for (const Unit& u : layout.units()) shard += comm::chunk_range(u.numel, world, rank).size;
  const size_t f = sizeof(float), full = layout.numel();
  const size_t owned = stage == 0 ? full : shard;  // the elements this rank steps
  const ZeroPools pools = zero_pools(options, model);
  MemoryBytes b;
  // Mixed precision (docs/precision.md): the bf16 compute copies are the
  // parameters; the fp32 masters count with the optimizer state.
  const bool mixed = model.precision() == DType::BF16;
  b.parameters = (mixed ? sizeof(bf16) : f) * (stage == 3 ? shard : full);
  b.gradients = f * (stage <= 1 ? full : shard + (options.accumulate_locally ? full : 0));
  b.optimizer = optimizer_state_bytes(options.optimizer, owned) + (mixed ? f * owned : 0);
  b.gathered = bytes_of(pools.gathered);
  b.scratch = bytes_of(pools.scratch) + bytes_of(pools.wire);
  // --reduce-dtype bf16 with DDP's buckets (ddp, zero1 by all-reduce): one
  // bf16 copy of the whole gradient buffer.
  if (buckets && options.ddp.reduce_dtype == DType::BF16) b.scratch += sizeof(bf16) * full;
  if (options.offload.what != Offload::None) {
    // The tier streams each optimizer's span through chunk buffers sized
    // for the longest span (the rank's largest unit chunk under ZeRO).
    size_t longest = full;
    if (stage > 0) {
      longest = 0;
      for (const Unit& u : layout.units()) longest = std::max(longest, comm::chunk_range(u.numel, world, rank).size);
    }
    // --offload params: the fp32 masters are one more tensor in the file.
    const bool masters = options.offload.what == Offload::Params && mixed;
    const size_t state = optimizer_state_bytes(options.optimizer, owned) + (masters ? f * owned : 0);
    b.offloaded = state;
    b.optimizer = b.optimizer - state +
                  offload_buffer_bytes(state_floats(options.optimizer) + (masters ? 1 : 0), longest,
                                       options.offload.chunk_bytes);
  }
  return b;
}

SharedWindows shared_windows(const StrategyOptions& options, const Model& model) {
  if (options.strategy->trains_one_replica()) return {};
  const size_t n = model.param_count();
  const bool wire = options.ddp.reduce_dtype == DType::BF16;
  const size_t reduced = n * (wire ? sizeof(bf16) : sizeof(float));  // what DDP's reducer all-reduces
  const size_t params = n * (model.precision() == DType::BF16 ? sizeof(bf16) : sizeof(float));
  // ZeRO's whole gradient buffer, reduce-scattered in place unless its bf16
  // copies (pooled) are what is reduced.
  const size_t grads = wire ? 0 : n * sizeof(float);
  switch (options.strategy->zero_stage) {
    case 0: return {reduced, true};
    case 1: return options.zero_scatter ? SharedWindows{grads + params, !wire} : SharedWindows{reduced + params, true};
    case 2: return {params + (options.accumulate_locally ? grads : 0), options.accumulate_locally && !wire};
    default: return {options.accumulate_locally ? grads : 0, false};
  }
}

}  // namespace dpt
