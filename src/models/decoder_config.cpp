#include "models/decoder_config.h"

#include <cmath>

#include "core/error.h"
#include "models/model.h"

namespace dpt {

namespace {

const std::string* find(const std::map<std::string, std::string>& hp, const std::string& key) {
  auto it = hp.find(key);
  return it == hp.end() ? nullptr : &it->second;
}

// A positive finite number, or `fallback` when absent.
float hparam_float(const std::map<std::string, std::string>& hp, const std::string& key, float fallback) {
  const std::string* s = find(hp, key);
  if (!s) return fallback;
  size_t used = 0;
  float v = 0.0f;
  try {
    v = std::stof(*s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != s->size() || !std::isfinite(v) || v <= 0.0f)
    throw InputError(fmt::format("model setting {} = '{}' is not a positive number", key, *s));
  return v;
}

// "1"/"true" or "0"/"false", or `fallback` when absent.
bool hparam_flag(const std::map<std::string, std::string>& hp, const std::string& key, bool fallback) {
  const std::string* s = find(hp, key);
  if (!s) return fallback;
  if (*s == "1" || *s == "true") return true;
  if (*s == "0" || *s == "false") return false;
  throw InputError(fmt::format("model setting {} = '{}' is not 1 or 0", key, *s));
}

void read_rope_scaling(const std::map<std::string, std::string>& hp, DecoderConfig& c) {
  const std::string* kind = find(hp, "rope_scaling");
  if (!kind || kind->empty() || *kind == "none") return;
  if (*kind != "llama3")
    throw InputError(fmt::format("model setting rope_scaling = '{}' is not implemented (only llama3 is)", *kind));
  RopeLlama3Scaling s;
  s.factor = hparam_float(hp, "rope_factor", s.factor);
  s.low_freq_factor = hparam_float(hp, "rope_low_freq_factor", s.low_freq_factor);
  s.high_freq_factor = hparam_float(hp, "rope_high_freq_factor", s.high_freq_factor);
  s.original_max_position_embeddings =
      hparam_int(hp, "rope_original_max_position_embeddings", s.original_max_position_embeddings);
  if (s.high_freq_factor <= s.low_freq_factor)
    throw InputError(fmt::format("model setting rope_high_freq_factor {} is not above rope_low_freq_factor {}",
                                 s.high_freq_factor, s.low_freq_factor));
  c.rope_scaling = s;
}

void read_llama(const std::map<std::string, std::string>& hp, DecoderConfig& c) {
  c.kv_heads = hparam_int(hp, "n_kv_head", c.kv_heads);
  c.head_size = hparam_int(hp, "head_dim", c.width % c.heads == 0 ? c.width / c.heads : c.head_size);
  c.intermediate = hparam_int(hp, "intermediate_size", c.intermediate);
  c.rope_theta = hparam_float(hp, "rope_theta", c.rope_theta);
  c.norm_eps = hparam_float(hp, "rms_norm_eps", c.norm_eps);
  c.tied = hparam_flag(hp, "tie_word_embeddings", c.tied);
  c.qkv_bias = hparam_flag(hp, "qkv_bias", c.qkv_bias);
  c.o_bias = hparam_flag(hp, "o_bias", c.o_bias);
  if (const std::string* t = find(hp, "model_type")) c.model_type = *t;
  read_rope_scaling(hp, c);
}

void check(const DecoderConfig& c) {
  if (c.padded_vocab < c.vocab)
    throw InputError(fmt::format("padded vocabulary {} is smaller than the vocabulary {}", c.padded_vocab, c.vocab));
  if (c.head_size == 0 && c.width % c.heads != 0)
    throw InputError(fmt::format("width {} is not divisible by {} heads", c.width, c.heads));
  if (c.heads % c.kv() != 0)
    throw InputError(fmt::format("{} attention heads are not divisible by {} key/value heads", c.heads, c.kv()));
  if (c.rotary && c.head_dim() % 2 != 0)
    throw InputError(fmt::format("rotary positions need an even head size, not {}", c.head_dim()));
}

}  // namespace

DecoderConfig DecoderConfig::llama() {
  DecoderConfig c;
  c.family = "llama";
  c.model_type = "llama";
  c.norm = NormKind::RmsNorm;
  c.rotary = true;
  c.kv_heads = 2;
  c.qkv_bias = c.o_bias = c.mlp_bias = false;
  c.mlp = MlpKind::SwiGlu;
  c.intermediate = 704;
  c.tied = false;
  return c;
}

DecoderConfig DecoderConfig::from(const std::map<std::string, std::string>& hp) {
  const std::string* family = find(hp, "dpt.model");
  DecoderConfig c = family && *family == "llama" ? llama() : DecoderConfig{};
  c.vocab = hparam_int(hp, "vocab_size", c.vocab);
  c.layers = hparam_int(hp, "n_layer", c.layers);
  c.heads = hparam_int(hp, "n_head", c.heads);
  c.width = hparam_int(hp, "n_embd", c.width);
  c.context = hparam_int(hp, "block_size", c.context);
  c.padded_vocab = hparam_int(hp, "padded_vocab_size", c.vocab);
  if (find(hp, "sizes")) throw InputError(fmt::format("model setting sizes is the mlp's, not {}'s", c.family));
  if (c.family == "llama") {
    read_llama(hp, c);
  } else {
    for (const char* key : {"n_kv_head", "head_dim", "intermediate_size", "rope_theta", "rms_norm_eps", "rope_scaling",
                            "tie_word_embeddings"})
      if (find(hp, key))
        throw InputError(fmt::format("model setting {} is for the llama family, not {}", key, c.family));
  }
  check(c);
  return c;
}

std::map<std::string, std::string> DecoderConfig::metadata() const {
  std::map<std::string, std::string> m = {{"dpt.model", family},
                                          {"vocab_size", std::to_string(vocab)},
                                          {"n_layer", std::to_string(layers)},
                                          {"n_head", std::to_string(heads)},
                                          {"n_embd", std::to_string(width)},
                                          {"block_size", std::to_string(context)}};
  if (rows() != vocab) m["padded_vocab_size"] = std::to_string(rows());
  if (family != "llama") return m;
  auto flag = [](bool b) { return std::string(b ? "1" : "0"); };
  m["n_kv_head"] = std::to_string(kv());
  m["head_dim"] = std::to_string(head_dim());
  m["intermediate_size"] = std::to_string(ffn());
  m["rope_theta"] = fmt::format("{}", rope_theta);
  m["rms_norm_eps"] = fmt::format("{}", norm_eps);
  m["tie_word_embeddings"] = flag(tied);
  m["qkv_bias"] = flag(qkv_bias);
  m["o_bias"] = flag(o_bias);
  if (!model_type.empty()) m["model_type"] = model_type;
  if (rope_scaling) {
    m["rope_scaling"] = "llama3";
    m["rope_factor"] = fmt::format("{}", rope_scaling->factor);
    m["rope_low_freq_factor"] = fmt::format("{}", rope_scaling->low_freq_factor);
    m["rope_high_freq_factor"] = fmt::format("{}", rope_scaling->high_freq_factor);
    m["rope_original_max_position_embeddings"] = std::to_string(rope_scaling->original_max_position_embeddings);
  }
  return m;
}

double DecoderConfig::block_gemm_params() const {
  const double C = static_cast<double>(width), hd = static_cast<double>(head_dim());
  const double H = static_cast<double>(heads), KV = static_cast<double>(kv());
  const double F = static_cast<double>(ffn());
  const double mlp = this->mlp == MlpKind::SwiGlu ? 3.0 * C * F : 2.0 * C * F;
  return (H + 2.0 * KV) * hd * C + H * hd * C + mlp;
}

int64_t DecoderConfig::block_params() const {
  const int64_t C = width, hd = head_dim(), H = heads, KV = kv(), F = ffn();
  const int64_t norms = norm == NormKind::LayerNorm ? 4 * C : 2 * C;
  const int64_t attn = (H + 2 * KV) * hd * C + H * hd * C + (qkv_bias ? (H + 2 * KV) * hd : 0) + (o_bias ? C : 0);
  const int64_t mlp_params =
      mlp == MlpKind::SwiGlu ? 3 * C * F : 2 * C * F + (mlp_bias ? F + C : 0);
  return norms + attn + mlp_params;
}

int64_t DecoderConfig::params() const {
  const int64_t C = width;
  const int64_t final_norm = norm == NormKind::LayerNorm ? 2 * C : C;
  return vocab * C * (tied ? 1 : 2) + (rotary ? 0 : context * C) + final_norm + layers * block_params();
}

}  // namespace dpt
