// "Never read a file as something it is not" (issue 33): a data file is read
// as text only when --data-format bytes (--from bytes) says so or it is valid
// UTF-8 without a NUL byte; a damaged shard, nanoGPT's raw uint16 .bin, a
// NUL or invalid UTF-8 is refused in one sentence by dpt train, eval and
// tokens. --load of a file that is not safetensors says so, and dpt train
// refuses flags that contradict each other.
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cli_run.h"
#include "core/error.h"
#include "data/file_kind.h"
#include "data/token_shards.h"

namespace dpt {
namespace {

namespace fs = std::filesystem;
using test::q;
using test::RunResult;

constexpr const char* kGpt = "--model gpt --layers 1 --heads 2 --width 16 --context 8 --threads 1";
constexpr const char* kMagics = "(llm.c's shards start with 88 d8 34 01 or a1 d9 34 01)";

class FileKindsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / fmt::format("dpt_file_kinds_{}", ::getpid());
    fs::create_directories(dir_);
    weights_ = (dir_ / "gpt.safetensors").string();
    const RunResult r = dpt(fmt::format("train {} --synthetic --steps 1 --quiet --save {}", kGpt, q(weights_)));
    ASSERT_EQ(r.code, 0) << r.err;
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  static RunResult dpt(const std::string& args) {
    return test::run_shell(fmt::format("env OMP_NUM_THREADS=1 {}/dpt {}", DPT_BINARY_DIR, args), dir_, 60);
  }
  static std::string write(const std::string& name, const std::string& bytes) {
    const std::string p = (dir_ / name).string();
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }
  // 2 x n bytes of uint16 tokens 0, 1, 2, ... (below 256): nanoGPT's train.bin.
  static std::string raw_u16(const std::string& name, int n) {
    std::string b;
    for (int i = 0; i < n; ++i) b += std::string{static_cast<char>(i % 256), '\0'};
    return write(name, b);
  }
  // An llm.c shard of n tokens (width 2 or 4 bytes) whose magic is `magic`.
  static std::string shard(const std::string& name, int32_t magic, int width, int n) {
    std::vector<int32_t> h(256, 0);
    h[0] = magic;
    h[1] = width == 4 ? kLlmc32Version : kLlmcVersion;
    h[2] = n;
    std::string b(reinterpret_cast<const char*>(h.data()), kLlmcHeaderBytes);
    for (int i = 0; i < n; ++i) {
      const uint32_t t = static_cast<uint32_t>(i % 200);
      b.append(reinterpret_cast<const char*>(&t), static_cast<size_t>(width));
    }
    return write(name, b);
  }
  static std::string text(const std::string& name) { return write(name, std::string(400, 'x') + " héllo wörld ✓\n"); }

  // The refusal's sentence for `path`, whose first bytes are `head` and whose
  // byte `at` is `what`, with `u16`/`bytes` the command's flags.
  static std::string refusal(const std::string& path, const std::string& head, size_t at, const std::string& what,
                             const std::string& flag = "--data-format") {
    return fmt::format("{}: neither an llm.c shard nor text: its first four bytes are {} {} and byte {} is {}; raw "
                       "uint16 tokens need {} u16, text read byte by byte needs {} bytes",
                       path, head, kMagics, at, what, flag, flag);
  }
  static std::string error_of(const std::string& path) {
    try {
      resolve_format(path, TokenFormat::Auto, data_format_flags());
    } catch (const InputError& e) {
      return e.what();
    }
    return "";
  }
  // exit 1, nothing on stdout, and exactly one line: "dpt: error: <says>".
  static void expect_refused(const RunResult& r, const std::string& says) {
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_EQ(r.err, "dpt: error: " + says + "\n");
    EXPECT_EQ(r.out, "");
  }
  std::string train(const std::string& data, const std::string& more = "") const {
    return fmt::format("train {} --quiet --batch 4 --steps 2 --data {} {}", kGpt, q(data), more);
  }
  std::string eval(const std::string& data, const std::string& more = "") const {
    return fmt::format("eval --threads 1 --weights {} --data {} {}", q(weights_), q(data), more);
  }
  std::string tokens(const std::string& input, const std::string& more = "") const {
    return fmt::format("tokens --input {} --out {} {}", q(input), q(dir_ / "out"), more);
  }

  static fs::path dir_;
  static std::string weights_;
};

fs::path FileKindsTest::dir_;
std::string FileKindsTest::weights_;

std::string hex4(uint32_t v) {
  return fmt::format("{:02x} {:02x} {:02x} {:02x}", v & 0xff, (v >> 8) & 0xff, (v >> 16) & 0xff, v >> 24);
}

// Each of the 32 bits of each magic flipped: refused, never read as text.
TEST_F(FileKindsTest, EveryFlippedMagicBitIsRefused) {
  for (const auto& [magic, width] : {std::pair{kLlmcMagic, 2}, std::pair{kLlmc32Magic, 4}}) {
    const std::string good = shard("good.bin", magic, width, 100);
    EXPECT_EQ(resolve_format(good, TokenFormat::Auto, data_format_flags()), TokenFormat::Llmc);
    for (int bit = 0; bit < 32; ++bit) {
      SCOPED_TRACE(fmt::format("magic {} bit {}", magic, bit));
      const uint32_t flipped = static_cast<uint32_t>(magic) ^ (1u << bit);
      const std::string p = shard("flipped.bin", static_cast<int32_t>(flipped), width, 100);
      const std::string err = error_of(p);
      const std::string start = fmt::format("{}: neither an llm.c shard nor text: its first four bytes are {} {}",
                                            p, hex4(flipped), kMagics);
      EXPECT_EQ(err.rfind(start, 0), 0u) << err;
      EXPECT_NE(err.find("raw uint16 tokens need --data-format u16, text read byte by byte needs --data-format "
                         "bytes"),
                std::string::npos)
          << err;
    }
  }
}

// The same flipped shard through each command: one sentence, exit 1.
TEST_F(FileKindsTest, AFlippedMagicIsRefusedByTrainEvalAndTokens) {
  const std::string p = shard("flip.bin", kLlmcMagic ^ 4, 2, 100);
  const std::string head = hex4(static_cast<uint32_t>(kLlmcMagic ^ 4));
  expect_refused(dpt(train(p)), refusal(p, head, 0, "not valid UTF-8"));
  expect_refused(dpt(eval(p)), refusal(p, head, 0, "not valid UTF-8"));
  expect_refused(dpt(tokens(p)), refusal(p, head, 0, "not valid UTF-8", "--from"));
}

// nanoGPT's raw uint16 train.bin: refused unless --data-format u16.
TEST_F(FileKindsTest, RawUint16FileNeedsItsFormat) {
  const std::string p = raw_u16("train.bin", 200);
  expect_refused(dpt(train(p)), refusal(p, "00 00 01 00", 0, "a NUL"));
  expect_refused(dpt(eval(p)), refusal(p, "00 00 01 00", 0, "a NUL"));
  expect_refused(dpt(tokens(p)), refusal(p, "00 00 01 00", 0, "a NUL", "--from"));
  RunResult r = dpt(train(p, "--data-format u16"));
  EXPECT_EQ(r.code, 0) << r.err;
  r = dpt(tokens(p, "--from u16"));
  EXPECT_EQ(r.code, 0) << r.err;
}

TEST_F(FileKindsTest, ANulByteIsRefused) {
  const std::string p = write("nul.txt", std::string(30, 'a') + '\0' + std::string(30, 'b'));
  EXPECT_EQ(error_of(p), refusal(p, "61 61 61 61", 30, "a NUL"));
  expect_refused(dpt(train(p)), refusal(p, "61 61 61 61", 30, "a NUL"));
  expect_refused(dpt(eval(p)), refusal(p, "61 61 61 61", 30, "a NUL"));
  expect_refused(dpt(tokens(p)), refusal(p, "61 61 61 61", 30, "a NUL", "--from"));
}

TEST_F(FileKindsTest, InvalidUtf8IsRefused) {
  const std::string p = write("latin1.txt", std::string(20, 'a') + "caf\xe9 " + std::string(40, 'b'));
  expect_refused(dpt(train(p)), refusal(p, "61 61 61 61", 23, "not valid UTF-8"));
  expect_refused(dpt(eval(p)), refusal(p, "61 61 61 61", 23, "not valid UTF-8"));
  expect_refused(dpt(tokens(p)), refusal(p, "61 61 61 61", 23, "not valid UTF-8", "--from"));
  // A sequence cut by the reader's 1 MiB chunk is whole text; a bad byte past
  // the chunk is found at its offset.
  constexpr size_t kChunk = size_t{1} << 20;
  std::string big(kChunk - 1, 'a');
  big += "\xc3\xa9";
  const std::string ok = write("big.txt", big);
  EXPECT_EQ(error_of(ok), "");
  const std::string bad = write("big_bad.txt", big + "a\xff");
  EXPECT_EQ(error_of(bad), refusal(bad, "61 61 61 61", kChunk + 2, "not valid UTF-8"));
}

// Valid UTF-8 is text; --data-format bytes and --from bytes read any file.
TEST_F(FileKindsTest, TextAndFlaggedBytesAreRead) {
  const std::string t = text("ok.txt");
  EXPECT_EQ(resolve_format(t, TokenFormat::Auto, data_format_flags()), TokenFormat::Bytes);
  for (const std::string& cmd : {train(t), eval(t), tokens(t)}) {
    const RunResult r = dpt(cmd);
    EXPECT_EQ(r.code, 0) << cmd << "\n" << r.err;
  }
  const std::string raw = raw_u16("raw.bin", 200);
  for (const std::string& cmd : {train(raw, "--data-format bytes"), eval(raw, "--data-format bytes"),
                                 tokens(raw, "--from bytes")}) {
    const RunResult r = dpt(cmd);
    EXPECT_EQ(r.code, 0) << cmd << "\n" << r.err;
  }
}

// --val-data beside text --data is checked as --data is.
TEST_F(FileKindsTest, HeldOutFilesAreCheckedToo) {
  const std::string t = text("train.txt"), raw = raw_u16("val.bin", 200);
  expect_refused(dpt(train(t, "--val-data " + q(raw))), refusal(raw, "00 00 01 00", 0, "a NUL"));
}

TEST_F(FileKindsTest, LoadingATextFileSaysItIsNotSafetensors) {
  const std::string t = write("passwd", "root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1:daemon:/usr/sbin\n");
  const std::string says = t + ": not a safetensors file (its first 8 bytes give a header length of " +
                           "3475222254926655346, which exceeds the 100 MB limit and runs past the end of the " +
                           "62-byte file; its header is not a JSON object: byte 8 is ':' (0x3a), where '{' must open "
                           "it)";
  expect_refused(dpt(fmt::format("train {} --quiet --steps 1 --synthetic --load {}", kGpt, q(t))), says);
  expect_refused(dpt(fmt::format("eval --threads 1 --weights {} --data {}", q(t), q(text("e.txt")))), says);
  const std::string brace = write("brace.bin", std::string("\x10\0\0\0\0\0\0\0[1, 2, 3, 4, 5, 6]", 24));
  expect_refused(dpt(fmt::format("eval --threads 1 --weights {} --model gpt", q(brace))),
                 brace + ": not a safetensors file (its header is not a JSON object: byte 8 is '[' (0x5b), where "
                         "'{' must open it)");
}

// A directory where a file belongs, beside weights or a tokenizer: read as a
// stream it threw std::ios_base::failure (exit 2, "basic_filebuf::underflow
// error reading the file"), and a merges.txt directory read as no merges
// (exit 0, a tokenizer that merges nothing).
TEST_F(FileKindsTest, ADirectoryWhereAFileBelongsIsOneSentence) {
  const fs::path hf = fs::path(DPT_SOURCE_DIR) / "tests/fixtures/hf/gpt2";
  const fs::path tok = fs::path(DPT_SOURCE_DIR) / "tests/fixtures/tokenizer/gpt2_style_files";
  const std::string t = text("dirs.txt");
  // Each copy with one file replaced by a directory of its name.
  const auto copy_with_dir = [&](const fs::path& from, const std::string& name, const std::string& dir) {
    const fs::path to = dir_ / name;
    fs::copy(from, to, fs::copy_options::recursive);
    fs::remove(to / dir);
    fs::create_directory(to / dir);
    return to;
  };
  const fs::path config = copy_with_dir(hf, "config_dir", "config.json");
  expect_refused(dpt(fmt::format("eval --threads 1 --weights {} --data {}", q(config), q(t))),
                 (config / "config.json").string() + ": a directory, not a config.json");
  const fs::path gen = copy_with_dir(hf, "generation_dir", "generation_config.json");
  expect_refused(dpt(fmt::format("generate --threads 1 --weights {} --prompt-ids 1 --output ids", q(gen))),
                 (gen / "generation_config.json").string() + ": a directory, not a JSON file");
  const fs::path index = copy_with_dir(hf, "index_dir", "model.safetensors.index.json");
  expect_refused(dpt(fmt::format("eval --threads 1 --weights {} --data {}", q(index), q(t))),
                 (index / "model.safetensors.index.json").string() + ": a directory, not a safetensors index");
  const fs::path merges = copy_with_dir(tok, "merges_dir", "merges.txt");
  expect_refused(dpt(fmt::format("tokens --tokenizer {} --input {} --out {}", q(merges), q(t), q(dir_ / "m_out"))),
                 (merges / "merges.txt").string() + ": a directory, not a merges.txt");
  EXPECT_FALSE(fs::exists(dir_ / "m_out"));
}

TEST_F(FileKindsTest, SyntheticWithDataIsRefused) {
  const std::string t = text("s.txt");
  expect_refused(dpt(fmt::format("train {} --steps 1 --synthetic --data {}", kGpt, q(t))),
                 "--synthetic and --data contradict each other: --synthetic trains on random batches and reads no "
                 "data; give one");
  expect_refused(dpt(fmt::format("train {} --steps 1 --synthetic --val-data {}", kGpt, q(t))),
                 "--synthetic and --val-data contradict each other: --synthetic trains on random batches and reads "
                 "no data; give one");
}

// The other contradictions dpt train refuses, each in one sentence.
TEST_F(FileKindsTest, OtherContradictingFlagsAreRefused) {
  const std::string t = text("c.txt");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {fmt::format("{} --steps 1 --synthetic --data-format bytes", kGpt), "--synthetic and --data-format contradict"},
      {fmt::format("{} --steps 1 --synthetic --val-fraction 0.2", kGpt), "--synthetic and --val-fraction contradict"},
      {fmt::format("{} --steps 1 --synthetic --eval-every 1", kGpt), "--synthetic and --eval-every contradict"},
      {fmt::format("{} --steps 1 --synthetic --eval-windows 3", kGpt), "--synthetic and --eval-windows contradict"},
      {fmt::format("{} --steps 1 --data {} --val-data {} --val-fraction 0.2", kGpt, q(t), q(t)),
       "--val-data and --val-fraction contradict"},
      {"--model mlp --synthetic --steps 1 --epochs 2", "--steps and --epochs contradict"},
      {fmt::format("{} --steps 1 --synthetic --per-param --bucket-mb 1", kGpt),
       "--per-param and --bucket-mb contradict"},
      {fmt::format("{} --steps 1 --synthetic --per-param --first-bucket-mb 1", kGpt),
       "--per-param and --first-bucket-mb contradict"},
      {"--model mlp --steps 1 --val-fraction 0.2", "--val-fraction contradicts the mlp model"},
      {"--model mlp --steps 1 --data-format bytes", "--data-format contradicts the mlp model"},
      {fmt::format("{} --synthetic --epochs 2", kGpt), "--epochs contradicts the gpt model"},
      {"--model mlp --steps 1 --synthetic --beta1 0.8", "--beta1 contradicts the sgd optimizer"},
      {fmt::format("{} --steps 1 --synthetic --momentum 0.9", kGpt), "--momentum contradicts the adamw optimizer"},
      {fmt::format("{} --steps 1 --synthetic --min-lr 0.001", kGpt), "--min-lr contradicts the constant schedule"},
      // A cosine schedule decays to --min-lr: above --lr it would climb.
      {fmt::format("{} --steps 1 --synthetic --schedule cosine --min-lr 0.001", kGpt),
       "--min-lr 0.001 is above the learning rate 0.0003"},
      // Flags only other strategies read (the default here: local).
      {fmt::format("{} --steps 1 --synthetic --prefetch none", kGpt), "--prefetch sets when a sharded strategy"},
      {fmt::format("{} --steps 1 --synthetic --reshard-after-forward false", kGpt), "--reshard-after-forward sets"},
      {fmt::format("{} --steps 1 --synthetic --strategy local --zero-reduce scatter", kGpt),
       "--zero-reduce sets how zero1 reduces its gradients, and --strategy local does not read it"},
      {"--model mlp --steps 1 --synthetic --dp-replicas 2", "--dp-replicas sets the replica threads"},
      // One process: the default strategy is local, which reduces nothing.
      {"--model mlp --steps 1 --synthetic --bucket-mb 4",
       "--bucket-mb shapes DDP's gradient buckets, and the default strategy (local: one data-parallel rank) reduces "
       "in none (only ddp or zero1 without --zero-reduce scatter does)"},
  };
  for (const auto& [flags, says] : cases) {
    SCOPED_TRACE(flags);
    const RunResult r = dpt("train --quiet " + flags);
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_EQ(r.err.rfind("dpt: error: " + says, 0), 0u) << r.err;
    EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << r.err;
  }
  // The same flags apart still run.
  EXPECT_EQ(dpt(fmt::format("train {} --quiet --steps 1 --synthetic --schedule cosine --min-lr 0.0001", kGpt)).code, 0);
  EXPECT_EQ(dpt("train --model mlp --quiet --steps 1 --synthetic --strategy dp --dp-replicas 2 --threads 1").code, 0);
}

// The flags only some strategies read are checked once, against the
// strategy's catalog record: the sentence names the flag, what it sets, the
// strategy (given, or the default) and those that read it. An alias reads
// what its strategy reads (--strategy fsdp --prefetch was refused).
TEST_F(FileKindsTest, StrategyFlagsAreCheckedAgainstTheRecord) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {fmt::format("{} --steps 1 --synthetic --prefetch none", kGpt),
       "--prefetch sets when a sharded strategy gathers its next unit's parameters, and the default strategy (local: "
       "one data-parallel rank) does not read it (only zero3 or hsdp does)\n"},
      {fmt::format("{} --steps 1 --synthetic --strategy zero2 --reshard-after-forward false", kGpt),
       "--reshard-after-forward sets whether a sharded strategy frees a unit's gathered parameters, and --strategy "
       "zero2 does not read it (only zero3 or hsdp does)\n"},
      {fmt::format("{} --steps 1 --synthetic --strategy fsdp --per-param", kGpt),
       "--per-param shapes DDP's gradient buckets, and --strategy fsdp reduces in none (only ddp or zero1 without "
       "--zero-reduce scatter does)\n"},
      {"--model mlp --steps 1 --synthetic --strategy zero1 --dp-replicas 2",
       "--dp-replicas sets the replica threads of the single-process dp strategy, and --strategy zero1 does not read "
       "it (only dp does)\n"},
  };
  for (const auto& [flags, says] : cases) {
    SCOPED_TRACE(flags);
    const RunResult r = dpt("train --quiet " + flags);
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_EQ(r.err, "dpt: error: " + says);
  }
  for (const std::string flags : {"--strategy fsdp --prefetch none --reshard-after-forward false",
                                  "--strategy zero1 --bucket-mb 1 --zero-reduce all-reduce"}) {
    const RunResult r = dpt(fmt::format("train --quiet {} --steps 1 --synthetic {}", kGpt, flags));
    EXPECT_EQ(r.code, 0) << flags << ": " << r.err;
  }
}

// A warm-up longer than the run: the learning rate never reached --lr, and
// the run ended without a word. --steps is the run's whole length under
// --resume too (the resumed run ends at the same step), so a warm-up within
// it runs however few steps are left, and one past it is refused there too.
TEST_F(FileKindsTest, AWarmUpLongerThanTheRunIsRefused) {
  const std::string ck = (dir_ / "warmup_ck").string();
  const std::string mlp = "train --model mlp --sizes 784,16,10 --batch 8 --synthetic --quiet --threads 1";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {mlp + " --steps 2 --warmup 5",
       "--warmup 5 is longer than --steps 2: the learning rate would never reach --lr 0.05; give --warmup at most 2, "
       "or more --steps\n"},
      {fmt::format("train {} --synthetic --quiet --warmup 201", kGpt),
       "--warmup 201 is longer than the run's 200 steps (--steps is not given): the learning rate would never reach "
       "--lr 0.0003; give --warmup at most 200, or more --steps\n"},
      {mlp + " --strategy dp --steps 3 --warmup 4", "--warmup 4 is longer than --steps 3"},
  };
  for (const auto& [args, says] : cases) {
    SCOPED_TRACE(args);
    const RunResult r = dpt(args);
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_EQ(r.err.rfind("dpt: error: " + says, 0), 0u) << r.err;
    EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << r.err;
  }
  EXPECT_EQ(dpt(mlp + " --steps 3 --warmup 3").code, 0);
  const RunResult first =
      dpt(fmt::format("{} --steps 4 --warmup 3 --checkpoint-dir {} --checkpoint-every 2", mlp, q(ck)));
  ASSERT_EQ(first.code, 0) << first.err;
  const RunResult resumed = dpt(fmt::format("{} --steps 4 --warmup 4 --resume {}", mlp, q(ck + "/step-00000002")));
  EXPECT_EQ(resumed.code, 0) << resumed.err;
  const RunResult past = dpt(fmt::format("{} --steps 4 --warmup 5 --resume {}", mlp, q(ck + "/step-00000002")));
  EXPECT_EQ(past.code, 1) << past.err;
  EXPECT_EQ(past.err.rfind("dpt: error: --warmup 5 is longer than --steps 4", 0), 0u) << past.err;
}

// --zero-accumulate chooses how ZeRO-2/3 keep their gradients between the
// micro-batches of a step: under another strategy, or with one micro-batch
// per step, it ran to exit 0 and was read by nothing.
TEST_F(FileKindsTest, ZeroAccumulateWhereNothingAccumulatesIsRefused) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--strategy ddp --grad-accum 2 --batch 4",
       "--zero-accumulate sets how a sharded strategy keeps its gradients over --grad-accum's micro-batches, and "
       "--strategy ddp does not read it (only zero2, zero3 or hsdp does)\n"},
      {"--strategy zero1 --grad-accum 2 --batch 4", "--zero-accumulate sets how a sharded strategy keeps its "
                                                    "gradients over --grad-accum's micro-batches, and --strategy zero1 "
                                                    "does not read it (only zero2, zero3 or hsdp does)\n"},
      {"--grad-accum 2 --batch 4", "--zero-accumulate sets how a sharded strategy keeps its gradients over "
                                   "--grad-accum's micro-batches, and the default strategy (local: one data-parallel "
                                   "rank) does not read it (only zero2, zero3 or hsdp does)\n"},
      {"--strategy zero2", "--zero-accumulate sets how a sharded strategy keeps its gradients over --grad-accum's "
                           "micro-batches, and this run has one micro-batch per step (give --grad-accum 2 or more, or "
                           "leave --zero-accumulate out)\n"},
      {"--strategy zero3 --grad-accum 1", "--zero-accumulate sets how a sharded strategy keeps its gradients over "
                                          "--grad-accum's micro-batches, and this run has one micro-batch per step"},
  };
  for (const auto& [flags, says] : cases) {
    SCOPED_TRACE(flags);
    const RunResult r =
        dpt(fmt::format("train --quiet {} --steps 1 --synthetic --zero-accumulate local {}", kGpt, flags));
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_EQ(r.err.rfind("dpt: error: " + says, 0), 0u) << r.err;
    EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << r.err;
  }
  for (const char* strategy : {"zero2", "zero3"}) {
    const RunResult r = dpt(fmt::format("train --quiet {} --steps 1 --synthetic --strategy {} --grad-accum 2 --batch 4 "
                                        "--zero-accumulate local",
                                        kGpt, strategy));
    EXPECT_EQ(r.code, 0) << strategy << ": " << r.err;
  }
}

// Flags that shape what --save or --checkpoint-dir writes, given without it:
// they ran to exit 0 and wrote nothing. And --save-format hf of the MLP,
// which wrote the engine's layout under the name of Hugging Face's.
TEST_F(FileKindsTest, FlagsOfAnOutputThatIsNotGivenAreRefused) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--save-format hf", "--save-format sets how --save writes the trained weights, and --save is not given"},
      {"--save-dtype bf16", "--save-dtype sets how --save writes the trained weights, and --save is not given"},
      {"--save-shard-mb 10", "--save-shard-mb sets how --save writes the trained weights, and --save is not given"},
      {"--checkpoint-every 1", "--checkpoint-every sets when checkpoints are written into --checkpoint-dir, and "
                               "--checkpoint-dir is not given"},
      {"--keep 2", "--keep sets how many checkpoints --checkpoint-dir keeps, and --checkpoint-dir is not given"},
  };
  for (const auto& [flags, says] : cases) {
    SCOPED_TRACE(flags);
    const RunResult r = dpt(fmt::format("train {} --quiet --steps 1 --synthetic {}", kGpt, flags));
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_EQ(r.err, "dpt: error: " + says + "\n");
  }
  const RunResult mlp =
      dpt(fmt::format("train --model mlp --sizes 784,8,10 --threads 1 --quiet --steps 1 --synthetic --save {} "
                      "--save-format hf",
                      q(dir_ / "mlp_hf.safetensors")));
  EXPECT_EQ(mlp.code, 1) << mlp.err;
  EXPECT_EQ(mlp.err.rfind("dpt: error: --save-format hf contradicts the mlp model", 0), 0u) << mlp.err;
  EXPECT_FALSE(fs::exists(dir_ / "mlp_hf.safetensors"));
}

// dpt eval of an MLP read neither --data-format nor --load-format hf, and
// said nothing of it.
TEST_F(FileKindsTest, EvalOfAnMlpRefusesAGptsFlags) {
  const std::string mlp = (dir_ / "eval_mlp.safetensors").string();
  ASSERT_EQ(dpt(fmt::format("train --model mlp --sizes 784,8,10 --threads 1 --quiet --steps 1 --synthetic --save {}",
                            q(mlp)))
                .code,
            0);
  expect_refused(dpt(fmt::format("eval --threads 1 --weights {} --data-format u16", q(mlp))),
                 "--data-format contradicts the mlp model, which is evaluated on Fashion-MNIST's images: it is a "
                 "GPT's flag");
  const RunResult hf = dpt(fmt::format("eval --threads 1 --weights {} --load-format hf", q(mlp)));
  EXPECT_EQ(hf.code, 1) << hf.err;
  EXPECT_EQ(hf.err.rfind("dpt: error: --load-format hf contradicts the mlp model", 0), 0u) << hf.err;
}

}  // namespace
}  // namespace dpt
