// A barrier for the two processes of a forked bench (update_fusion.cpp,
// lockstep_ceiling.cpp), placed in memory both map (MAP_SHARED before the
// fork). Spinning: each process has a core of its own.
#pragma once

#include <unistd.h>

#include <atomic>

struct ProcessBarrier {
  std::atomic<int> count{0}, generation{0};
  void wait() { wait_with([] {}); }
  // The same, off the core while it waits (a process that sits a way out).
  void wait_sleeping() { wait_with([] { usleep(500); }); }

 private:
  template <typename Pause>
  void wait_with(Pause pause) {
    const int g = generation.load();
    if (count.fetch_add(1) == 1) {
      count.store(0);
      generation.fetch_add(1);
    } else {
      while (generation.load() == g) pause();
    }
  }
};
