// Multi-layer perceptron classifier (W-MLP): Linear, ReLU, ..., Linear,
// softmax cross-entropy. Parameter names are those of PyTorch's
// nn.Sequential(Linear, ReLU, Linear, ReLU, Linear): "0.weight", "0.bias",
// "2.weight", ...; every Linear is one unit.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "models/model.h"

namespace dpt {

struct MlpConfig {
  std::vector<int64_t> sizes{784, 1024, 1024, 10};  // inputs, hidden..., classes
  static MlpConfig from(const std::map<std::string, std::string>& hparams);
};

class Mlp : public Model {
 public:
  explicit Mlp(MlpConfig config);

  std::string kind() const override { return "mlp"; }
  std::map<std::string, std::string> metadata() const override;
  void init_range(uint64_t seed, size_t begin, size_t n, float* out) const override;
  ForwardStats forward(const Batch& batch) override;
  void backward(float loss_scale) override;
  double train_flops(int64_t B) const override;
  std::vector<int> unit_order() const override;
  int64_t positions() const override { return 1; }
  size_t activation_bytes_for(int64_t B) const override;
  const MlpConfig& config() const { return config_; }

 private:
  // Points the activation pointers into acts_ for a batch of B rows.
  void plan_activations(int64_t B);
  int64_t activation_floats(int64_t B) const;
  // The passes, on compute type CT (float or bf16).
  template <typename CT>
  void forward_as(int64_t B);
  template <typename CT>
  void backward_as(float loss_scale);

  // The MLP's passes run on the CPU only (its blocked weight gradients are
  // not in device/kernels.h yet): --device cuda is refused for it.
  void place_buffers(Device d) override;

  // Elements per block of a weight gradient reported ready (1 MiB of fp32).
  static constexpr int64_t kReadyBlock = int64_t{1} << 18;

  MlpConfig config_;
  std::vector<int> weight_, bias_;  // slot per layer
  int64_t batch_ = 0;               // rows the arena is laid out for
  const float* input_ = nullptr;    // the last forward's features (caller's)
  std::vector<float*> out_;         // per layer: [B, sizes[l+1]]; last = probs
  float* dbuf_[2] = {nullptr, nullptr};
  // bf16 runs: each layer's input as the bf16 GEMM operand (kept for the
  // weight gradient), and an output gradient converted for the GEMMs.
  std::vector<void*> in16_;
  void* dout16_ = nullptr;
  DType planned_precision_ = DType::F32;
  std::vector<int32_t> targets_;
};

}  // namespace dpt
