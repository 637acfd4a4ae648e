// Host memory page-locked for a device (Kernels::pinned_alloc), owned: the
// pointer gives it back through the same Kernels when it goes. One kind for
// every pinned buffer: the checkpoint's staging chunk, a RamTier pinned for
// a GPU, the host update's copies.
#pragma once

#include <cstddef>
#include <memory>

#include "device/kernels.h"

namespace dpt {

struct PinnedFree {
  const Kernels* k;
  void operator()(void* p) const { k->pinned_free(p); }
};

template <typename T>
using Pinned = std::unique_ptr<T[], PinnedFree>;

// count elements, not zeroed; none yet when count is 0 (a null pointer that
// still knows its Kernels).
template <typename T>
Pinned<T> pinned(const Kernels& k, size_t count) {
  return Pinned<T>(count ? static_cast<T*>(k.pinned_alloc(count * sizeof(T))) : nullptr, PinnedFree{&k});
}

}  // namespace dpt
