#include "core/threads.h"

#include <omp.h>
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

}  // namespace dpt
