// Process memory as the OS sees it.
#pragma once

#include <cstddef>

namespace dpt {

// Peak resident set size of this program, in bytes: VmHWM from
// /proc/self/status, which starts afresh with the new address space at exec.
// getrusage's ru_maxrss does not: a process forked from a large parent (a
// Python harness, a notebook) inherits the parent's high-water mark, so it
// would report the harness's memory, not the engine's.
size_t peak_rss_bytes();

// Resident set size now (VmRSS), in bytes.
size_t current_rss_bytes();

// Bytes of this process's anonymous memory on transparent huge pages now
// (AnonHugePages of /proc/self/smaps_rollup; 0 where the kernel has none):
// whether core/host_alloc.h's advice was taken.
size_t huge_page_bytes();

}  // namespace dpt
