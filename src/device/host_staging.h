// A bounded buffer of pinned host memory (Kernels::pinned_alloc) that device
// memory passes through a chunk at a time on its way to or from the host:
// a GPU run's parameters going into a checkpoint file. On the CPU the
// "device" is the host and each chunk is a memcpy, so the CPU tests run the
// same path a GPU run takes.
#pragma once

#include <algorithm>
#include <cstddef>

#include "device/kernels.h"
#include "device/pinned.h"

namespace dpt {

class HostStaging {
 public:
  // Room for `floats` floats, allocated at the first chunk.
  HostStaging(const Kernels& k, size_t floats)
      : k_(k), size_(std::max<size_t>(floats, 1)), data_(pinned<float>(k, 0)) {}

  // n floats, a chunk at a time: fill(done, k, chunk) puts
  // elements [done, done + k) into the host chunk, then use(chunk, k) reads
  // them, before the next chunk is filled.
  template <typename Fill, typename Use>
  void pass(size_t n, Fill fill, Use use) {
    for (size_t done = 0; done < n;) {
      if (!data_) data_ = pinned<float>(k_, size_);
      const size_t k = std::min(size_, n - done);
      fill(done, k, data_.get());
      use(static_cast<const float*>(data_.get()), k);
      done += k;
    }
  }
  // The same for device memory: the chunks are downloads of src.
  template <typename Use>
  void download(const float* src, size_t n, Use use) {
    pass(n, [&](size_t done, size_t k, float* chunk) { k_.download(chunk, src + done, k * sizeof(float)); }, use);
  }

 private:
  const Kernels& k_;
  size_t size_;
  Pinned<float> data_;
};

}  // namespace dpt
