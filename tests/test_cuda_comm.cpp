// Collectives on GPU buffers in a world of one (issue 17): with
// DPT_DEVICE_COMM=nccl every collective runs through NCCL even with one rank
// (the code path of real multi-GPU nodes); the staged path is checked with
// two ranks sharing a GPU by tests/gpu/trajectory.py --mode ddp. Skipped,
// with the reason, where no GPU is.
#include <gtest/gtest.h>

#include <vector>

#include "comm/process_group.h"
#include "gpu_or_skip.h"
#include "device/kernels.h"

namespace {

using dpt::Device;
using dpt::DType;
using dpt::Kernels;
using dpt::comm::ReduceOp;

using dpt::test::gpu_or_reason;

#define REQUIRE_GPU(k)                   \
  std::string why;                       \
  const Kernels* k = gpu_or_reason(why);           \
  if (!k) DPT_SKIP_WITHOUT_GPU(why);

TEST(CudaComm, NcclWorldOfOneRunsEveryCollective) {
  REQUIRE_GPU(k);
  dpt::comm::Config config;
  config.device_comm = dpt::comm::DeviceComm::Nccl;
  auto pg = dpt::comm::ProcessGroup::create(config);
  ASSERT_EQ(pg->size(), 1);
  const size_t n = 1000;
  std::vector<float> host(n), back(n);
  for (size_t i = 0; i < n; ++i) host[i] = 0.5f * static_cast<float>(i % 17) - 3.0f;
  float* d = static_cast<float*>(k->alloc(n * sizeof(float)));
  auto round_trip = [&](const char* what, auto run) {
    k->upload(d, host.data(), n * sizeof(float));
    run();
    k->download(back.data(), d, n * sizeof(float));
    EXPECT_EQ(back, host) << what << ": a world of one leaves the data as it is";
  };
  round_trip("all_reduce sum", [&] { pg->all_reduce(d, n, DType::F32, ReduceOp::Sum); });
  round_trip("all_reduce avg", [&] { pg->all_reduce(d, n, DType::F32, ReduceOp::Avg); });
  round_trip("all_reduce max", [&] { pg->all_reduce(d, n, DType::F32, ReduceOp::Max); });
  round_trip("reduce_scatter", [&] { pg->reduce_scatter(d, n, DType::F32, ReduceOp::Sum); });
  round_trip("all_gather", [&] { pg->all_gather(d, n, DType::F32); });
  round_trip("broadcast", [&] { pg->broadcast(d, n, DType::F32, 0); });
  round_trip("reduce", [&] { pg->reduce(d, n, DType::F32, ReduceOp::Sum, 0); });
  round_trip("all_reduce bf16", [&] { pg->all_reduce(d, n / 2, DType::BF16, ReduceOp::Sum); });
  k->free(d);
  // Each ran as an operation of the ledger (no bytes move in a world of one).
  const auto ops = pg->ledger().snapshot();
  EXPECT_EQ(ops.at("all_reduce").count, 4);
  EXPECT_EQ(ops.at("reduce_scatter").count, 1);
  EXPECT_EQ(ops.at("all_gather").count, 1);
  EXPECT_EQ(ops.at("broadcast").count, 1);
  EXPECT_EQ(ops.at("reduce").count, 1);
}

TEST(CudaComm, HostBuffersStillTakeTheHostPath) {
  REQUIRE_GPU(k);
  (void)k;
  auto pg = dpt::comm::ProcessGroup::create(dpt::comm::Config{});
  std::vector<float> x(64, 2.0f);
  pg->all_reduce(x.data(), x.size(), DType::F32, ReduceOp::Sum);
  EXPECT_EQ(x, std::vector<float>(64, 2.0f));
  EXPECT_EQ(dpt::pointer_device(x.data()), Device::CPU);
}

}  // namespace
