// Loading a BpeTokenizer: Hugging Face's tokenizer.json, or GPT-2's
// vocab.json + merges.txt. Whatever the tokenizer cannot reproduce exactly
// is refused in one sentence naming the field (docs/tokenizer.md).
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/bpe_tokenizer.h"
#include "data/byte_level.h"
#include "io/read_checks.h"

namespace dpt {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string read_text(const std::string& path) {
  refuse_directory(path, "a tokenizer file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(fmt::format("{}: cannot open", path));
  return {std::istreambuf_iterator<char>(in), {}};
}

// nlohmann's message without its tag ("[json.exception.parse_error.101] "),
// which names the library's exception, not the problem.
std::string json_message(const json::exception& e) {
  const std::string what = e.what();
  const size_t tag = what.starts_with("[json.exception.") ? what.find("] ") : std::string::npos;
  return tag == std::string::npos ? what : what.substr(tag + 2);
}

json parse(const std::string& text, const std::string& name) {
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    throw InputError(fmt::format("{}: not valid JSON ({})", name, json_message(e)));
  }
}

[[noreturn]] void refuse(const std::string& name, const std::string& what) {
  throw InputError(fmt::format("{}: {}", name, what));
}

// A field's value for a message: its JSON, shortened.
std::string shown(const json& v) {
  std::string s = v.dump();
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

// A field's JSON type in a message.
template <typename T>
constexpr const char* kind_of() {
  if constexpr (std::is_same_v<T, bool>) return "true or false";
  if constexpr (std::is_same_v<T, std::string>) return "a string";
  return "a number";
}

// "model" + "type": "model.type"; "" + "decoder": "decoder".
std::string path_of(const std::string& where, const std::string& key) {
  return where.empty() ? key : where + "." + key;
}

// obj[key] as T, or `fallback` where obj has no key or null there; another
// type is refused naming the field (`where`: obj's own path, "model").
// nlohmann's own error ("type must be string, but is number", "cannot use
// value() with null") names no field.
template <typename T>
T field(const json& obj, const std::string& where, const char* key, T fallback, const std::string& name) {
  if (!obj.is_object() || !obj.contains(key) || obj[key].is_null()) return fallback;
  const json& v = obj[key];
  bool ok = v.is_number();
  if constexpr (std::is_same_v<T, bool>) ok = v.is_boolean();
  if constexpr (std::is_same_v<T, std::string>) ok = v.is_string();
  if (!ok) refuse(name, fmt::format("{} is {}, not {}", path_of(where, key), shown(v), kind_of<T>()));
  return v.get<T>();
}

bool is_true(const json& obj, const std::string& where, const char* key, const std::string& name) {
  return field(obj, where, key, false, name);
}

// v, which must be a JSON object (or, where `optional`, null: absent).
void need_object(const json& v, const std::string& where, const std::string& name, bool optional = false) {
  if (!v.is_object() && !(optional && v.is_null()))
    refuse(name, fmt::format("{} is {}, not an object", where, shown(v)));
}

bool set(const json& obj, const char* key) {
  return obj.contains(key) && !obj[key].is_null() && !(obj[key].is_string() && obj[key].get<std::string>().empty());
}

constexpr const char* kSentencePiece =
    "SentencePiece-style BPE (Llama 2, TinyLlama, Mistral) is not supported, only byte-level BPE (GPT-2, Llama 3)";

void check_model(const json& m, const std::string& name) {
  if (!m.is_object()) refuse(name, "no \"model\" object: not a tokenizer.json");
  const std::string type = field<std::string>(m, "model", "type", m.contains("merges") ? "BPE" : "", name);
  if (type != "BPE") refuse(name, fmt::format("model.type is \"{}\": only byte-level BPE is supported", type));
  if (is_true(m, "model", "byte_fallback", name))
    refuse(name, fmt::format("model.byte_fallback is true: {}", kSentencePiece));
  if (field(m, "model", "dropout", 0.0, name) != 0.0)
    refuse(name, fmt::format("model.dropout is {}: BPE dropout (random merges) is not supported", shown(m["dropout"])));
  for (const char* f : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (set(m, f)) refuse(name, fmt::format("model.{} is {}: not byte-level BPE", f, shown(m[f])));
  if (!m.contains("vocab") || !m["vocab"].is_object())
    refuse(name, m.contains("vocab") ? fmt::format("model.vocab is {}, not an object", shown(m["vocab"]))
                                     : "model.vocab is missing");
  if (!m.contains("merges") || !m["merges"].is_array())
    refuse(name, m.contains("merges") ? fmt::format("model.merges is {}, not an array", shown(m["merges"]))
                                      : "model.merges is missing");
}

// p (at `where`) is ByteLevel, without a prefix space, splitting by GPT-2's
// pattern or (use_regex false) not at all.
bool byte_level(const json& p, const std::string& where, bool use_regex, const std::string& name) {
  need_object(p, where, name);
  return field<std::string>(p, where, "type", "", name) == "ByteLevel" &&
         !is_true(p, where, "add_prefix_space", name) && field(p, where, "use_regex", true, name) == use_regex;
}

// The split a pre_tokenizer stands for: GPT-2's ByteLevel, or Split by a
// known pattern then ByteLevel without its own split (Llama 3).
SplitPattern check_pre_tokenizer(const json& p, const std::string& name) {
  if (p.is_null()) refuse(name, "pre_tokenizer is missing (this tokenizer implements ByteLevel, or Split by GPT-2's "
                               "or Llama 3's pattern then ByteLevel)");
  need_object(p, "pre_tokenizer", name);
  const std::string type = field<std::string>(p, "pre_tokenizer", "type", "", name);
  if (type == "Metaspace") refuse(name, fmt::format("pre_tokenizer is Metaspace: {}", kSentencePiece));
  if (type == "ByteLevel" && is_true(p, "pre_tokenizer", "add_prefix_space", name))
    refuse(name, "pre_tokenizer.add_prefix_space is true: not implemented (GPT-2 and Llama 3 have it false)");
  if (byte_level(p, "pre_tokenizer", true, name)) return SplitPattern::Gpt2;
  const json& list = p.contains("pretokenizers") ? p["pretokenizers"] : json();
  if (type == "Sequence" && !list.is_array())
    refuse(name, fmt::format("pre_tokenizer.pretokenizers is {}, not an array", shown(list)));
  if (type == "Sequence" && list.size() == 2) {
    const json& split = list[0];
    const std::string where = "pre_tokenizer.pretokenizers[0]";
    need_object(split, where, name);
    const json& regex = split.contains("pattern") ? split["pattern"] : json();
    need_object(regex, where + ".pattern", name, true);
    const std::string pattern = field<std::string>(regex, where + ".pattern", "Regex", "", name);
    const bool isolated = field<std::string>(split, where, "type", "", name) == "Split" &&
                          field<std::string>(split, where, "behavior", "", name) == "Isolated" &&
                          !is_true(split, where, "invert", name);
    if (isolated && byte_level(list[1], "pre_tokenizer.pretokenizers[1]", false, name)) {
      if (pattern == kLlama3Pattern) return SplitPattern::Llama3;
      if (pattern == kGpt2Pattern) return SplitPattern::Gpt2;
      refuse(name, fmt::format("pre_tokenizer.pretokenizers[0].pattern {} is not a split this tokenizer "
                               "implements (GPT-2's or Llama 3's)", shown(pattern)));
    }
  }
  refuse(name, fmt::format("pre_tokenizer {} is not one this tokenizer implements (ByteLevel, or Split by GPT-2's "
                           "or Llama 3's pattern then ByteLevel)", shown(p)));
}

void check_rest(const json& j, const std::string& name) {
  if (j.contains("normalizer") && !j["normalizer"].is_null())
    refuse(name, fmt::format("normalizer {} is not implemented (only none)", shown(j["normalizer"])));
  if (j.contains("decoder") && !j["decoder"].is_null() &&
      (!j["decoder"].is_object() || field<std::string>(j["decoder"], "decoder", "type", "", name) != "ByteLevel"))
    refuse(name, fmt::format("decoder {} is not implemented (only ByteLevel)", shown(j["decoder"])));
}

std::vector<AddedToken> added_tokens(const json& j, const std::string& name) {
  std::vector<AddedToken> out;
  if (!j.contains("added_tokens") || j["added_tokens"].is_null()) return out;
  if (!j["added_tokens"].is_array())
    refuse(name, fmt::format("added_tokens is {}, not an array", shown(j["added_tokens"])));
  for (size_t i = 0; i < j["added_tokens"].size(); ++i) {
    const json& t = j["added_tokens"][i];
    const std::string where = fmt::format("added_tokens[{}]", i);
    need_object(t, where, name);
    for (const char* f : {"lstrip", "rstrip", "single_word"})
      if (is_true(t, where, f, name)) refuse(name, fmt::format("{}.{} is true: not implemented", where, f));
    if (!t.contains("id") || !t["id"].is_number_unsigned() || !t.contains("content") || !t["content"].is_string() ||
        t["content"].get<std::string>().empty())
      refuse(name, fmt::format("{} needs an id (>= 0) and a non-empty content", where));
    const bool special = is_true(t, where, "special", name);
    out.push_back({t["content"], t["id"], special, field(t, where, "normalized", !special, name)});
  }
  return out;
}

// vocab: token text -> id, as both file formats hold it. Merges: pairs of
// token texts in rank order. Checks and converts both to byte strings.
BpeModel make_model(const json& vocab, const std::vector<std::pair<std::string, std::string>>& merges,
                    bool ignore_merges, const std::string& name, const char* merges_field) {
  IdsByBytes ids;
  for (const auto& [text, id] : vocab.items()) {
    if (!id.is_number_unsigned() || id.get<uint64_t>() >= (uint64_t{1} << 31))
      refuse(name, fmt::format("model.vocab[\"{}\"] is {}, not a token id", text, shown(id)));
    // Entries that are not byte strings cannot come out of merges: skipped.
    if (auto bytes = byte_level::to_bytes(text)) ids[*bytes] = id.get<uint32_t>();
  }
  for (int b = 0; b < 256; ++b)
    if (!ids.contains(std::string(1, static_cast<char>(b))))
      refuse(name, fmt::format("model.vocab has no token for byte 0x{:02X} (byte-level BPE needs all 256)", b));
  std::vector<std::array<uint32_t, 3>> pairs;
  pairs.reserve(merges.size());
  const auto id_of = [&](const std::string& text, size_t i) {
    const auto bytes = byte_level::to_bytes(text);
    const auto it = bytes ? ids.find(*bytes) : ids.end();
    if (it == ids.end()) refuse(name, fmt::format("{}[{}]: \"{}\" is not in model.vocab", merges_field, i, text));
    return it->second;
  };
  for (size_t i = 0; i < merges.size(); ++i)
    pairs.push_back({id_of(merges[i].first, i), id_of(merges[i].second, i),
                     id_of(merges[i].first + merges[i].second, i)});
  return BpeModel(std::move(ids), pairs, ignore_merges);
}

std::vector<std::pair<std::string, std::string>> json_merges(const json& m, const std::string& name) {
  std::vector<std::pair<std::string, std::string>> out;
  for (size_t i = 0; i < m.size(); ++i) {
    const json& e = m[i];
    if (e.is_string()) {  // "a b" (the older form)
      const std::string s = e;
      const size_t sp = s.find(' ');
      if (sp != std::string::npos && sp > 0 && sp + 1 < s.size() && s.find(' ', sp + 1) == std::string::npos) {
        out.emplace_back(s.substr(0, sp), s.substr(sp + 1));
        continue;
      }
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {  // [a, b]
      out.emplace_back(e[0], e[1]);
      continue;
    }
    refuse(name, fmt::format("model.merges[{}] is {}, neither \"a b\" nor [a, b]", i, shown(e)));
  }
  return out;
}

// From a parsed tokenizer.json; nlohmann's own errors (a field of the wrong
// type) become one sentence too.
BpeTokenizer from_parsed(const json& j, const std::string& name) try {
  if (!j.is_object()) refuse(name, "not a tokenizer.json (not a JSON object)");
  check_model(j.contains("model") ? j["model"] : json(), name);
  check_rest(j, name);
  const SplitPattern pattern = check_pre_tokenizer(j.contains("pre_tokenizer") ? j["pre_tokenizer"] : json(), name);
  const json& m = j["model"];
  BpeModel model = make_model(m["vocab"], json_merges(m["merges"], name), is_true(m, "model", "ignore_merges", name),
                              name, "model.merges");
  return BpeTokenizer(std::move(model), pattern, added_tokens(j, name));
} catch (const json::exception& e) {
  throw InputError(fmt::format("{}: not a tokenizer.json this tokenizer reads ({})", name, json_message(e)));
}

}  // namespace

BpeTokenizer BpeTokenizer::from_json(const std::string& text, const std::string& name) {
  return from_parsed(parse(text, name), name);
}

BpeTokenizer BpeTokenizer::from_vocab_merges(const std::string& vocab_path, const std::string& merges_path) {
  const json vocab = parse(read_text(vocab_path), vocab_path);
  if (!vocab.is_object()) refuse(vocab_path, "not a vocab.json (not a JSON object of token to id)");
  std::vector<std::pair<std::string, std::string>> merges;
  // A directory would read as no merges at all, silently.
  refuse_directory(merges_path, "a merges.txt");
  std::ifstream in(merges_path);
  if (!in) throw IoError(fmt::format("{}: cannot open", merges_path));
  std::string line;
  for (size_t n = 1; std::getline(in, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (n == 1 && line.rfind("#version", 0) == 0)) continue;
    const size_t sp = line.find(' ');
    if (sp == std::string::npos || sp == 0 || sp + 1 == line.size())
      refuse(merges_path, fmt::format("line {} is \"{}\", not \"a b\"", n, line));
    merges.emplace_back(line.substr(0, sp), line.substr(sp + 1));
  }
  BpeModel model = make_model(vocab, merges, false, vocab_path, "merges");
  // GPT-2's files mark no special token: its <|endoftext|> is the one.
  std::vector<AddedToken> added;
  if (vocab.contains("<|endoftext|>")) added.push_back({"<|endoftext|>", vocab["<|endoftext|>"], true, false});
  return BpeTokenizer(std::move(model), SplitPattern::Gpt2, std::move(added));
}

BpeTokenizer BpeTokenizer::load(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    if (fs::exists(fs::path(path) / "tokenizer.json")) return load((fs::path(path) / "tokenizer.json").string());
    if (fs::exists(fs::path(path) / "vocab.json"))
      return from_vocab_merges((fs::path(path) / "vocab.json").string(), (fs::path(path) / "merges.txt").string());
    throw InputError(fmt::format("{}: a directory with neither tokenizer.json nor vocab.json", path));
  }
  if (!fs::exists(path, ec)) throw IoError(fmt::format("{}: no such file", path));
  const json j = parse(read_text(path), path);
  // A vocab.json is a flat object of token to id; merges.txt lies beside it.
  if (j.is_object() && !j.contains("model") && !j.empty() && j.begin()->is_number())
    return from_vocab_merges(path, (fs::path(path).parent_path() / "merges.txt").string());
  return from_parsed(j, path);
}

}  // namespace dpt
