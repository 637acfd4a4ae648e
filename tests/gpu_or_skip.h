// The GPU's kernels for a test, or the reason there are none (a build
// without CUDA, no usable GPU), for GTEST_SKIP to print. With
// DPT_REQUIRE_GPU=1 (scripts/device/gpu.sh sets it on a GPU machine) a
// missing GPU fails the test instead: there, a backend that does not load or
// a driver that does not answer is a failure, not a skip.
#pragma once

#include <cstdlib>
#include <exception>
#include <string>

#include "device/kernels.h"

namespace dpt::test {

inline const Kernels* gpu_or_reason(std::string& why) {
  try {
    return &kernels(Device::CUDA);
  } catch (const std::exception& e) {
    why = e.what();
    return nullptr;
  }
}

inline bool gpu_required() {
  const char* v = std::getenv("DPT_REQUIRE_GPU");
  return v && std::string(v) == "1";
}

}  // namespace dpt::test

// In a test (or SetUp): skip, or fail where a GPU is required.
#define DPT_SKIP_WITHOUT_GPU(why)                                                  \
  do {                                                                           \
    if (::dpt::test::gpu_required()) GTEST_FAIL() << "DPT_REQUIRE_GPU=1: " << (why); \
    GTEST_SKIP() << (why);                                                       \
  } while (0)
