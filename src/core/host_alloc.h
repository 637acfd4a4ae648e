// The CPU's allocations of the engine's flat buffers (parameters, gradients,
// optimizer state, activation arenas).
//
// A buffer of 2 MiB or more starts on a 2 MiB boundary and asks the kernel
// for transparent huge pages (madvise MADV_HUGEPAGE): the update, the
// norms and the GEMMs' packing stream over buffers of tens of MiB, and with
// 4 KiB pages every 4 KiB of them costs a TLB entry (docs/performance.md,
// "Huge pages": W-GPT bf16 3.2% faster, one thread). Where the kernel's
// THP setting is "madvise" (Debian's default) this is what turns them on;
// "always" gives them anyway, "never" refuses quietly (the buffer is then
// as before). Shared windows (comm/shm_window.h) are tmpfs memory, which
// takes huge pages only where shmem_enabled allows it.
//
// DPT_HUGE_PAGES=0 in the environment turns the advice off (for A/B
// measurements).
#pragma once

#include <cstddef>

namespace dpt {

// `bytes` zeroed bytes aligned to 256 (2 MiB from 2 MiB up); nullptr for 0.
// Throws std::bad_alloc when the memory is not there.
void* host_alloc(size_t bytes);
void host_free(void* p);

// Whether buffers of 2 MiB or more are advised onto huge pages (not
// DPT_HUGE_PAGES=0).
bool host_huge_pages();

}  // namespace dpt
