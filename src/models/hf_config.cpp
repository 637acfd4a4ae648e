#include "models/hf_config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/read_checks.h"
#include "models/hf_gpt2.h"

namespace dpt {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const std::vector<std::string> kLlamaTypes = {"llama", "qwen2", "mistral"};

bool is_llama_type(const std::string& t) { return std::find(kLlamaTypes.begin(), kLlamaTypes.end(), t) != kLlamaTypes.end(); }

InputError unknown_type(const std::string& where, const std::string& type) {
  return InputError(fmt::format("{}: model_type '{}' is not supported (known: {})", where, type,
                                fmt::join(hf_model_types(), ", ")));
}

// The keys of one JSON object, each read with its type checked, every
// message naming the file and the key (`prefix` for a nested object:
// "rope_scaling."). A key whose value is null counts as absent.
class Keys {
 public:
  Keys(const json& j, const std::string& where, std::string prefix = "")
      : j_(j), where_(where), prefix_(std::move(prefix)) {}
  bool has(const std::string& k) const { return j_.is_object() && j_.contains(k) && !j_[k].is_null(); }
  bool present(const std::string& k) const { return j_.is_object() && j_.contains(k); }  // null included
  std::string name(const std::string& k) const { return prefix_ + k; }

  void require(const std::string& k) const {
    if (!has(k)) throw InputError(fmt::format("{}: required key {} is missing", where_, name(k)));
  }
  int64_t integer(const std::string& k) const {
    require(k);
    return integer_or(k, 0);
  }
  int64_t integer_or(const std::string& k, int64_t fallback) const {
    if (!has(k)) return fallback;
    if (!j_[k].is_number_integer() || j_[k].get<int64_t>() <= 0) throw bad(k, "a positive integer");
    return j_[k].get<int64_t>();
  }
  double number(const std::string& k) const {
    require(k);
    return number_or(k, 0.0);
  }
  double number_or(const std::string& k, double fallback) const {
    if (!has(k)) return fallback;
    if (!j_[k].is_number() || !(j_[k].get<double>() > 0.0) || !std::isfinite(j_[k].get<double>()))
      throw bad(k, "a positive number");
    return j_[k].get<double>();
  }
  bool flag_or(const std::string& k, bool fallback) const {
    if (!has(k)) return fallback;
    if (!j_[k].is_boolean()) throw bad(k, "true or false");
    return j_[k].get<bool>();
  }
  std::string text_or(const std::string& k, const std::string& fallback) const {
    if (!has(k)) return fallback;
    if (!j_[k].is_string()) throw bad(k, "a string");
    return j_[k].get<std::string>();
  }

 private:
  InputError bad(const std::string& k, const char* want) const {
    return InputError(fmt::format("{}: {} is {}, not {}", where_, name(k), j_[k].dump(), want));
  }
  const json& j_;
  const std::string& where_;
  std::string prefix_;
};

std::string num(double v) { return fmt::format("{}", v); }  // shortest form that reads back exactly
std::string num(int64_t v) { return std::to_string(v); }
std::string bit(bool b) { return std::string(1, b ? '1' : '0'); }  // the engine's booleans

// rope_theta and the rope scaling: transformers 5 writes both inside
// rope_parameters, earlier versions write rope_theta and rope_scaling.
void read_rope(const json& config, const std::string& where, std::map<std::string, std::string>& hp) {
  const Keys top(config, where);
  const bool v5 = top.has("rope_parameters");
  const std::string key = v5 ? "rope_parameters" : "rope_scaling";
  static const json kNone = nullptr;
  const json& scaling = top.has(key) ? config[key] : kNone;
  if (!scaling.is_null() && !scaling.is_object())
    throw InputError(fmt::format("{}: {} is {}, not an object", where, key, scaling.dump()));
  const Keys rs(scaling, where, key + ".");
  const double theta = top.number_or("rope_theta", 10000.0);
  hp["rope_theta"] = num(v5 ? rs.number_or("rope_theta", theta) : theta);
  std::string type = "default", type_key = "rope_type";
  if (rs.has("rope_type")) {
    type = rs.text_or("rope_type", type);
  } else if (rs.has("type")) {  // the older spelling
    type = rs.text_or("type", type);
    type_key = "type";
  } else if (scaling.is_object() && !v5) {
    throw InputError(fmt::format("{}: rope_scaling gives neither rope_type nor type", where));
  }
  if (type == "default") return;
  if (type != "llama3")
    throw InputError(fmt::format("{}: {} '{}' is not implemented (implemented: default, llama3)", where,
                                 rs.name(type_key), type));
  const double low = rs.number("low_freq_factor"), high = rs.number("high_freq_factor");
  if (!(high > low))
    throw InputError(fmt::format("{}: {} {} must be above {} {}", where, rs.name("high_freq_factor"), high,
                                 rs.name("low_freq_factor"), low));
  hp["rope_scaling"] = "llama3";
  hp["rope_factor"] = num(rs.number("factor"));
  hp["rope_low_freq_factor"] = num(low);
  hp["rope_high_freq_factor"] = num(high);
  hp["rope_original_max_position_embeddings"] = num(rs.integer("original_max_position_embeddings"));
}

// A window key as transformers reads it: absent is its default (4096),
// null is no window.
std::optional<int64_t> window(const Keys& k, const char* key) {
  if (!k.present(key)) return 4096;
  if (!k.has(key)) return std::nullopt;
  return k.integer_or(key, 0);
}

// Sliding-window attention, refused where it would change the model: qwen2
// with use_sliding_window (from layer max_window_layers on), mistral with a
// window shorter than max_position_embeddings (a window covering every
// position is full attention), and transformers 5's layer_types naming any
// attention but full.
void refuse_sliding_window(const json& config, const std::string& where, const std::string& type, int64_t layers,
                           int64_t positions) {
  const Keys k(config, where);
  if (k.has("layer_types")) {
    const json& lt = config["layer_types"];
    for (size_t i = 0; lt.is_array() && i < lt.size(); ++i)
      if (lt[i] != "full_attention")
        throw InputError(fmt::format("{}: layer_types gives layer {} {} attention; only full attention is "
                                     "implemented",
                                     where, i, lt[i].dump()));
  }
  if (type == "qwen2" && k.flag_or("use_sliding_window", false)) {
    const auto w = window(k, "sliding_window");
    const int64_t from = k.integer_or("max_window_layers", 28);
    if (w && *w < positions && from < layers)
      throw InputError(fmt::format("{}: use_sliding_window is true (a window of {} positions from layer {} on), "
                                   "and sliding-window attention is not implemented",
                                   where, *w, from));
  }
  if (type == "mistral") {
    const auto w = window(k, "sliding_window");
    if (w && *w < positions)
      throw InputError(fmt::format("{}: sliding_window is {}{}, below max_position_embeddings {}, and "
                                   "sliding-window attention is not implemented (null means full attention)",
                                   where, *w, k.present("sliding_window") ? "" : " (transformers' default)",
                                   positions));
  }
}

// q/k/v and o_proj biases, and the MLP's (refused): llama reads
// attention_bias for all four; qwen2's q/k/v are always biased and its
// o_proj never, mistral has none, and neither reads the key, so a config
// that sets it is refused rather than half-obeyed.
void read_biases(const Keys& k, const std::string& where, const std::string& type,
                 std::map<std::string, std::string>& hp) {
  if (k.flag_or("mlp_bias", false))
    throw InputError(fmt::format("{}: mlp_bias is true, but the engine's SwiGLU MLP has no biases", where));
  const bool attention_bias = k.flag_or("attention_bias", false);
  if (attention_bias && type != "llama")
    throw InputError(fmt::format("{}: attention_bias is true, but a {} model's attention biases are fixed ({}) "
                                 "and transformers does not read the key",
                                 where, type, type == "qwen2" ? "on q, k and v, not on o_proj" : "none"));
  hp["qkv_bias"] = bit(attention_bias || type == "qwen2");
  hp["o_bias"] = bit(attention_bias);
}

// The attention's shape: heads, key/value heads and the head size.
void read_heads(const Keys& k, const std::string& where, const std::string& type, int64_t hidden,
                std::map<std::string, std::string>& hp) {
  const int64_t heads = k.integer("num_attention_heads");
  // transformers: absent is the head count for llama; qwen2's and mistral's
  // defaults (32, 8) are one model's, so there the key is required.
  const int64_t kv = type == "llama" ? k.integer_or("num_key_value_heads", heads) : k.integer("num_key_value_heads");
  if (heads % kv != 0)
    throw InputError(fmt::format("{}: num_key_value_heads {} does not divide num_attention_heads {}", where, kv,
                                 heads));
  if (!k.has("head_dim") && hidden % heads != 0)
    throw InputError(fmt::format("{}: hidden_size {} is not a multiple of num_attention_heads {} and no head_dim "
                                 "is given",
                                 where, hidden, heads));
  const int64_t head_dim = k.integer_or("head_dim", hidden / heads);
  if (head_dim % 2 != 0)
    throw InputError(fmt::format("{}: head_dim {} is odd, and rotary embeddings rotate pairs of channels", where,
                                 head_dim));
  hp["n_head"] = num(heads);
  hp["n_kv_head"] = num(kv);
  hp["head_dim"] = num(head_dim);
}

int64_t default_positions(const std::string& type) {
  return type == "llama" ? 2048 : type == "qwen2" ? 32768 : 131072;  // transformers' defaults
}

}  // namespace

std::vector<std::string> hf_model_types() { return {"gpt2", "llama", "qwen2", "mistral"}; }

std::map<std::string, std::string> llama_hparams_from_hf_config(const json& config, const std::string& where) {
  if (!config.is_object()) throw InputError(fmt::format("{}: not a JSON object", where));
  const Keys k(config, where);
  k.require("model_type");
  const std::string type = k.text_or("model_type", "");
  if (!is_llama_type(type)) throw unknown_type(where, type);
  const std::string act = k.text_or("hidden_act", "silu");
  if (act != "silu")
    throw InputError(fmt::format("{}: hidden_act is '{}', but the engine's SwiGLU MLP implements silu only", where,
                                 act));
  std::map<std::string, std::string> hp = {{"dpt.model", "llama"}, {"model_type", type}};
  const int64_t hidden = k.integer("hidden_size"), layers = k.integer("num_hidden_layers");
  hp["vocab_size"] = num(k.integer("vocab_size"));
  hp["n_embd"] = num(hidden);
  hp["n_layer"] = num(layers);
  hp["intermediate_size"] = num(k.integer("intermediate_size"));
  read_heads(k, where, type, hidden, hp);
  const int64_t positions = k.integer_or("max_position_embeddings", default_positions(type));
  hp["block_size"] = num(positions);
  hp["rms_norm_eps"] = num(k.number_or("rms_norm_eps", 1e-6));
  hp["tie_word_embeddings"] = bit(k.flag_or("tie_word_embeddings", false));
  read_biases(k, where, type, hp);
  read_rope(config, where, hp);
  refuse_sliding_window(config, where, type, layers, positions);
  return hp;
}

std::map<std::string, std::string> hparams_from_hf_config(const json& config, const std::string& where) {
  if (!config.is_object()) throw InputError(fmt::format("{}: not a JSON object", where));
  const std::string type = Keys(config, where).text_or("model_type", "gpt2");
  if (type == "gpt2") return gpt2_hparams_from_config(config, where);
  if (is_llama_type(type)) return llama_hparams_from_hf_config(config, where);
  throw unknown_type(where, type);
}

std::map<std::string, std::string> read_hf_config(const std::string& path) {
  refuse_directory(path, "a config.json");
  std::ifstream in(path);
  if (!in) throw IoError(fmt::format("{}: cannot open", path));
  json j;
  try {
    in >> j;
  } catch (const json::exception&) {
    throw InputError(fmt::format("{}: not valid JSON", path));
  }
  return hparams_from_hf_config(j, path);
}

// ---- Writing ----

namespace {

// A hyper-parameter a config.json needs; InputError if absent or malformed.
std::string need(const std::map<std::string, std::string>& hp, const std::string& key) {
  auto it = hp.find(key);
  if (it == hp.end())
    throw InputError(fmt::format("hyper-parameter {} is missing, so no config.json can be written", key));
  return it->second;
}

int64_t need_int(const std::map<std::string, std::string>& hp, const std::string& key) {
  const std::string s = need(hp, key);
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != s.size() || v <= 0)
    throw InputError(fmt::format("hyper-parameter {} = '{}' is not a positive integer", key, s));
  return v;
}

double need_num(const std::map<std::string, std::string>& hp, const std::string& key) {
  const std::string s = need(hp, key);
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != s.size() || !(v > 0) || !std::isfinite(v))
    throw InputError(fmt::format("hyper-parameter {} = '{}' is not a positive number", key, s));
  return v;
}

bool flag(const std::map<std::string, std::string>& hp, const std::string& key) {
  auto it = hp.find(key);
  return it != hp.end() && it->second == "1";
}

// The biases as the model_type can say them (see read_biases).
void write_biases(const std::map<std::string, std::string>& hp, const std::string& type, json& j) {
  const bool qkv = flag(hp, "qkv_bias"), o = flag(hp, "o_bias");
  const bool fits = type == "llama" ? qkv == o : type == "qwen2" ? qkv && !o : !qkv && !o;
  if (!fits)
    throw InputError(fmt::format("a {} config.json cannot say qkv_bias {} with o_bias {} ({})", type, qkv ? 1 : 0,
                                 o ? 1 : 0,
                                 type == "llama"   ? "its attention_bias covers q, k, v and o_proj alike"
                                 : type == "qwen2" ? "q, k and v are always biased, o_proj never"
                                                   : "mistral has no attention biases"));
  if (type == "llama") {
    j["attention_bias"] = qkv;
    j["mlp_bias"] = false;
  }
}

}  // namespace

json hf_config_from_hparams(const std::map<std::string, std::string>& hp) {
  auto it = hp.find("model_type");
  const std::string type = it == hp.end() ? "llama" : it->second;
  if (!is_llama_type(type)) throw unknown_type("hyper-parameters", type);
  const char* arch = type == "llama" ? "LlamaForCausalLM" : type == "qwen2" ? "Qwen2ForCausalLM" : "MistralForCausalLM";
  json j;  // keys sorted, as save_pretrained writes them
  j["architectures"] = json::array({arch});
  j["model_type"] = type;
  j["vocab_size"] = need_int(hp, "vocab_size");
  j["hidden_size"] = need_int(hp, "n_embd");
  j["intermediate_size"] = need_int(hp, "intermediate_size");
  j["num_hidden_layers"] = need_int(hp, "n_layer");
  j["num_attention_heads"] = need_int(hp, "n_head");
  j["num_key_value_heads"] = need_int(hp, "n_kv_head");
  j["head_dim"] = need_int(hp, "head_dim");
  j["max_position_embeddings"] = need_int(hp, "block_size");
  j["rms_norm_eps"] = need_num(hp, "rms_norm_eps");
  j["rope_theta"] = need_num(hp, "rope_theta");
  j["rope_scaling"] = nullptr;
  if (auto rs = hp.find("rope_scaling"); rs != hp.end()) {
    if (rs->second != "llama3")
      throw InputError(fmt::format("hyper-parameter rope_scaling = '{}' is not implemented (implemented: llama3)",
                                   rs->second));
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", need_num(hp, "rope_factor")},
                         {"low_freq_factor", need_num(hp, "rope_low_freq_factor")},
                         {"high_freq_factor", need_num(hp, "rope_high_freq_factor")},
                         {"original_max_position_embeddings", need_int(hp, "rope_original_max_position_embeddings")}};
  }
  j["tie_word_embeddings"] = flag(hp, "tie_word_embeddings");
  write_biases(hp, type, j);
  if (type == "qwen2") j["use_sliding_window"] = false;
  if (type == "mistral") j["sliding_window"] = nullptr;  // absent would mean transformers' 4096
  j["hidden_act"] = "silu";
  j["torch_dtype"] = "float32";
  return j;
}

void write_hf_config(const std::string& weights_path, const std::map<std::string, std::string>& hparams) {
  std::error_code ec;
  const fs::path dir = fs::is_directory(weights_path, ec) ? fs::path(weights_path) : fs::path(weights_path).parent_path();
  AtomicFile file((dir / "config.json").string());
  file.write(hf_config_from_hparams(hparams).dump(2) + "\n");
  file.commit();
}

// ---- Generation ----

namespace {

// eos_token_id of one file, as ids.
std::vector<int32_t> eos_ids(const fs::path& path) {
  refuse_directory(path.string(), "a JSON file");
  std::ifstream in(path);
  if (!in) throw IoError(fmt::format("{}: cannot open", path.string()));
  json j;
  try {
    in >> j;
  } catch (const json::exception&) {
    throw InputError(fmt::format("{}: not valid JSON", path.string()));
  }
  const json* v = j.is_object() && j.contains("eos_token_id") ? &j["eos_token_id"] : nullptr;
  if (!v || v->is_null()) return {};
  const json list = v->is_array() ? *v : json::array({*v});
  std::vector<int32_t> ids;
  for (const json& id : list) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
      throw InputError(fmt::format("{}: eos_token_id {} is not a token id or a list of them", path.string(),
                                   v->dump()));
    ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
  }
  return ids;
}

}  // namespace

std::vector<int32_t> hf_eos_token_ids(const std::string& weights_path) {
  std::error_code ec;
  const fs::path dir = fs::is_directory(weights_path, ec) ? fs::path(weights_path) : fs::path(weights_path).parent_path();
  for (const char* name : {"generation_config.json", "config.json"})
    if (fs::exists(dir / name, ec)) return eos_ids(dir / name);
  return {};
}

}  // namespace dpt
