#include "comm/mpi_env.h"

#include <cstdlib>

#include "comm/process_group.h"
#include "comm/types.h"

namespace dpt::comm {

std::mutex& mpi_mutex() {
  static std::mutex mu;
  return mu;
}

namespace {
// Finalises MPI when the process ends normally. Paths that end on a
// communication error leave with _exit instead: finalising next to a dead
// peer can hang.
struct MpiFinalizer {
  ~MpiFinalizer() {
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (init && !fin) MPI_Finalize();
  }
};
}  // namespace

void mpi_ensure_init() {
  static MpiFinalizer finalizer;
  std::lock_guard<std::mutex> lock(mpi_mutex());
  int init = 0;
  MPI_Initialized(&init);
  if (init) return;
  int provided = 0;
  if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
    throw CommError("MPI_Init_thread failed");
  if (provided < MPI_THREAD_SERIALIZED)
    throw CommError("this MPI cannot be called from a communication thread (no MPI_THREAD_SERIALIZED)");
  // Errors come back as codes, which the engine turns into CommError.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
}

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"})
    if (std::getenv(v)) return true;
  return false;
}

}  // namespace dpt::comm
