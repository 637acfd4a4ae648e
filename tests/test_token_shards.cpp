// Token shards (llm.c and raw uint16), their checks, windows, the epoch
// permutation and the sampler's guarantees: every window once per epoch,
// ranks disjoint, the same windows per step whatever the world size, and an
// exact resume from the sampler's state.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli_run.h"
#include "compare.h"
#include "io/safetensors.h"

#include "core/error.h"
#include "core/threads.h"
#include "data/shard_sampler.h"
#include "data/shard_writer.h"
#include "data/token_shards.h"
#include "models/decoder.h"
#include "train/evaluate.h"

namespace dpt {
namespace {

namespace fs = std::filesystem;

class TokenShardsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / fmt::format("dpt_shards_{}_{}", ::getpid(), info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  // Tokens first, first + 1, ... (mod m).
  static std::vector<uint16_t> ramp(int64_t n, int first = 0, int m = 256) {
    std::vector<uint16_t> t(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = static_cast<uint16_t>((first + i) % m);
    return t;
  }
  std::string shard(const std::string& name, const std::vector<uint16_t>& t) const {
    write_llmc_shard(path(name), t.data(), static_cast<int64_t>(t.size()));
    return path(name);
  }
  void raw(const std::string& name, const std::string& bytes) const {
    std::ofstream(path(name), std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  // The InputError or IoError message of f, or "" if it throws none.
  template <class F>
  static std::string error_of(F f) {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }

  fs::path dir_;
};

TEST_F(TokenShardsTest, LlmcShardReadsBackAndIsDetected) {
  const auto t = ramp(1000, 7, 300);
  const std::string p = shard("a.bin", t);
  EXPECT_EQ(fs::file_size(p), kLlmcHeaderBytes + 2000);
  EXPECT_EQ(detect_format(p), TokenFormat::Llmc);
  raw("text.txt", "hello, world");
  EXPECT_EQ(detect_format(path("text.txt")), TokenFormat::Bytes);
  TokenShards s(p, TokenFormat::Llmc, 300);
  ASSERT_EQ(s.count(), 1u);
  EXPECT_EQ(s.tokens(0), 1000);
  std::vector<int32_t> got(10);
  s.read(0, 995, 5, got.data());
  for (int i = 0; i < 5; ++i) EXPECT_EQ(got[static_cast<size_t>(i)], t[static_cast<size_t>(995 + i)]);
}

TEST_F(TokenShardsTest, DirectoryAndGlobInNameOrder) {
  shard("b.bin", ramp(50, 100));
  shard("a.bin", ramp(40, 0));
  raw("notes.txt", "x");
  TokenShards g(path("*.bin"), TokenFormat::Llmc, 256);
  ASSERT_EQ(g.count(), 2u);
  EXPECT_EQ(g.path(0), path("a.bin"));
  EXPECT_EQ(g.tokens(1), 50);
  EXPECT_NE(error_of([&] { TokenShards d(dir_.string(), TokenFormat::Llmc, 256); }).find("notes.txt"),
            std::string::npos);  // a directory means all of its files
  EXPECT_NE(error_of([&] { TokenShards n(path("*.none"), TokenFormat::Llmc, 256); }).find("no file matches"),
            std::string::npos);
}

TEST_F(TokenShardsTest, RawU16NeedsItsFormatAndAnEvenSize) {
  const auto t = ramp(64);
  raw("r.bin", std::string(reinterpret_cast<const char*>(t.data()), 128));
  EXPECT_EQ(detect_format(path("r.bin")), TokenFormat::Bytes);  // never guessed
  TokenShards s(path("r.bin"), TokenFormat::U16, 256);
  EXPECT_EQ(s.tokens(0), 64);
  raw("odd.bin", "abc");
  EXPECT_EQ(error_of([&] { TokenShards o(path("odd.bin"), TokenFormat::U16, 256); }),
            path("odd.bin") + ": 3 bytes, an odd number, cannot be uint16 tokens (byte 2 is left over)");
}

TEST_F(TokenShardsTest, BadShardsAreRefusedNamingFileAndOffset) {
  auto t = ramp(100);
  t[37] = 256;
  const std::string bad_token = shard("tok.bin", t);
  EXPECT_EQ(error_of([&] { TokenShards s(bad_token, TokenFormat::Llmc, 256); }),
            bad_token + ": token 256 at byte " + std::to_string(1024 + 2 * 37) + " is outside the vocabulary 0..255");

  const std::string good = shard("good.bin", ramp(100));
  std::string bytes(kLlmcHeaderBytes + 200, '\0');
  std::ifstream(good, std::ios::binary).read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  raw("short.bin", bytes.substr(0, bytes.size() - 2));
  EXPECT_EQ(error_of([&] { TokenShards s(path("short.bin"), TokenFormat::Llmc, 256); }),
            path("short.bin") + ": 1222 bytes, but its header (byte 8) promises 100 tokens, 1224 bytes");
  std::string wrong_version = bytes;
  wrong_version[4] = 2;
  raw("v.bin", wrong_version);
  EXPECT_NE(error_of([&] { TokenShards s(path("v.bin"), TokenFormat::Llmc, 256); }).find("version 2 at byte 4"),
            std::string::npos);
  raw("magic.bin", std::string(2000, 'a'));
  EXPECT_NE(error_of([&] { TokenShards s(path("magic.bin"), TokenFormat::Llmc, 256); }).find("at byte 0 is not llm.c"),
            std::string::npos);
  raw("tiny.bin", "ab");
  EXPECT_NE(error_of([&] { TokenShards s(path("tiny.bin"), TokenFormat::Llmc, 256); }).find("shorter than llm.c"),
            std::string::npos);
  EXPECT_EQ(error_of([&] { TokenShards s(path("missing.bin"), TokenFormat::Llmc, 256); }),
            path("missing.bin") + ": no such file or directory");
  EXPECT_THROW(parse_token_format("utf8"), InputError);
}

TEST_F(TokenShardsTest, EveryTruncationIsRefusedNamingTheFile) {
  const std::string good = shard("good.bin", ramp(10));
  std::string bytes(kLlmcHeaderBytes + 20, '\0');
  std::ifstream(good, std::ios::binary).read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    raw("cut.bin", bytes.substr(0, cut));
    const std::string e = error_of([&] { TokenShards s(path("cut.bin"), TokenFormat::Llmc, 256); });
    ASSERT_EQ(e.rfind(path("cut.bin") + ": ", 0), 0u) << "cut at " << cut << ": '" << e << "'";
  }
}

TEST_F(TokenShardsTest, WindowsStartAtMultiplesOfTAndNeverCrossShards) {
  // 21 tokens with T = 4: windows at 0, 4, 8, 12, 16 (the last ends at 20);
  // 8 tokens: one window (0..4); 4 tokens: none.
  shard("a.bin", ramp(21, 0));
  shard("b.bin", ramp(8, 100));
  shard("c.bin", ramp(4, 200));
  TokenShards s(path("*.bin"), TokenFormat::Llmc, 256);
  EXPECT_EQ(ShardWindows::total(s, 4), 6);
  ShardWindows w(s, 4);
  Batch b;
  b.tokens.resize(8);
  b.targets.resize(8);
  w.fill(4, b, 0);  // a.bin's last window
  w.fill(5, b, 1);  // b.bin's only one
  EXPECT_EQ(std::vector<int32_t>(b.tokens.begin(), b.tokens.end()), (std::vector<int32_t>{16, 17, 18, 19, 100, 101, 102, 103}));
  EXPECT_EQ(std::vector<int32_t>(b.targets.begin(), b.targets.end()), (std::vector<int32_t>{17, 18, 19, 20, 101, 102, 103, 104}));
  ShardWindows tail(s, 4, 4, 2);  // a held-out range: windows 4 and 5
  tail.fill(1, b, 0);
  EXPECT_EQ(b.tokens[0], 100);
}

TEST(WindowPermutation, IsABijectionAndDependsOnTheKey) {
  for (uint64_t n : {1u, 2u, 3u, 5u, 64u, 100u, 1000u, 4097u}) {
    WindowPermutation p(n, 42), q(n, 43);
    std::vector<bool> seen(n, false);
    int64_t same = 0;
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t v = p(i);
      ASSERT_LT(v, n);
      EXPECT_FALSE(seen[v]) << "n " << n << ": " << v << " twice";
      seen[v] = true;
      same += v == q(i);
    }
    if (n >= 100) {
      EXPECT_LT(same, static_cast<int64_t>(n) / 10) << "keys 42 and 43 give nearly the same order";
    }
  }
}

// The windows (as their first token's identity) of `steps` optimizer steps,
// each as a sorted set, for a run of `world` ranks and `accum` micro-steps.
std::vector<std::multiset<int64_t>> step_windows(const ShardWindows& w, int64_t global, int world, int64_t accum,
                                                 int64_t steps, uint64_t seed) {
  const int64_t micro = global / world / accum;
  std::vector<ShardSampler> ranks;
  for (int r = 0; r < world; ++r) ranks.emplace_back(w, global, seed, r, world);
  std::vector<std::multiset<int64_t>> out;
  Batch b;
  for (int64_t s = 0; s < steps; ++s) {
    std::multiset<int64_t> set;
    for (int64_t k = 0; k < accum; ++k)
      for (auto& r : ranks) {
        r.next(b, micro);
        for (int64_t i = 0; i < micro; ++i) set.insert(b.tokens[static_cast<size_t>(i * w.T())] / w.T());
      }
    out.push_back(set);
  }
  return out;
}

TEST_F(TokenShardsTest, SamplerEpochsCoverEveryWindowOnceAndIgnoreTheWorldSize) {
  // One shard whose window i starts with token i*T, so a window names itself.
  const int64_t T = 4, W = 50;
  std::vector<uint16_t> t(static_cast<size_t>(W * T + 1));
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<uint16_t>(i);
  shard("a.bin", t);
  TokenShards s(path("a.bin"), TokenFormat::Llmc, 1000);
  ShardWindows w(s, T);
  ASSERT_EQ(w.size(), W);
  // Global batch 8: 6 steps per epoch (48 windows, 2 dropped).
  const auto one = step_windows(w, 8, 1, 1, 12, 7);
  std::set<int64_t> epoch0, epoch1;
  for (int i = 0; i < 6; ++i) epoch0.insert(one[static_cast<size_t>(i)].begin(), one[static_cast<size_t>(i)].end());
  for (int i = 6; i < 12; ++i) epoch1.insert(one[static_cast<size_t>(i)].begin(), one[static_cast<size_t>(i)].end());
  EXPECT_EQ(epoch0.size(), 48u);  // no repeats: 48 distinct windows
  EXPECT_EQ(epoch1.size(), 48u);
  EXPECT_NE(one[0], one[6]) << "the second epoch repeats the first one's order";
  EXPECT_EQ(step_windows(w, 8, 2, 1, 12, 7), one);  // 2 ranks: the same windows per step
  EXPECT_EQ(step_windows(w, 8, 2, 2, 12, 7), one);  // and with 2 micro-steps
  EXPECT_EQ(step_windows(w, 8, 4, 1, 12, 7), one);
  EXPECT_NE(step_windows(w, 8, 1, 1, 12, 8), one);  // another seed, another order
}

TEST_F(TokenShardsTest, SamplerRanksAreDisjointAndStateResumesExactly) {
  shard("a.bin", ramp(401, 0, 1000));
  TokenShards s(path("a.bin"), TokenFormat::Llmc, 1000);
  ShardWindows w(s, 4);  // 100 windows
  ShardSampler r0(w, 6, 3, 0, 2), r1(w, 6, 3, 1, 2);
  Batch a, b;
  for (int step = 0; step < 20; ++step) {
    r0.next(a, 3);
    r1.next(b, 3);
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 3; ++j) EXPECT_NE(a.tokens[static_cast<size_t>(4 * i)], b.tokens[static_cast<size_t>(4 * j)]);
  }
  const SamplerState st = r0.state();
  EXPECT_EQ(st.epoch, 1);  // 16 steps per epoch
  EXPECT_EQ(st.position, 4 * 6);
  ShardSampler resumed(w, 6, 3, 0, 2);
  resumed.set_state(st);
  for (int step = 0; step < 30; ++step) {
    r0.next(a, 3);
    resumed.next(b, 3);
    ASSERT_EQ(a.tokens, b.tokens) << "step " << step << " after resuming";
  }
  ShardSampler skipped(w, 6, 3, 0, 2);  // a resumed run: 50 steps done
  skipped.skip_steps(50);
  r0.next(a, 3);
  skipped.next(b, 3);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_THROW(resumed.set_state({0, 5}), InputError);  // not a step boundary
  EXPECT_THROW(ShardSampler(w, 101, 0), InputError);     // one global batch does not fit
}

TEST_F(TokenShardsTest, EvaluationCountsEveryWindowOnceAcrossRanks) {
  shard("a.bin", ramp(333, 0, 64));
  TokenShards s(path("a.bin"), TokenFormat::Llmc, 64);
  ShardWindows w(s, 8);  // 41 windows
  set_threads(1);
  Decoder model(DecoderConfig{.vocab = 64, .layers = 1, .heads = 2, .width = 16, .context = 8});
  model.init_params(0);
  const EvalResult all = evaluate_windows(model, w, 5, 0);
  EXPECT_EQ(all.count, 41 * 8);
  EvalResult sum;
  for (int r = 0; r < 3; ++r) {
    const EvalResult part = evaluate_windows(model, w, 5, 0, r, 3);
    sum.loss_sum += part.loss_sum;
    sum.count += part.count;
  }
  EXPECT_EQ(sum.count, all.count);
  EXPECT_NEAR(sum.loss_sum, all.loss_sum, 1e-6 * all.loss_sum);
}

TEST_F(TokenShardsTest, TokensFromTextAndU16GoThroughTheSameReader) {
  raw("b.txt", "world, once more\n");
  raw("a.txt", "hello ");
  raw("a.txt.dat", "INDEX");  // fortune's index: skipped, as ByteCorpus skips it
  TextTokens text(dir_.string());
  const auto paths = write_llmc_shards(text, path("out"), "t", 10, 3);
  ASSERT_EQ(paths.size(), 3u);  // 23 tokens: 10 + 10 train, the last 3 val
  TokenShards train(path("out/t_train_*.bin"), TokenFormat::Llmc, 256), val(paths[2], TokenFormat::Llmc, 256);
  std::string got;
  std::vector<int32_t> buf(10);
  for (size_t i = 0; i < train.count(); ++i) {
    train.read(i, 0, train.tokens(i), buf.data());
    for (int64_t k = 0; k < train.tokens(i); ++k) got += static_cast<char>(buf[static_cast<size_t>(k)]);
  }
  val.read(0, 0, 3, buf.data());
  for (int k = 0; k < 3; ++k) got += static_cast<char>(buf[static_cast<size_t>(k)]);
  EXPECT_EQ(got, "hello world, once more\n");

  const auto t = ramp(30, 1000, 60000);
  raw("stream.u16", std::string(reinterpret_cast<const char*>(t.data()), 60));
  U16Tokens u16(path("stream.u16"));
  const auto up = write_llmc_shards(u16, path("u"), "u", 100, 0);
  ASSERT_EQ(up.size(), 1u);
  TokenShards back(up[0], TokenFormat::Llmc, 60000);
  back.read(0, 29, 1, buf.data());
  EXPECT_EQ(buf[0], 1029);
  EXPECT_THROW(write_llmc_shards(u16, path("u"), "u", 100, 30), InputError);  // nothing left to train on
}

// `dpt train` on shards: a bad one is one sentence and exit 1 before any
// training; good ones train and evaluate on --val-data.
TEST_F(TokenShardsTest, TrainFromShardsAndRefuseABadOne) {
  const std::string dpt = fmt::format("env OMP_NUM_THREADS=1 {}/dpt train --model gpt --layers 1 --heads 2 --width 16 "
                                      "--context 8 --threads 1 --quiet --batch 4 --steps 2",
                                      DPT_BINARY_DIR);
  auto t = ramp(200);
  t[5] = 300;
  const std::string bad = shard("bad.bin", t);
  test::RunResult r = test::run_shell(dpt + " --data " + test::q(bad), dir_, 60);
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err, "dpt: error: " + bad + ": token 300 at byte 1034 is outside the vocabulary 0..255\n");
  const std::string train = shard("train.bin", ramp(400)), val = shard("val.bin", ramp(90, 3));
  r = test::run_shell(dpt + " --data " + test::q(train) + " --val-data " + test::q(val) + " --eval-windows 0 " +
                          "--summary-out " + test::q(dir_ / "s.json"),
                      dir_, 60);
  ASSERT_EQ(r.code, 0) << r.all();
  const auto j = nlohmann::json::parse(test::read_file(dir_ / "s.json"));
  EXPECT_TRUE(std::isfinite(j["val_loss"].get<double>()));
  // A raw uint16 file is not guessed: without --data-format u16 it is text.
  raw("raw.bin", std::string(reinterpret_cast<const char*>(t.data()), 2 * t.size()));
  r = test::run_shell(dpt + " --data " + test::q(path("raw.bin")) + " --data-format u16", dir_, 60);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("token 300 at byte 10 is outside"), std::string::npos) << r.err;
}

// A run resumed from a checkpoint in its second epoch sees exactly the
// windows of the uninterrupted run: their weights are equal bit for bit.
TEST_F(TokenShardsTest, ResumeFromACheckpointSeesTheSameWindows) {
  const std::string train = shard("train.bin", ramp(13 * 8 + 1, 0, 251));  // 13 windows: 3 steps of 4 per epoch
  const std::string common =
      fmt::format("env OMP_NUM_THREADS=1 {}/dpt train --model gpt --layers 1 --heads 2 --width 16 --context 8 "
                  "--threads 1 --quiet --batch 4 --steps 7 --val-fraction 0 --data {}",
                  DPT_BINARY_DIR, test::q(train));
  test::RunResult r = test::run_shell(common + " --checkpoint-dir " + test::q(path("ck")) +
                                          " --checkpoint-every 4 --save " + test::q(path("full.safetensors")),
                                      dir_, 60);
  ASSERT_EQ(r.code, 0) << r.all();
  const auto manifest = nlohmann::json::parse(test::read_file(dir_ / "ck" / "step-00000004" / "manifest.json"));
  // 3 steps per epoch: after 4, the second epoch has handed out 4 windows.
  EXPECT_EQ(manifest["data"]["epoch"], 1) << manifest["data"].dump();
  EXPECT_EQ(manifest["data"]["windows"], 4) << manifest["data"].dump();
  r = test::run_shell(common + " --resume " + test::q(path("ck/step-00000004")) + " --save " +
                          test::q(path("resumed.safetensors")),
                      dir_, 60);
  ASSERT_EQ(r.code, 0) << r.all();
  const SafetensorsFile a = load_safetensors(path("full.safetensors")), b = load_safetensors(path("resumed.safetensors"));
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i)
    EXPECT_TRUE(test::bitwise_equal(a.tensors[i].data.data(), b.tensors[i].data.data(), a.tensors[i].data.size()))
        << a.tensors[i].name;
}

}  // namespace
}  // namespace dpt
