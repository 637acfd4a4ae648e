#include "parallel/traffic.h"

#include <set>

#include "comm/types.h"
#include "core/dtype.h"
#include "parallel/catalog.h"
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

CommPlan bucket_traffic(const StrategyOptions& o, const Model& model, int world, int rank) {
  CommPlan c;
  if (world < 2) return c;
  const RingSends ring{world, rank};
  const size_t red = dtype_size(o.ddp.reduce_dtype);  // --reduce-dtype bf16: half the bytes
  for (const Bucket& b : Reducer::assign(model.layout(), o.ddp)) c.backward += ring.ar(b.numel, red);
  c.logged_other = ring.ar(1, sizeof(float));  // the logged loss's average
  return c;
}

CommPlan zero_traffic(int stage, const StrategyOptions& o, const Model& model, int world, int rank,
                      int64_t grad_accum) {
  CommPlan c;
  if (world < 2) return c;
  const RingSends ring{world, rank};
  // Reductions move --reduce-dtype (bf16: half the bytes); parameter
  // all-gathers move the compute copies (bf16 under mixed precision).
  const size_t red = dtype_size(o.ddp.reduce_dtype), par = dtype_size(model.precision());
  uint64_t rs = 0, ag = 0;
  for (const Unit& u : model.layout().units()) {
    rs += ring.rs(u.numel, red);
    ag += ring.ag(u.numel, par);
  }
  const uint64_t micro = static_cast<uint64_t>(grad_accum);
  // Full gradients are reduced once, on the last micro-step; unit
  // gradients in scratch every micro-step.
  const uint64_t scattered = o.accumulate_locally ? rs : micro * rs;
  if (stage == 1) {
    c.backward = o.zero_scatter ? rs : bucket_traffic(o, model, world, rank).backward;
    c.optimizer = ag;  // the updated shards, all-gathered after the step
  } else if (stage == 2) {
    c.backward = scattered;
    c.optimizer = ag;
  } else {
    c.backward = scattered;
    zero3_gathers(o, model, ring, par, micro, c);
  }
  c.logged_other = ring.ar(1, sizeof(float));
  // Every rank's sum of squares, a double each, gathered as two floats.
  c.logged_optimizer = ring.ag(2 * static_cast<size_t>(world), sizeof(float));
  return c;
}

CommPlan planned_comm(const StrategyOptions& o, const Model& model, int world, int rank, int64_t grad_accum) {
  return o.strategy->traffic(o, model, world, rank, grad_accum);
}

CommPlan context_traffic(const Decoder& model, int64_t blocks, int64_t micro, int64_t grad_accum) {
  const DecoderConfig& c = model.config();
  const uint64_t cp = static_cast<uint64_t>(model.context_parallel());
  const int64_t kv = c.kv() / model.tp().size;  // this TP rank's key/value heads
  const uint64_t block =
      static_cast<uint64_t>(micro * model.local_rows(c.context) * 2 * kv * c.head_dim()) * sizeof(float);
  const uint64_t per_pass = block * static_cast<uint64_t>(blocks * grad_accum);
  CommPlan p;
  p.forward = (cp - 1) * per_pass;
  p.backward = (2 * cp - 1 + (model.checkpoint_activations() ? cp - 1 : 0)) * per_pass;
  return p;
}

}  // namespace dpt
