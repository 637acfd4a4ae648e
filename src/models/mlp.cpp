#include "models/mlp.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <type_traits>

#include "core/error.h"
#include "core/rng.h"
#include "nn/activations.h"
#include "nn/cross_entropy.h"
#include "nn/linear.h"

namespace dpt {

MlpConfig MlpConfig::from(const std::map<std::string, std::string>& hparams) {
  // A transformer's setting (--layers, --vocab ...) would be dropped silently.
  for (const char* key : {"vocab_size", "padded_vocab_size", "n_layer", "n_head", "n_embd", "block_size", "n_kv_head",
                          "head_dim", "intermediate_size", "tie_word_embeddings"})
    if (hparams.count(key)) throw InputError(fmt::format("model setting {} is a transformer's, not the mlp's", key));
  MlpConfig c;
  auto it = hparams.find("sizes");
  if (it == hparams.end()) return c;
  c.sizes.clear();
  std::stringstream ss(it->second);
  std::string part;
  while (std::getline(ss, part, ',')) {
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != part.size() || v <= 0)
      throw InputError(fmt::format("MLP sizes '{}' must be positive integers separated by commas",
                                   it->second));
    c.sizes.push_back(v);
  }
  // getline yields no item after a final comma: "784,10," would read as 784,10.
  if (it->second.ends_with(','))
    throw InputError(fmt::format("MLP sizes '{}' must be positive integers separated by commas", it->second));
  if (c.sizes.size() < 2)
    throw InputError(fmt::format("MLP sizes '{}' need at least inputs and classes", it->second));
  return c;
}

Mlp::Mlp(MlpConfig config) : config_(std::move(config)) {
  const auto& s = config_.sizes;
  for (size_t l = 0; l + 1 < s.size(); ++l) {
    // nn.Sequential numbers a Linear every second module (ReLUs between).
    std::string name = std::to_string(2 * l);
    layout_.begin_unit(name);
    weight_.push_back(layout_.add(name + ".weight", {s[l + 1], s[l]}, true));
    bias_.push_back(layout_.add(name + ".bias", {s[l + 1]}, false));
  }
}

std::map<std::string, std::string> Mlp::metadata() const {
  std::string sizes;
  for (size_t i = 0; i < config_.sizes.size(); ++i) {
    if (i) sizes += ',';
    sizes += std::to_string(config_.sizes[i]);
  }
  return {{"dpt.model", "mlp"}, {"sizes", sizes}};
}

void Mlp::init_range(uint64_t seed, size_t begin, size_t n, float* out) const {
  // PyTorch's nn.Linear default: weight and bias ~ U(-1/sqrt(in), 1/sqrt(in)).
  const size_t end = begin + n;
  for (size_t l = 0; l < weight_.size(); ++l) {
    const float bound = 1.0f / std::sqrt(static_cast<float>(config_.sizes[l]));
    for (int slot : {weight_[l], bias_[l]}) {
      const Slot& s = layout_.slot(slot);
      for (size_t i = std::max(begin, s.offset); i < std::min(end, s.offset + s.numel); ++i)
        out[i - begin] = (2.0f * counter_uniform(seed, i) - 1.0f) * bound;
    }
  }
}

int64_t Mlp::activation_floats(int64_t B) const {
  const auto& s = config_.sizes;
  int64_t widest = 0, total = 0;
  for (size_t l = 1; l < s.size(); ++l) {
    total += B * s[l];
    widest = std::max(widest, s[l]);
  }
  total += 2 * B * widest;
  if (precision_ == DType::BF16) {  // in16_ per layer and dout16_, 64-byte rounded
    for (size_t l = 0; l + 1 < s.size(); ++l) total += (B * s[l] + 31) / 32 * 16;
    total += (B * widest + 31) / 32 * 16;
  }
  return total;
}

size_t Mlp::activation_bytes_for(int64_t B) const {
  return static_cast<size_t>(activation_floats(B)) * sizeof(float);
}

void Mlp::plan_activations(int64_t B) {
  if (B == batch_ && precision_ == planned_precision_) return;
  const auto& s = config_.sizes;
  int64_t widest = 0;
  for (size_t l = 1; l < s.size(); ++l) widest = std::max(widest, s[l]);
  const int64_t total = activation_floats(B);
  acts_.reserve(static_cast<size_t>(total));
  float* p = acts_.f32();
  out_.clear();
  for (size_t l = 1; l < s.size(); ++l) {
    out_.push_back(p);
    p += B * s[l];
  }
  dbuf_[0] = p;
  dbuf_[1] = p + B * widest;
  p += 2 * B * widest;
  in16_.assign(s.size() - 1, nullptr);
  dout16_ = nullptr;
  if (precision_ == DType::BF16) {
    for (size_t l = 0; l + 1 < s.size(); ++l) {
      in16_[l] = p;
      p += (B * s[l] + 31) / 32 * 16;
    }
    dout16_ = p;
    p += (B * widest + 31) / 32 * 16;
  }
  DPT_CHECK(p - acts_.f32() == total, "MLP activation plan is {} floats, arena {}", p - acts_.f32(), total);
  targets_.resize(static_cast<size_t>(B));
  batch_ = B;
  planned_precision_ = precision_;
}

ForwardStats Mlp::forward(const Batch& batch) {
  const auto& s = config_.sizes;
  const int64_t B = batch.B;
  if (static_cast<int64_t>(batch.features.size()) < B * s[0] ||
      static_cast<int64_t>(batch.targets.size()) < B)
    throw InputError(fmt::format("MLP batch of {} needs {} features and {} labels", B, B * s[0], B));
  plan_activations(B);
  input_ = batch.features.data();
  std::copy(batch.targets.begin(), batch.targets.begin() + B, targets_.begin());
  if (precision_ == DType::BF16)
    forward_as<bf16>(B);
  else
    forward_as<float>(B);
  const size_t L = weight_.size();
  ForwardStats st;
  st.count = B;
  // logits -> probabilities in place
  st.loss = cross_entropy_forward(out_[L - 1], out_[L - 1], targets_.data(), B, s[L], &st.correct);
  return st;
}

template <typename CT>
void Mlp::forward_as(int64_t B) {
  const auto& s = config_.sizes;
  const size_t L = weight_.size();
  const float* x = input_;
  begin(Pass::Forward);
  for (size_t l = 0; l < L; ++l) {
    // x [B, s[l]] -> out [B, s[l+1]]; layer l is unit l. A bf16 run keeps
    // the layer's input as bf16 for this GEMM and the weight gradient's.
    open(static_cast<int>(l));
    linear_forward(out_[l], operand<CT>(k(), x, B * s[l], in16_[l]), weight<CT>(weight_[l]), param(bias_[l]), B, s[l],
                   s[l + 1]);
    close(static_cast<int>(l));
    if (l + 1 < L) relu_forward(out_[l], out_[l], B * s[l + 1]);
    x = out_[l];
  }
}

void Mlp::backward(float loss_scale) {
  if (precision_ == DType::BF16)
    backward_as<bf16>(loss_scale);
  else
    backward_as<float>(loss_scale);
}

template <typename CT>
void Mlp::backward_as(float loss_scale) {
  const auto& s = config_.sizes;
  const int64_t B = batch_;
  const size_t L = weight_.size();
  // dlogits [B, classes] written over the probabilities.
  float* dout = out_[L - 1];
  cross_entropy_backward(dout, dout, targets_.data(), B, s[L], loss_scale / static_cast<float>(B));
  begin(Pass::Backward);
  for (size_t l = L; l-- > 0;) {
    const int64_t C = s[l], OC = s[l + 1];
    open(static_cast<int>(l));
    const CT* inp;
    if constexpr (std::is_same_v<CT, float>)
      inp = l > 0 ? out_[l - 1] : input_;
    else
      inp = static_cast<const bf16*>(in16_[l]);
    // Parameter gradients first, reported as they become final from the end
    // of the layer's range to its start (bias, then the weight's rows from
    // the last block to the first), so DDP can reduce them while the rest of
    // backward runs. The weight is done in blocks of about kReadyBlock
    // elements: the first layer is the last thing backward computes, and
    // without blocks its whole gradient would wait until the very end.
    // The bias's gradient from the fp32 gradient in a bf16 run too, in the
    // pass that makes the GEMMs' bf16 operand.
    const CT* d;
    if constexpr (std::is_same_v<CT, float>) {
      linear_backward_bias(grad(bias_[l]), dout, B, OC);
      d = dout;
    } else {
      k().output_grad_bf16(static_cast<bf16*>(dout16_), grad(bias_[l]), dout, B, OC);
      d = static_cast<const bf16*>(dout16_);
    }
    slots_ready(bias_[l], bias_[l]);
    const size_t w0 = layout_.slot(weight_[l]).offset;
    const int64_t blocks = std::max<int64_t>(1, (OC * C + kReadyBlock - 1) / kReadyBlock);
    const int64_t rows = (OC + blocks - 1) / blocks;
    for (int64_t o1 = OC; o1 > 0; o1 -= rows) {
      const int64_t o0 = std::max<int64_t>(0, o1 - rows);
      linear_backward_weight(grad(weight_[l]), d, inp, B, C, OC, o0, o1);
      grads_ready(w0 + static_cast<size_t>(o0 * C), static_cast<size_t>((o1 - o0) * C));
    }
    // The first layer's input is data: it needs no gradient.
    if (l > 0) {
      float* dinp = dbuf_[l % 2];
      linear_backward_input(dinp, d, weight<CT>(weight_[l]), B, C, OC);
      relu_backward(dinp, dinp, out_[l - 1], B * C);
      dout = dinp;
    }
    close(static_cast<int>(l));
  }
}

void Mlp::place_buffers(Device d) {
  if (d != Device::CPU)
    throw InputError(fmt::format("--device {}: the MLP model runs on the CPU only; the GPT runs on GPUs",
                                 device_name(d)));
}

double Mlp::train_flops(int64_t B) const {
  // forward + weight gradient: 2 GEMMs per layer; input gradient for all
  // layers but the first. Each GEMM is 2 * B * in * out FLOPs.
  const auto& s = config_.sizes;
  double f = 0.0;
  for (size_t l = 0; l + 1 < s.size(); ++l) {
    double mn = static_cast<double>(s[l]) * static_cast<double>(s[l + 1]);
    f += 2.0 * 2.0 * B * mn + (l > 0 ? 2.0 * B * mn : 0.0);
  }
  return f;
}

std::vector<int> Mlp::unit_order() const {
  std::vector<int> order;  // one unit per Linear, in forward's order
  for (size_t l = 0; l + 1 < config_.sizes.size(); ++l) order.push_back(static_cast<int>(l));
  return order;
}

}  // namespace dpt
