// The replicated strategies: local (one process) and DDP. Every rank holds
// the whole model, its gradients and its optimizer state in the model's own
// flat buffers; DDP all-reduces the gradients in buckets during backward
// (parallel/reducer.h) and every rank steps the whole model.
#include "parallel/replicated.h"

#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "comm/types.h"
#include "models/weights.h"
#include "parallel/catalog.h"
#include "parallel/rank_bytes.h"
#include "parallel/replicas.h"
#include "core/timeline.h"

namespace dpt {

LocalStrategy::LocalStrategy(const StrategyOptions& options, Model& model, comm::ProcessGroup& pg,
                             const StrategyInit& init, uint64_t seed_offset)
    : options_(options), model_(model), pg_(pg) {
  if (!init.load.empty())
    load_weights(model_, init.load, init.load_format);
  else
    model_.init_params(init.seed + seed_offset);
  model_.set_store(nullptr);
  tier_ = make_state_tier(options_.offload, pg_.rank(), model_.device());
  opt_ = make_optimizer(options_.optimizer, model_.layout(), 0, model_.param_count(), tier_.get());
  if (tier_->device() != model_.device())
    host_ = std::make_unique<HostUpdate>(model_.k(), model_.param_count());
}

std::string LocalStrategy::describe() const { return "local: one process holds everything"; }

// The optimizer zeroes every gradient it reads (GradsAfter::Zeroed), so after
// a step the buffer is already zero: one pass over it instead of two. Zeroed
// here only before the first step, or after a step that failed part-way.
void LocalStrategy::begin_step() {
  if (!grads_zero_) model_.zero_grads();
  grads_zero_ = false;
}

double LocalStrategy::grad_norm_squared() { return model_.grad_squares(model_.grads(), 0, model_.param_count()); }

void LocalStrategy::scale_grads(float factor) { model_.k().scale(model_.grads(), model_.param_count(), factor); }

// In a bf16 run the update writes the model's bf16 compute copy as it writes
// the fp32 parameters, instead of each unit converting them again when it
// next opens.
void LocalStrategy::step(float lr) {
  bf16* copy = model_.params16_for_update();
  if (host_)
    host_->step(*opt_, model_.params(), model_.grads(), copy, lr, GradsAfter::Zeroed);
  else
    opt_->step(model_.params(), model_.grads(), lr, GradsAfter::Zeroed, copy);
  if (copy) model_.params16_written();
  grads_zero_ = true;
}

void LocalStrategy::gather_unit(int unit, float* out) {
  const Unit& u = model_.layout().units()[static_cast<size_t>(unit)];
  model_.download_params(u.offset, u.numel, out);
}

std::vector<StateSpan> LocalStrategy::state_spans() {
  return {{.begin = 0, .n = model_.param_count(), .params = model_.params(), .optimizer = opt_.get(), .at = 0}};
}

void LocalStrategy::restored(int64_t optimizer_steps) {
  opt_->set_steps(optimizer_steps);
  if (host_) host_->stale();
}

nlohmann::json LocalStrategy::offload_detail() const { return with_host_updates(tier_->detail(), {host_.get()}); }

MemoryBytes LocalStrategy::bytes() const {
  const size_t p = model_.param_count() * sizeof(float);
  // Mixed precision: the model's bf16 copy is the parameters, its fp32
  // buffer the master weights, counted with the optimizer state (in RAM:
  // --offload optimizer moves only the state).
  const bool mixed = model_.precision() == DType::BF16;
  if (host_)  // on the GPU: the parameters (fp32, and a bf16 run's copy) and the gradients; the rest on the host
    return {.parameters = p + (mixed ? model_.param_count() * sizeof(bf16) : 0), .gradients = p,
            .offloaded = tier_->ram_bytes() + tier_->offloaded_bytes() + host_->host_bytes()};
  return {.parameters = mixed ? model_.param_count() * sizeof(bf16) : p, .gradients = p,
          .optimizer = tier_->ram_bytes() + (mixed ? p : 0), .offloaded = tier_->offloaded_bytes()};
}

// Ranks other than 0 start from other weights on purpose: DDP's initial
// broadcast must make them equal, and the replica check proves it did.
DdpStrategy::DdpStrategy(const StrategyOptions& options, Model& model, comm::ProcessGroup& pg,
                         const StrategyInit& init)
    : LocalStrategy(options, model, pg, init, 1000003ULL * static_cast<uint64_t>(pg.rank())) {
  pg_.broadcast(model_.params(), model_.param_count(), DType::F32, 0);
  verify_replicas(model_, pg_, 0);
  reducer_ = std::make_unique<Reducer>(model_, pg_, options_.ddp);
}

std::string DdpStrategy::describe() const {
  const auto& b = reducer_->buckets();
  return fmt::format("ddp: {} buckets (first {:.2f} MiB, cap {:.1f} MiB){}{}", b.size(),
                     b.front().numel * 4.0 / (1 << 20), options_.ddp.bucket_bytes / double(1 << 20),
                     options_.ddp.per_param ? ", one per parameter"
                                            : (options_.ddp.overlap ? ", overlapped with backward" : ", after backward"),
                     reducer_->in_place() ? ", all-reduced in place (shared window)" : "");
}

nlohmann::json DdpStrategy::detail() const {
  nlohmann::json buckets = nlohmann::json::array();
  for (const Bucket& b : reducer_->buckets()) buckets.push_back({{"offset", b.offset}, {"numel", b.numel}});
  return {{"buckets", buckets},
          {"overlap", options_.ddp.overlap},
          {"per_param", options_.ddp.per_param},
          {"in_place", reducer_->in_place()}};
}

float DdpStrategy::loss_scale() const { return 1.0f / static_cast<float>(pg_.size()); }

void DdpStrategy::begin_micro_step(bool last) { reducer_->prepare(last); }

double DdpStrategy::finish_backward() { return reducer_->finish(); }

void DdpStrategy::verify(int64_t step) { verify_replicas(model_, pg_, step); }

// Each replica writes and reads one chunk of everything (comm::chunk_range,
// the all-gather's own cut), so a checkpoint costs every rank 1/N of it.
std::vector<StateSpan> DdpStrategy::state_spans() {
  const comm::Range c = comm::chunk_range(model_.param_count(), pg_.size(), pg_.rank());
  return {{.begin = c.begin, .n = c.size, .params = model_.params() + c.begin, .optimizer = opt_.get(), .at = c.begin}};
}

void DdpStrategy::restored(int64_t optimizer_steps) {
  opt_->set_steps(optimizer_steps);
  if (host_) host_->stale();
  const size_t n = model_.param_count();
  pg_.all_gather(model_.params(), n, DType::F32);
  gather_optimizer_state(*opt_, pg_);
  verify_replicas(model_, pg_, 0);
}

void DdpStrategy::trace(Timeline& tl, int64_t step) const {
  const auto& buckets = reducer_->buckets();
  for (size_t i = 0; i < buckets.size(); ++i)
    if (buckets[i].work)
      tl.add(Timeline::AllReduce, step, static_cast<int>(i), buckets[i].numel * dtype_size(options_.ddp.reduce_dtype),
             buckets[i].work->started_at(), buckets[i].work->finished_at());
}

size_t DdpStrategy::trace_spans() const { return reducer_->buckets().size(); }

MemoryBytes DdpStrategy::bytes() const {
  MemoryBytes b = LocalStrategy::bytes();
  b.scratch = reducer_->wire_bytes();  // --reduce-dtype bf16: the gradients' bf16 copy
  return b;
}

StrategyRecord local_record() {
  StrategyRecord r;
  r.name = "local";
  r.help = "local";
  r.runs = StrategyRecord::Runs::OneProcess;
  r.fits_because = [](bool mesh) {
    return std::string(mesh ? "one replica's ranks (its tp x pp mesh) hold everything" : "one rank holds everything");
  };
  r.formula = [](const StrategyOptions&, int) { return std::string("one replica: nothing to reduce"); };
  r.make = [](const StrategyOptions& o, Model& m, comm::ProcessGroup& pg, const StrategyInit& init) {
    return std::make_unique<LocalStrategy>(o, m, pg, init);
  };
  // One replica: a data-parallel group of one (a rank, or a tp x pp mesh).
  r.refuse = [](const RunAsk& a) {
    if (a.dp > 1)
      throw InputError(fmt::format("--strategy local trains one process, but {} ranks were launched; use ddp", a.dp));
  };
  r.bytes = [](const StrategyOptions& o, const Model& m, int world, int rank) {
    return sharded_bytes(o, m, world, rank, 0, false);
  };
  r.traffic = [](const StrategyOptions&, const Model&, int, int, int64_t) { return CommPlan{}; };
  return r;
}

StrategyRecord ddp_record() {
  StrategyRecord r;
  r.name = "ddp";
  r.help = "ddp (default with several ranks)";
  r.reads = {{Setting::Buckets, "", nullptr}};
  r.fits_because = [](bool) {
    return std::string("the model, its gradients and optimizer state fit on every rank: DDP");
  };
  r.formula = [](const StrategyOptions&, int n) {
    return fmt::format("ring all-reduce over N = {} data-parallel rank{}: 2(N-1)/N = {:.3f}", n, n == 1 ? "" : "s",
                       2.0 * (n - 1) / n);
  };
  r.make = [](const StrategyOptions& o, Model& m, comm::ProcessGroup& pg, const StrategyInit& init) {
    return std::make_unique<DdpStrategy>(o, m, pg, init);
  };
  r.bytes = [](const StrategyOptions& o, const Model& m, int world, int rank) {
    return sharded_bytes(o, m, world, rank, 0, true);
  };
  r.traffic = [](const StrategyOptions& o, const Model& m, int world, int rank, int64_t) {
    return bucket_traffic(o, m, world, rank);
  };
  return r;
}

}  // namespace dpt
