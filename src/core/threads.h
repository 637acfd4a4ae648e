// One thread pool for the whole process. OpenBLAS is linked in its OpenMP
// flavour, so GEMM and the engine's own parallel loops share libgomp's pool
// instead of two pools spinning against each other on the same cores.
#pragma once

#include <cstdint>

namespace dpt {

// Sets the threads used by GEMM and by the engine's loops. n <= 0: all cores.
void set_threads(int n);
int threads();
// OMP_NUM_THREADS if set to a positive number, else 0 (meaning all cores).
int omp_threads_from_env();

// Called inside an OpenMP parallel region: the calling thread's share
// [begin, end) of [0, n), contiguous and in thread order, cut at multiples
// of 16 elements (whole 16-float vectors, whole 64-byte lines of floats).
struct ThreadSpan {
  int64_t begin, end;
};
ThreadSpan thread_span16(int64_t n);

}  // namespace dpt
