#include "core/host_alloc.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <new>

namespace dpt {

namespace {
constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kAlign = 256;
}  // namespace

bool host_huge_pages() {
  static const bool on = [] {
    const char* v = std::getenv("DPT_HUGE_PAGES");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return on;
}

void* host_alloc(size_t bytes) {
  if (bytes == 0) return nullptr;
  const bool huge = bytes >= kHugePage && host_huge_pages();
  const size_t align = huge ? kHugePage : kAlign;
  const size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  // aligned_alloc wants a multiple of the alignment; the tail past
  // `rounded` is never touched, so it costs address space only.
  void* p = std::aligned_alloc(align, (rounded + align - 1) / align * align);
  if (!p) throw std::bad_alloc();
  // Advice, not a requirement: a kernel without THP answers EINVAL and the
  // pages stay small. Only whole huge pages inside the buffer are advised,
  // before the first touch (the memset), so they are faulted in huge.
  if (huge) ::madvise(p, rounded / kHugePage * kHugePage, MADV_HUGEPAGE);
  std::memset(p, 0, rounded);
  return p;
}

void host_free(void* p) { std::free(p); }

}  // namespace dpt
