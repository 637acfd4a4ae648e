// A GPU run's update on the host (parallel/host_update.h), run here on the
// CPU's kernels behind a spy: the same parameters and bf16 copy as the
// optimizer stepping the buffers in place, bit for bit (the CPU's update
// either way: on a GPU the device's update and the host's differ in the
// last bits, tests/gpu/trajectory.py --mode offload), with the bytes it
// moves counted.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "decoder_step.h"
#include "forwarding_kernels.h"
#include "models/decoder.h"
#include "parallel/host_update.h"

namespace dpt {
namespace {

using test::CopySpy;

std::vector<float> random_values(size_t n, uint64_t seed, float scale) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

TEST(HostUpdate, GivesTheInPlaceUpdateBitForBitAndCountsItsCopies) {
  const Decoder model(test::small_llama_and_gpt(32, 16)[1]);
  const Layout& layout = model.layout();
  const size_t n = layout.numel();
  OptimizerConfig config;
  config.name = "adamw";
  config.weight_decay = 0.1f;
  auto in_place = make_optimizer(config, layout, 0, n, nullptr);
  auto on_host = make_optimizer(config, layout, 0, n, nullptr);
  CopySpy spy(cpu_kernels());
  HostUpdate host(spy, n);

  std::vector<float> ref = random_values(n, 1, 0.5f), dev = ref;
  std::vector<bf16> ref16(n), dev16(n);
  for (int step = 0; step < 4; ++step) {
    SCOPED_TRACE(step);
    if (step == 2) {  // the device's parameters rewritten (a checkpoint read): stale
      ref = random_values(n, 7, 0.5f);
      dev = ref;
      host.stale();
    }
    std::vector<float> g = random_values(n, 100 + static_cast<uint64_t>(step), 0.01f), dev_g = g;
    spy.downloaded = spy.uploaded = 0;
    in_place->step(ref.data(), g.data(), 1e-2f, GradsAfter::Zeroed, ref16.data());
    host.step(*on_host, dev.data(), dev_g.data(), dev16.data(), 1e-2f, GradsAfter::Zeroed);
    EXPECT_EQ(0, std::memcmp(dev.data(), ref.data(), n * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(dev16.data(), ref16.data(), n * sizeof(bf16)));
    EXPECT_EQ(dev_g, std::vector<float>(n, 0.0f)) << "the device's gradients are left zero";
    // Down: the gradients (and the parameters, on the first step and after stale()); up: both copies.
    EXPECT_EQ(spy.downloaded, (step == 0 || step == 2 ? 2 : 1) * n * sizeof(float));
    EXPECT_EQ(spy.uploaded, n * (sizeof(float) + sizeof(bf16)));
  }
  EXPECT_EQ(host.host_bytes(), n * (2 * sizeof(float) + sizeof(bf16)));
  EXPECT_EQ(host.detail()["steps"], 4);
  // A strategy's detail: the tier's, with the updates summed (a ZeRO rank's shards).
  EXPECT_TRUE(with_host_updates(nullptr, {nullptr}).is_null());
  const nlohmann::json two = with_host_updates(nlohmann::json{{"pinned_for", "cuda"}}, {&host, nullptr, &host});
  EXPECT_EQ(two["pinned_for"], "cuda");
  EXPECT_EQ(two["host_update"]["host_bytes"].get<double>(), 2.0 * static_cast<double>(host.host_bytes()));
}

}  // namespace
}  // namespace dpt
