// Vocabulary of the communication layer.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

#include "core/dtype.h"
#include "core/error.h"
#include "core/reduce_op.h"

namespace dpt::comm {

// The communication layer names it comm::ReduceOp (core/reduce_op.h).
using dpt::ReduceOp;

// Which implementation runs a collective: the engine's own ring algorithms
// over its transports, or MPI's built-in collectives (for comparison).
enum class Algo { Ring, Mpi };

// How ring algorithms reach a peer: "auto" uses shared memory for peers on
// the same host and MPI point-to-point for the others.
enum class Transport { Auto, Shm, Mpi };
// How collectives on GPU buffers run (docs/gpu.md): NCCL, or staged through
// host memory and the host algorithms. "auto" takes NCCL when every rank of
// the group has a GPU of its own (NCCL refuses two ranks on one GPU) and
// stages otherwise; "nccl" insists, and runs NCCL even in a group of one.
enum class DeviceComm { Auto, Nccl, Staged };

struct Config {
  Algo algo = Algo::Ring;
  Transport transport = Transport::Auto;
  // Every wait in every collective ends by this deadline (a dead or missing
  // peer becomes a CommError, never a hang).
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // Before each collective, check that every rank issued the same one
  // (operation, element count, dtype, root); stop at the first difference.
  bool check_order = false;
  DeviceComm device_comm = DeviceComm::Auto;
  // Shared windows (comm/shm_window.h): when every rank of a group is on one
  // host, ProcessGroup::shared_memory hands out memory the peers map, and an
  // all-reduce on it runs in place, without the transport's copies. false:
  // shared_memory returns nothing and every all-reduce takes the ring.
  bool in_place = true;

  // Defaults overridden by the environment: DPT_DEVICE_COMM=auto|nccl|staged,
  // DPT_COMM_ALGO=ring|mpi, DPT_COMM_IN_PLACE=1|0,
  // DPT_COMM_TRANSPORT=auto|shm|mpi, DPT_COMM_TIMEOUT=<seconds>,
  // DPT_COMM_CHECK=1. Throws InputError on an unknown value.
  static Config from_env();
};

Algo parse_algo(const std::string& s);            // "ring" | "mpi"
Transport parse_transport(const std::string& s);  // "auto" | "shm" | "mpi"
const char* algo_name(Algo a);
DeviceComm parse_device_comm(const std::string& s);  // "auto" | "nccl" | "staged"

// A collective failed: a peer died or timed out, or ranks disagreed. The
// message names the operation, its sequence number and its size.
class CommError : public Error {
 public:
  using Error::Error;
};

// Elements [begin, begin + size) of chunk i when `count` elements are split
// over n ranks: sizes differ by at most one, larger chunks first (so counts
// that don't divide by n need no padding).
struct Range {
  size_t begin = 0, size = 0;
};
inline Range chunk_range(size_t count, int n, int i) {
  const size_t base = count / static_cast<size_t>(n), extra = count % static_cast<size_t>(n);
  const size_t ui = static_cast<size_t>(i);
  return {ui * base + (ui < extra ? ui : extra), base + (ui < extra ? 1 : 0)};
}

}  // namespace dpt::comm
