// ZeRO stages 1, 2 and 3 (3 = FSDP's FULL_SHARD), one implementation
// (parallel/zero.cpp, docs/zero.md).
//
// Every unit of the layout (an embedding, a transformer block, a layer) is
// cut into world chunks by comm::chunk_range (sizes differ by at most one;
// no padding): rank r owns chunk r of every unit, its "shard". So a unit's
// all-gather and reduce-scatter are each one collective over the unit.
//
//   stage 1: full parameters and gradients on every rank; optimizer state
//            for the shard only. Gradients are all-reduced in DDP's buckets
//            (or reduce-scattered per unit with zero_scatter); each rank
//            steps its shard; the updated units are all-gathered, and a
//            unit's next forward waits for its own all-gather only.
//   stage 2: as stage 1, but a unit's gradients live in a reused scratch
//            buffer while backward writes them and are reduce-scattered as
//            soon as they are final; each rank keeps only its gradient shard.
//   stage 3: parameters sharded too. A unit is all-gathered into a buffer
//            just before the model opens it and freed when it closes; the
//            next unit's all-gather is issued first (prefetch), in forward and
//            backward, in the order recorded on the first micro-step.
//
// bf16 mixed precision (Model::precision() == BF16, docs/precision.md): at
// every stage the fp32 parameters exist only as the rank's master shards
// (optimizer state, as the ZeRO paper counts them); the model computes on
// bf16 copies: full on every rank at stages 1 and 2 (each rank converts its
// updated shard and the step's all-gather moves bf16), a bf16 shard at
// stage 3 whose units are all-gathered in bf16 (half the bytes).
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "parallel/host_update.h"
#include "parallel/strategy.h"
#include "core/timeline.h"

namespace dpt {

class SafetensorsSet;

// Buffers handed out and taken back: a request gets the smallest free
// buffer that holds it, else a new buffer of exactly its size. ZeroStrategy
// reserves every buffer it will need up front (zero_pools: sizes chosen so
// that this rule never runs out), so a run allocates nothing after set-up,
// holds exactly what the memory estimate said, and a growing pool would show
// in the accounted bytes (tests/test_plan_cli.cpp).
class BufferPool {
 public:
  // Buffers in the memory of `device` (the model's).
  explicit BufferPool(Device device = Device::CPU) : device_(device) {}
  void place(Device device) { device_ = device; }
  // Free buffers of these sizes, made before the first step
  // (parallel/rank_bytes.h's zero_pools), so the pool never grows after.
  void reserve(const std::vector<size_t>& sizes);
  int take(size_t numel);
  void give(int i) { free_[static_cast<size_t>(i)] = true; }
  float* data(int i) { return bufs_[static_cast<size_t>(i)].f32(); }
  bool fits(size_t numel) const;  // a free buffer holds numel elements
  size_t bytes() const;           // of every buffer, free or not

 private:
  std::deque<FlatBuffer> bufs_;  // a deque: data pointers stay valid as it grows
  std::vector<bool> free_;
  Device device_;
};

class ZeroStrategy : public Strategy, private UnitStore {
 public:
  ZeroStrategy(const StrategyOptions& options, Model& model, comm::ProcessGroup& pg, const StrategyInit& init,
               int stage);
  ~ZeroStrategy() override;

  const std::string& name() const override { return options_.strategy.name(); }
  std::string describe() const override;
  nlohmann::json detail() const override;
  float loss_scale() const override { return 1.0f / static_cast<float>(pg_.size()); }
  void begin_step() override;
  void begin_micro_step(bool last) override;
  double finish_backward() override;
  double grad_norm_squared() override;
  void scale_grads(float factor) override;
  void step(float lr) override;
  void gather_unit(int unit, float* out) override;
  void verify(int64_t step) override;
  std::vector<StateSpan> state_spans() override;
  bool writes_state() const override { return !replica_group_ || replica_group_->rank() == 0; }
  void restored(int64_t optimizer_steps) override;
  MemoryBytes bytes() const override;
  nlohmann::json offload_detail() const override;
  double take_gather_wait() override;
  void trace(Timeline& tl, int64_t step) const override;
  size_t trace_spans() const override { return 4 * layout_.units().size() + 4; }

  // Rank r's chunk of unit u, and where it sits in the shard buffers.
  struct Shard {
    size_t begin = 0, n = 0;  // elements of the unit: [begin, begin + n)
    size_t at = 0;            // offset in param_shard_ / grad_shard_
  };

 private:
  void make_shards();
  // Every shard's update: in place, through the tier, or on the host.
  void update_shards(float lr);
  // UnitStore: what the model sees.
  void begin_pass(Pass pass, int part) override;
  const float* acquire(int unit) override;
  const bf16* acquire_bf16(int unit) override;
  void release(int unit) override;
  float* unit_grads(int unit) override;
  void grads_ready(size_t offset, size_t numel) override;

  const Unit& unit(int u) const { return layout_.units()[static_cast<size_t>(u)]; }
  bool full_grads() const { return stage_ == 1 || options_.accumulate_locally; }
  // On one host, the buffers reduced or gathered at offsets the layout
  // fixes go into shared windows so those collectives run in place
  // (comm/shm_window.h): the model's whole gradients (full_grads()) and,
  // under stages 1 and 2, the parameters (or a mixed run's bf16 copy).
  // Never the pools: which buffer a unit gets depends on when earlier
  // reductions completed, which differs between ranks. (rank_bytes.h's
  // shared_windows states the same for the plan: change both together.)
  void place_in_windows();
  // The fp32 parameters live only as shards (stage 3, or mixed precision).
  bool sharded_params() const { return stage_ == 3 || mixed_; }
  // --offload params: the fp32 master shards live in the optimizers' tier
  // (one more state tensor), not in param_shard_ (mixed precision only).
  bool masters_offloaded() const { return options_.offload.what == Offload::Params; }
  // Fills unit u's master shard from the seed or the weights file (init).
  void init_shard(int u, const StrategyInit& init, const SafetensorsSet* file, float* out);
  float* param_shard(int u);  // the rank's chunk of unit u's (master) parameters
  bf16* compute_chunk(int u);  // mixed: where the rank's chunk of unit u's bf16 copy lives
  // Mixed: unit u's master shard converted into its bf16 chunk (from
  // `masters` when given, else param_shard), and at stages 1, 2 the unit's
  // all-gather started.
  void publish(int u, const float* masters = nullptr);
  void start_param_gather(int u);
  // The bytes of one unit's all-gather element (bf16 in a mixed run).
  size_t gather_elem_bytes() const { return mixed_ ? sizeof(bf16) : sizeof(float); }
  float* grad_shard(int u);   // the rank's chunk of unit u's reduced gradients
  void wait_timed(const std::shared_ptr<comm::Work>& w);
  void wait_param_gather(int u);  // stages 1, 2: unit u's all-gather from the last step
  void start_gather(int u);   // stage 3: into a pool buffer, asynchronously
  void free_gathered(int u);
  int next_unit() const;      // the unit the model will open after this one
  void complete_oldest();     // waits for the oldest reduce-scatter and takes its shard
  void record(Timeline::Kind kind, int u, const std::shared_ptr<comm::Work>& w);

  StrategyOptions options_;
  int stage_;
  Model& model_;
  bool mixed_;  // bf16 compute copies, fp32 masters
  comm::ProcessGroup& pg_;
  // hsdp: the ranks this rank shards over, and those holding the same shards
  // in the other groups (their gradient shards are all-reduced); null under
  // zero1/2/3. spg_ is the group shards are cut over (shard_group_ or pg_).
  std::unique_ptr<comm::ProcessGroup> shard_group_, replica_group_;
  comm::ProcessGroup& spg_;
  const Layout& layout_;
  int world_, rank_;  // in spg_
  std::vector<Shard> shards_;
  size_t shard_numel_ = 0;
  std::unique_ptr<StateTier> tier_;               // their state: RAM or a file (outlives opts_)
  std::vector<std::unique_ptr<Optimizer>> opts_;  // one per unit's shard
  // A GPU model's shards updated on the host (--offload optimizer), one per
  // unit; else empty.
  std::vector<std::unique_ptr<HostUpdate>> hosts_;
  FlatBuffer param_shard_, grad_shard_;           // stage 3 or mixed; stages 2 and 3
  FlatBuffer params16_{0, DType::BF16};           // mixed: full (stages 1, 2) or the shard (stage 3)

  std::unique_ptr<Reducer> reducer_;  // stage 1 with all-reduce
  std::vector<std::shared_ptr<comm::Work>> param_gather_;  // stages 1, 2: after step

  struct UnitGrads {
    int buf = -1;        // grad pool buffer (stages 2, 3 without local accumulation)
    int wire = -1;       // --reduce-dtype bf16: wire pool buffer, the unit's bf16 copy reduced
    size_t pending = 0;  // elements not final yet in this backward
    std::shared_ptr<comm::Work> work;  // its reduce-scatter
  };
  std::vector<UnitGrads> grads_;
  std::deque<int> inflight_;  // units whose reduce-scatter is in flight, oldest first
  BufferPool grad_pool_;
  BufferPool wire_pool_;  // bf16 copies of unit gradients being reduce-scattered
  bool wire_bf16() const { return options_.ddp.reduce_dtype == DType::BF16; }
  bool sync_ = true;

  struct Gathered {
    int buf = -1, refs = 0;
    std::shared_ptr<comm::Work> work;  // its all-gather, while in flight
  };
  std::vector<Gathered> gathered_;  // stage 3
  BufferPool gather_pool_;
  // The order the model opens units in each pass, recorded on the first
  // micro-step and replayed for prefetching: order_[0] forward, order_[1]
  // backward for a model's part 0 (the only part of most models). A model
  // with several parts (a pipeline rank's chunks, a split backward) has an
  // order per (pass, part) beyond those, each recorded in its first pass.
  std::vector<std::vector<int>> order_ = std::vector<std::vector<int>>(2);
  std::vector<char> done_ = std::vector<char>(2, 0);  // parts > 0: recorded
  bool recorded_ = false;  // part 0
  bool multi_part_ = false;
  Pass pass_ = Pass::Forward;
  size_t key_ = 0;  // 2 x part + (backward ? 1 : 0)
  size_t pos_ = 0;
  bool recorded() const { return key_ < 2 ? recorded_ : done_[key_] != 0; }
  void record_open(int u) {
    if (!recorded()) order_[key_].push_back(u);
    ++pos_;
  }

  std::vector<double> norm_parts_;  // every rank's sum of squares (no allocation in a step)
  double gather_wait_s_ = 0.0;
  struct Traced {
    Timeline::Kind kind;
    int unit;
    std::shared_ptr<comm::Work> work;
  };
  std::vector<Traced> traced_;
};

// The catalog's records (parallel/catalog.h): zero1, zero2, zero3 (= fsdp)
// by stage, and hsdp.
StrategyRecord zero_record(int stage);
StrategyRecord hsdp_record();

}  // namespace dpt
