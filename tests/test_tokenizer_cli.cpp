// `dpt tokens --tokenizer`: a corpus through the BPE tokenizer into llm.c
// shards, read back through the engine's shard reader (data/token_shards.h),
// which reads llm.c's uint32 shards (magic 20240801) too.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli_run.h"
#include "core/error.h"
#include "data/bpe_tokenizer.h"
#include "data/token_shards.h"

namespace dpt {
namespace {

namespace fs = std::filesystem;
using test::q;

const fs::path kFixtures = fs::path(DPT_SOURCE_DIR) / "tests" / "fixtures" / "tokenizer";

class TokensCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / fmt::format("dpt_tokens_{}_{}", ::getpid(), counter_++);
    fs::create_directories(dir_ / "corpus");
  }
  void TearDown() override { fs::remove_all(dir_); }
  test::RunResult dpt(const std::string& args) {
    return test::run_shell(fmt::format("{}/dpt tokens {}", DPT_BINARY_DIR, args), dir_, 120);
  }
  void write(const fs::path& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }
  // Every token of the shards matching `glob`, through the engine's reader.
  std::vector<int32_t> read_back(const std::string& glob, int64_t vocab) {
    TokenShards shards((dir_ / glob).string(), TokenFormat::Llmc, vocab);
    std::vector<int32_t> all;
    for (size_t s = 0; s < shards.count(); ++s) {
      std::vector<int32_t> t(static_cast<size_t>(shards.tokens(s)));
      shards.read(s, 0, shards.tokens(s), t.data());
      all.insert(all.end(), t.begin(), t.end());
    }
    return all;
  }
  fs::path dir_;
  static inline int counter_ = 0;
};

// The documents of the corpus below, in the order dpt reads them.
std::vector<std::string> write_corpus(const fs::path& dir) {
  const std::string a = "A text file is one document. It quotes <|begin_of_text|> and <|endoftext|> as text.\n\n";
  std::ofstream(dir / "a.txt", std::ios::binary) << a;
  std::ofstream(dir / "b.jsonl", std::ios::binary)
      << R"({"text": "first line's text", "id": 1})" << "\n\n"
      << R"({"text": ""})" << "\n"
      << "{\"text\": \"bad \xff\xfe bytes \xe2\x82 and emoji \xf0\x9f\x98\x80\"}\n";
  return {a, "first line's text", "", "bad \xEF\xBF\xBD\xEF\xBF\xBD bytes \xEF\xBF\xBD and emoji \xf0\x9f\x98\x80"};
}

std::vector<int32_t> expected(const BpeTokenizer& tok, const std::vector<std::string>& docs) {
  std::vector<int32_t> out;
  for (const std::string& d : docs) {
    out.push_back(static_cast<int32_t>(*tok.delimiter()));
    for (const uint32_t id : tok.encode_ordinary(d)) out.push_back(static_cast<int32_t>(id));
  }
  return out;
}

TEST_F(TokensCli, WritesUint16ShardsTheReaderReads) {
  const auto docs = write_corpus(dir_ / "corpus");
  const fs::path tokenizer = kFixtures / "llama3_style.json";
  const auto r = dpt(fmt::format("--tokenizer {} --input {} --out {} --name t --shard-tokens 20 --val-tokens 5",
                                 q(tokenizer), q(dir_ / "corpus"), q(dir_ / "out")));
  ASSERT_EQ(r.code, 0) << r.all();
  EXPECT_NE(r.out.find("4 documents"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("uint16 (magic 20240520)"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("tokens: 100%"), std::string::npos) << r.err;
  const BpeTokenizer tok = BpeTokenizer::load(tokenizer.string());
  const auto want = expected(tok, docs);
  auto got = read_back("out/t_train_*.bin", tok.vocab_size());
  const auto val = read_back("out/t_val_000000.bin", tok.vocab_size());
  EXPECT_EQ(val.size(), 5u);
  got.insert(got.end(), val.begin(), val.end());
  EXPECT_EQ(got, want);
  EXPECT_EQ(got[0], static_cast<int32_t>(*tok.special_id("<|begin_of_text|>")));
  EXPECT_FALSE(fs::exists(dir_ / "out" / ".t_tokens.tmp"));
}

// A vocabulary past 65536 (Llama 3's 128,256) needs llm.c's uint32 shards.
TEST_F(TokensCli, WideVocabularyWritesUint32Shards) {
  auto j = nlohmann::json::parse(test::read_file(kFixtures / "gpt2_style.json"));
  j["added_tokens"].push_back({{"id", 100000}, {"content", "<|far|>"}, {"special", true}, {"normalized", false}});
  write(dir_ / "wide.json", j.dump());
  const auto docs = write_corpus(dir_ / "corpus");
  const auto r = dpt(fmt::format("--tokenizer {} --input {} --out {}", q(dir_ / "wide.json"),
                                 q(dir_ / "corpus"), q(dir_ / "out")));
  ASSERT_EQ(r.code, 0) << r.all();
  EXPECT_NE(r.out.find("uint32 (magic 20240801)"), std::string::npos) << r.out;
  const std::string shard = test::read_file(dir_ / "out" / "data_train_000000.bin");
  int32_t header[3];
  std::memcpy(header, shard.data(), sizeof header);
  EXPECT_EQ(header[0], 20240801);
  EXPECT_EQ(header[1], 7);
  const BpeTokenizer tok = BpeTokenizer::load((dir_ / "wide.json").string());
  EXPECT_EQ(tok.vocab_size(), 100001u);
  EXPECT_EQ(read_back("out/data_train_*.bin", tok.vocab_size()), expected(tok, docs));
  EXPECT_EQ(static_cast<size_t>(header[2]) * 4 + 1024, shard.size());
}

TEST_F(TokensCli, RefusesInOneSentence) {
  write_corpus(dir_ / "corpus");
  auto j = nlohmann::json::parse(test::read_file(kFixtures / "gpt2_style.json"));
  j["normalizer"] = {{"type", "NFC"}};
  write(dir_ / "nfc.json", j.dump());
  const std::string good = q(kFixtures / "gpt2_style.json");
  test::expect_one_refusal(dpt(fmt::format("--tokenizer {} --input {} --out {}", q(dir_ / "nfc.json"),
                                           q(dir_ / "corpus"), q(dir_ / "out"))),
                           "normalizer");
  test::expect_one_refusal(dpt(fmt::format("--tokenizer {} --from bytes --out {}", good, q(dir_ / "out"))),
                           "--from and --tokenizer contradict");
  write(dir_ / "bad.jsonl", "{\"text\": \"ok\"}\n{\"txt\": \"no text\"}\n");
  test::expect_one_refusal(dpt(fmt::format("--tokenizer {} --input {} --out {}", good, q(dir_ / "bad.jsonl"),
                                           q(dir_ / "out"))),
                           "bad.jsonl: line 2 is not a JSON object with a \"text\" string");
  write(dir_ / "binary.txt", std::string("abc\0def", 7));
  test::expect_one_refusal(dpt(fmt::format("--tokenizer {} --input {} --out {}", good, q(dir_ / "binary.txt"),
                                           q(dir_ / "out"))),
                           "binary.txt: not text: its first four bytes are 61 62 63 00 and byte 3 is a NUL; raw "
                           "uint16 tokens need --from u16 without --tokenizer");
  test::expect_one_refusal(dpt(fmt::format("--tokenizer {} --out {}", q(dir_ / "missing.json"), q(dir_ / "out"))),
                           "missing.json");
}

// A tokenizer.json that is not JSON, or whose fields have the wrong type:
// nlohmann's message, without its "[json.exception.parse_error.101]" tag
// (the library's exception's name, which said nothing to a user).
TEST_F(TokensCli, ATokenizerThatIsNotJsonIsOneSentenceWithoutTheLibrarysTag) {
  write_corpus(dir_ / "corpus");
  write(dir_ / "broken.json", "{bad");
  const test::RunResult r = dpt(fmt::format("--tokenizer {} --input {} --out {}", q(dir_ / "broken.json"),
                                      q(dir_ / "corpus"), q(dir_ / "out")));
  test::expect_one_refusal(r, "broken.json: not valid JSON (parse error at line 1, column 2: syntax error");
  EXPECT_EQ(r.err.find("json.exception"), std::string::npos) << r.err;
  write(dir_ / "typed.json", R"({"model": {"type": "BPE", "vocab": {}, "merges": []}})");
  const test::RunResult t = dpt(fmt::format("--tokenizer {} --input {} --out {}", q(dir_ / "typed.json"),
                                      q(dir_ / "corpus"), q(dir_ / "out")));
  test::expect_one_refusal(t, "typed.json: pre_tokenizer is missing (this tokenizer implements ByteLevel");
  EXPECT_EQ(t.err.find("json.exception"), std::string::npos) << t.err;
  EXPECT_FALSE(fs::exists(dir_ / "out"));
}

// A field of the wrong type is one sentence naming the file and the field:
// nlohmann's own text ("type must be string, but is number", "cannot use
// value() with null") named neither, and a boolean written as a string
// ("byte_fallback": "true") read as false.
TEST_F(TokensCli, AFieldOfTheWrongTypeIsNamed) {
  write_corpus(dir_ / "corpus");
  std::ifstream in(kFixtures / "gpt2_style.json");
  const nlohmann::json good = nlohmann::json::parse(in);
  using nlohmann::json;
  const std::vector<std::pair<std::function<void(json&)>, std::string>> cases = {
      {[](json& j) { j["model"]["vocab"] = 5; }, "model.vocab is 5, not an object"},
      {[](json& j) { j["model"]["merges"] = "a b"; }, "model.merges is \"a b\", not an array"},
      {[](json& j) { j["model"]["type"] = 5; }, "model.type is 5, not a string"},
      {[](json& j) { j["model"]["dropout"] = "x"; }, "model.dropout is \"x\", not a number"},
      {[](json& j) { j["model"]["byte_fallback"] = "true"; }, "model.byte_fallback is \"true\", not true or false"},
      {[](json& j) { j["model"]["ignore_merges"] = 1; }, "model.ignore_merges is 1, not true or false"},
      {[](json& j) { j["pre_tokenizer"]["use_regex"] = "yes"; },
       "pre_tokenizer.use_regex is \"yes\", not true or false"},
      {[](json& j) { j["pre_tokenizer"] = 3; }, "pre_tokenizer is 3, not an object"},
      {[](json& j) { j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", 7}}; },
       "pre_tokenizer.pretokenizers is 7, not an array"},
      {[](json& j) { j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {nullptr, json::object()}}}; },
       "pre_tokenizer.pretokenizers[0] is null, not an object"},
      {[](json& j) { j["decoder"] = {{"type", 3}}; }, "decoder.type is 3, not a string"},
      {[](json& j) { j["added_tokens"] = {{"a", 1}}; }, "added_tokens is {\"a\":1}, not an array"},
      {[](json& j) { j["added_tokens"][0] = 3; }, "added_tokens[0] is 3, not an object"},
      {[](json& j) { j["added_tokens"][0]["special"] = "yes"; },
       "added_tokens[0].special is \"yes\", not true or false"},
  };
  for (const auto& [mutate, says] : cases) {
    json j = good;
    mutate(j);
    write(dir_ / "t.json", j.dump());
    const test::RunResult r = dpt(fmt::format("--tokenizer {} --input {} --out {}", q(dir_ / "t.json"),
                                              q(dir_ / "corpus"), q(dir_ / "out")));
    SCOPED_TRACE(says);
    test::expect_one_refusal(r, "t.json: " + says);
    EXPECT_FALSE(fs::exists(dir_ / "out"));
  }
  // The fixture itself reads.
  write(dir_ / "t.json", good.dump());
  EXPECT_EQ(dpt(fmt::format("--tokenizer {} --input {} --out {}", q(dir_ / "t.json"), q(dir_ / "corpus"),
                            q(dir_ / "out")))
                .code,
            0);
}

// The inputs' kind is checked before anything is written, as dpt tokens
// --from bytes and dpt train --data check theirs (data/file_kind.h): an
// llm.c shard (either magic) and raw uint16 tokens are refused in one
// sentence naming the file and its first four bytes, the first such file of
// a directory included; invalid UTF-8 without a NUL is text (read as
// errors="replace" reads it).
TEST_F(TokensCli, RefusesShardsAndRawTokensBeforeWriting) {
  const std::string good = q(kFixtures / "gpt2_style.json");
  const auto refused = [&](const fs::path& input, const std::string& says) {
    test::expect_one_refusal(
        dpt(fmt::format("--tokenizer {} --input {} --out {}", good, q(input), q(dir_ / "out"))), says);
    EXPECT_FALSE(fs::exists(dir_ / "out")) << input;
  };
  for (const int32_t magic : {kLlmcMagic, kLlmc32Magic}) {
    std::vector<int32_t> header(256, 0);
    header[0] = magic;
    header[1] = magic == kLlmcMagic ? 1 : 7;
    header[2] = 2;
    std::string bytes(reinterpret_cast<const char*>(header.data()), 1024);
    bytes += std::string("\x05\x00\x07\x00", 4);
    write(dir_ / "corpus" / "z.bin", bytes);
    std::string four;
    for (int i = 0; i < 4; ++i) four += fmt::format("{}{:02x}", i ? " " : "", static_cast<unsigned char>(bytes[i]));
    refused(dir_ / "corpus" / "z.bin", fmt::format("z.bin: an llm.c shard, not text: its first four bytes are {}", four));
    write(dir_ / "corpus" / "a.txt", "plain text\n");
    refused(dir_ / "corpus", "z.bin: an llm.c shard, not text");  // a directory: its shard named
    fs::remove(dir_ / "corpus" / "z.bin");
  }
  // nanoGPT's train.bin: raw uint16 tokens, no header.
  write(dir_ / "train.bin", std::string("\x48\x00\x65\x00\x6c\x00", 6));
  refused(dir_ / "train.bin", "train.bin: not text: its first four bytes are 48 00 65 00 and byte 1 is a NUL");
  // Invalid UTF-8 without a NUL is text.
  write(dir_ / "latin1.txt", "caf\xe9 cr\xe8me\n");
  const auto r = dpt(fmt::format("--tokenizer {} --input {} --out {}", good, q(dir_ / "latin1.txt"), q(dir_ / "out")));
  EXPECT_EQ(r.code, 0) << r.err;
}

// llm.c's uint32 shards by hand: the reader widens them, checks them against
// the vocabulary, and refuses a wrong version.
TEST(TokenizerShards, ReaderReadsUint32Shards) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("dpt_shards32_{}", ::getpid());
  fs::create_directories(dir);
  const auto shard = [&](const std::string& name, int32_t version, const std::vector<uint32_t>& t) {
    int32_t header[256] = {20240801, version, static_cast<int32_t>(t.size())};
    std::ofstream out(dir / name, std::ios::binary);
    out.write(reinterpret_cast<const char*>(header), sizeof header);
    out.write(reinterpret_cast<const char*>(t.data()), static_cast<std::streamsize>(4 * t.size()));
    return (dir / name).string();
  };
  const std::vector<uint32_t> tokens = {0, 65535, 65536, 128255, 7};
  const std::string ok = shard("ok.bin", 7, tokens);
  EXPECT_EQ(detect_format(ok), TokenFormat::Llmc);
  TokenShards s(ok, TokenFormat::Llmc, 128256);
  std::vector<int32_t> got(tokens.size());
  s.read(0, 0, static_cast<int64_t>(tokens.size()), got.data());
  EXPECT_EQ(got, std::vector<int32_t>(tokens.begin(), tokens.end()));
  const auto error_of = [](const std::string& path, int64_t vocab) -> std::string {
    try {
      TokenShards t(path, TokenFormat::Llmc, vocab);
    } catch (const InputError& e) {
      return e.what();
    }
    return "(read)";
  };
  EXPECT_NE(error_of(ok, 128255).find("token 128255 at byte 1036 is outside the vocabulary"), std::string::npos);
  EXPECT_NE(error_of(shard("v1.bin", 1, tokens), 128256).find("version 1 at byte 4 is not 7 (uint32 tokens)"),
            std::string::npos);
  fs::resize_file(dir / "ok.bin", 1024 + 4 * tokens.size() - 2);
  EXPECT_NE(error_of(ok, 128256).find("promises 5 tokens, 1044 bytes"), std::string::npos);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace dpt
