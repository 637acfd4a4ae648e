// The process's MPI: initialised once on the first ProcessGroup of a job
// started by a launcher, finalised at exit. Every MPI call holds mpi_mutex(),
// so groups with their own communication threads never call MPI at once.
#pragma once

#include <mpi.h>

#include <mutex>

namespace dpt::comm {

// Initialises MPI if needed (thread level SERIALIZED is enough under the mutex).
void mpi_ensure_init();
std::mutex& mpi_mutex();

}  // namespace dpt::comm
