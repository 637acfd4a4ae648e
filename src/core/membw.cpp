#include "core/membw.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

namespace dpt {

double measure_memcpy_gbs(size_t bytes, int threads, int reps) {
  threads = std::max(threads, 1);
  bytes = std::max(bytes, size_t{1});
  // Uninitialised storage; the untimed first run below touches every page of
  // both buffers, so the timed runs measure copying, not page faults.
  std::unique_ptr<char[]> src(new char[bytes]), dst(new char[bytes]);
  std::memset(src.get(), 1, bytes);

  const size_t slice = (bytes + static_cast<size_t>(threads) - 1) / static_cast<size_t>(threads);
  auto copy_slice = [&](int t) {
    const size_t begin = std::min(bytes, slice * static_cast<size_t>(t));
    const size_t end = std::min(bytes, begin + slice);
    std::memcpy(dst.get() + begin, src.get() + begin, end - begin);
  };
  auto run = [&] {
    if (threads == 1) return copy_slice(0);
    std::vector<std::thread> pool;
    for (int t = 1; t < threads; ++t) pool.emplace_back(copy_slice, t);
    copy_slice(0);
    for (auto& th : pool) th.join();
  };

  run();
  double best = 0.0;
  for (int rep = 0; rep < std::max(reps, 1); ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    run();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > 0) best = std::max(best, static_cast<double>(bytes) / s / 1e9);
  }
  // Keep the copies observable so the compiler cannot drop them.
  volatile char sink = dst[bytes - 1];
  (void)sink;
  return best;
}

MemcpyBandwidth measure_memcpy_bandwidth(size_t bytes) {
  MemcpyBandwidth r;
  r.bytes = bytes;
  r.one_thread = measure_memcpy_gbs(bytes, 1);
  r.two_threads = measure_memcpy_gbs(bytes, 2);
  return r;
}

}  // namespace dpt
