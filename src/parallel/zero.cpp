#include "parallel/zero.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>

#include <fmt/format.h>

#include "core/error.h"
#include "io/safetensors.h"
#include "models/weights.h"
#include "parallel/catalog.h"
#include "parallel/rank_bytes.h"
#include "parallel/replicas.h"

namespace dpt {

void ZeroStrategy::place_in_windows() {
  if (model_.device() != Device::CPU) return;
  const size_t n = layout_.numel();
  // The model's whole gradients, reduce-scattered unit by unit (unless
  // ZeRO-1's all-reduce reducer has put them in its own group's window, or
  // their bf16 copies in the wire pool are what is reduced).
  if (full_grads() && !reducer_ && !wire_bf16())
    if (auto shared = spg_.shared_memory(n * sizeof(float))) model_.place_grads(FlatBuffer(std::move(shared), n));
  if (stage_ == 3) return;  // its gathers go into pool buffers
  // The updated parameters, all-gathered unit by unit after each step: the
  // fp32 ones, or a mixed run's bf16 compute copy.
  if (!mixed_) {
    if (auto shared = spg_.shared_memory(n * sizeof(float))) model_.place_params(FlatBuffer(std::move(shared), n));
  } else if (auto shared = spg_.shared_memory(n * sizeof(bf16))) {
    params16_ = FlatBuffer(std::move(shared), n, DType::BF16);
  }
}

void BufferPool::reserve(const std::vector<size_t>& sizes) {
  for (size_t n : sizes) {
    bufs_.emplace_back(n, DType::F32, device_);
    free_.push_back(true);
  }
}

int BufferPool::take(size_t numel) {
  int best = -1;
  for (size_t i = 0; i < bufs_.size(); ++i)
    if (free_[i] && bufs_[i].numel() >= numel && (best < 0 || bufs_[i].numel() < bufs_[static_cast<size_t>(best)].numel()))
      best = static_cast<int>(i);
  if (best < 0) {
    bufs_.emplace_back(numel, DType::F32, device_);
    free_.push_back(false);
    return static_cast<int>(bufs_.size() - 1);
  }
  free_[static_cast<size_t>(best)] = false;
  return best;
}

bool BufferPool::fits(size_t numel) const {
  for (size_t i = 0; i < bufs_.size(); ++i)
    if (free_[i] && bufs_[i].numel() >= numel) return true;
  return false;
}

size_t BufferPool::bytes() const {
  size_t b = 0;
  for (const FlatBuffer& f : bufs_) b += f.numel() * sizeof(float);
  return b;
}

namespace {
// hsdp's groups: shard groups of consecutive ranks (one host's, by default),
// replica groups of the ranks at the same place in each (collective: every
// rank splits twice, in this order).
std::unique_ptr<comm::ProcessGroup> hsdp_group(const StrategyOptions& o, comm::ProcessGroup& pg, bool shard) {
  if (!o.strategy->shard_groups) return nullptr;
  const int s = o.shard_group;
  return pg.split(shard ? pg.rank() / s : pg.rank() % s, pg.rank(), shard ? "shard" : "replica");
}
}  // namespace

ZeroStrategy::ZeroStrategy(const StrategyOptions& options, Model& model, comm::ProcessGroup& pg,
                           const StrategyInit& init, int stage)
    : options_(options),
      stage_(stage),
      model_(model),
      mixed_(model.precision() == DType::BF16),
      pg_(pg),
      shard_group_(hsdp_group(options, pg, true)),
      replica_group_(hsdp_group(options, pg, false)),
      spg_(shard_group_ ? *shard_group_ : pg),
      layout_(model.layout()),
      world_(spg_.size()),
      rank_(spg_.rank()) {
  tier_ = make_state_tier(options_.offload, rank_, model_.device());
  for (BufferPool* p : {&gather_pool_, &grad_pool_, &wire_pool_}) p->place(model_.device());
  for (FlatBuffer* b : {&param_shard_, &grad_shard_, &params16_}) b->place(model_.device());
  make_shards();
  const size_t U = layout_.units().size();
  grads_.resize(U);
  gathered_.resize(U);
  param_gather_.resize(U);
  norm_parts_.resize(static_cast<size_t>(world_));
  traced_.reserve(trace_spans());

  // Initial weights: the same values under every strategy and world size
  // (Model::init_range is keyed by element position), each rank filling
  // what it holds: the whole model (stages 1, 2) or its shards (stage 3,
  // and the masters of a mixed run).
  if (!sharded_params()) {
    if (!init.load.empty())
      load_weights(model_, init.load, init.load_format);
    else
      model_.init_params(init.seed);
  } else if (!masters_offloaded()) {
    param_shard_.reserve(shard_numel_);
    // Filled on the host (a GPU run's shards uploaded at the end).
    const bool host = model_.device() == Device::CPU;
    std::vector<float> staged(host ? 0 : shard_numel_);
    std::optional<SafetensorsSet> file;
    if (!init.load.empty()) file.emplace(init.load);
    for (size_t u = 0; u < U; ++u)
      init_shard(static_cast<int>(u), init, file ? &*file : nullptr,
                 host ? param_shard(static_cast<int>(u)) : staged.data() + shards_[u].at);
    if (!host) model_.k().upload(param_shard_.f32(), staged.data(), staged.size() * sizeof(float));
  }
  if (stage_ >= 2) grad_shard_.reserve(shard_numel_);
  const ZeroPools pools = zero_pools(options_, model_);
  gather_pool_.reserve(pools.gathered);
  grad_pool_.reserve(pools.scratch);
  wire_pool_.reserve(pools.wire);
  if (full_grads()) model_.zero_grads();
  if (stage_ == 1 && !options_.zero_scatter) reducer_ = std::make_unique<Reducer>(model_, pg_, options_.ddp);
  place_in_windows();
  model_.set_store(this);
  if (mixed_) {
    params16_.reserve(stage_ == 3 ? shard_numel_ : layout_.numel());
    if (masters_offloaded()) {
      // Each unit's masters made in a unit-sized buffer, written to the
      // tier and published from there: the shard is never whole in RAM.
      std::optional<SafetensorsSet> file;
      if (!init.load.empty()) file.emplace(init.load);
      std::vector<float> unit_masters;
      for (size_t u = 0; u < U; ++u) {
        unit_masters.resize(shards_[u].n);
        init_shard(static_cast<int>(u), init, file ? &*file : nullptr, unit_masters.data());
        opts_[u]->write_state(opts_[u]->master_tensor(), 0, unit_masters.size(), unit_masters.data());
        publish(static_cast<int>(u), unit_masters.data());
      }
    } else {
      for (size_t u = 0; u < U; ++u) publish(static_cast<int>(u));
    }
  }
  verify(0);
}

// This rank's shard of each unit, its optimizer, and for a GPU run whose
// state is on the host (--offload optimizer) its update there.
void ZeroStrategy::make_shards() {
  for (const Unit& u : layout_.units()) {
    const comm::Range r = comm::chunk_range(u.numel, world_, rank_);
    shards_.push_back({r.begin, r.size, shard_numel_});
    shard_numel_ += r.size;
    opts_.push_back(
        make_optimizer(options_.optimizer, layout_, u.offset + r.begin, r.size, tier_.get(), masters_offloaded()));
    if (tier_->device() != model_.device()) hosts_.push_back(std::make_unique<HostUpdate>(model_.k(), r.size));
  }
}

ZeroStrategy::~ZeroStrategy() {
  // Never leave the communication thread writing into buffers we free;
  // errors were already reported where they were waited for.
  auto quiet_wait = [](const std::shared_ptr<comm::Work>& w) {
    if (w) try {
        w->wait();
      } catch (const std::exception&) {
      }
  };
  for (const auto& w : param_gather_) quiet_wait(w);
  for (const auto& g : grads_) quiet_wait(g.work);
  for (const auto& g : gathered_) quiet_wait(g.work);
  reducer_.reset();
  model_.set_store(nullptr);
}

std::string ZeroStrategy::describe() const {
  std::string how;
  if (stage_ == 1)
    how = options_.zero_scatter ? "gradients reduce-scattered per unit" : "gradients all-reduced in DDP's buckets";
  else
    how = fmt::format("gradients reduce-scattered per unit{}",
                      options_.accumulate_locally ? " once per step (accumulated locally)" : "");
  if (stage_ == 3) {
    how += fmt::format(", parameters gathered per unit ({} after forward, prefetch {})",
                       options_.reshard_after_forward ? "freed" : "kept", prefetch_name(options_.prefetch));
  }
  if (replica_group_)
    how += fmt::format(", each gradient shard all-reduced across the {} shard groups", replica_group_->size());
  return fmt::format("{}: {} units sharded over {} ranks ({} of {} elements here), {}", options_.strategy.name(),
                     layout_.units().size(), world_, shard_numel_, layout_.numel(), how);
}

nlohmann::json ZeroStrategy::detail() const {
  nlohmann::json units = nlohmann::json::array();
  for (size_t u = 0; u < shards_.size(); ++u)
    units.push_back({{"name", layout_.units()[u].name}, {"offset", layout_.units()[u].offset},
                     {"numel", layout_.units()[u].numel}, {"shard_begin", shards_[u].begin},
                     {"shard_numel", shards_[u].n}});
  return {{"stage", stage_}, {"units", units}, {"shard_group", world_},
          {"replicas", replica_group_ ? replica_group_->size() : 1}, {"zero_scatter", options_.zero_scatter},
          {"accumulate_locally", options_.accumulate_locally},
          {"reshard_after_forward", options_.reshard_after_forward},
          {"prefetch", prefetch_name(options_.prefetch)}};
}

void ZeroStrategy::init_shard(int u, const StrategyInit& init, const SafetensorsSet* file, float* out) {
  const size_t begin = unit(u).offset + shards_[static_cast<size_t>(u)].begin, n = shards_[static_cast<size_t>(u)].n;
  if (file) {  // each rank reads only its shards' bytes
    if (u == 0) check_weight_file(model_, *file, init.load_format);
    load_weight_range(model_, *file, begin, n, out, init.load_format);
  } else {
    model_.init_range(init.seed, begin, n, out);
  }
}

float* ZeroStrategy::param_shard(int u) {
  const Shard& s = shards_[static_cast<size_t>(u)];
  return sharded_params() ? param_shard_.f32() + s.at : model_.params() + unit(u).offset + s.begin;
}

bf16* ZeroStrategy::compute_chunk(int u) {
  const Shard& s = shards_[static_cast<size_t>(u)];
  return stage_ == 3 ? params16_.b16() + s.at : params16_.b16() + unit(u).offset + s.begin;
}

void ZeroStrategy::publish(int u, const float* masters) {
  model_.k().convert(compute_chunk(u), masters ? masters : param_shard(u), shards_[static_cast<size_t>(u)].n);
  start_param_gather(u);
}

void ZeroStrategy::start_param_gather(int u) {
  if (stage_ == 3) return;
  param_gather_[static_cast<size_t>(u)] = spg_.all_gather_async(params16_.b16() + unit(u).offset, unit(u).numel, DType::BF16);
  record(Timeline::AllGather, u, param_gather_[static_cast<size_t>(u)]);
}

float* ZeroStrategy::grad_shard(int u) {
  const Shard& s = shards_[static_cast<size_t>(u)];
  return stage_ == 1 ? model_.grads() + unit(u).offset + s.begin : grad_shard_.f32() + s.at;
}

void ZeroStrategy::wait_timed(const std::shared_ptr<comm::Work>& w) {
  const auto t0 = std::chrono::steady_clock::now();
  w->wait();
  gather_wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void ZeroStrategy::wait_param_gather(int u) {
  if (auto& w = param_gather_[static_cast<size_t>(u)]) {
    wait_timed(w);
    w.reset();
  }
}

double ZeroStrategy::take_gather_wait() {
  const double s = gather_wait_s_;
  gather_wait_s_ = 0.0;
  return s;
}

void ZeroStrategy::record(Timeline::Kind kind, int u, const std::shared_ptr<comm::Work>& w) {
  if (traced_.size() < traced_.capacity()) traced_.push_back({kind, u, w});
}

void ZeroStrategy::trace(Timeline& tl, int64_t step) const {
  for (const Traced& t : traced_)
    tl.add(t.kind, step, t.unit,
           unit(t.unit).numel * (t.kind == Timeline::AllGather ? gather_elem_bytes() : dtype_size(options_.ddp.reduce_dtype)),
           t.work->started_at(), t.work->finished_at());
}

// ---------------------------------------------------------------- the step

void ZeroStrategy::begin_step() {
  traced_.clear();
  if (full_grads()) model_.zero_grads();
  if (stage_ >= 2) grad_shard_.zero();
}

void ZeroStrategy::begin_micro_step(bool last) {
  while (!inflight_.empty()) complete_oldest();
  // Full gradients accumulate locally until the step's last micro-step
  // (stage 1 always, like DDP's no_sync; stages 2, 3 when asked); unit
  // gradients in scratch are reduced every micro-step.
  sync_ = full_grads() ? last : true;
  if (reducer_) reducer_->prepare(last);
}

double ZeroStrategy::finish_backward() {
  if (reducer_) return reducer_->finish();
  const auto t0 = std::chrono::steady_clock::now();
  while (!inflight_.empty()) complete_oldest();
  for (size_t u = 0; u < grads_.size(); ++u)
    DPT_CHECK(grads_[u].pending == 0, "unit {} still waits for {} gradients after backward", u, grads_[u].pending);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void ZeroStrategy::complete_oldest() {
  const int u = inflight_.front();
  inflight_.pop_front();
  UnitGrads& g = grads_[static_cast<size_t>(u)];
  g.work->wait();
  g.work.reset();
  const Shard& s = shards_[static_cast<size_t>(u)];
  float* dst = grad_shard(u);
  if (replica_group_) {
    // hsdp: this chunk summed over the shard group; now over the replicas too.
    if (g.wire >= 0)
      replica_group_->all_reduce(reinterpret_cast<bf16*>(wire_pool_.data(g.wire)) + s.begin, s.n, DType::BF16,
                                 comm::ReduceOp::Sum);
    else
      replica_group_->all_reduce((full_grads() ? model_.grads() + unit(u).offset : grad_pool_.data(g.buf)) + s.begin,
                                 s.n, DType::F32, comm::ReduceOp::Sum);
  }
  if (g.wire >= 0) {
    // Reduced in bf16: this rank's chunk widened, into the full gradients'
    // chunk (stage 1: replaced, as the in-place fp32 reduction would) or
    // added to the shard (stages 2, 3).
    DPT_CHECK(model_.device() == Device::CPU, "bf16 reductions of GPU gradients are not built");
    const bf16* w = reinterpret_cast<const bf16*>(wire_pool_.data(g.wire)) + s.begin;
    if (stage_ == 1)
      for (size_t i = 0; i < s.n; ++i) dst[i] = to_f32(w[i]);
    else
      for (size_t i = 0; i < s.n; ++i) dst[i] += to_f32(w[i]);
    wire_pool_.give(g.wire);
    g.wire = -1;
  } else if (stage_ > 1) {
    // This rank's chunk of the reduced unit, added to its gradient shard
    // (micro-steps accumulate there); stage 1 reduced in place.
    const float* src = (full_grads() ? model_.grads() + unit(u).offset : grad_pool_.data(g.buf)) + s.begin;
    model_.k().residual_forward(dst, dst, src, static_cast<int64_t>(s.n));  // dst += src
  }
  if (g.buf >= 0) {
    grad_pool_.give(g.buf);
    g.buf = -1;
  }
}

double ZeroStrategy::grad_norm_squared() {
  double mine = 0.0;
  for (size_t u = 0; u < shards_.size(); ++u)
    mine += model_.grad_squares(grad_shard(static_cast<int>(u)), unit(static_cast<int>(u)).offset + shards_[u].begin,
                                shards_[u].n);
  // Every rank's sum, added in rank order in double, so all ranks agree
  // exactly (all_gather moves bytes: a double travels as two floats).
  std::fill(norm_parts_.begin(), norm_parts_.end(), 0.0);
  norm_parts_[static_cast<size_t>(rank_)] = mine;
  // (hsdp: within the shard group; the other groups hold the same shards.)
  spg_.all_gather(norm_parts_.data(), 2 * norm_parts_.size(), DType::F32);
  double total = 0.0;
  for (double v : norm_parts_) total += v;
  return total;
}

void ZeroStrategy::scale_grads(float factor) {
  for (size_t u = 0; u < shards_.size(); ++u) model_.k().scale(grad_shard(static_cast<int>(u)), shards_[u].n, factor);
}

void ZeroStrategy::update_shards(float lr) {
  for (size_t u = 0; u < shards_.size(); ++u) {
    const int ui = static_cast<int>(u);
    // bf16: each chunk's copy is written by the update as it writes the
    // masters (from the tier when offloaded), no conversion pass after.
    if (!hosts_.empty())  // a GPU's shard, updated on the host
      hosts_[u]->step(*opts_[u], param_shard(ui), grad_shard(ui), mixed_ ? compute_chunk(ui) : nullptr, lr,
                      GradsAfter::Kept);
    else if (masters_offloaded())
      opts_[u]->prepare(nullptr, grad_shard(ui), lr, compute_chunk(ui));
    else
      opts_[u]->prepare(param_shard(ui), grad_shard(ui), lr, mixed_ ? compute_chunk(ui) : nullptr);
  }
  if (hosts_.empty()) step_prepared(opts_);  // one pass of the tier: an offloaded unit's state is read while the last is updated
}

void ZeroStrategy::step(float lr) {
  update_shards(lr);
  if (masters_offloaded() || mixed_)
    for (size_t u = 0; u < shards_.size(); ++u) start_param_gather(static_cast<int>(u));
  if (stage_ == 3 || mixed_) return;
  // Stages 1, 2: every rank's updated chunk of each unit goes to every rank,
  // in place. Nothing waits here: the next forward waits for each unit as
  // it opens it, so the all-gathers run behind the forward of earlier units.
  for (size_t u = 0; u < shards_.size(); ++u) {
    param_gather_[u] = spg_.all_gather_async(model_.params() + layout_.units()[u].offset,
                                            layout_.units()[u].numel, DType::F32);
    record(Timeline::AllGather, static_cast<int>(u), param_gather_[u]);
  }
}

void ZeroStrategy::gather_unit(int u, float* out) {
  if (!sharded_params()) {
    wait_param_gather(u);
    model_.download_params(unit(u).offset, unit(u).numel, out);
    return;
  }
  const Shard& s = shards_[static_cast<size_t>(u)];
  if (masters_offloaded())
    opts_[static_cast<size_t>(u)]->read_state(opts_[static_cast<size_t>(u)]->master_tensor(), 0, s.n, out + s.begin);
  else
    model_.k().download(out + s.begin, param_shard(u), s.n * sizeof(float));
  spg_.all_gather(out, unit(u).numel, DType::F32);
}

void ZeroStrategy::verify(int64_t step) {
  if (stage_ == 3) return;  // no replicas: every rank holds other shards
  for (size_t u = 0; u < param_gather_.size(); ++u) wait_param_gather(static_cast<int>(u));
  if (mixed_) {
    std::vector<char> host(model_.device() == Device::CPU ? 0 : params16_.bytes());
    if (!host.empty()) model_.k().download(host.data(), params16_.b16(), host.size());
    verify_replicas(host.empty() ? static_cast<const void*>(params16_.b16()) : host.data(), params16_.bytes(), pg_,
                    step);
  } else
    verify_replicas(model_, pg_, step);
}

// A rank's shards: the parameters it updates and their optimizer state.
std::vector<StateSpan> ZeroStrategy::state_spans() {
  std::vector<StateSpan> spans;
  for (size_t u = 0; u < shards_.size(); ++u) {
    const int ui = static_cast<int>(u);
    if (stage_ < 3) wait_param_gather(ui);  // the last step's all-gather still writes the other chunks
    spans.push_back({.begin = unit(ui).offset + shards_[u].begin, .n = shards_[u].n,
                     .params = masters_offloaded() ? nullptr : param_shard(ui), .optimizer = opts_[u].get(), .at = 0});
  }
  return spans;
}

void ZeroStrategy::restored(int64_t optimizer_steps) {
  for (auto& o : opts_) o->set_steps(optimizer_steps);
  for (auto& h : hosts_) h->stale();
  if (mixed_) {  // the bf16 copies follow the masters just read
    std::vector<float> unit_masters;  // --offload params: a unit's masters at a time, out of the tier
    for (size_t u = 0; u < shards_.size(); ++u) {
      if (masters_offloaded()) {
        unit_masters.resize(shards_[u].n);
        opts_[u]->read_state(opts_[u]->master_tensor(), 0, unit_masters.size(), unit_masters.data());
      }
      publish(static_cast<int>(u), masters_offloaded() ? unit_masters.data() : nullptr);
    }
    verify(0);
    return;
  }
  if (stage_ == 3) return;
  // Stages 1, 2 keep full parameters: every rank read its chunk of each unit.
  for (const Unit& u : layout_.units()) pg_.all_gather(model_.params() + u.offset, u.numel, DType::F32);
  verify_replicas(model_, pg_, 0);
}

MemoryBytes ZeroStrategy::bytes() const {
  const size_t full = layout_.numel() * sizeof(float), shard = shard_numel_ * sizeof(float);
  MemoryBytes b;
  // Mixed precision: the parameters are the bf16 copies; the fp32 masters
  // count with the optimizer state (WORKLOADS.md's K = 12 for AdamW).
  b.parameters = mixed_ ? params16_.bytes() : (stage_ == 3 ? shard : full);
  b.gradients = (stage_ == 1 ? full : shard) + (stage_ >= 2 && options_.accumulate_locally ? full : 0);
  // (--offload params: the masters are in the tier's file, counted offloaded.)
  b.optimizer = tier_->ram_bytes() + (mixed_ && !masters_offloaded() ? shard : 0);
  b.offloaded = tier_->offloaded_bytes();
  if (!hosts_.empty()) {  // on the GPU: the fp32 shard stays (the parameters); the state is the host's
    b.parameters += mixed_ ? shard : 0;
    b.optimizer = 0;
    b.offloaded += tier_->ram_bytes();
    for (const auto& h : hosts_) b.offloaded += h->host_bytes();
  }
  b.gathered = gather_pool_.bytes();
  b.scratch = grad_pool_.bytes() + wire_pool_.bytes() + (reducer_ ? reducer_->wire_bytes() : 0);
  return b;
}

nlohmann::json ZeroStrategy::offload_detail() const {
  std::vector<const HostUpdate*> hosts;
  for (const auto& h : hosts_) hosts.push_back(h.get());
  return with_host_updates(tier_->detail(), hosts);
}

// ---------------------------------------------------------------- the model's units

void ZeroStrategy::begin_pass(Pass pass, int part) {
  // A part's first pass has ended: its order is recorded.
  if (key_ >= 2 && !order_[key_].empty()) done_[key_] = 1;
  pass_ = pass;
  pos_ = 0;
  key_ = 2 * static_cast<size_t>(part) + (pass == Pass::Forward ? 0 : 1);
  if (key_ >= order_.size()) {
    order_.resize(key_ + 1);
    done_.resize(key_ + 1, 0);
  }
  if (part > 0) multi_part_ = true;
  if (key_ >= 2 || multi_part_) {
    // Several parts: the next pass is the schedule's choice, so what is
    // still gathered from the last one (but this pass's first unit) is freed.
    const int first = recorded() && !order_[key_].empty() ? order_[key_][0] : -1;
    if (stage_ == 3)
      for (size_t u = 0; u < gathered_.size(); ++u)
        if (gathered_[u].buf >= 0 && gathered_[u].refs == 0 && static_cast<int>(u) != first)
          free_gathered(static_cast<int>(u));
    if (key_ >= 2) return;
  }
  if (pass != Pass::Forward) return;
  // The first forward after a backward has both orders recorded; until
  // then a forward restarts its recording (an evaluation may come first).
  if (!recorded_) {
    if (!order_[1].empty())
      recorded_ = true;
    else
      order_[0].clear();
  }
  // Units still gathered from the last pass (kept, or prefetched for a
  // backward that an evaluation's forward never ran) are freed.
  if (stage_ == 3 && !multi_part_)
    for (size_t u = 0; u < gathered_.size(); ++u)
      if (gathered_[u].buf >= 0 && gathered_[u].refs == 0) free_gathered(static_cast<int>(u));
}

int ZeroStrategy::next_unit() const {
  const auto& order = order_[key_];
  if (pos_ < order.size()) return order[pos_];
  if (key_ == 0 && !multi_part_ && !order_[1].empty()) return order_[1][0];
  return -1;
}

void ZeroStrategy::start_gather(int u) {
  Gathered& g = gathered_[static_cast<size_t>(u)];
  const size_t numel = unit(u).numel;
  const Shard& s = shards_[static_cast<size_t>(u)];
  // A pool buffer of floats; a bf16 unit takes half as many.
  g.buf = gather_pool_.take(mixed_ ? (numel + 1) / 2 : numel);
  void* b = gather_pool_.data(g.buf);
  if (mixed_)
    model_.k().copy(static_cast<bf16*>(b) + s.begin, params16_.b16() + s.at, s.n * sizeof(bf16));
  else
    model_.k().copy(static_cast<float*>(b) + s.begin, param_shard_.f32() + s.at, s.n * sizeof(float));
  g.work = spg_.all_gather_async(b, numel, mixed_ ? DType::BF16 : DType::F32);
  record(Timeline::AllGather, u, g.work);
}

void ZeroStrategy::free_gathered(int u) {
  Gathered& g = gathered_[static_cast<size_t>(u)];
  if (g.work) {
    g.work->wait();
    g.work.reset();
  }
  gather_pool_.give(g.buf);
  g.buf = -1;
}

const bf16* ZeroStrategy::acquire_bf16(int u) {
  DPT_CHECK(mixed_, "bf16 parameters asked of an fp32 {} run", options_.strategy.name());
  if (stage_ < 3) {
    record_open(u);
    wait_param_gather(u);
    return params16_.b16() + unit(u).offset;
  }
  return static_cast<const bf16*>(static_cast<const void*>(acquire(u)));
}

const float* ZeroStrategy::acquire(int u) {
  record_open(u);
  if (stage_ < 3) {
    wait_param_gather(u);
    return model_.params() + unit(u).offset;
  }
  Gathered& g = gathered_[static_cast<size_t>(u)];
  if (g.buf < 0) start_gather(u);
  if (g.work) {
    wait_timed(g.work);
    g.work.reset();
  }
  ++g.refs;
  // Prefetch: the next unit's all-gather runs while this one computes.
  if (recorded()) {
    const int next = next_unit();
    const bool in_forward = pass_ == Pass::Forward && pos_ < order_[key_].size();
    const Prefetch p = options_.prefetch;
    const bool allowed = p == Prefetch::Both || (p == Prefetch::Forward && in_forward) ||
                         (p == Prefetch::Backward && !in_forward);
    if (allowed && next >= 0 && gathered_[static_cast<size_t>(next)].buf < 0) start_gather(next);
  }
  return gather_pool_.data(g.buf);
}

void ZeroStrategy::release(int u) {
  if (stage_ < 3) return;
  Gathered& g = gathered_[static_cast<size_t>(u)];
  DPT_CHECK(g.refs > 0, "unit {} released more often than acquired", u);
  if (--g.refs > 0) return;
  const bool keep = (pass_ == Pass::Forward && !options_.reshard_after_forward) || (recorded() && next_unit() == u);
  if (!keep) free_gathered(u);
}

float* ZeroStrategy::unit_grads(int u) {
  if (full_grads()) return model_.grads() + unit(u).offset;
  UnitGrads& g = grads_[static_cast<size_t>(u)];
  if (g.buf < 0) {
    // Wait for a reduce-scatter to give a reserved buffer back rather than
    // grow the pool past what the memory estimate counted.
    while (!grad_pool_.fits(unit(u).numel) && !inflight_.empty()) complete_oldest();
    g.buf = grad_pool_.take(unit(u).numel);
    model_.k().zero(grad_pool_.data(g.buf), unit(u).numel * sizeof(float));
  }
  return grad_pool_.data(g.buf);
}

void ZeroStrategy::grads_ready(size_t offset, size_t numel) {
  if (reducer_) {  // stage 1 with DDP's buckets
    if (model_.on_grads_ready) model_.on_grads_ready(offset, numel);
    return;
  }
  const auto& units = layout_.units();
  const auto it = std::upper_bound(units.begin(), units.end(), offset,
                                   [](size_t off, const Unit& un) { return off < un.offset; });
  const int u = static_cast<int>(it - units.begin()) - 1;
  DPT_CHECK(u >= 0 && offset + numel <= unit(u).offset + unit(u).numel,
            "gradients {}..{} reported ready cross a unit boundary", offset, offset + numel);
  UnitGrads& g = grads_[static_cast<size_t>(u)];
  // A unit's count restarts with its first report of a micro-step (a
  // pipeline rank's chunks report their units in backwards of their own).
  if (g.pending == 0) g.pending = unit(u).numel;
  DPT_CHECK(g.pending >= numel, "gradients {}..{} reported ready twice", offset, offset + numel);
  g.pending -= numel;
  if (g.pending == 0 && sync_) {
    // Sum: the 1/world of the average is already in the loss scale.
    float* b = full_grads() ? model_.grads() + unit(u).offset : grad_pool_.data(g.buf);
    if (wire_bf16()) {  // a bf16 copy goes on the wire: half the bytes
      g.wire = wire_pool_.take((unit(u).numel + 1) / 2);
      bf16* w = reinterpret_cast<bf16*>(wire_pool_.data(g.wire));
      model_.k().convert(w, b, unit(u).numel);
      g.work = spg_.reduce_scatter_async(w, unit(u).numel, DType::BF16, comm::ReduceOp::Sum);
    } else {
      g.work = spg_.reduce_scatter_async(b, unit(u).numel, DType::F32, comm::ReduceOp::Sum);
    }
    inflight_.push_back(u);
    record(Timeline::ReduceScatter, u, g.work);
  }
  // Take the shards of reductions that are already done, freeing buffers.
  // Not under hsdp: there completing a unit issues the replica group's
  // blocking all-reduce, and issued at a moment that depends on timing it
  // falls at different places among the shard group's collectives on
  // different ranks: one rank then waits in the replica all-reduce for a
  // peer that waits in a shard-group all-gather for a rank that waits in
  // the replica all-reduce (a deadlock, seen in 1 run of 4-6). The other
  // completions happen at the same point of the program on every rank.
  if (!replica_group_)
    while (!inflight_.empty() && grads_[static_cast<size_t>(inflight_.front())].work->is_completed())
      complete_oldest();
}

namespace {

// k ring collectives' share of the parameters each, (N-1)/N, over n ranks.
std::string ring_terms(int k, int n, const char* ranks = "data-parallel rank") {
  return fmt::format("over N = {} {}{}: {}(N-1)/N = {:.3f}", n, ranks, n == 1 ? "" : "s",
                     k == 1 ? "" : std::to_string(k), k * (n - 1.0) / n);
}

}  // namespace

StrategyRecord zero_record(int stage) {
  static const char* kFits[] = {"", "the model and its gradients fit, the optimizer state does not: ZeRO-1",
                                "the model fits, its gradients and optimizer state do not: ZeRO-2 / FSDP SHARD_GRAD_OP",
                                "the model does not fit: ZeRO-3 / FSDP FULL_SHARD"};
  StrategyRecord r;
  r.name = fmt::format("zero{}", stage);
  if (stage == 3) r.aliases = {"fsdp"};
  r.help = stage == 3 ? "zero3 (= fsdp)" : r.name;
  r.zero_stage = stage;
  // ZeRO-1 keeps full gradients, reduced once per step: --zero-accumulate
  // is the later stages' choice, as gathering parameters is ZeRO-3's.
  if (stage == 1)
    r.reads = {{Setting::ZeroReduce, "", nullptr},
               {Setting::Buckets, "--zero-reduce scatter", [](const RunAsk& a) { return a.zero_scatter; }}};
  if (stage >= 2) r.reads.push_back({Setting::ZeroAccumulate, "", nullptr});
  if (stage == 3)
    for (Setting s : {Setting::Prefetch, Setting::Reshard}) r.reads.push_back({s, "", nullptr});
  r.fits_because = [stage](bool) { return std::string(kFits[stage]); };
  r.formula = [stage](const StrategyOptions& o, int n) {
    if (stage == 1 && !o.zero_scatter)
      return fmt::format("ZeRO-1's gradient all-reduce and parameter all-gather {}", ring_terms(3, n));
    if (stage < 3)
      return fmt::format("ZeRO-{}'s gradient reduce-scatter and parameter all-gather {}", stage, ring_terms(2, n));
    return fmt::format("ZeRO-3's parameter all-gathers in forward and backward and gradient reduce-scatter {}",
                       ring_terms(3, n));
  };
  r.make = [stage](const StrategyOptions& o, Model& m, comm::ProcessGroup& pg, const StrategyInit& init) {
    return std::make_unique<ZeroStrategy>(o, m, pg, init, stage);
  };
  r.bytes = [stage](const StrategyOptions& o, const Model& m, int world, int rank) {
    return sharded_bytes(o, m, world, rank, stage, stage == 1 && !o.zero_scatter);
  };
  r.traffic = [stage](const StrategyOptions& o, const Model& m, int world, int rank, int64_t grad_accum) {
    return zero_traffic(stage, o, m, world, rank, grad_accum);
  };
  return r;
}

StrategyRecord hsdp_record() {
  StrategyRecord r = zero_record(3);
  r.name = "hsdp";
  r.aliases = {};
  r.help = "hsdp (zero3 inside --shard-group ranks, replicated across groups)";
  r.shard_groups = true;
  r.plannable = false;
  r.fits_because = [](bool) { return std::string("the model does not fit on a rank, but on a shard group: HSDP"); };
  r.formula = [](const StrategyOptions& o, int n) {
    const int s = o.shard_group > 0 ? o.shard_group : n;
    const int groups = n / s;
    return fmt::format("HSDP's ZeRO-3 in each shard group {}, and each gradient shard's all-reduce over R = {} "
                       "groups: 2(R-1)/R / N = {:.3f}",
                       ring_terms(3, s, "rank"), groups, 2.0 * (groups - 1) / groups / s);
  };
  r.make = [](const StrategyOptions& o, Model& m, comm::ProcessGroup& pg, const StrategyInit& init) {
    return std::make_unique<ZeroStrategy>(o, m, pg, init, 3);
  };
  // A ZeRO-3 rank of its shard group (consecutive ranks).
  r.bytes = [](const StrategyOptions& o, const Model& m, int world, int rank) {
    const bool grouped = o.shard_group > 0 && world % o.shard_group == 0;
    return grouped ? sharded_bytes(o, m, o.shard_group, rank % o.shard_group, 3, false)
                   : sharded_bytes(o, m, world, rank, 3, false);
  };
  // o.shard_group as resolve_options leaves it (0, unresolved: one group).
  r.traffic = [](const StrategyOptions& o, const Model& m, int world, int rank, int64_t grad_accum) {
    const int s = o.shard_group > 0 ? o.shard_group : world;
    CommPlan c = zero_traffic(3, o, m, s, rank % s, grad_accum);
    if (world < 2) return c;
    // Each unit's reduced chunk, all-reduced over the replica group (the
    // ranks at the same place in every shard group), whenever the shard
    // group reduce-scatters it; the logged loss averaged over every rank.
    const RingSends replicas{world / s, rank / s};
    const size_t red = dtype_size(o.ddp.reduce_dtype);
    uint64_t shards = 0;
    for (const Unit& u : m.layout().units()) shards += replicas.ar(comm::chunk_range(u.numel, s, rank % s).size, red);
    c.backward += (o.accumulate_locally ? 1 : static_cast<uint64_t>(grad_accum)) * shards;
    c.logged_other = RingSends{world, rank}.ar(1, sizeof(float));
    return c;
  };
  return r;
}

}  // namespace dpt
