// Memory copy bandwidth, measured: the physical ceiling of any collective
// between ranks on one machine (every byte a shared-memory transport moves
// is a memcpy into or out of a shared segment).
#pragma once

#include <cstddef>

namespace dpt {

struct MemcpyBandwidth {
  size_t bytes = 0;        // size of the buffer copied per run
  double one_thread = 0;   // GB/s (1e9 bytes copied per second), one thread
  double two_threads = 0;  // GB/s, two threads each copying half the buffer
};

// GB/s of memcpy of a `bytes` buffer (best of `reps` after one untimed run
// that faults the pages in) with `threads` threads, each copying an equal
// slice. The figure counts bytes copied, not bytes moved: a copy reads and
// writes every byte, so the memory traffic is twice this.
double measure_memcpy_gbs(size_t bytes, int threads, int reps = 5);

// Both figures for a 256 MiB buffer (about 0.5 s; allocates 512 MiB).
MemcpyBandwidth measure_memcpy_bandwidth(size_t bytes = size_t{256} << 20);

}  // namespace dpt
