// A model: a Layout of named parameters, flat parameter and gradient
// buffers, an activation arena, and explicit forward/backward passes.
//
// The same model code runs under every strategy. A strategy only needs the
// flat buffers (a bucket or a shard is a range of them) and the moment in
// backward at which each range of gradients is final (on_grads_ready).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "device/kernels.h"
#include "tensor/flat_buffer.h"
#include "tensor/layout.h"

namespace dpt {

// One micro-batch. Vectors are reused from step to step, so filling a batch
// allocates nothing once they have reached their size.
struct Batch {
  int64_t B = 0;                  // samples (images or sequences)
  int64_t T = 1;                  // positions per sample; 1 for the MLP
  std::vector<float> features;    // MLP: [B, inputs], scaled to [0, 1]
  std::vector<int32_t> tokens;    // GPT: [B, T] input bytes
  std::vector<int32_t> targets;   // MLP: [B] labels; GPT: [B, T] next bytes
};

struct ForwardStats {
  float loss = 0.0f;   // mean cross-entropy over the batch's targets
  int64_t correct = 0; // targets that are the argmax of their logits
  int64_t count = 0;   // targets in the batch
};

// Where a model's parameters and gradients live while it computes, one unit
// at a time: the strategy's side of the model's unit boundaries.
//
// The model calls acquire(u) before it reads unit u's parameters and
// release(u) when it is done with them, in forward and again in backward; in
// backward it also asks for unit_grads(u), where it adds (+=) the unit's
// gradients, and reports ranges of the flat gradient buffer as final with
// grads_ready (every element exactly once per backward). Pointers are to the
// unit's first element; a slot sits at (slot.offset - unit.offset) in them.
// The model itself holds a full store (both buffers whole, allocated on first
// use); ZeRO-2/3 hand it one that gathers units and keeps only shards.
enum class Pass { Forward, Backward };

class UnitStore {
 public:
  virtual ~UnitStore() = default;
  // Called as forward or backward starts. `part` names which pass of the
  // model it is where one model runs several different ones (a pipeline
  // rank's chunks, a split backward's input and weight passes: each opens
  // its own units in its own order); 0 for a model with one of each.
  virtual void begin_pass(Pass, int /*part*/) {}
  virtual const float* acquire(int unit) = 0;
  // A bf16 run's acquire: the unit's bf16 compute copy of its parameters
  // (docs/precision.md). Stores that do not hold one throw InternalError.
  virtual const bf16* acquire_bf16(int unit);
  virtual void release(int /*unit*/) {}
  virtual float* unit_grads(int unit) = 0;
  virtual void grads_ready(size_t offset, size_t numel) = 0;
};

class Model {
 public:
  virtual ~Model() = default;
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  virtual std::string kind() const = 0;  // "mlp", "gpt" or "llama"
  // Hyper-parameters as strings, for the safetensors __metadata__.
  virtual std::map<std::string, std::string> metadata() const = 0;
  // Writes the initial values of elements [begin, begin + n) of the flat
  // parameter buffer into out[0, n), from a seed, by each model's standard
  // scheme. Each value depends only on the seed and its element's position
  // (a counter-based generator), so a rank can initialise just its shard
  // and every strategy and world size starts from the very same weights.
  virtual void init_range(uint64_t seed, size_t begin, size_t n, float* out) const = 0;
  // Fills the model's own parameter buffer: init_range over all of it (on
  // the host, then uploaded when the model computes on a GPU).
  void init_params(uint64_t seed);
  // Forward pass; keeps what backward needs. The activation arena grows on
  // the first batch of a given size and is reused afterwards.
  virtual ForwardStats forward(const Batch& batch) = 0;
  // Backward of the last forward. Adds d(loss * loss_scale)/d(params) into
  // the gradients (+=), so micro-batches accumulate; loss_scale = 1/K
  // makes K micro-batches sum to the gradient of their mean.
  virtual void backward(float loss_scale) = 0;
  // Model FLOPs of one forward + backward on a batch of B samples (the
  // standard count of GEMM work; elementwise work is not counted).
  virtual double train_flops(int64_t B) const = 0;
  // FLOPs that activation checkpointing adds to train_flops(B): the
  // recomputed forwards (0 where checkpointing drops nothing).
  virtual double recompute_flops(int64_t /*B*/) const { return 0.0; }
  // Of train_flops(B) + recompute_flops(B), those computed outside GEMM
  // calls (a fused attention's products): the step budget's GEMM rate
  // leaves them out.
  virtual double non_gemm_flops(int64_t /*B*/) const { return 0.0; }
  // The units forward opens, in order, a unit opened twice listed twice (the
  // GPT's tied embedding); backward opens them in the reverse order. What a
  // zero3 step gathers follows from it (parallel/traffic.h's planned_comm).
  virtual std::vector<int> unit_order() const = 0;
  // Samples per batch element: T for GPT (tokens), 1 for MLP.
  virtual int64_t positions() const = 0;
  // Bytes of the activation arena for micro-batches of B samples, before
  // allocating it (memory estimates).
  virtual size_t activation_bytes_for(int64_t B) const = 0;
  // This rank's share of the global gradient norm's sum of squares, for
  // g = gradients [begin, begin + n) of the flat buffer: all of it, except
  // where ranks outside the strategy's group hold copies of the same
  // tensors (a tensor-parallel GPT's replicated ones; models/decoder.h).
  virtual double grad_squares(const float* g, size_t /*begin*/, size_t n) const { return k().sum_of_squares(g, n); }

  const Layout& layout() const { return layout_; }
  // The model's own full buffers (allocated on first use). A strategy that
  // installs another store never touches them, so they are never allocated.
  // Writable access marks the bf16 compute copy stale: whoever writes the
  // parameters (an optimizer, a loader) goes through here.
  float* params() {
    ++params_version_;
    return own_params();
  }
  const float* params() const { return own_params(); }
  float* grads() { return own_grads(); }
  const float* grads() const { return own_grads(); }
  void zero_grads() { own_grads(); grads_.zero(); }
  // Move the gradients or the parameters, values and all, into `buffer`
  // (CPU, fp32, exactly param_count elements): DDP and ZeRO-1/2 put them in
  // a shared window so their collectives run in place (parallel/reducer.h,
  // parallel/zero.h).
  void place_grads(FlatBuffer buffer);
  void place_params(FlatBuffer buffer);
  size_t param_count() const { return layout_.numel(); }
  size_t activation_bytes() const { return acts_.bytes(); }

  // Activation checkpointing: forward keeps only each unit's input, and
  // backward recomputes a unit's forward from it just before that unit's
  // backward (docs/memory.md). Gradients are bitwise those of a run without
  // it (same kernels, same order); the arena shrinks, the compute grows by
  // about one forward. Set before the first forward; activation_bytes_for
  // answers for the current setting.
  void set_checkpoint_activations(bool on) { checkpoint_ = on; }
  bool checkpoint_activations() const { return checkpoint_; }

  // Compute precision: DType::F32, or DType::BF16 for mixed precision:
  // every GEMM reads bf16 weights and bf16 inputs and accumulates in fp32;
  // the rest (LayerNorm, softmax, GELU, the loss, the residual stream, all
  // gradients) stays fp32 (docs/precision.md says why). The store then
  // hands out bf16 units (acquire_bf16); the model's own store keeps a bf16
  // copy of its fp32 parameters, refreshed a unit at a time after they
  // change. Set before the first forward.
  void set_precision(DType p) { precision_ = p; }
  DType precision() const { return precision_; }
  // The whole bf16 compute copy, for an optimizer that writes it as it
  // updates the fp32 parameters (Optimizer::step's publish): nullptr in
  // fp32. After that update has written every element, params16_written()
  // marks every unit's copy current, so no unit converts it again.
  bf16* params16_for_update();
  void params16_written();

  // The device the model computes on: its buffers (parameters, gradients,
  // activations, compute copies) live there and every op of its passes runs
  // there (device/kernels.h). Batches stay host data; forward uploads them.
  // Setting it moves what is allocated (a model loaded on the host, then
  // sent to its GPU).
  void set_device(Device d);
  Device device() const { return device_; }
  const Kernels& k() const { return *k_; }
  // Tests: computes through `k` (kernels of this model's device that wrap
  // its own, e.g. to count calls) until set_device.
  void use_kernels(const Kernels& k);
  // The model's own parameters copied to / from host memory (n floats from
  // element `begin` of the flat buffer), whatever the device.
  void download_params(size_t begin, size_t n, float* host) const;
  void upload_params(size_t begin, size_t n, const float* host);

  // Where forward and backward find parameters and put gradients: the
  // model's own full buffers (nullptr) or a strategy's store.
  void set_store(UnitStore* store) { store_ = store ? store : &own_; }

  // Called by the model's own store during backward each time the gradients
  // in elements [offset, offset + numel) of the flat buffer are final:
  // nothing in the range changes for the rest of backward, so a strategy may
  // reduce it at once. Every element is reported exactly once per backward.
  // The models here report from the end of the buffer to its start
  // (backward's order), a layer or a block of a weight's rows at a time.
  std::function<void(size_t offset, size_t numel)> on_grads_ready;

 protected:
  Model() : own_(*this), store_(&own_) {}
  // Unit boundaries, called by forward and backward: open(u) before a
  // unit's parameters are read (in backward: and its gradients written),
  // close(u) after. begin(pass) as forward or backward starts.
  void begin(Pass pass, int part = 0);
  void open(int unit);
  void close(int unit);
  void grads_ready(size_t offset, size_t numel) { store_->grads_ready(offset, numel); }
  // Slots [first, last] (consecutive, so one range) are final.
  void slots_ready(int first, int last) {
    const size_t begin = layout_.slot(first).offset;
    grads_ready(begin, layout_.slot(last).offset + layout_.slot(last).numel - begin);
  }
  // A slot's parameters and gradients, inside its open unit. In a bf16 run
  // param() serves vectors (biases, LayerNorm) as fp32 widened from the
  // unit's bf16 copy when it was opened, and param16() serves matrices.
  const float* param(int slot) const;
  const bf16* param16(int slot) const { return at(unit_params16_, slot); }
  // The weight as a GEMM of compute type T reads it.
  template <typename T>
  const T* weight(int slot) const {
    if constexpr (std::is_same_v<T, bf16>)
      return param16(slot);
    else
      return param(slot);
  }
  float* grad(int slot) { return at(unit_grads_, slot); }

  // Derived models place their own buffers on the model's device.
  virtual void place_buffers(Device /*d*/) {}

  Layout layout_;
  FlatBuffer acts_;
  Device device_ = Device::CPU;
  const Kernels* k_ = &cpu_kernels();
  bool checkpoint_ = false;
  DType precision_ = DType::F32;

 private:
  template <typename T>
  T* at(const std::vector<T*>& base, int slot) const {
    const Slot& s = layout_.slot(slot);
    T* b = base[static_cast<size_t>(s.unit)];
    DPT_CHECK(b != nullptr, "slot {} used outside an open unit", s.name);
    return b + (s.offset - layout_.units()[static_cast<size_t>(s.unit)].offset);
  }
  // The model's own store: both buffers whole.
  class OwnStore : public UnitStore {
   public:
    explicit OwnStore(Model& m) : m_(m) {}
    const float* acquire(int unit) override { return m_.own_params() + m_.unit_offset(unit); }
    const bf16* acquire_bf16(int unit) override { return m_.own_params16(unit); }
    float* unit_grads(int unit) override { return m_.own_grads() + m_.unit_offset(unit); }
    void grads_ready(size_t offset, size_t numel) override {
      if (m_.on_grads_ready) m_.on_grads_ready(offset, numel);
    }

   private:
    Model& m_;
  };
  size_t unit_offset(int unit) const { return layout_.units()[static_cast<size_t>(unit)].offset; }
  float* own_params() const;
  float* own_grads() const;
  // Unit u of the bf16 copy, converted from the fp32 parameters if they
  // were written since (params_version_).
  const bf16* own_params16(int unit);
  // Widens the vector slots of unit u into vectors_ (bf16 runs).
  void widen_vectors(int unit);

  OwnStore own_;
  UnitStore* store_;
  Pass pass_ = Pass::Forward;
  std::vector<const float*> unit_params_;
  std::vector<const bf16*> unit_params16_;
  std::vector<float*> unit_grads_;
  mutable FlatBuffer params_, grads_;
  FlatBuffer params16_{0, DType::BF16};
  std::vector<uint64_t> converted_version_;  // per unit: params_version_ its bf16 copy was made at
  uint64_t params_version_ = 1;
  FlatBuffer vectors_;                   // bf16 runs: vector slots widened to fp32
  std::vector<size_t> vector_at_;        // per slot: its place in vectors_ (vector slots)
};

// The integer hyper-parameter `key`, or `fallback` when absent. Throws
// InputError naming the key when the value is not a positive integer.
int64_t hparam_int(const std::map<std::string, std::string>& hparams, const std::string& key,
                   int64_t fallback);

// Builds a model from hyper-parameters given as strings (the safetensors
// metadata, or flags): "dpt.model" = "mlp" | "gpt" | "llama", plus
//   mlp: "sizes" = "784,1024,1024,10"
//   gpt, llama: "vocab_size", "n_layer", "n_head", "n_embd", "block_size"
//   (llama also its own keys: DecoderConfig::from, models/decoder_config.cpp)
// Missing keys take the reference workload's defaults (W-MLP, W-GPT, W-LLAMA).
// Throws InputError for an unknown model or a nonsensical size.
std::unique_ptr<Model> make_model(const std::map<std::string, std::string>& hparams);

}  // namespace dpt
