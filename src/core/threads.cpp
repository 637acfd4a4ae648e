#include "core/threads.h"

#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

extern "C" void openblas_set_num_threads(int);

namespace dpt {

static int g_threads = 1;

void set_threads(int n) {
  if (n <= 0) n = static_cast<int>(std::thread::hardware_concurrency());
  if (n <= 0) n = 1;
  g_threads = n;
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int threads() { return g_threads; }

int omp_threads_from_env() {
  const char* v = std::getenv("OMP_NUM_THREADS");
  int n = v ? std::atoi(v) : 0;
  return n > 0 ? n : 0;
}

ThreadSpan thread_span16(int64_t n) {
  const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
  const int64_t per = ((n + nt - 1) / nt + 15) / 16 * 16;
  const int64_t begin = std::min(n, t * per);
  return {begin, std::min(n, begin + per)};
}

}  // namespace dpt
