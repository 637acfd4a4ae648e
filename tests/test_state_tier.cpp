// State tiers (optim/state_tier.h, optim/file_tier.h): the file tier holds
// what the RAM tier holds, at any offset and chunk size; its file is
// unlinked from the start and never enters the page cache; optimizers
// stepped through it give bitwise the RAM tier's parameters; and a bad
// offload directory is refused in one sentence.
#include "optim/file_tier.h"

#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "compare.h"
#include "core/error.h"
#include "core/rng.h"
#include "models/model.h"
#include "optim/optimizer.h"
#include "parallel/rank_bytes.h"
#include "parallel/strategy.h"
#include "tensor/layout.h"
#include "train/train.h"
#include "train/rank_setup.h"
#include "train/run_checks.h"

namespace dpt {
namespace {

namespace fs = std::filesystem;

std::vector<float> random_vector(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = 2.0f * rng.uniform() - 1.0f;
  return v;
}

class StateTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           fmt::format("dpt_state_tier_{}_{}", ::getpid(), ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  // The /proc/self/fd entry of the tier's file, or "" (it is unlinked: the
  // link reads "<path> (deleted)").
  static std::string fd_link(const std::string& path) {
    for (const auto& e : fs::directory_iterator("/proc/self/fd")) {
      std::error_code ec;
      const std::string target = fs::read_symlink(e.path(), ec).string();
      if (!ec && target.rfind(path, 0) == 0) return e.path().string();
    }
    return "";
  }
  fs::path dir_;
};

// Adds `lo`-dependent values to every element, so a chunk applied at the
// wrong offset or twice shows.
class AddKernel : public ChunkKernel {
 public:
  explicit AddKernel(size_t tensors) : tensors_(tensors) {}
  void update(size_t lo, size_t k, float* const* t) override {
    for (size_t i = 0; i < tensors_; ++i)
      for (size_t e = 0; e < k; ++e) t[i][e] = t[i][e] * 0.5f + static_cast<float>((lo + e) % 97) + i;
    chunks_++;
  }
  size_t tensors_, chunks_ = 0;
};

TEST_F(StateTierTest, FileTierHoldsWhatRamTierHoldsAtAnyOffset) {
  RamTier ram;
  FileTier file(dir_.string(), 0, 4096);  // 1024-element chunks: many per region
  const std::vector<std::pair<size_t, size_t>> shapes = {{2, 5000}, {1, 1}, {3, 1025}, {0, 77}, {2, 4096}};
  std::vector<int> rr, fr;
  for (auto [t, n] : shapes) {
    rr.push_back(ram.add_region(t, n));
    fr.push_back(file.add_region(t, n));
  }
  // Written at odd offsets and lengths (read-modify-write of partial blocks).
  for (size_t r = 0; r < shapes.size(); ++r)
    for (size_t t = 0; t < shapes[r].first; ++t) {
      const size_t n = shapes[r].second;
      const auto v = random_vector(n, 10 * r + t);
      for (size_t at = 0; at < n;) {
        const size_t m = std::min(n - at, 1 + (at * 7919) % 1500);
        ram.write(rr[r], t, at, m, v.data() + at);
        file.write(fr[r], t, at, m, v.data() + at);
        at += m;
      }
    }
  // Two passes over all regions, then every tensor read back whole and in pieces.
  std::vector<AddKernel> kr, kf;
  for (const auto& s : shapes) {
    kr.emplace_back(s.first);
    kf.emplace_back(s.first);
  }
  for (int pass = 0; pass < 2; ++pass) {
    std::vector<StateTier::Job> jr, jf;
    for (size_t r = 0; r < shapes.size(); ++r) {
      jr.push_back({rr[r], &kr[r]});
      jf.push_back({fr[r], &kf[r]});
    }
    ram.stream(jr.data(), jr.size());
    file.stream(jf.data(), jf.size());
  }
  EXPECT_EQ(kf[0].chunks_, 2u * 5u);  // 5000 elements in chunks of 1024, twice
  for (size_t r = 0; r < shapes.size(); ++r)
    for (size_t t = 0; t < shapes[r].first; ++t) {
      const size_t n = shapes[r].second;
      std::vector<float> want(n), got(n, -1.0f), piece(n, -1.0f);
      ram.read(rr[r], t, 0, n, want.data());
      file.read(fr[r], t, 0, n, got.data());
      EXPECT_TRUE(test::bitwise_equal(got.data(), want.data(), n)) << "region " << r << " tensor " << t;
      const size_t a = n / 3, b = n - n / 5;
      file.read(fr[r], t, a, b - a, piece.data());
      EXPECT_TRUE(test::bitwise_equal(piece.data(), want.data() + a, b - a)) << "region " << r << " tensor " << t;
    }
  EXPECT_EQ(file.offloaded_bytes(), ram.ram_bytes());
  EXPECT_EQ(file.ram_bytes(), 4u * 3u * 4096u);  // 4 buffers of 3 tensors' chunks
}

TEST_F(StateTierTest, TheFileIsUnlinkedFromTheStartAndClosedAtTheEnd) {
  std::string path, link;
  {
    FileTier tier(dir_.string(), 3, 1 << 20);
    tier.add_region(2, 100000);
    path = tier.path();
    EXPECT_EQ(fs::path(path).parent_path(), dir_);
    EXPECT_NE(path.find("rank3"), std::string::npos) << path;
    EXPECT_TRUE(fs::is_empty(dir_));  // nothing to leave behind, however the process ends
    link = fd_link(path);
    ASSERT_FALSE(link.empty()) << "no open descriptor of " << path;
    EXPECT_EQ(fs::read_symlink(link).string(), path + " (deleted)");
    EXPECT_EQ(fs::file_size(link), tier.file_bytes());  // the link reaches the open file
    EXPECT_GE(tier.file_bytes(), 2u * 100000u * 4u);
    EXPECT_TRUE(tier.direct()) << "this filesystem refused O_DIRECT";
  }
  EXPECT_EQ(fd_link(path), "");
}

// O_DIRECT: after a stream and a checkpoint-style read, none of the file's
// pages is in the page cache (mincore through a mapping of the same file).
TEST_F(StateTierTest, TheStateNeverEntersThePageCache) {
  FileTier tier(dir_.string(), 0, 1 << 16);
  const size_t n = 1 << 20;
  const int region = tier.add_region(2, n);
  AddKernel k(2);
  const StateTier::Job job{region, &k};
  tier.stream(&job, 1);
  std::vector<float> out(n);
  tier.read(region, 1, 0, n, out.data());
  EXPECT_EQ(out[5], 5.0f + 1.0f);
  const std::string link = fd_link(tier.path());
  ASSERT_FALSE(link.empty());
  std::FILE* f = std::fopen(link.c_str(), "rb");  // a new descriptor of the unlinked file
  ASSERT_NE(f, nullptr);
  const size_t bytes = tier.file_bytes();
  void* map = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fileno(f), 0);
  ASSERT_NE(map, MAP_FAILED);
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> resident((bytes + page - 1) / page);
  ASSERT_EQ(::mincore(map, bytes, resident.data()), 0);
  size_t cached = 0;
  for (unsigned char r : resident) cached += r & 1;
  ::munmap(map, bytes);
  std::fclose(f);
  EXPECT_EQ(cached, 0u) << "of " << resident.size() << " pages";
}

Layout mixed_layout() {
  Layout l;
  l.begin_unit("a");
  l.add("a.w", {130, 170}, true);
  l.add("a.b", {13}, false);
  l.begin_unit("b");
  l.add("b.ln", {47}, false);
  l.add("b.w", {200, 20}, true);
  return l;
}

// Optimizers over two spans sharing a file tier (chunks of 1024 elements,
// cut across slots) give the RAM tier's parameters and state bit for bit.
TEST_F(StateTierTest, OptimizersThroughAFileGiveTheRamResultBitwise) {
  const Layout l = mixed_layout();
  const size_t N = l.numel(), cut = 9000;
  for (const char* name : {"adamw", "sgd"}) {
    OptimizerConfig c;
    c.name = name;
    c.weight_decay = 0.1f;
    FileTier file(dir_.string(), 0, 4096);
    std::vector<std::unique_ptr<Optimizer>> ram, off;
    ram.push_back(make_optimizer(c, l, 0, cut));
    ram.push_back(make_optimizer(c, l, cut, N - cut));
    off.push_back(make_optimizer(c, l, 0, cut, &file));
    off.push_back(make_optimizer(c, l, cut, N - cut, &file));
    std::vector<float> p_ram = random_vector(N, 1), p_off = p_ram;
    for (int t = 0; t < 4; ++t) {
      auto g = random_vector(N, 100 + t), g_off = g;
      ram[0]->step(p_ram.data(), g.data(), 1e-2f);
      ram[1]->step(p_ram.data() + cut, g.data() + cut, 1e-2f);
      // The offloaded pass also zeroes the gradients, chunk by chunk.
      off[0]->prepare(p_off.data(), g_off.data(), 1e-2f, nullptr, GradsAfter::Zeroed);
      off[1]->prepare(p_off.data() + cut, g_off.data() + cut, 1e-2f, nullptr, GradsAfter::Zeroed);
      step_prepared(off);
      EXPECT_EQ(g_off, std::vector<float>(N, 0.0f)) << name << ": gradients after a Zeroed pass, step " << t;
    }
    EXPECT_TRUE(test::bitwise_equal(p_off.data(), p_ram.data(), N)) << name;
    for (size_t o = 0; o < 2; ++o)
      for (size_t i = 0; i < ram[o]->state_names().size(); ++i) {
        std::vector<float> s(ram[o]->numel());
        off[o]->read_state(i, 0, s.size(), s.data());
        EXPECT_TRUE(test::bitwise_equal(s.data(), ram[o]->ram_state(i), s.size())) << name << " state " << i;
        EXPECT_EQ(off[o]->ram_state(i), nullptr);
      }
  }
}

// The memory estimate counts the chunk buffers in RAM and the state as
// offloaded, and a run accounts exactly that.
TEST_F(StateTierTest, TheEstimateCountsTheBuffersAndARunAccountsThem) {
  TrainOptions o;
  o.model = "gpt";
  o.hparams = {{"n_layer", "2"}, {"n_embd", "32"}, {"n_head", "2"}, {"block_size", "16"}};
  o.batch = 4;
  o.steps = 2;
  o.synthetic = true;
  o.quiet = true;
  o.strategy = "local";
  o.offload = Offload::Optimizer;
  o.offload_dir = dir_.string();
  o.offload_chunk_bytes = 8192;
  apply_defaults(o);
  auto model = make_model(model_hparams(o));
  const size_t P = model->param_count();
  StrategyOptions so = strategy_options(o);
  const MemoryBytes est = rank_bytes(so, *model, 1);
  EXPECT_EQ(est.offloaded, 8 * P);
  EXPECT_EQ(est.optimizer, 4u * 2u * 8192u);  // 4 buffers of m's and v's 2048-element chunks
  const TrainResult r = run_training(o);
  EXPECT_EQ(r.memory.optimizer, est.optimizer);
  EXPECT_EQ(r.memory.offloaded, est.offloaded);
  EXPECT_TRUE(fs::is_empty(dir_));
  // ZeRO on 2 ranks: rank 0's shard, buffers of its longest unit chunk at most.
  so.strategy = "zero3";
  const MemoryBytes z = rank_bytes(so, *model, 2);
  so.offload.what = Offload::None;
  EXPECT_EQ(z.offloaded, rank_bytes(so, *model, 2).optimizer);
  EXPECT_LE(z.optimizer, est.optimizer);
}

TEST_F(StateTierTest, ABadOffloadDirectoryIsRefusedInOneSentence) {
  auto refused = [](const std::string& dir, uint64_t bytes) -> std::string {
    try {
      check_offload_dir(dir, bytes);
    } catch (const InputError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(refused(dir_.string(), 1 << 20), "");
  EXPECT_NE(refused("", 1).find("needs --offload-dir"), std::string::npos);
  EXPECT_NE(refused((dir_ / "nowhere").string(), 1).find("nowhere: no such directory"), std::string::npos);
  std::ofstream(dir_ / "file") << "x";
  EXPECT_NE(refused((dir_ / "file").string(), 1).find("not a directory"), std::string::npos);
  // More than any disk here holds: the free space is named.
  const std::string full = refused(dir_.string(), uint64_t{1} << 60);
  EXPECT_NE(full.find("free, but the ranks on this host offload"), std::string::npos) << full;
  struct statfs shm {};
  if (::statfs("/dev/shm", &shm) == 0 && shm.f_type == TMPFS_MAGIC) {
    EXPECT_NE(refused("/dev/shm", 1).find("in memory"), std::string::npos);
  }
}

}  // namespace
}  // namespace dpt
