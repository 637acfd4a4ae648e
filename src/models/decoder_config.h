// The configuration of the one decoder-only transformer (models/decoder.h):
// its sizes and its architecture. GPT-2 (2019) is the default configuration;
// the Llama family (Llama 2/3, Qwen2, Mistral, SmolLM, TinyLlama) is another
// set of the same knobs:
//
//                 GPT-2 ("gpt")               Llama family ("llama")
//   norm          LayerNorm with bias         RMSNorm, weight only, eps
//   positions     learned (wpe)               rotary (theta, Llama 3 scaling)
//   attention     heads x width/heads         GQA: kv_heads, head_dim free
//   biases        on every linear             q/k/v (qkv_bias), o (o_bias)
//   MLP           GELU-tanh, 4 x width        SwiGLU gate/up/down, intermediate
//   head          tied to the embedding       tied or untied (lm_head)
//   names         nanoGPT's                   Hugging Face's
//
// The hyper-parameters travel as strings (a weight file's metadata, the
// flags): "dpt.model" = "gpt" with vocab_size, n_layer, n_head, n_embd,
// block_size[, padded_vocab_size]; "dpt.model" = "llama" with those and
// n_kv_head, head_dim, intermediate_size, rope_theta, rms_norm_eps,
// tie_word_embeddings, qkv_bias, o_bias, model_type and, for Llama 3's rope
// scaling, rope_scaling = "llama3" with rope_factor, rope_low_freq_factor,
// rope_high_freq_factor and rope_original_max_position_embeddings
// (docs/models.md).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "nn/rope.h"

namespace dpt {

enum class NormKind { LayerNorm, RmsNorm };
enum class MlpKind { GeluTanh, SwiGlu };

struct DecoderConfig {
  int64_t vocab = 256;    // vocab_size
  int64_t layers = 4;     // n_layer
  int64_t heads = 4;      // n_head
  int64_t width = 256;    // n_embd (C)
  int64_t context = 128;  // block_size (T_max)
  // padded_vocab_size: rows of the embedding (and an untied head) in
  // memory; 0 = vocab. Last of the sizes, so the positional
  // initialisations {vocab, layers, heads, width, context} stay valid.
  int64_t padded_vocab = 0;

  // The architecture; GPT-2's unless set.
  std::string family = "gpt";  // "gpt" or "llama": dpt.model, and the parameter names
  NormKind norm = NormKind::LayerNorm;
  float norm_eps = 1e-5f;        // RMSNorm's (LayerNorm's is fixed at 1e-5)
  bool rotary = false;           // rotary positions, else learned (wpe)
  float rope_theta = 10000.0f;
  std::optional<RopeLlama3Scaling> rope_scaling{};
  int64_t kv_heads = 0;          // 0: heads (multi-head attention)
  int64_t head_size = 0;         // 0: width / heads
  bool qkv_bias = true, o_bias = true;
  MlpKind mlp = MlpKind::GeluTanh;
  int64_t intermediate = 0;      // 0: 4 x width
  bool mlp_bias = true;          // GELU's c_fc and c_proj biases
  bool tied = true;              // the head is the embedding's transpose
  std::string model_type{};      // Hugging Face's model_type, for config.json ("llama", "qwen2", ...)

  // The Llama-family defaults (W-LLAMA's architecture): RMSNorm, rotary,
  // SwiGLU, no biases, untied head.
  static DecoderConfig llama();
  // From hyper-parameters as strings (above); InputError, naming the key,
  // for a value that is not a number of the right kind or sizes that do not
  // fit together.
  static DecoderConfig from(const std::map<std::string, std::string>& hparams);
  std::map<std::string, std::string> metadata() const;

  int64_t rows() const { return padded_vocab > 0 ? padded_vocab : vocab; }  // embedding rows in memory
  int64_t kv() const { return kv_heads > 0 ? kv_heads : heads; }
  int64_t head_dim() const { return head_size > 0 ? head_size : width / heads; }
  int64_t ffn() const { return intermediate > 0 ? intermediate : 4 * width; }
  // GPT-2's attention kernel (nn/attention.h) serves multi-head attention
  // with heads x head size = width and no rotation; everything else takes
  // the grouped-query kernel (nn/gqa_attention.h).
  bool grouped() const { return rotary || kv() != heads || head_dim() * heads != width; }
  // Weights of one block and of the model (the embedding, the head when
  // untied, the final norm; learned positions).
  int64_t block_params() const;
  int64_t params() const;
  // Parameters of one whole block's GEMMs (q/k/v, o and the MLP's
  // matrices): what the FLOP counts multiply.
  double block_gemm_params() const;
};

}  // namespace dpt
