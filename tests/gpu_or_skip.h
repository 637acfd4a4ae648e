// The GPU's kernels for a test, or the reason there are none (a build
// without CUDA, no usable GPU), for GTEST_SKIP to print.
#pragma once

#include <exception>
#include <string>

#include "nn/kernels.h"

namespace dpt::test {

inline const Kernels* gpu_or_reason(std::string& why) {
  try {
    return &kernels(Device::CUDA);
  } catch (const std::exception& e) {
    why = e.what();
    return nullptr;
  }
}

}  // namespace dpt::test
