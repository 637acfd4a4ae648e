// One thread pool for the whole process. OpenBLAS is linked in its OpenMP
// flavour, so GEMM and the engine's own parallel loops share libgomp's pool
// instead of two pools spinning against each other on the same cores.
#pragma once

namespace dpt {

// Sets the threads used by GEMM and by the engine's loops. n <= 0: all cores.
void set_threads(int n);
int threads();
// OMP_NUM_THREADS if set to a positive number, else 0 (meaning all cores).
int omp_threads_from_env();

}  // namespace dpt
