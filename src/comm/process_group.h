// ProcessGroup: the ranks of a job and the collectives between them.
//
// One process per rank, launched by mpirun (or `dpt launch`, or srun). A
// process started without a launcher is a world of one and touches no MPI.
//
// Every collective is issued from the caller's thread and runs on one
// background communication thread, strictly in issue order, so every rank
// executes the same sequence (DESIGN.md: collectives issued in a
// rank-dependent order hang). The non-blocking forms return a Work handle;
// the blocking forms are `issue(...)->wait()`.
//
// Collectives work in place on flat buffers, which is what DDP buckets and
// ZeRO shards are:
//   all_reduce      data[0, count) becomes the reduction over ranks
//   reduce_scatter  data[chunk(rank)] becomes the reduction of that chunk;
//                   the rest of data is scratch afterwards
//   all_gather      data[chunk(r)] holds rank r's contribution on entry;
//                   all of data holds every rank's chunk on exit
//   broadcast       data[0, count) of root is copied to every rank
//   reduce          root's data becomes the reduction; others' is scratch
// where chunk(r) = chunk_range(count, size, r): uneven chunks, no padding.
// Reductions are fp32 (Sum, Avg, Max) or bf16 (Sum: each addition in fp32,
// rounded to bf16, as NCCL's bf16 sums); all_gather, broadcast, send and
// recv move any dtype.
//
// send and recv are queued like every other operation, and a send completes
// only once the peer receives it (MPI_Ssend's semantics): two ranks that
// both send first, then receive, wait on each other until the deadline.
// Pair them in matched order (one sends while the other receives).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "comm/ledger.h"
#include "comm/types.h"
#include "comm/work.h"

namespace dpt::comm {

class ProcessGroup {
 public:
  // Joins the job the launcher started (MPI), or makes a world of one.
  static std::unique_ptr<ProcessGroup> create(const Config& config = Config::from_env());
  // A world of one even inside a launched job (a reference run beside a
  // distributed one, in tests).
  static std::unique_ptr<ProcessGroup> create_self();
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  // Collective over this group: the ranks that pass the same color form a
  // child group, ranked by key, then by their rank here (MPI_Comm_split).
  // A child has its own rank and size, shared-memory ring for its members
  // on one host and MPI links across hosts, communication thread, ledger
  // and deadlines; its errors name it ("tp group: all_reduce #3 ..."). Call
  // it with nothing in flight on this group (it waits for what is).
  // Groups run their collectives concurrently under the ring algorithm
  // (the default). Under Algo::Mpi a blocking MPI collective holds the
  // process's MPI lock for its whole duration, so two groups' collectives
  // in flight at once on one rank can deadlock: there, use one group at a
  // time.
  std::unique_ptr<ProcessGroup> split(int color, int key, const std::string& name);

  int rank() const { return rank_; }
  int size() const { return size_; }
  // "world", or the name given to split().
  const std::string& name() const { return name_; }
  // The rank in the job (MPI_COMM_WORLD) of each rank of this group.
  const std::vector<int>& world_ranks() const { return world_ranks_; }
  // Host name of each rank; ranks sharing one use shared memory.
  const std::vector<std::string>& hosts() const { return hosts_; }
  const Config& config() const { return config_; }
  // The transport actually used to reach `peer` ("shm", "mpi", "self").
  std::string transport_to(int peer) const;
  // One link of the ring: the rank at a ring position, the rank after it,
  // and the transport between them as `from` uses it.
  struct Link {
    int from, to;
    std::string transport;
  };
  // Collective: every link of the ring, in ring order (empty for a world of
  // one). Shows where shared memory and MPI are really used (under
  // Algo::Mpi, by send and recv only: MPI's collectives pick their own paths).
  std::vector<Link> ring_links();

  // Collective: `bytes` of memory that every other rank of this group can
  // read and write in place (a shared window, comm/shm_window.h), or null
  // when the group cannot have one: a group of one, ranks on several hosts
  // or without shared-memory links, --comm-algo mpi, DPT_COMM_IN_PLACE=0,
  // or /dev/shm without the space (then every rank says why on stderr and
  // nothing changes). An all_reduce, reduce_scatter or all_gather whose
  // buffer lies inside such memory runs in place: every rank reduces its
  // chunk straight from its peers' buffers and writes the result where the
  // collective puts it (all-reduce: into every rank's buffer), or copies
  // its peers' chunks from theirs (all-gather). Same results, bitwise, and
  // the same ledger bytes as the ring, without the copies through the
  // transport. Every rank must pass memory at the same place in its
  // window (the same buffer, the same offsets): a buffer pool whose
  // assignment depends on timing must not live there. The memory lives as
  // long as the returned pointer and its copies. Call it with nothing in
  // flight on this group.
  std::shared_ptr<void> shared_memory(size_t bytes);

  std::shared_ptr<Work> all_reduce_async(void* data, size_t count, DType dtype, ReduceOp op);
  std::shared_ptr<Work> reduce_scatter_async(void* data, size_t count, DType dtype, ReduceOp op);
  std::shared_ptr<Work> all_gather_async(void* data, size_t count, DType dtype);
  std::shared_ptr<Work> broadcast_async(void* data, size_t count, DType dtype, int root);
  std::shared_ptr<Work> reduce_async(void* data, size_t count, DType dtype, ReduceOp op, int root);
  std::shared_ptr<Work> barrier_async();
  std::shared_ptr<Work> send_async(const void* data, size_t count, DType dtype, int peer);
  std::shared_ptr<Work> recv_async(void* data, size_t count, DType dtype, int peer);

  void all_reduce(void* data, size_t count, DType dtype, ReduceOp op) {
    all_reduce_async(data, count, dtype, op)->wait();
  }
  void reduce_scatter(void* data, size_t count, DType dtype, ReduceOp op) {
    reduce_scatter_async(data, count, dtype, op)->wait();
  }
  void all_gather(void* data, size_t count, DType dtype) { all_gather_async(data, count, dtype)->wait(); }
  void broadcast(void* data, size_t count, DType dtype, int root) {
    broadcast_async(data, count, dtype, root)->wait();
  }
  void reduce(void* data, size_t count, DType dtype, ReduceOp op, int root) {
    reduce_async(data, count, dtype, op, root)->wait();
  }
  void barrier() { barrier_async()->wait(); }
  void send(const void* data, size_t count, DType dtype, int peer) {
    send_async(data, count, dtype, peer)->wait();
  }
  void recv(void* data, size_t count, DType dtype, int peer) {
    recv_async(data, count, dtype, peer)->wait();
  }

  Ledger& ledger() { return ledger_; }
  // The phase of the step that collectives issued from now on belong to, in
  // the ledger ("forward", "backward", "optimizer", ...; a string literal).
  // Set by the training loop's thread, read when a collective is issued.
  // A group and every subgroup split from it share one phase: the step is
  // in one phase at a time, so a data-parallel group under a mesh counts
  // its reductions where the loop is (not where it was last told).
  void set_phase(const char* phase) { *phase_ = phase; }

 private:
  ProcessGroup() = default;
  // A group over `comm` (owned from here on; MPI_COMM_NULL: a world of one).
  static std::unique_ptr<ProcessGroup> build(const Config& config, void* comm, const std::string& name);
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int rank_ = 0, size_ = 1;
  std::string name_ = "world";
  std::vector<int> world_ranks_;
  std::vector<std::string> hosts_;
  Config config_;
  Ledger ledger_;
  std::shared_ptr<const char*> phase_ = std::make_shared<const char*>("other");
};

// True when this process was started by a launcher (mpirun, srun) that
// expects it to join a job.
bool launched_by_mpi();

}  // namespace dpt::comm
