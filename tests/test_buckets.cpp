// DDP bucket assignment (Reducer::assign, docs/ddp.md "Buckets"): on the
// reference layouts (W-MLP, W-GPT, and a GPT-2-small-sized GPT), buckets
// cover every slot once, are contiguous ranges of the flat buffer in reverse
// parameter order, respect their caps (a tensor never splits, so a slot
// larger than the cap is a bucket alone), and are maximal (a bucket closes
// only when the next slot would overflow it). Plus hand-computed boundaries
// on the MLP with small caps.
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "models/gpt.h"
#include "models/mlp.h"
#include "parallel/reducer.h"

namespace dpt {
namespace {

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kKiB = size_t{1} << 10;

size_t bytes_of(size_t numel) { return numel * sizeof(float); }

// Every structural property of an assignment, as one assertion result (so
// a failure names the layout, the options and the bucket).
::testing::AssertionResult well_formed(const Layout& layout, const ReducerOptions& o,
                                       const std::vector<Bucket>& buckets) {
  const auto& slots = layout.slots();
  const int n = static_cast<int>(slots.size());
  if (buckets.empty()) return ::testing::AssertionFailure() << "no buckets";
  std::vector<int> seen(slots.size(), 0);
  for (size_t i = 0; i < buckets.size(); ++i) {
    const Bucket& b = buckets[i];
    auto fail = [&]() {
      return ::testing::AssertionFailure() << "bucket " << i << " (slots " << b.first_slot << ".."
                                           << b.last_slot << ", offset " << b.offset << ", numel " << b.numel
                                           << "): ";
    };
    if (b.first_slot < 0 || b.last_slot >= n || b.first_slot > b.last_slot) return fail() << "bad slot range";
    // Contiguous: the slots are consecutive in the layout, so their
    // elements are one range of the flat buffer starting at the first one.
    size_t numel = 0;
    for (int s = b.first_slot; s <= b.last_slot; ++s) {
      const Slot& slot = slots[static_cast<size_t>(s)];
      if (slot.offset != b.offset + numel) return fail() << "slot " << s << " is not contiguous";
      numel += slot.numel;
      ++seen[static_cast<size_t>(s)];
    }
    if (b.offset != slots[static_cast<size_t>(b.first_slot)].offset) return fail() << "offset is not the first slot's";
    if (numel != b.numel) return fail() << "numel is not the sum of its slots' (" << numel << ")";
    // Reverse parameter order: bucket 0 ends with the last slot, and each
    // bucket ends right before the previous one begins.
    if (i == 0 && b.last_slot != n - 1) return fail() << "bucket 0 does not hold the last slot";
    if (i > 0) {
      const Bucket& prev = buckets[i - 1];
      if (b.last_slot != prev.first_slot - 1) return fail() << "does not end right before bucket " << i - 1;
      if (b.offset >= prev.offset) return fail() << "offset not below bucket " << i - 1 << "'s";
      if (b.offset + b.numel != prev.offset) return fail() << "leaves a gap before bucket " << i - 1;
    }
    if (i + 1 == buckets.size() && (b.first_slot != 0 || b.offset != 0))
      return fail() << "the last bucket does not start at slot 0";
    const bool single = b.first_slot == b.last_slot;
    if (o.per_param) {
      if (!single) return fail() << "per_param bucket with more than one slot";
      continue;
    }
    const size_t cap = i == 0 ? o.first_bucket_bytes : o.bucket_bytes;
    if (bytes_of(b.numel) > cap && !single)
      return fail() << bytes_of(b.numel) << " bytes exceed the cap " << cap << " with more than one slot";
    // Maximal: the bucket was closed because the next slot (in backward
    // order) would have pushed it past its cap.
    if (b.first_slot > 0) {
      const size_t next = slots[static_cast<size_t>(b.first_slot - 1)].numel;
      if (bytes_of(b.numel + next) <= cap)
        return fail() << "closed although slot " << b.first_slot - 1 << " (" << bytes_of(next)
                      << " bytes) still fits under the cap " << cap;
    }
  }
  for (int s = 0; s < n; ++s)
    if (seen[static_cast<size_t>(s)] != 1)
      return ::testing::AssertionFailure() << "slot " << s << " (" << slots[static_cast<size_t>(s)].name
                                           << ") is in " << seen[static_cast<size_t>(s)] << " buckets";
  return ::testing::AssertionSuccess();
}

std::unique_ptr<Model> w_mlp() { return std::make_unique<Mlp>(MlpConfig{}); }
std::unique_ptr<Model> w_gpt() { return std::make_unique<Gpt>(GptConfig{}); }
// GPT-2 small's shape (85M parameters: 680 MB of parameters and gradients),
// built once.
const Model& gpt_12x768() {
  static const std::unique_ptr<Model> model = [] {
    GptConfig c;
    c.layers = 12;
    c.heads = 12;
    c.width = 768;
    return std::make_unique<Gpt>(c);
  }();
  return *model;
}

std::vector<ReducerOptions> option_grid() {
  std::vector<ReducerOptions> grid;
  grid.push_back(ReducerOptions{});
  for (size_t first : {size_t{0}, 4 * kKiB, 64 * kKiB, kMiB, 8 * kMiB})
    for (size_t cap : {4 * kKiB, 256 * kKiB, 4 * kMiB, 25 * kMiB, 1024 * kMiB}) {
      ReducerOptions o;
      o.first_bucket_bytes = first;
      o.bucket_bytes = cap;
      grid.push_back(o);
    }
  ReducerOptions per;
  per.per_param = true;
  grid.push_back(per);
  return grid;
}

void check_layout(const Model& model, const std::string& what) {
  for (const ReducerOptions& o : option_grid()) {
    const auto buckets = Reducer::assign(model.layout(), o);
    EXPECT_TRUE(well_formed(model.layout(), o, buckets))
        << what << " with first " << o.first_bucket_bytes << " cap " << o.bucket_bytes << " per_param "
        << o.per_param;
    if (o.per_param) {
      EXPECT_EQ(buckets.size(), model.layout().slots().size()) << what;
      for (size_t i = 0; i < buckets.size(); ++i) {
        const int slot = static_cast<int>(model.layout().slots().size() - 1 - i);
        EXPECT_EQ(buckets[i].first_slot, slot) << what << " bucket " << i;
        EXPECT_EQ(buckets[i].last_slot, slot) << what << " bucket " << i;
      }
    }
  }
}

TEST(Buckets, DefaultOptions) {
  const ReducerOptions o;
  EXPECT_EQ(o.bucket_bytes, 25 * kMiB);
  EXPECT_EQ(o.first_bucket_bytes, 1 * kMiB);
  EXPECT_TRUE(o.overlap);
  EXPECT_FALSE(o.per_param);
}

TEST(Buckets, WMlpLayout) { check_layout(*w_mlp(), "W-MLP"); }
TEST(Buckets, WGptLayout) { check_layout(*w_gpt(), "W-GPT"); }
TEST(Buckets, Gpt12x768Layout) { check_layout(gpt_12x768(), "GPT 12x768"); }

// The W-MLP's slots, in layout order: 0.weight 1024x784 = 802816,
// 0.bias 1024, 2.weight 1024x1024 = 1048576, 2.bias 1024, 4.weight 10x1024 =
// 10240, 4.bias 10. Backward order is the reverse.
struct Expected {
  int first_slot, last_slot;
  size_t offset, numel;
};

void expect_buckets(const std::vector<Bucket>& got, const std::vector<Expected>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].first_slot, want[i].first_slot) << "bucket " << i;
    EXPECT_EQ(got[i].last_slot, want[i].last_slot) << "bucket " << i;
    EXPECT_EQ(got[i].offset, want[i].offset) << "bucket " << i;
    EXPECT_EQ(got[i].numel, want[i].numel) << "bucket " << i;
  }
}

constexpr size_t kW0 = 802816, kB0 = 1024, kW2 = 1048576, kB2 = 1024, kW4 = 10240, kB4 = 10;
constexpr size_t kOffW0 = 0, kOffB0 = kW0, kOffW2 = kOffB0 + kB0, kOffB2 = kOffW2 + kW2, kOffW4 = kOffB2 + kB2,
                 kOffB4 = kOffW4 + kW4;

TEST(Buckets, MlpLayoutIsWhatTheHandComputationAssumes) {
  auto m = w_mlp();
  const auto& s = m->layout().slots();
  ASSERT_EQ(s.size(), 6u);
  const size_t numel[] = {kW0, kB0, kW2, kB2, kW4, kB4};
  const size_t offset[] = {kOffW0, kOffB0, kOffW2, kOffB2, kOffW4, kOffB4};
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(s[i].numel, numel[i]) << s[i].name;
    EXPECT_EQ(s[i].offset, offset[i]) << s[i].name;
  }
}

TEST(Buckets, MlpSmallCaps) {
  // Caps of 64 KiB = 16384 floats. Bucket 0: 4.bias (10) + 4.weight
  // (10240) + 2.bias (1024) = 11274 floats = 45096 bytes; adding 2.weight
  // would overflow. 2.weight (4 MiB) alone; then 0.bias alone (0.weight
  // does not fit beside it); then 0.weight alone.
  ReducerOptions o;
  o.first_bucket_bytes = 64 * kKiB;
  o.bucket_bytes = 64 * kKiB;
  expect_buckets(Reducer::assign(w_mlp()->layout(), o), {{3, 5, kOffB2, kB4 + kW4 + kB2},
                                                          {2, 2, kOffW2, kW2},
                                                          {1, 1, kOffB0, kB0},
                                                          {0, 0, kOffW0, kW0}});
}

TEST(Buckets, MlpDefaultCaps) {
  // First bucket 1 MiB = 262144 floats: the same 11274 floats (2.weight
  // would overflow it). The rest, 1048576 + 1024 + 802816 = 1852416 floats
  // (7.07 MiB), fits one 25 MiB bucket.
  expect_buckets(Reducer::assign(w_mlp()->layout(), ReducerOptions{}),
                 {{3, 5, kOffB2, kB4 + kW4 + kB2}, {0, 2, 0, kW2 + kB0 + kW0}});
}

TEST(Buckets, MlpCapReachedExactly) {
  // A cap of exactly 2.weight's 4 MiB: the bucket is full, not overflowing,
  // so 2.weight fills it; 0.bias opens the next one, which 0.weight joins
  // (803840 floats < 1048576).
  ReducerOptions o;
  o.first_bucket_bytes = 64 * kKiB;
  o.bucket_bytes = kW2 * sizeof(float);
  expect_buckets(Reducer::assign(w_mlp()->layout(), o),
                 {{3, 5, kOffB2, kB4 + kW4 + kB2}, {2, 2, kOffW2, kW2}, {0, 1, 0, kB0 + kW0}});
  // One float less and 2.weight is over the cap: a bucket alone all the
  // same, and the next bucket is unchanged.
  o.bucket_bytes = kW2 * sizeof(float) - sizeof(float);
  expect_buckets(Reducer::assign(w_mlp()->layout(), o),
                 {{3, 5, kOffB2, kB4 + kW4 + kB2}, {2, 2, kOffW2, kW2}, {0, 1, 0, kB0 + kW0}});
  // A cap one float short of 0.bias + 0.weight splits them.
  o.bucket_bytes = (kB0 + kW0) * sizeof(float) - sizeof(float);
  expect_buckets(Reducer::assign(w_mlp()->layout(), o),
                 {{3, 5, kOffB2, kB4 + kW4 + kB2}, {2, 2, kOffW2, kW2}, {1, 1, kOffB0, kB0}, {0, 0, 0, kW0}});
  // The first bucket's cap exactly at its 11274 floats: still one bucket.
  o.first_bucket_bytes = (kB4 + kW4 + kB2) * sizeof(float);
  o.bucket_bytes = 25 * kMiB;
  expect_buckets(Reducer::assign(w_mlp()->layout(), o),
                 {{3, 5, kOffB2, kB4 + kW4 + kB2}, {0, 2, 0, kW2 + kB0 + kW0}});
  // One float less: 2.bias no longer fits in bucket 0 and opens bucket 1.
  o.first_bucket_bytes -= sizeof(float);
  expect_buckets(Reducer::assign(w_mlp()->layout(), o),
                 {{4, 5, kOffW4, kB4 + kW4}, {0, 3, 0, kB2 + kW2 + kB0 + kW0}});
}

TEST(Buckets, MlpFirstCapSmallerThanLastSlot) {
  // A first cap below even 4.bias (40 bytes): bucket 0 is that slot alone.
  ReducerOptions o;
  o.first_bucket_bytes = 16;
  expect_buckets(Reducer::assign(w_mlp()->layout(), o), {{5, 5, kOffB4, kB4}, {0, 4, 0, kOffB4}});
}

TEST(Buckets, MlpPerParam) {
  ReducerOptions o;
  o.per_param = true;
  expect_buckets(Reducer::assign(w_mlp()->layout(), o), {{5, 5, kOffB4, kB4},
                                                          {4, 4, kOffW4, kW4},
                                                          {3, 3, kOffB2, kB2},
                                                          {2, 2, kOffW2, kW2},
                                                          {1, 1, kOffB0, kB0},
                                                          {0, 0, kOffW0, kW0}});
}

TEST(Buckets, WGptDefaultFirstBucketIsSmall) {
  // W-GPT (4 blocks of width 256): backward starts with ln_f (2 x 256) and
  // the last block's mlp.c_proj.bias (256); its mlp.c_proj.weight (256 x
  // 1024 = exactly 1 MiB) would overflow the 1 MiB first bucket.
  auto m = w_gpt();
  const auto buckets = Reducer::assign(m->layout(), ReducerOptions{});
  ASSERT_GE(buckets.size(), 2u);
  const int n = static_cast<int>(m->layout().slots().size());
  EXPECT_EQ(buckets[0].last_slot, n - 1);
  EXPECT_EQ(buckets[0].first_slot, n - 3);
  EXPECT_EQ(buckets[0].numel, 768u);
  // The whole model (about 3.2M parameters, 12.6 MiB) fits one more bucket.
  EXPECT_EQ(buckets.size(), 2u);
}

TEST(Buckets, Gpt12x768DefaultCapsSplitTheModel) {
  // About 85M parameters (340 MiB): at 25 MiB a bucket, at least 14 buckets,
  // each but the first filled to more than half its cap (a block's
  // c_fc/c_proj matrices are 9 MiB each, so the slack of a bucket is less
  // than that).
  const Model& m = gpt_12x768();
  const auto buckets = Reducer::assign(m.layout(), ReducerOptions{});
  EXPECT_GE(buckets.size(), bytes_of(m.param_count()) / (25 * kMiB) + 1);
  for (size_t i = 1; i + 1 < buckets.size(); ++i)
    EXPECT_GT(bytes_of(buckets[i].numel), 25 * kMiB - 9 * kMiB) << "bucket " << i;
}

}  // namespace
}  // namespace dpt
