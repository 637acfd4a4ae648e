// The byte-level BPE tokenizer against Hugging Face `tokenizers`: the ids of
// tests/fixtures/tokenizer/ (made by scripts/make_tokenizer_fixtures.py with
// the pinned wheel) on the fortunes corpus, a hostile set, fuzzed strings and
// invalid UTF-8; decode inverting encode; the refusals, one per field.
#include <zlib.h>

#include <algorithm>
#include <ctime>
#include <functional>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/bpe_tokenizer.h"
#include "data/byte_corpus.h"
#include "data/utf8.h"

namespace dpt {
namespace {

namespace fs = std::filesystem;

const fs::path kFixtures = fs::path(DPT_SOURCE_DIR) / "tests" / "fixtures" / "tokenizer";

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  EXPECT_TRUE(in) << p;
  return {std::istreambuf_iterator<char>(in), {}};
}

std::string inflate_file(const fs::path& p) {
  const std::string z = read_file(p);
  z_stream s{};
  inflateInit(&s);
  s.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(z.data()));
  s.avail_in = static_cast<uInt>(z.size());
  std::string out;
  char buf[1 << 16];
  int rc = Z_OK;
  while (rc == Z_OK) {
    s.next_out = reinterpret_cast<Bytef*>(buf);
    s.avail_out = sizeof buf;
    rc = inflate(&s, Z_NO_FLUSH);
    out.append(buf, sizeof buf - s.avail_out);
  }
  inflateEnd(&s);
  EXPECT_EQ(rc, Z_STREAM_END) << p;
  return out;
}

struct Reader {
  std::string data;
  size_t at = 0;
  uint32_t u32() { return take<uint32_t>(); }
  template <class T>
  T take() {
    T v;
    std::memcpy(&v, data.data() + at, sizeof v);
    at += sizeof v;
    return v;
  }
  std::string bytes(size_t n) { return at += n, data.substr(at - n, n); }
};

struct Doc {
  std::string name, raw;
};

// What tokenizers gave: the ids, or for a long document a hash per block.
struct Expected {
  uint32_t n = 0;
  std::vector<uint32_t> ids;
  std::vector<uint64_t> block_hashes;
};
constexpr size_t kBlock = 4096;

uint64_t fnv1a(const void* p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const uint8_t*>(p)[i]) * 0x100000001b3ull;
  return h;
}

// The same word as the fixture script's one_megabyte_word.
std::string one_megabyte_word() {
  const char* syl[] = {"an", "the", "ing", "qu", "x", "zo", "er", "ti", "on", "ble", "str", "a"};
  std::string w;
  uint64_t x = 33;
  while (w.size() < (size_t{1} << 20)) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    w += syl[(x >> 33) % 12];
  }
  w.resize(size_t{1} << 20);
  return w;
}

// The fortunes files as the fixture saw them; empty (the test skips) when
// this machine's corpus differs.
std::vector<Doc> fortunes() {
  const auto meta = nlohmann::json::parse(read_file(kFixtures / "fixtures.json"));
  std::vector<Doc> out;
  const auto files = text_files(kFortunesDir);
  if (files.size() != meta["fortunes"].size()) return {};
  for (size_t i = 0; i < files.size(); ++i) {
    Doc d{fs::path(files[i]).filename().string(), read_file(files[i])};
    const auto& m = meta["fortunes"][i];
    if (d.name != m["name"] || fmt::format("{:016x}", fnv1a(d.raw.data(), d.raw.size())) != m["fnv1a"]) return {};
    out.push_back(std::move(d));
  }
  return out;
}

std::vector<Doc> hostile_docs() {
  Reader r{inflate_file(kFixtures / "docs.bin.z")};
  std::vector<Doc> out(r.u32());
  for (Doc& d : out) {
    d.name = r.bytes(r.u32());
    d.raw = r.bytes(r.u32());
  }
  return out;
}

std::vector<Expected> expected_ids(const std::string& tokenizer) {
  Reader r{inflate_file(kFixtures / (tokenizer + "_ids.bin.z"))};
  std::vector<Expected> out;
  while (r.at < r.data.size()) {
    Expected e;
    e.n = r.u32();
    if (r.u32() == 0) {
      e.ids.resize(e.n);
      for (uint32_t& id : e.ids) id = r.u32();
    } else {
      e.block_hashes.resize((e.n + kBlock - 1) / kBlock);
      for (uint64_t& h : e.block_hashes) h = r.take<uint64_t>();
    }
    out.push_back(std::move(e));
  }
  return out;
}

void expect_same(const Expected& want, const std::vector<uint32_t>& got, const std::string& name) {
  if (want.block_hashes.empty()) {
    EXPECT_EQ(got, want.ids) << name;
    return;
  }
  ASSERT_EQ(got.size(), want.n) << name;
  for (size_t b = 0; b < want.block_hashes.size(); ++b) {
    const size_t n = std::min(kBlock, got.size() - b * kBlock);
    ASSERT_EQ(fnv1a(got.data() + b * kBlock, 4 * n), want.block_hashes[b])
        << name << ": ids " << b * kBlock << ".." << b * kBlock + n << " differ from tokenizers'";
  }
}

BpeTokenizer load(const std::string& name) { return BpeTokenizer::load((kFixtures / name).string()); }

// The fixture's documents in its order: fortunes, hostile and fuzzed, the 1 MB word.
void check_all(const std::string& tokenizer, bool with_fortunes) {
  const BpeTokenizer tok = load(tokenizer + ".json");
  const auto want = expected_ids(tokenizer);
  const auto fort = fortunes();
  const auto docs = hostile_docs();
  ASSERT_EQ(want.size(), fort.size() + docs.size() + 1) << "fixture and fortunes corpus disagree";
  EncodeCache cache;
  if (with_fortunes) {
    if (fort.empty()) GTEST_SKIP() << "this machine's fortunes corpus differs from the fixture's";
    for (size_t i = 0; i < fort.size(); ++i) expect_same(want[i], tok.encode(fort[i].raw, &cache), fort[i].name);
  } else {
    for (size_t i = 0; i < docs.size(); ++i)
      expect_same(want[fort.size() + i], tok.encode(docs[i].raw, &cache), docs[i].name);
  }
}

TEST(Tokenizer, Gpt2StyleMatchesTokenizersOnFortunes) { check_all("gpt2_style", true); }
TEST(Tokenizer, Llama3StyleMatchesTokenizersOnFortunes) { check_all("llama3_style", true); }
TEST(Tokenizer, Gpt2StyleMatchesTokenizersOnHostileSet) { check_all("gpt2_style", false); }
TEST(Tokenizer, Llama3StyleMatchesTokenizersOnHostileSet) { check_all("llama3_style", false); }

// A word of 1 MB that no pre-tokenizer splits: the merges must not take a
// quadratic path (hours at this size; the linear one takes well under a
// second). The bound is the process's CPU time, not wall time (a loaded
// machine stretched 1 s of wall time past a 1 s bound in a CI run of
// 2026-11-28), and 10 s: it fails on a change of complexity, not of speed.
TEST(Tokenizer, OneMegabyteWordMatchesInLinearTime) {
  const std::string word = one_megabyte_word();
  for (const std::string name : {"gpt2_style", "llama3_style"}) {
    const BpeTokenizer tok = load(name + ".json");
    const std::clock_t c0 = std::clock();
    const auto ids = tok.encode(word);
    const double s = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
    expect_same(expected_ids(name).back(), ids, name + " 1 MB word");
    EXPECT_LT(s, 10.0) << name;
    EXPECT_EQ(tok.decode(ids), word);
  }
}

TEST(Tokenizer, VocabAndMergesFilesMatchTokenizerJson) {
  const BpeTokenizer json = load("gpt2_style.json");
  const BpeTokenizer files = load("gpt2_style_files/vocab.json");
  const BpeTokenizer dir = load("gpt2_style_files");
  EXPECT_EQ(files.vocab_size(), json.vocab_size());
  EXPECT_EQ(files.delimiter(), json.delimiter());
  for (const Doc& d : hostile_docs()) {
    EXPECT_EQ(files.encode(d.raw), json.encode(d.raw)) << d.name;
    EXPECT_EQ(dir.encode(d.raw), json.encode(d.raw)) << d.name;
  }
}

TEST(Tokenizer, DecodeInvertsEncode) {
  auto docs = hostile_docs();
  for (Doc& f : fortunes()) docs.push_back(std::move(f));
  for (const std::string name : {"gpt2_style", "llama3_style"}) {
    const BpeTokenizer tok = load(name + ".json");
    for (const Doc& d : docs) {
      // Invalid UTF-8 comes back as Python's errors="replace" reads it.
      const std::string text = utf8::valid(d.raw) ? d.raw : utf8::replace_invalid(d.raw);
      EXPECT_EQ(tok.decode(tok.encode(d.raw)), text) << name << " " << d.name;
      EXPECT_EQ(tok.decode(tok.encode_ordinary(d.raw)), text) << name << " " << d.name;
    }
  }
}

// Python's ids of invalid bytes decode to Python's replacement text: ours
// must be the same bytes.
TEST(Tokenizer, InvalidUtf8IsReplacedAsPythonDoes) {
  const BpeTokenizer tok = load("gpt2_style.json");
  const auto want = expected_ids("gpt2_style");
  const auto docs = hostile_docs();
  const size_t first = want.size() - 1 - docs.size();
  int invalid = 0;
  for (size_t i = 0; i < docs.size(); ++i) {
    if (utf8::valid(docs[i].raw)) continue;
    ++invalid;
    EXPECT_EQ(utf8::replace_invalid(docs[i].raw), tok.decode(want[first + i].ids)) << docs[i].name;
  }
  EXPECT_GT(invalid, 100);
}

TEST(Tokenizer, SpecialTokenTextInACorpusIsPlainText) {
  for (const auto& [name, special] : {std::pair{"gpt2_style", "<|endoftext|>"},
                                      std::pair{"llama3_style", "<|begin_of_text|>"}}) {
    const BpeTokenizer tok = load(std::string(name) + ".json");
    const std::string text = fmt::format("a{}b", special);
    const auto id = tok.special_id(special);
    ASSERT_TRUE(id);
    EXPECT_EQ(tok.delimiter(), id);
    const auto with = tok.encode(text), plain = tok.encode_ordinary(text);
    EXPECT_NE(std::find(with.begin(), with.end(), *id), with.end());
    EXPECT_EQ(std::find(plain.begin(), plain.end(), *id), plain.end());
    EXPECT_EQ(tok.decode(plain), text);
  }
}

TEST(Tokenizer, BatchEqualsOneAtATime) {
  const BpeTokenizer tok = load("llama3_style.json");
  const auto docs = hostile_docs();
  std::vector<std::string_view> views;
  for (const Doc& d : docs) views.push_back(d.raw);
  const auto batch = tok.encode_batch(views);
  ASSERT_EQ(batch.size(), docs.size());
  for (size_t i = 0; i < docs.size(); ++i) EXPECT_EQ(batch[i], tok.encode_ordinary(docs[i].raw)) << docs[i].name;
}

// The fixture's GPT-2-style tokenizer.json with one change, loaded; the
// refusal's sentence.
std::string refusal(const std::function<void(nlohmann::json&)>& change) {
  auto j = nlohmann::json::parse(read_file(kFixtures / "gpt2_style.json"));
  change(j);
  try {
    BpeTokenizer::from_json(j.dump(), "tok.json");
  } catch (const InputError& e) {
    return e.what();
  }
  return "(loaded)";
}

void expect_refusal(const std::function<void(nlohmann::json&)>& change, const std::string& says) {
  const std::string msg = refusal(change);
  EXPECT_NE(msg.find(says), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
}

TEST(Tokenizer, RefusesWhatItCannotRepresent) {
  using J = nlohmann::json;
  expect_refusal([](J& j) { j["model"]["type"] = "Unigram"; }, "model.type is \"Unigram\"");
  expect_refusal([](J& j) { j["model"]["type"] = "WordPiece"; }, "model.type");
  expect_refusal([](J& j) { j["normalizer"] = {{"type", "NFC"}}; }, "normalizer {\"type\":\"NFC\"} is not implemented");
  expect_refusal([](J& j) { j["model"]["byte_fallback"] = true; }, "model.byte_fallback is true: SentencePiece-style");
  expect_refusal([](J& j) { j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "▁"}}; },
                 "pre_tokenizer is Metaspace: SentencePiece-style");
  expect_refusal([](J& j) { j["pre_tokenizer"] = {{"type", "Whitespace"}}; }, "pre_tokenizer {\"type\":\"Whitespace\"}");
  expect_refusal([](J& j) { j["pre_tokenizer"]["add_prefix_space"] = true; }, "pre_tokenizer.add_prefix_space");
  expect_refusal(
      [](J& j) {
        j["pre_tokenizer"] = J::parse(R"({"type":"Sequence","pretokenizers":[{"type":"Split","pattern":
          {"Regex":"\\p{N}| ?\\p{L}+"},"behavior":"Isolated","invert":false},{"type":"ByteLevel",
          "add_prefix_space":false,"use_regex":false}]})");
      },
      "pre_tokenizer.pretokenizers[0].pattern");
  expect_refusal([](J& j) { j["decoder"] = {{"type", "ByteFallback"}}; }, "decoder");
  expect_refusal([](J& j) { j["model"]["dropout"] = 0.1; }, "model.dropout");
  expect_refusal([](J& j) { j["model"]["continuing_subword_prefix"] = "##"; }, "model.continuing_subword_prefix");
  expect_refusal([](J& j) { j["added_tokens"][0]["lstrip"] = true; }, "added_tokens[0].lstrip");
  expect_refusal([](J& j) { j["model"]["merges"][3] = "abc"; }, "model.merges[3] is \"abc\"");
  expect_refusal([](J& j) { j["model"]["merges"][2] = "zzz@ q"; }, "model.merges[2]: \"zzz@\" is not in model.vocab");
  expect_refusal([](J& j) { j["model"]["vocab"].erase("Ġ"); }, "model.vocab has no token for byte 0x20");
  expect_refusal([](J& j) { j["model"]["vocab"]["a"] = -3; }, "model.vocab[\"a\"] is -3");
  expect_refusal([](J& j) { j["model"]["vocab"] = 3; }, "model.vocab");
  expect_refusal([](J& j) { j.erase("model"); }, "no \"model\" object");
}

TEST(Tokenizer, UnchangedFixtureLoads) {
  EXPECT_EQ(refusal([](nlohmann::json&) {}), "(loaded)");
  EXPECT_THROW(BpeTokenizer::from_json("{not json", "x.json"), InputError);
  EXPECT_THROW(load("no_such_tokenizer.json"), IoError);
}

TEST(Tokenizer, DecodeRefusesAnIdOutsideTheVocabulary) {
  const BpeTokenizer tok = load("gpt2_style.json");
  EXPECT_THROW(tok.decode({tok.vocab_size()}), InputError);
}

}  // namespace
}  // namespace dpt
