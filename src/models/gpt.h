// GPT-2-style byte-level transformer (W-GPT): token + learned position
// embedding, pre-LayerNorm blocks of causal self-attention and a GELU MLP of
// 4x width, a final LayerNorm, and an output projection tied to the token
// embedding. Parameter names are nanoGPT's ("transformer.h.0.attn.c_attn.weight").
//
// Units: "transformer.embed" (wte, wpe), one per block "transformer.h.{i}",
// and "transformer.ln_f".
//
// The vocabulary may be padded in memory (padded_vocab > vocab, GPT-2's
// 50257 held as 50304 rows, a multiple of 64, as llm.c does for its GEMMs):
// wte then has padded_vocab rows, the pad rows start at zero and stay there
// (their logits are left out of the softmax, so no gradient reaches them),
// tokens must still be below vocab, and weight files hold only the vocab
// true rows (models/weights.h).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "models/model.h"

namespace dpt {

struct GptConfig {
  int64_t vocab = 256;   // vocab_size
  int64_t layers = 4;    // n_layer
  int64_t heads = 4;     // n_head
  int64_t width = 256;   // n_embd (C)
  int64_t context = 128; // block_size (T_max)
  // padded_vocab_size: rows of wte in memory; 0 = vocab. Last, so the
  // positional initialisations {vocab, layers, heads, width, context} stay valid.
  int64_t padded_vocab = 0;
  static GptConfig from(const std::map<std::string, std::string>& hparams);
  int64_t rows() const { return padded_vocab > 0 ? padded_vocab : vocab; }  // of wte in memory
};

class Gpt : public Model {
 public:
  explicit Gpt(GptConfig config);

  std::string kind() const override { return "gpt"; }
  std::map<std::string, std::string> metadata() const override;
  void init_range(uint64_t seed, size_t begin, size_t n, float* out) const override;
  ForwardStats forward(const Batch& batch) override;
  void backward(float loss_scale) override;
  double train_flops(int64_t B) const override;
  double recompute_flops(int64_t B) const override;
  std::vector<int> unit_order() const override;
  int64_t positions() const override { return config_.context; }
  size_t activation_bytes_for(int64_t B) const override;
  const GptConfig& config() const { return config_; }

 private:
  struct BlockSlots {
    int ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, fcproj_w, fcproj_b;
  };
  // Activations of one block for the current batch (pointers into acts_).
  // With checkpointing, every block's res3 (its output: the next block's
  // input) is its own, and all the rest point to one scratch block shared by
  // all blocks, refilled by recomputation before each block's backward.
  struct BlockActs {
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *att, *res2;
    float *ln2, *ln2_mean, *ln2_rstd, *fch, *fch_gelu, *res3;
  };
  void plan_activations(int64_t B, int64_t T);
  // With a padded vocabulary the head's GEMM writes [N, padded_vocab]
  // logits; the loss reads [N, vocab]: pack_logits drops the pad columns in
  // place after forward, unpack_logit_grads puts them back (as zeros) before
  // the head's backward.
  void pack_logits(int64_t N);
  void unpack_logit_grads(int64_t N);
  int64_t activation_floats(int64_t B, int64_t T) const;
  // Block l's forward from its input x into acts_of_[l] (with unit l + 1 open).
  void block_forward(size_t l, const float* x, int64_t B, int64_t T);

  GptConfig config_;
  int wte_, wpe_, lnf_w_, lnf_b_;
  int embed_unit_ = 0, lnf_unit_ = 0;  // block l is unit l + 1
  std::vector<BlockSlots> blocks_;
  int64_t batch_ = 0, seq_ = 0;  // the arena's layout (B, T)
  bool planned_checkpoint_ = false;  // ... and whether it was planned for checkpointing
  std::vector<BlockActs> acts_of_;
  float *encoded_ = nullptr, *lnf_ = nullptr, *lnf_mean_ = nullptr, *lnf_rstd_ = nullptr;
  float* logits_ = nullptr;  // [B*T, padded V]; [B*T, V] probabilities after forward
  // Backward scratch, reused by every block.
  float *dres_ = nullptr, *dC_ = nullptr, *d3C_ = nullptr, *d4C_ = nullptr;
  std::vector<int32_t> tokens_, targets_;
};

}  // namespace dpt
