#include "core/threads.h"

#include <omp.h>
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

}  // namespace dpt
