// Sleeping on a 32-bit word in shared memory until another process changes
// it (Linux futexes). The words live in segments other processes map, so
// these are shared futexes (no FUTEX_PRIVATE_FLAG).
#pragma once

#include <atomic>
#include <cstdint>

namespace dpt::comm {

// Sleeps while *word == seen, at most timeout_ns (a wake, a change or the
// timeout ends it; spurious returns are allowed: the caller re-checks).
void futex_wait(std::atomic<uint32_t>* word, uint32_t seen, long timeout_ns);
void futex_wake_all(std::atomic<uint32_t>* word);

}  // namespace dpt::comm
