// DDP bucket assignment (Reducer::assign, docs/ddp.md "Buckets"): on the
// reference layouts (W-MLP, W-GPT, and a GPT-2-small-sized GPT), buckets are
// contiguous ranges of the flat buffer that cover it exactly once, from its
// end to its start (backward's order); caps are rounded down to whole
// 64-byte lines; bucket 0 holds the first cap less what aligns its start to a
// line, every other bucket but the last exactly the cap; per_param gives one
// bucket per tensor. Plus hand-computed
// boundaries on the MLP.
#include <algorithm>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "models/decoder.h"
#include "models/mlp.h"
#include "parallel/reducer.h"

namespace dpt {
namespace {

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kKiB = size_t{1} << 10;

size_t bytes_of(size_t numel) { return numel * sizeof(float); }

// A cap in floats as the reducer must round it: whole lines of 16, at least one.
size_t line_floats(size_t bytes) { return std::max<size_t>(16, bytes / 4 / 16 * 16); }

// Every structural property of an assignment, as one assertion result (so
// a failure names the layout, the options and the bucket).
::testing::AssertionResult well_formed(const Layout& layout, const ReducerOptions& o,
                                       const std::vector<Bucket>& buckets) {
  if (buckets.empty()) return ::testing::AssertionFailure() << "no buckets";
  size_t end = layout.numel();  // where the next bucket must end
  for (size_t i = 0; i < buckets.size(); ++i) {
    const Bucket& b = buckets[i];
    auto fail = [&]() {
      return ::testing::AssertionFailure() << "bucket " << i << " (offset " << b.offset << ", numel " << b.numel
                                           << "): ";
    };
    if (b.numel == 0) return fail() << "empty";
    if (b.offset + b.numel != end) return fail() << "does not end where bucket " << i - 1 << " begins (" << end << ")";
    end = b.offset;
    if (o.per_param) {
      // One tensor exactly: the slot that starts at the bucket's offset.
      const auto& slots = layout.slots();
      const Slot& slot = slots[slots.size() - 1 - i];
      if (slot.offset != b.offset || slot.numel != b.numel) return fail() << "is not slot " << slot.name;
      continue;
    }
    const size_t cap = line_floats(i == 0 ? o.first_bucket_bytes : o.bucket_bytes);
    if (b.numel > cap) return fail() << "exceeds the cap of " << cap << " floats";
    if (b.offset % 16 != 0) return fail() << "does not start on a 64-byte line";
    // Full: only the bucket that reaches the start of the buffer may be
    // short, and bucket 0 by less than a line (what aligns its start).
    if (b.offset > 0 && b.numel + (i == 0 ? 15 : 0) < cap) return fail() << "is not full (" << cap << " floats)";
  }
  if (end != 0) return ::testing::AssertionFailure() << "the buckets leave [0, " << end << ") uncovered";
  return ::testing::AssertionSuccess();
}

std::unique_ptr<Model> w_mlp() { return std::make_unique<Mlp>(MlpConfig{}); }
std::unique_ptr<Model> w_gpt() { return std::make_unique<Decoder>(DecoderConfig{}); }
// GPT-2 small's shape (85M parameters: 680 MB of parameters and gradients),
// built once.
const Model& gpt_12x768() {
  static const std::unique_ptr<Model> model = [] {
    DecoderConfig c;
    c.layers = 12;
    c.heads = 12;
    c.width = 768;
    return std::make_unique<Decoder>(c);
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
  size_t offset, numel;
};

void expect_buckets(const std::vector<Bucket>& got, const std::vector<Expected>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].offset, want[i].offset) << "bucket " << i;
    EXPECT_EQ(got[i].numel, want[i].numel) << "bucket " << i;
  }
}

constexpr size_t kW0 = 802816, kB0 = 1024, kW2 = 1048576, kB2 = 1024, kW4 = 10240, kB4 = 10;
constexpr size_t kOffW0 = 0, kOffB0 = kW0, kOffW2 = kOffB0 + kB0, kOffB2 = kOffW2 + kW2, kOffW4 = kOffB2 + kB2,
                 kOffB4 = kOffW4 + kW4, kTotal = kOffB4 + kB4;  // 1863690

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
  EXPECT_EQ(m->layout().numel(), kTotal);
}

TEST(Buckets, MlpDefaultCaps) {
  // First bucket 1 MiB = 262144 floats from the end, less 6 to start on a
  // line (1863690 - 262144 = 1601546 rounds up to 1601552): 4.bias,
  // 4.weight, 2.bias and the last 250848 floats of 2.weight (a tensor may be
  // cut). The rest, 1601552 floats (6.1 MiB), fits one 25 MiB bucket.
  expect_buckets(Reducer::assign(w_mlp()->layout(), ReducerOptions{}), {{1601552, 262138}, {0, 1601552}});
}

TEST(Buckets, MlpOneMiBCaps) {
  // 1863690 floats in 1 MiB buckets: bucket 0 as by default, six full ones
  // down to 28688, and 28688 floats left.
  ReducerOptions o;
  o.bucket_bytes = kMiB;
  std::vector<Expected> want{{1601552, 262138}};
  for (size_t i = 1; i <= 6; ++i) want.push_back({1601552 - i * 262144, 262144});
  want.push_back({0, 28688});
  expect_buckets(Reducer::assign(w_mlp()->layout(), o), want);
}

TEST(Buckets, CapsRoundDownToWholeLines) {
  // 100 bytes = 25 floats -> 16, of which bucket 0 keeps the 10 floats past
  // the last line boundary (1863690 = 16 * 116480 + 10); 64 KiB + 60 bytes
  // -> 16384; 4 bytes -> 16 (at least one line).
  ReducerOptions o;
  o.first_bucket_bytes = 100;
  o.bucket_bytes = 64 * kKiB + 60;
  auto b = Reducer::assign(w_mlp()->layout(), o);
  ASSERT_GE(b.size(), 3u);
  EXPECT_EQ(b[0].numel, 10u);
  EXPECT_EQ(b[1].numel, 16384u);
  EXPECT_EQ(b[1].offset, kTotal - 10 - 16384);
  o.first_bucket_bytes = 4;
  EXPECT_EQ(Reducer::assign(w_mlp()->layout(), o)[0].numel, 10u);
}

TEST(Buckets, CapLargerThanTheModelGivesTwoBuckets) {
  ReducerOptions o;
  o.bucket_bytes = 1024 * kMiB;
  expect_buckets(Reducer::assign(w_mlp()->layout(), o), {{1601552, 262138}, {0, 1601552}});
  // ... and one when the first cap covers it too.
  o.first_bucket_bytes = 1024 * kMiB;
  expect_buckets(Reducer::assign(w_mlp()->layout(), o), {{0, kTotal}});
}

TEST(Buckets, MlpPerParam) {
  ReducerOptions o;
  o.per_param = true;
  expect_buckets(Reducer::assign(w_mlp()->layout(), o),
                 {{kOffB4, kB4}, {kOffW4, kW4}, {kOffB2, kB2}, {kOffW2, kW2}, {kOffB0, kB0}, {kOffW0, kW0}});
}

TEST(Buckets, WGptDefaultFirstBucketIsSmall) {
  // W-GPT (about 3.2M parameters, 12.6 MiB): a 1 MiB first bucket, then the
  // rest in one 25 MiB bucket.
  auto m = w_gpt();
  const auto buckets = Reducer::assign(m->layout(), ReducerOptions{});
  ASSERT_EQ(buckets.size(), 2u);
  EXPECT_GT(bytes_of(buckets[0].numel), kMiB - 64);
  EXPECT_LE(bytes_of(buckets[0].numel), kMiB);
  EXPECT_EQ(buckets[1].offset, 0u);
}

TEST(Buckets, Gpt12x768DefaultCapsSplitTheModel) {
  // About 85M parameters (340 MiB): 1 MiB, then full 25 MiB buckets, then
  // the remainder: 1 + ceil((340 - 1) / 25) buckets.
  const Model& m = gpt_12x768();
  const auto buckets = Reducer::assign(m.layout(), ReducerOptions{});
  const size_t rest = buckets.at(0).offset;
  EXPECT_EQ(buckets.size(), 1 + (rest + 25 * kMiB / 4 - 1) / (25 * kMiB / 4));
}

}  // namespace
}  // namespace dpt
