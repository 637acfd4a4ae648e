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
#include <vector>

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

class Model {
 public:
  virtual ~Model() = default;

  virtual std::string kind() const = 0;  // "mlp" or "gpt"
  // Hyper-parameters as strings, for the safetensors __metadata__.
  virtual std::map<std::string, std::string> metadata() const = 0;
  // Fills the parameters from a seed (each model's standard scheme).
  virtual void init_params(uint64_t seed) = 0;
  // Forward pass; keeps what backward needs. The activation arena grows on
  // the first batch of a given size and is reused afterwards.
  virtual ForwardStats forward(const Batch& batch) = 0;
  // Backward of the last forward. Adds d(loss * loss_scale)/d(params) into
  // the gradient buffer (+=), so micro-batches accumulate; loss_scale = 1/K
  // makes K micro-batches sum to the gradient of their mean.
  virtual void backward(float loss_scale) = 0;
  // Model FLOPs of one forward + backward on a batch of B samples (the
  // standard count of GEMM work; elementwise work is not counted).
  virtual double train_flops(int64_t B) const = 0;
  // Samples per batch element: T for GPT (tokens), 1 for MLP.
  virtual int64_t positions() const = 0;

  const Layout& layout() const { return layout_; }
  float* params() { return params_.f32(); }
  const float* params() const { return params_.f32(); }
  float* grads() { return grads_.f32(); }
  const float* grads() const { return grads_.f32(); }
  void zero_grads() { grads_.zero(); }
  size_t param_count() const { return layout_.numel(); }
  size_t activation_bytes() const { return acts_.bytes(); }

  // Called during backward each time the gradients in elements
  // [offset, offset + numel) of the flat buffer are final: nothing in the
  // range changes for the rest of backward, so a strategy may reduce it at
  // once. Every element is reported exactly once per backward. The models
  // here report from the end of the buffer to its start (backward's order),
  // a layer or a block of a weight's rows at a time.
  std::function<void(size_t offset, size_t numel)> on_grads_ready;

 protected:
  // Allocates params_ and grads_ once the layout is complete.
  void allocate_state();
  void grads_ready(size_t offset, size_t numel) {
    if (on_grads_ready) on_grads_ready(offset, numel);
  }
  // Slots [first, last] (consecutive, so one range) are final.
  void slots_ready(int first, int last) {
    const size_t begin = layout_.slot(first).offset;
    grads_ready(begin, layout_.slot(last).offset + layout_.slot(last).numel - begin);
  }
  float* param(int slot) { return params_.f32() + layout_.slot(slot).offset; }
  float* grad(int slot) { return grads_.f32() + layout_.slot(slot).offset; }

  Layout layout_;
  FlatBuffer params_, grads_, acts_;
};

// The integer hyper-parameter `key`, or `fallback` when absent. Throws
// InputError naming the key when the value is not a positive integer.
int64_t hparam_int(const std::map<std::string, std::string>& hparams, const std::string& key,
                   int64_t fallback);

// Builds a model from hyper-parameters given as strings (the safetensors
// metadata, or flags): "dpt.model" = "mlp" | "gpt", plus
//   mlp: "sizes" = "784,1024,1024,10"
//   gpt: "vocab_size", "n_layer", "n_head", "n_embd", "block_size"
// Missing keys take the reference workload's defaults (W-MLP, W-GPT).
// Throws InputError for an unknown model or a nonsensical size.
std::unique_ptr<Model> make_model(const std::map<std::string, std::string>& hparams);

}  // namespace dpt
