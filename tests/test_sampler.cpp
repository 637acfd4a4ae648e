// The DistributedSampler and the batch sources built on it (docs/ddp.md,
// "The DistributedSampler"): each rank's share of every epoch, and the
// property DDP's equivalence rests on: the samples all N ranks take at step
// t (batch b each) are exactly the samples one process takes at step t with
// batch N*b. Single process: ranks are simulated by constructing one sampler
// per rank.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "data/batches.h"
#include "data/distributed_sampler.h"

namespace dpt {
namespace {

using Tail = DistributedSampler::Tail;

const int64_t kSizes[] = {10, 11, 60000};
const uint64_t kSeeds[] = {0, 7};

// Epoch e's full permutation: world 1 with Drop keeps all of it.
std::vector<int64_t> permutation(int64_t n, uint64_t seed, int64_t epoch) {
  DistributedSampler s(n, 0, 1, seed, Tail::Drop);
  s.set_epoch(epoch);
  return s.indices();
}

TEST(DistributedSampler, WorldOneIsAPermutation) {
  for (int64_t n : kSizes)
    for (uint64_t seed : kSeeds)
      for (int64_t epoch : {0, 1, 5}) {
        auto p = permutation(n, seed, epoch);
        ASSERT_EQ(static_cast<int64_t>(p.size()), n);
        std::sort(p.begin(), p.end());
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(p[static_cast<size_t>(i)], i) << "n " << n;
        // Pad with one rank pads nothing.
        DistributedSampler pad(n, 0, 1, seed, Tail::Pad);
        pad.set_epoch(epoch);
        EXPECT_EQ(pad.indices(), permutation(n, seed, epoch));
      }
}

TEST(DistributedSampler, DropSharesAreDisjointAndInterleaved) {
  for (int64_t n : kSizes)
    for (int world = 1; world <= 4; ++world)
      for (uint64_t seed : kSeeds)
        for (int64_t epoch : {0, 1, 3}) {
          SCOPED_TRACE(::testing::Message() << "n " << n << " world " << world << " seed " << seed << " epoch "
                                            << epoch);
          const auto perm = permutation(n, seed, epoch);
          const int64_t kept = n / world * world;
          std::set<int64_t> all;
          for (int r = 0; r < world; ++r) {
            DistributedSampler s(n, r, world, seed, Tail::Drop);
            s.set_epoch(epoch);
            EXPECT_EQ(s.epoch(), epoch);
            const auto& share = s.indices();
            ASSERT_EQ(static_cast<int64_t>(share.size()), n / world);
            // Rank r takes positions r, r + N, ... of the permutation.
            for (size_t j = 0; j < share.size(); ++j)
              ASSERT_EQ(share[j], perm[static_cast<size_t>(r) + j * static_cast<size_t>(world)]) << "rank " << r;
            for (int64_t i : share) EXPECT_TRUE(all.insert(i).second) << "index " << i << " in two shares";
          }
          // Together: exactly the permutation's first floor(n/N)*N samples.
          EXPECT_EQ(all, std::set<int64_t>(perm.begin(), perm.begin() + kept));
        }
}

TEST(DistributedSampler, PadCoversEverythingWithEqualShares) {
  for (int64_t n : kSizes)
    for (int world = 1; world <= 4; ++world)
      for (uint64_t seed : kSeeds) {
        SCOPED_TRACE(::testing::Message() << "n " << n << " world " << world << " seed " << seed);
        const auto perm = permutation(n, seed, 0);
        const int64_t per_rank = (n + world - 1) / world;
        std::vector<int64_t> times(static_cast<size_t>(n), 0);
        for (int r = 0; r < world; ++r) {
          DistributedSampler s(n, r, world, seed, Tail::Pad);
          const auto& share = s.indices();
          ASSERT_EQ(static_cast<int64_t>(share.size()), per_rank);
          for (size_t j = 0; j < share.size(); ++j) {
            // Position p of the padded permutation is perm[p % n].
            const size_t p = static_cast<size_t>(r) + j * static_cast<size_t>(world);
            ASSERT_EQ(share[j], perm[p % static_cast<size_t>(n)]);
          }
          for (int64_t i : share) ++times[static_cast<size_t>(i)];
        }
        // Every sample at least once; only the padding (the permutation's
        // first per_rank*N - n samples) twice.
        const int64_t padding = per_rank * world - n;
        for (int64_t p = 0; p < n; ++p)
          ASSERT_EQ(times[static_cast<size_t>(perm[static_cast<size_t>(p)])], p < padding ? 2 : 1) << "position " << p;
      }
}

TEST(DistributedSampler, EpochsReshuffleDeterministically) {
  for (int64_t n : kSizes)
    for (int world = 1; world <= 4; ++world)
      for (Tail tail : {Tail::Drop, Tail::Pad}) {
        SCOPED_TRACE(::testing::Message() << "n " << n << " world " << world);
        DistributedSampler a(n, world - 1, world, 7, tail), b(n, world - 1, world, 7, tail);
        EXPECT_EQ(a.epoch(), 0);
        const auto e0 = a.indices();
        a.set_epoch(1);
        const auto e1 = a.indices();
        b.set_epoch(1);
        EXPECT_EQ(b.indices(), e1) << "same (seed, epoch), same share";
        a.set_epoch(0);
        EXPECT_EQ(a.indices(), e0) << "back to epoch 0: the same share again";
        // Tiny datasets can repeat a share by chance (10 samples, 4 ranks:
        // shares of 2); the full permutation must change.
        if (n == 60000) {
          EXPECT_NE(e0, e1) << "epoch 1 reuses epoch 0's order";
        }
        EXPECT_NE(permutation(n, 7, 0), permutation(n, 7, 1));
        EXPECT_NE(permutation(n, 7, 0), permutation(n, 8, 0)) << "the seed does not matter";
      }
}

TEST(DistributedSampler, DropLeavesOutADifferentTailEachEpoch) {
  // 11 samples on 4 ranks: 3 left out per epoch, chosen by the permutation.
  std::set<std::set<int64_t>> left_out;
  for (int64_t epoch = 0; epoch < 8; ++epoch) {
    std::set<int64_t> seen;
    for (int r = 0; r < 4; ++r) {
      DistributedSampler s(11, r, 4, 3, Tail::Drop);
      s.set_epoch(epoch);
      seen.insert(s.indices().begin(), s.indices().end());
    }
    ASSERT_EQ(seen.size(), 8u);
    std::set<int64_t> out;
    for (int64_t i = 0; i < 11; ++i)
      if (!seen.count(i)) out.insert(i);
    left_out.insert(out);
  }
  EXPECT_GT(left_out.size(), 1u) << "the same samples are dropped every epoch";
}

TEST(DistributedSampler, Errors) {
  EXPECT_EQ(DistributedSampler::parse_tail("drop"), Tail::Drop);
  EXPECT_EQ(DistributedSampler::parse_tail("pad"), Tail::Pad);
  EXPECT_THROW(DistributedSampler::parse_tail("foo"), InputError);
  EXPECT_THROW(DistributedSampler::parse_tail(""), InputError);
  EXPECT_THROW(DistributedSampler(3, 0, 4, 0, Tail::Drop), InputError);  // fewer samples than ranks
  EXPECT_THROW(DistributedSampler(3, 0, 4, 0, Tail::Pad), InputError);
  EXPECT_THROW(DistributedSampler(0, 0, 1, 0, Tail::Drop), InputError);
  EXPECT_THROW(DistributedSampler(10, 4, 4, 0, Tail::Drop), InputError);  // rank out of range
  EXPECT_THROW(DistributedSampler(10, -1, 4, 0, Tail::Drop), InputError);
  EXPECT_THROW(DistributedSampler(10, 0, 0, 0, Tail::Drop), InputError);
  EXPECT_NO_THROW(DistributedSampler(4, 3, 4, 0, Tail::Drop));  // one sample each
}

// ------------------------------------------------------------ ImageEpochs

// 103 images of 2x2 pixels, every pixel of image i = i (all < 256) and
// label i % 10, so a batch tells which images it holds.
ImageSet numbered_images(int64_t count = 103) {
  ImageSet set;
  set.count = count;
  set.rows = 2;
  set.cols = 2;
  for (int64_t i = 0; i < count; ++i) {
    for (int p = 0; p < 4; ++p) set.pixels.push_back(static_cast<uint8_t>(i % 256));
    set.labels.push_back(static_cast<uint8_t>(i % 10));
  }
  return set;
}

std::vector<int64_t> indices_of(const Batch& b) {
  std::vector<int64_t> out;
  for (int64_t s = 0; s < b.B; ++s) {
    const float* f = b.features.data() + s * 4;
    const int64_t i = std::lround(f[0] * 255.0f);
    for (int p = 1; p < 4; ++p) EXPECT_EQ(std::lround(f[p] * 255.0f), i) << "pixels of one image disagree";
    EXPECT_EQ(b.targets[static_cast<size_t>(s)], static_cast<int32_t>(i % 10)) << "label of image " << i;
    out.push_back(i);
  }
  return out;
}

TEST(ImageEpochs, RanksTogetherTakeTheSingleProcessBatch) {
  const ImageSet set = numbered_images();
  for (int world = 1; world <= 4; ++world)
    for (int64_t b : {1, 3, 5, 8})
      for (uint64_t seed : kSeeds) {
        SCOPED_TRACE(::testing::Message() << "world " << world << " batch " << b << " per rank, seed " << seed);
        ImageEpochs single(set, world * b, seed);
        std::vector<std::unique_ptr<ImageEpochs>> ranks;
        for (int r = 0; r < world; ++r) ranks.push_back(std::make_unique<ImageEpochs>(set, b, seed, r, world));
        // floor(floor(n/N)/b) = floor(n/(N b)): the epochs end together.
        ASSERT_EQ(ranks[0]->steps_per_epoch(), single.steps_per_epoch());
        const int64_t steps = 2 * single.steps_per_epoch() + 3;  // two epoch boundaries
        Batch one, mine;
        for (int64_t t = 0; t < steps; ++t) {
          single.next(one);
          ASSERT_EQ(one.B, world * b);
          const auto want = indices_of(one);
          std::multiset<int64_t> got;
          for (int r = 0; r < world; ++r) {
            ranks[static_cast<size_t>(r)]->next(mine);
            ASSERT_EQ(mine.B, b);
            for (int64_t i : indices_of(mine)) got.insert(i);
            EXPECT_EQ(ranks[static_cast<size_t>(r)]->epoch(), single.epoch()) << "step " << t;
          }
          EXPECT_EQ(got, std::multiset<int64_t>(want.begin(), want.end())) << "step " << t;
          EXPECT_EQ(std::set<int64_t>(want.begin(), want.end()).size(), want.size()) << "repeat within a batch";
        }
        EXPECT_EQ(single.epoch(), 2);
      }
}

TEST(ImageEpochs, PadMatchesTheSingleProcessWithinTheFirstEpoch) {
  // With Pad every rank's share is ceil(n/N); the padding sits at the end of
  // the permutation, so the steps before it are those of one process.
  const ImageSet set = numbered_images();
  for (int world = 2; world <= 4; ++world) {
    const int64_t b = 4;
    ImageEpochs single(set, world * b, 5);
    std::vector<std::unique_ptr<ImageEpochs>> ranks;
    for (int r = 0; r < world; ++r) ranks.push_back(std::make_unique<ImageEpochs>(set, b, 5, r, world, Tail::Pad));
    Batch one, mine;
    for (int64_t t = 0; t < single.steps_per_epoch(); ++t) {
      single.next(one);
      const auto want = indices_of(one);
      std::multiset<int64_t> got;
      for (auto& r : ranks) {
        r->next(mine);
        for (int64_t i : indices_of(mine)) got.insert(i);
      }
      EXPECT_EQ(got, std::multiset<int64_t>(want.begin(), want.end())) << "world " << world << " step " << t;
    }
  }
}

TEST(ImageEpochs, Errors) {
  const ImageSet set = numbered_images();
  EXPECT_THROW(ImageEpochs(set, 0, 0), InputError);
  EXPECT_THROW(ImageEpochs(set, 104, 0), InputError);  // more than the set
  EXPECT_THROW(ImageEpochs(set, 26, 0, 0, 4), InputError);  // a share is 25 images
  EXPECT_NO_THROW(ImageEpochs(set, 25, 0, 3, 4));
  const ImageSet tiny = numbered_images(3);
  EXPECT_THROW(ImageEpochs(tiny, 1, 0, 0, 4), InputError);  // fewer images than ranks
}

// ---------------------------------------------------------- WindowSampler

TEST(WindowSampler, RanksInOrderAreTheSingleProcessBatch) {
  std::vector<uint8_t> text(1000);
  uint64_t x = 12345;
  for (uint8_t& c : text) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    c = static_cast<uint8_t>(x >> 56);
  }
  const int64_t T = 8;
  for (int world = 1; world <= 4; ++world)
    for (int64_t B : {1, 3}) {
      SCOPED_TRACE(::testing::Message() << "world " << world << " B " << B);
      WindowSampler single(text.data(), text.size(), T, 42);
      std::vector<std::unique_ptr<WindowSampler>> ranks;
      for (int r = 0; r < world; ++r)
        ranks.push_back(std::make_unique<WindowSampler>(text.data(), text.size(), T, 42, r, world));
      Batch one, mine;
      for (int step = 0; step < 5; ++step) {
        single.next(one, world * B);
        ASSERT_EQ(one.B, world * B);
        std::vector<int32_t> tokens, targets;
        for (auto& r : ranks) {
          r->next(mine, B);
          ASSERT_EQ(mine.B, B);
          ASSERT_EQ(mine.T, T);
          tokens.insert(tokens.end(), mine.tokens.begin(), mine.tokens.end());
          targets.insert(targets.end(), mine.targets.begin(), mine.targets.end());
        }
        EXPECT_EQ(tokens, one.tokens) << "step " << step;
        EXPECT_EQ(targets, one.targets) << "step " << step;
        // Targets are the inputs shifted by one byte.
        for (int64_t b = 0; b < one.B; ++b)
          for (int64_t t = 0; t + 1 < T; ++t)
            ASSERT_EQ(one.targets[static_cast<size_t>(b * T + t)], one.tokens[static_cast<size_t>(b * T + t + 1)]);
      }
    }
}

}  // namespace
}  // namespace dpt
