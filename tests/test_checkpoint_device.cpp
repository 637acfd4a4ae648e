// A checkpoint reads the parameters off the model's device and writes them
// back there (train/checkpoint.cpp): every parameter byte goes through the
// model's Kernels (download into a bounded pinned buffer on the way out,
// upload on the way in), the path a GPU run takes, here on the CPU's
// kernels watched by a spy.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <numeric>
#include <vector>

#include "comm/process_group.h"
#include "decoder_step.h"
#include "device/host_staging.h"
#include "forwarding_kernels.h"
#include "models/decoder.h"
#include "parallel/strategy.h"
#include "train/checkpoint.h"

namespace dpt {
namespace {

using test::CopySpy;

TEST(HostStaging, PassesDeviceMemoryInBoundedChunksInOrder) {
  CopySpy spy(cpu_kernels());
  std::vector<float> src(2500);
  std::iota(src.begin(), src.end(), 0.0f);
  std::vector<float> seen;
  std::vector<size_t> chunks;
  {
    HostStaging staged(spy, 1000);
    staged.download(src.data(), 0, [&](const float*, size_t k) { chunks.push_back(k); });
    EXPECT_EQ(spy.pinned, 0) << "nothing to pass: nothing allocated";
    staged.download(src.data(), src.size(), [&](const float* c, size_t k) {
      chunks.push_back(k);
      seen.insert(seen.end(), c, c + k);
    });
  }
  EXPECT_EQ(chunks, (std::vector<size_t>{1000, 1000, 500}));
  EXPECT_EQ(seen, src);
  EXPECT_EQ(spy.pinned, 1);
  EXPECT_EQ(spy.pinned_bytes, 1000 * sizeof(float));
  EXPECT_EQ(spy.pinned_freed, 1);
  EXPECT_EQ(spy.downloaded, src.size() * sizeof(float));
}

TEST(CheckpointOnADevice, ParametersLeaveAndReturnThroughTheModelsKernels) {
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("dpt_ckpt_device_{}", ::getpid());
  std::filesystem::remove_all(dir);
  auto pg = comm::ProcessGroup::create_self();
  Decoder model(test::small_llama_and_gpt(32, 16)[1]);
  CopySpy spy(cpu_kernels());
  model.use_kernels(spy);
  StrategyOptions so;
  so.optimizer.name = "adamw";
  StrategyInit init;
  init.seed = 5;
  auto strategy = make_strategy(resolve_options(so, *pg), model, *pg, init);
  const std::vector<float> saved(model.params(), model.params() + model.param_count());
  const size_t bytes = saved.size() * sizeof(float);

  CheckpointInfo info;
  info.step = 3;
  info.model = model.metadata();
  info.optimizer = "adamw";
  info.settings = nlohmann::json::object();
  info.data = nlohmann::json::object();
  info.strategy = "local";
  spy.downloaded = spy.uploaded = 0;
  const WrittenCheckpoint written = write_checkpoint(dir.string(), info, *strategy, model, *pg, 0, true, nullptr);
  // The parameters, and only they (the optimizer state leaves through its
  // tier), in chunks of at most the staging buffer's 4 MiB.
  EXPECT_EQ(spy.downloaded, bytes);
  EXPECT_LE(spy.largest_download, size_t{4} << 20);
  EXPECT_EQ(spy.pinned, spy.pinned_freed);

  std::fill(model.params(), model.params() + model.param_count(), 7.0f);
  load_checkpoint(written.path, read_checkpoint_info(written.path), *strategy, model, *pg);
  EXPECT_EQ(spy.uploaded, bytes);
  EXPECT_EQ(0, std::memcmp(model.params(), saved.data(), bytes)) << "the parameters read back bit for bit";
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dpt
