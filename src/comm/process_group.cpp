#include "comm/process_group.h"

#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <random>
#include <thread>

#include "comm/mpi_env.h"
#include "comm/mpi_transport.h"
#include "comm/ring.h"
#include "comm/setup_deadline.h"
#include "comm/shm_transport.h"
#include "comm/shm_window.h"
#include "device/kernels.h"
#include "device/cuda_backend.h"

namespace dpt::comm {

namespace {

enum class OpCode : int64_t { AllReduce = 1, ReduceScatter, AllGather, Broadcast, Reduce, Barrier, Send, Recv };

const char* op_name(OpCode c) {
  switch (c) {
    case OpCode::AllReduce: return "all_reduce";
    case OpCode::ReduceScatter: return "reduce_scatter";
    case OpCode::AllGather: return "all_gather";
    case OpCode::Broadcast: return "broadcast";
    case OpCode::Reduce: return "reduce";
    case OpCode::Barrier: return "barrier";
    case OpCode::Send: return "send";
    case OpCode::Recv: return "recv";
  }
  return "?";
}

// What every rank must agree on for one collective (check_order mode).
struct Signature {
  int64_t op, count, dtype, root;
  bool operator==(const Signature&) const = default;
};

std::string describe(const Signature& s) {
  std::string d = fmt::format("{} of {} {}", op_name(static_cast<OpCode>(s.op)), s.count,
                              dtype_name(static_cast<DType>(s.dtype)));
  if (s.root >= 0) d += fmt::format(" (root {})", s.root);
  return d;
}

void mpi_check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    throw CommError(fmt::format("{} failed: {}", what, std::string(msg, static_cast<size_t>(len))));
  }
}

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::Max ? MPI_MAX : MPI_SUM; }

}  // namespace

struct ProcessGroup::Impl {
  ProcessGroup* pg = nullptr;
  MPI_Comm comm = MPI_COMM_NULL;
  std::unique_ptr<ShmSegment> shm;
  std::vector<std::unique_ptr<Peer>> peers;  // by rank; null for self
  std::vector<Peer*> raw_peers;              // the same, as the algorithms take them
  // Shared windows handed out by shared_memory (caller's thread only).
  std::vector<std::weak_ptr<ShmWindow>> windows;
  std::shared_ptr<ShmWindow> window_holding(const void* data, size_t bytes);
  // Runs a collective in place on a buffer inside window w.
  void in_window(ShmWindow& w, ShmWindow::Collective kind, const OpContext& ctx, const char* d, size_t count,
                 size_t es, ReduceOp op) {
    w.run(ctx, kind, static_cast<size_t>(d - w.data()) / es, count, es, op, ring_order, raw_peers, &pg->ledger_);
  }
  std::unique_ptr<Ring> ring;
  std::vector<int> ring_order;  // the rank at each ring position

  // The communication thread and its queue.
  std::thread thread;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<std::function<void(OpContext&)>, std::shared_ptr<Work>>> queue;
  bool stopping = false;
  std::exception_ptr broken;  // first failure: later operations fail at once
  uint64_t next_seq = 0;      // issue order (caller's thread)

  void run();
  // Queues body for the communication thread. It runs on data, or, when
  // data is in GPU memory, on a host copy of its `count` elements that is
  // copied back afterwards (docs/gpu.md: the host-staged path).
  std::shared_ptr<Work> submit(OpCode code, size_t count, DType dtype, int root, void* data,
                               std::function<void(OpContext&, char*)> body, ReduceOp op = ReduceOp::Sum);
  std::vector<char> staging;  // the host copy, grown to the largest staged buffer
  // GPU buffers: how they are reduced, decided at the first one (collective:
  // every rank reaches it in the same place).
  DeviceComm device_path = DeviceComm::Auto;  // Auto: not decided yet
  void decide_device_path(OpContext& ctx);
  std::unique_ptr<cuda::NcclComm> nccl;
  void run_nccl(const OpContext& ctx, OpCode code, char* d, size_t count, DType dtype, ReduceOp op, int root);
  void check_signature(const OpContext& ctx, const Signature& mine);
  // Runs one of MPI's blocking collectives. MPI's blocking collectives are
  // its fast ones (its non-blocking forms progress only when polled), but a
  // blocking call cannot be given a deadline: a watchdog thread watches it,
  // and if it outlasts the timeout the process reports the operation and
  // leaves with exit status 1, which ends the job (never a silent hang).
  void mpi_blocking(const OpContext& ctx, const char* call, const std::function<int()>& fn);
  void watch();
  std::thread watchdog;
  std::mutex watch_mu;
  std::condition_variable watch_cv;
  bool watch_stop = false;  // under watch_mu
  std::string watched;  // the operation in a blocking MPI call, or empty
  std::chrono::steady_clock::time_point watched_deadline;
};

void ProcessGroup::Impl::run() {
  // Naps while waiting on a peer are 20 us; the default 50 us timer slack
  // would stretch each one past 70 us.
  ::prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
  for (;;) {
    std::function<void(OpContext&)> body;
    std::shared_ptr<Work> work;
    std::string op;
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [this] { return stopping || !queue.empty(); });
      if (queue.empty()) return;
      body = std::move(queue.front().first);
      work = std::move(queue.front().second);
      queue.pop_front();
    }
    if (broken) {
      work->finish(broken);
      continue;
    }
    OpContext ctx;
    auto t0 = std::chrono::steady_clock::now();
    work->start();
    try {
      body(ctx);
      pg->ledger_.add_op(ctx.op, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      work->finish(nullptr);
    } catch (const CommError& e) {
      // Errors say which group (a child's rank numbers are its own).
      broken = std::make_exception_ptr(CommError(fmt::format("{} group: {}", pg->name_, e.what())));
      work->finish(broken);
    } catch (...) {
      broken = std::current_exception();
      work->finish(broken);
    }
  }
}

std::shared_ptr<Work> ProcessGroup::Impl::submit(OpCode code, size_t count, DType dtype, int root, void* data,
                                                 std::function<void(OpContext&, char*)> body, ReduceOp op) {
  const uint64_t seq = next_seq++;
  const char* name = op_name(code);
  auto work = std::make_shared<Work>(name, &pg->ledger_);
  const size_t bytes = count * dtype_size(dtype);
  const Signature sig{static_cast<int64_t>(code), static_cast<int64_t>(count),
                      static_cast<int64_t>(dtype), root};
  const bool check = pg->config_.check_order && pg->size_ > 1 && code != OpCode::Send && code != OpCode::Recv;
  auto timeout = pg->config_.timeout;
  const char* phase = *pg->phase_;
  char* d = static_cast<char*>(data);
  const Device device = pointer_device(data);
  // A GPU buffer: the compute stream is marked now, on the caller's thread,
  // so the collective waits for exactly the work queued before it.
  void* ready = device == Device::CPU ? nullptr : cuda::backend().record_ready();
  auto wrapped = [this, name, phase, seq, bytes, sig, check, timeout, d, device, code, count, dtype, op, root, ready,
                  body = std::move(body)](OpContext& ctx) {
    ctx.op = name;
    ctx.phase = phase;
    ctx.seq = seq;
    ctx.bytes = bytes;
    ctx.timeout = timeout;
    ctx.deadline = std::chrono::steady_clock::now() + timeout;
    ctx.hosts = &pg->hosts_;
    if (check) check_signature(ctx, sig);
    if (device == Device::CPU) return body(ctx, d);
    const cuda::Backend& cuda = cuda::backend();
    struct Release {  // the event back to its pool whatever happens
      const cuda::Backend& cuda;
      void* ready;
      ~Release() { cuda.release_ready(ready); }
    } release{cuda, ready};
    if (bytes == 0) return body(ctx, d);
    decide_device_path(ctx);
    if (device_path == DeviceComm::Nccl) {
      nccl->after(ready);
      return run_nccl(ctx, code, d, count, dtype, op, root);
    }
    if (pg->size_ == 1) return;
    // Host-staged: copied out once the buffer's producer is done, the host
    // algorithm run on the copy, the result copied back.
    if (staging.size() < bytes) staging.resize(bytes);
    cuda.download_after(staging.data(), d, bytes, ready);
    body(ctx, staging.data());
    cuda.upload_copy(d, staging.data(), bytes);
  };
  {
    std::lock_guard<std::mutex> lock(mu);
    queue.emplace_back(std::move(wrapped), work);
  }
  cv.notify_one();
  return work;
}

void ProcessGroup::Impl::decide_device_path(OpContext& ctx) {
  if (device_path != DeviceComm::Auto) return;
  DeviceComm want = pg->config_.device_comm;
  const cuda::Backend& cuda = cuda::backend();  // a GPU buffer came: the backend is loaded
  if (want == DeviceComm::Auto) {
    // NCCL when no two ranks share a GPU (it refuses them), else staged.
    const size_t n = static_cast<size_t>(pg->size_);
    std::vector<char> uuids(16 * n);
    cuda.device_uuid(uuids.data() + 16 * static_cast<size_t>(pg->rank_));
    ring->all_gather(ctx, uuids.data(), n, 16);
    bool shared = false;
    for (size_t a = 0; a < n; ++a)
      for (size_t b = a + 1; b < n; ++b) shared |= std::memcmp(&uuids[16 * a], &uuids[16 * b], 16) == 0;
    want = shared || n == 1 ? DeviceComm::Staged : DeviceComm::Nccl;
  }
  if (want == DeviceComm::Nccl) {
    char id[cuda::NcclComm::kIdBytes] = {};
    if (pg->rank_ == 0) cuda.nccl_id(id);
    ring->broadcast(ctx, id, sizeof id, 0);
    nccl = cuda.nccl_comm(id, pg->size_, pg->rank_);
  }
  device_path = want == DeviceComm::Nccl ? DeviceComm::Nccl : DeviceComm::Staged;
}

void ProcessGroup::Impl::run_nccl(const OpContext& ctx, OpCode code, char* d, size_t count, DType dtype, ReduceOp op,
                                  int root) {
  const std::string what = fmt::format("{} #{} of {} bytes", ctx.op, ctx.seq, ctx.bytes);
  const auto deadline = ctx.deadline;
  // NCCL moves its bytes itself: the ledger gets what the ring algorithm
  // would send and receive for the same operation (docs/gpu.md).
  const uint64_t n = static_cast<uint64_t>(pg->size_), b = ctx.bytes;
  const int r = pg->rank_, last = static_cast<int>((static_cast<uint64_t>(root) + n - 1) % n);
  uint64_t sent = 0, recv = 0;
  switch (code) {
    case OpCode::AllReduce: sent = recv = 2 * (n - 1) * b / n; break;
    case OpCode::ReduceScatter: case OpCode::AllGather: sent = recv = (n - 1) * b / n; break;
    case OpCode::Broadcast: sent = n > 1 && r != last ? b : 0; recv = r != root ? b : 0; break;
    case OpCode::Reduce: sent = r != root ? b : 0; recv = n > 1 && r != last ? b : 0; break;
    case OpCode::Send: sent = b; break;
    case OpCode::Recv: recv = b; break;
    case OpCode::Barrier: break;
  }
  pg->ledger_.add_transfer(ctx.op, ctx.phase, sent, recv);
  switch (code) {
    case OpCode::AllReduce: return nccl->all_reduce(d, count, dtype, op, what, deadline);
    case OpCode::ReduceScatter: return nccl->reduce_scatter(d, count, dtype, op, what, deadline);
    case OpCode::AllGather: return nccl->all_gather(d, count, dtype_size(dtype), what, deadline);
    case OpCode::Broadcast: return nccl->broadcast(d, count * dtype_size(dtype), root, what, deadline);
    case OpCode::Reduce: return nccl->reduce(d, count, dtype, op, root, what, deadline);
    case OpCode::Send: return nccl->send(d, count * dtype_size(dtype), root, what, deadline);
    case OpCode::Recv: return nccl->recv(d, count * dtype_size(dtype), root, what, deadline);
    case OpCode::Barrier: return;
  }
}

void ProcessGroup::Impl::check_signature(const OpContext& ctx, const Signature& mine) {
  const size_t n = static_cast<size_t>(pg->size_);
  std::vector<Signature> all(n);
  all[static_cast<size_t>(pg->rank_)] = mine;
  OpContext check_ctx = ctx;
  check_ctx.op = "order check";
  // Bytes of check traffic are not the collective's: keep them out of its entry.
  ring->all_gather(check_ctx, reinterpret_cast<char*>(all.data()), n, sizeof(Signature));
  for (size_t r = 0; r < n; ++r)
    if (!(all[r] == mine))
      throw CommError(fmt::format("collective #{} differs across ranks: rank {} issued {}, rank {} issued {}",
                                  ctx.seq, pg->rank_, describe(mine), r, describe(all[r])));
}

void ProcessGroup::Impl::mpi_blocking(const OpContext& ctx, const char* call, const std::function<int()>& fn) {
  {
    std::lock_guard<std::mutex> lock(watch_mu);
    watched = fmt::format("{} group: {} #{} of {} bytes ({}) timed out after {:.1f} s", pg->name_, ctx.op, ctx.seq,
                          ctx.bytes, call, static_cast<double>(ctx.timeout.count()) / 1000.0);
    watched_deadline = ctx.deadline;
  }
  watch_cv.notify_all();
  int rc;
  {
    std::lock_guard<std::mutex> lock(mpi_mutex());
    rc = fn();
  }
  {
    std::lock_guard<std::mutex> lock(watch_mu);
    watched.clear();
  }
  mpi_check(rc, call);
}

void ProcessGroup::Impl::watch() {
  std::unique_lock<std::mutex> lock(watch_mu);
  while (!watch_stop) {
    if (watched.empty()) {
      watch_cv.wait(lock);
      continue;
    }
    if (std::chrono::steady_clock::now() > watched_deadline) {
      std::fprintf(stderr, "dpt[rank %d]: error: %s\n", pg->rank_, watched.c_str());
      std::fflush(stderr);
      ::_exit(1);
    }
    watch_cv.wait_for(lock, std::chrono::milliseconds(100));
  }
}

std::unique_ptr<ProcessGroup> ProcessGroup::create_self() { return build(Config{}, MPI_COMM_NULL, "world"); }

std::unique_ptr<ProcessGroup> ProcessGroup::create(const Config& config) {
  MPI_Comm comm = MPI_COMM_NULL;
  if (launched_by_mpi()) {
    SetupDeadline deadline(config.timeout, "world");
    deadline.at("MPI initialisation");
    mpi_ensure_init();
    deadline.at("MPI_Comm_dup");
    std::lock_guard<std::mutex> lock(mpi_mutex());
    MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  }
  return build(config, comm, "world");
}

std::unique_ptr<ProcessGroup> ProcessGroup::split(int color, int key, const std::string& name) {
  if (color < 0) throw InputError(fmt::format("split color {} must not be negative", color));
  if (impl_->comm == MPI_COMM_NULL) {
    auto g = build(config_, MPI_COMM_NULL, name);
    g->phase_ = phase_;
    ledger_.adopt(&g->ledger_);
    return g;
  }
  barrier();  // nothing of this group in flight on any rank: the split is the next use of its communicator
  MPI_Comm child = MPI_COMM_NULL;
  {
    SetupDeadline deadline(config_.timeout, name);
    deadline.at("MPI_Comm_split");
    std::lock_guard<std::mutex> lock(mpi_mutex());
    mpi_check(MPI_Comm_split(impl_->comm, color, key, &child), "split");
  }
  auto g = build(config_, child, name);
  g->phase_ = phase_;
  ledger_.adopt(&g->ledger_);  // the run's report sums its subgroups
  return g;
}

namespace {

// Every member's rank in MPI_COMM_WORLD, by an all-gather.
std::vector<int> exchange_world_ranks(MPI_Comm comm, int n, int world_rank, SetupDeadline& deadline) {
  std::vector<int> ranks(static_cast<size_t>(n), world_rank);
  if (n > 1) {
    deadline.at("exchange of ranks (MPI_Allgather)");
    std::lock_guard<std::mutex> lock(mpi_mutex());
    mpi_check(MPI_Allgather(&world_rank, 1, MPI_INT, ranks.data(), 1, MPI_INT, comm), "rank exchange");
  }
  return ranks;
}

// Every member's host name, by an all-gather of fixed-size records.
std::vector<std::string> exchange_hosts(MPI_Comm comm, int n, int rank, SetupDeadline& deadline) {
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  std::vector<char> names(static_cast<size_t>(n) * sizeof host);
  std::copy(host, host + sizeof host, names.begin() + static_cast<long>(rank) * static_cast<long>(sizeof host));
  if (n > 1) {
    deadline.at("exchange of host names (MPI_Allgather)");
    std::lock_guard<std::mutex> lock(mpi_mutex());
    mpi_check(MPI_Allgather(MPI_IN_PLACE, 0, MPI_BYTE, names.data(), sizeof host, MPI_BYTE, comm), "host exchange");
  }
  std::vector<std::string> hosts;
  for (int r = 0; r < n; ++r) hosts.emplace_back(names.data() + static_cast<size_t>(r) * sizeof host);
  return hosts;
}

// The ring: hosts in order of their lowest rank, ranks in order within.
std::vector<int> ring_order(const std::vector<std::string>& hosts) {
  std::vector<int> rank_at(hosts.size());
  for (size_t r = 0; r < hosts.size(); ++r) rank_at[r] = static_cast<int>(r);
  auto first_rank = [&](const std::string& h) {
    return static_cast<int>(std::find(hosts.begin(), hosts.end(), h) - hosts.begin());
  };
  std::stable_sort(rank_at.begin(), rank_at.end(), [&](int a, int b) {
    return first_rank(hosts[static_cast<size_t>(a)]) < first_rank(hosts[static_cast<size_t>(b)]);
  });
  return rank_at;
}

void barrier(MPI_Comm comm) {
  std::lock_guard<std::mutex> lock(mpi_mutex());
  MPI_Barrier(comm);
}

// The segment the ranks of this host share (`local`, ascending; mapped
// only when `use_shm`). Collective over the whole group: a rank alone on its
// host (hosts of 3 ranks and 1) maps nothing but still joins the broadcast
// and the barriers, or the others wait for it forever.
std::unique_ptr<ShmSegment> map_shared_memory(MPI_Comm comm, const std::vector<int>& local, int rank, bool use_shm,
                                              SetupDeadline& deadline) {
  // A name unique to this job and group: rank 0's pid and a random tag.
  // The count is rank 0's: ranks create different numbers of groups that
  // need shared memory (a group of one needs none), so only the broadcast
  // name is the same on every member.
  static std::atomic<uint64_t> groups{0};
  uint64_t tag[3] = {static_cast<uint64_t>(::getpid()), std::random_device{}(), groups++};
  deadline.at("shared-memory handshake (MPI_Bcast, MPI_Barrier)");
  {
    std::lock_guard<std::mutex> lock(mpi_mutex());
    mpi_check(MPI_Bcast(tag, 3, MPI_UINT64_T, 0, comm), "shared memory setup");
  }
  const int local_index = static_cast<int>(std::find(local.begin(), local.end(), rank) - local.begin());
  const std::string name = fmt::format("/dpt-{}-{:x}-{}-{}", tag[0], tag[1] & 0xffffff, tag[2], local.front());
  const int lc = static_cast<int>(local.size());
  std::unique_ptr<ShmSegment> shm;
  std::string error;
  if (use_shm && local_index == 0) {
    try {
      shm = ShmSegment::create(name, lc);
    } catch (const CommError& e) {
      error = e.what();
    }
  }
  barrier(comm);
  if (use_shm && local_index != 0 && error.empty()) shm = ShmSegment::open(name, lc);
  barrier(comm);  // everyone mapped: the name can go
  if (local_index == 0 && shm) shm->unlink();
  if (!error.empty()) throw CommError(error);
  if (use_shm) shm->set_pid(local_index, ::getpid());
  return shm;
}

}  // namespace

std::unique_ptr<ProcessGroup> ProcessGroup::build(const Config& config, void* comm_ptr, const std::string& name) {
  const MPI_Comm comm = static_cast<MPI_Comm>(comm_ptr);
  auto pg = std::unique_ptr<ProcessGroup>(new ProcessGroup);
  pg->config_ = config;
  pg->name_ = name;
  pg->impl_ = std::make_unique<Impl>();
  Impl& im = *pg->impl_;
  im.pg = pg.get();
  im.comm = comm;
  SetupDeadline deadline(config.timeout, name);
  int world_rank = 0;
  if (comm != MPI_COMM_NULL) {
    std::lock_guard<std::mutex> lock(mpi_mutex());
    MPI_Comm_set_errhandler(im.comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(im.comm, &pg->rank_);
    MPI_Comm_size(im.comm, &pg->size_);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  }
  const int n = pg->size_, rank = pg->rank_;
  pg->world_ranks_ = exchange_world_ranks(im.comm, n, world_rank, deadline);
  pg->hosts_ = exchange_hosts(im.comm, n, rank, deadline);
  const std::vector<std::string>& hosts = pg->hosts_;

  // Peers: shared memory on this host unless told otherwise, MPI elsewhere.
  std::vector<int> local;  // ranks on this host, ascending
  for (int r = 0; r < n; ++r)
    if (hosts[static_cast<size_t>(r)] == hosts[static_cast<size_t>(rank)]) local.push_back(r);
  if (config.transport == Transport::Shm && static_cast<int>(local.size()) != n)
    throw InputError("--transport shm needs every rank on one host; use auto to add MPI between hosts");
  const bool use_shm = n > 1 && config.transport != Transport::Mpi && local.size() > 1;
  bool any_shared = false;
  for (const std::string& h : hosts) any_shared |= std::count(hosts.begin(), hosts.end(), h) > 1;
  if (n > 1 && config.transport != Transport::Mpi && any_shared)
    im.shm = map_shared_memory(im.comm, local, rank, use_shm, deadline);
  im.peers.resize(static_cast<size_t>(n));
  std::vector<Peer*> raw(static_cast<size_t>(n), nullptr);
  const int mine = static_cast<int>(std::find(local.begin(), local.end(), rank) - local.begin());
  for (int r = 0; r < n; ++r) {
    if (r == rank) continue;
    auto it = std::find(local.begin(), local.end(), r);
    if (use_shm && it != local.end())
      im.peers[static_cast<size_t>(r)] = std::make_unique<ShmPeer>(im.shm.get(), mine, static_cast<int>(it - local.begin()));
    else
      im.peers[static_cast<size_t>(r)] = std::make_unique<MpiPeer>(im.comm, r);
    raw[static_cast<size_t>(r)] = im.peers[static_cast<size_t>(r)].get();
  }
  im.ring_order = ring_order(hosts);
  im.raw_peers = raw;
  im.ring = std::make_unique<Ring>(rank, im.ring_order, raw, &pg->ledger_);
  im.thread = std::thread([&im] { im.run(); });
  if (config.algo == Algo::Mpi && n > 1) im.watchdog = std::thread([&im] { im.watch(); });
  return pg;
}

ProcessGroup::~ProcessGroup() {
  if (!impl_) return;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
  if (impl_->thread.joinable()) impl_->thread.join();
  {
    std::lock_guard<std::mutex> lock(impl_->watch_mu);
    impl_->watch_stop = true;
  }
  impl_->watch_cv.notify_all();
  if (impl_->watchdog.joinable()) impl_->watchdog.join();
  impl_->ring.reset();
  impl_->peers.clear();
  if (impl_->comm != MPI_COMM_NULL && !impl_->broken) {
    std::lock_guard<std::mutex> lock(mpi_mutex());
    MPI_Comm_free(&impl_->comm);
  }
}

std::string ProcessGroup::transport_to(int peer) const {
  if (peer == rank_) return "self";
  if (peer < 0 || peer >= size_) throw InputError(fmt::format("rank {} is outside 0..{}", peer, size_ - 1));
  return impl_->peers[static_cast<size_t>(peer)]->kind();
}

std::vector<ProcessGroup::Link> ProcessGroup::ring_links() {
  const std::vector<int>& order = impl_->ring_order;
  const size_t n = order.size();
  if (n < 2) return {};
  // Each rank's link to the rank after it, gathered (1 shared memory, 2 MPI:
  // small integers, exact in fp32).
  const size_t pos = static_cast<size_t>(std::find(order.begin(), order.end(), rank_) - order.begin());
  std::vector<float> kind(n, 0.0f);
  kind[static_cast<size_t>(rank_)] = transport_to(order[(pos + 1) % n]) == "shm" ? 1.0f : 2.0f;
  all_gather(kind.data(), n, DType::F32);
  std::vector<Link> links;
  for (size_t p = 0; p < n; ++p)
    links.push_back({order[p], order[(p + 1) % n], kind[static_cast<size_t>(order[p])] == 1.0f ? "shm" : "mpi"});
  return links;
}

std::shared_ptr<ShmWindow> ProcessGroup::Impl::window_holding(const void* data, size_t bytes) {
  for (const std::weak_ptr<ShmWindow>& weak : windows)
    if (auto w = weak.lock(); w && w->holds(data, bytes)) return w;
  return nullptr;
}

std::shared_ptr<void> ProcessGroup::shared_memory(size_t bytes) {
  if (size_ == 1 || config_.algo != Algo::Ring || !config_.in_place) return nullptr;
  for (int r = 0; r < size_; ++r)
    if (r != rank_ && std::strcmp(impl_->peers[static_cast<size_t>(r)]->kind(), "shm") != 0) return nullptr;
  // Every rank decided alike (one host, shared-memory links). The names:
  // rank 0's pid, a random tag and its count of windows, then the rank.
  SetupDeadline deadline(config_.timeout, name_);
  static std::atomic<uint64_t> count{0};
  uint64_t tag[3] = {static_cast<uint64_t>(::getpid()), std::random_device{}(), count++};
  auto agree = [&](const char* call, const std::function<int()>& fn) {
    deadline.at(call);
    std::lock_guard<std::mutex> lock(mpi_mutex());
    mpi_check(fn(), call);
  };
  agree("shared window setup (MPI_Bcast)", [&] { return MPI_Bcast(tag, 3, MPI_UINT64_T, 0, impl_->comm); });
  auto name_of = [&](int r) { return fmt::format("/dpt-w-{}-{:x}-{}-{}", tag[0], tag[1] & 0xffffff, tag[2], r); };
  std::unique_ptr<ShmWindow> window;
  std::string error;
  try {
    window = ShmWindow::create(name_of(rank_), bytes, size_, rank_);
  } catch (const CommError& e) {
    error = e.what();
  }
  // Every rank learns whether every block exists before mapping the others'.
  int failed = error.empty() ? 0 : 1;
  auto any_failed = [&](const char* call) {
    agree(call, [&] { return MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, impl_->comm); });
  };
  any_failed("shared window setup (MPI_Allreduce)");
  if (!failed) {
    try {
      for (int r = 0; r < size_; ++r)
        if (r != rank_) window->map_peer(r, name_of(r));
    } catch (const CommError& e) {
      error = e.what();
      failed = 1;
    }
  }
  any_failed("shared window setup (MPI_Allreduce)");  // and: everyone has mapped every block
  if (window) window->unlink();
  if (!error.empty())
    std::fprintf(stderr, "dpt[rank %d]: %s group: no shared window (%s); all-reduces take the ring\n", rank_,
                 name_.c_str(), error.c_str());
  if (failed) return nullptr;
  std::shared_ptr<ShmWindow> shared(std::move(window));
  impl_->windows.push_back(shared);
  return std::shared_ptr<void>(shared, shared->data());
}

namespace {
// fp32 reductions take every ReduceOp; bf16 ones (gradients reduced in
// bf16, --reduce-dtype bf16) sum only: each hop adds in fp32 and rounds.
void check_reduction(DType dtype, ReduceOp op, const char* name) {
  if (dtype == DType::BF16 && op != ReduceOp::Sum)
    throw InputError(fmt::format("{} of bf16 sums only", name));
}

// MPI has no bf16 type: bf16 travels as 16-bit integers, summed by an op of
// our own (created once, as MPI_Init's user ops must be).
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const bf16* a = static_cast<const bf16*>(in);
  bf16* b = static_cast<bf16*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = to_bf16(to_f32(a[i]) + to_f32(b[i]));
}

MPI_Op bf16_sum_op() {
  static MPI_Op op = [] {
    MPI_Op o;
    MPI_Op_create(&bf16_sum, 1, &o);
    return o;
  }();
  return op;
}

MPI_Datatype mpi_type(DType dtype) { return dtype == DType::BF16 ? MPI_UINT16_T : MPI_FLOAT; }
MPI_Op mpi_reduce_op(DType dtype, ReduceOp op) { return dtype == DType::BF16 ? bf16_sum_op() : mpi_op(op); }

void check_rank(int r, int size, const char* what) {
  if (r < 0 || r >= size) throw InputError(fmt::format("{} rank {} is outside 0..{}", what, r, size - 1));
}
}  // namespace

std::shared_ptr<Work> ProcessGroup::all_reduce_async(void* data, size_t count, DType dtype, ReduceOp op) {
  check_reduction(dtype, op, "all_reduce");
  const int n = size_;
  std::shared_ptr<ShmWindow> window = impl_->window_holding(data, count * dtype_size(dtype));
  return impl_->submit(OpCode::AllReduce, count, dtype, -1, data,
                       [this, count, op, n, dtype, window](OpContext& ctx, char* d) {
    if (n == 1) return;
    const size_t es = dtype_size(dtype);
    if (window) return impl_->in_window(*window, ShmWindow::Collective::AllReduce, ctx, d, count, es, op);
    if (config_.algo == Algo::Ring) return impl_->ring->all_reduce(ctx, d, count, es, op);
    impl_->mpi_blocking(ctx, "MPI_Allreduce", [&] {
      return MPI_Allreduce(MPI_IN_PLACE, d, static_cast<int>(count), mpi_type(dtype), mpi_reduce_op(dtype, op),
                           impl_->comm);
    });
    if (op == ReduceOp::Avg) {
      float* f = reinterpret_cast<float*>(d);
      for (size_t i = 0; i < count; ++i) f[i] /= static_cast<float>(n);
    }
  }, op);
}

std::shared_ptr<Work> ProcessGroup::reduce_scatter_async(void* data, size_t count, DType dtype, ReduceOp op) {
  check_reduction(dtype, op, "reduce_scatter");
  const int n = size_, rank = rank_;
  std::shared_ptr<ShmWindow> window = impl_->window_holding(data, count * dtype_size(dtype));
  return impl_->submit(OpCode::ReduceScatter, count, dtype, -1, data,
                       [this, count, op, n, rank, dtype, window](OpContext& ctx, char* d) {
    if (n == 1) return;
    const size_t es = dtype_size(dtype);
    if (window) return impl_->in_window(*window, ShmWindow::Collective::ReduceScatter, ctx, d, count, es, op);
    if (config_.algo == Algo::Ring) return impl_->ring->reduce_scatter(ctx, d, count, es, op);
    // MPI puts this rank's result at the start of the buffer; move it to
    // its chunk, where the engine's contract has it.
    std::vector<int> counts(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) counts[static_cast<size_t>(r)] = static_cast<int>(chunk_range(count, n, r).size);
    impl_->mpi_blocking(ctx, "MPI_Reduce_scatter", [&] {
      return MPI_Reduce_scatter(MPI_IN_PLACE, d, counts.data(), mpi_type(dtype), mpi_reduce_op(dtype, op),
                                impl_->comm);
    });
    Range mine = chunk_range(count, n, rank);
    std::memmove(d + mine.begin * es, d, mine.size * es);
    float* f = reinterpret_cast<float*>(d);
    if (op == ReduceOp::Avg)
      for (size_t i = 0; i < mine.size; ++i) f[mine.begin + i] /= static_cast<float>(n);
  }, op);
}

std::shared_ptr<Work> ProcessGroup::all_gather_async(void* data, size_t count, DType dtype) {
  const size_t es = dtype_size(dtype);
  const int n = size_;
  std::shared_ptr<ShmWindow> window = impl_->window_holding(data, count * es);
  return impl_->submit(OpCode::AllGather, count, dtype, -1, data, [this, count, es, n, window](OpContext& ctx, char* d) {
    if (n == 1) return;
    if (window)
      return impl_->in_window(*window, ShmWindow::Collective::AllGather, ctx, d, count, es, ReduceOp::Sum);
    if (config_.algo == Algo::Ring) return impl_->ring->all_gather(ctx, d, count, es);
    std::vector<int> counts(static_cast<size_t>(n)), displs(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      Range c = chunk_range(count, n, r);
      counts[static_cast<size_t>(r)] = static_cast<int>(c.size * es);
      displs[static_cast<size_t>(r)] = static_cast<int>(c.begin * es);
    }
    impl_->mpi_blocking(ctx, "MPI_Allgatherv", [&] {
      return MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_BYTE, d, counts.data(), displs.data(), MPI_BYTE,
                                impl_->comm);
    });
  });
}

std::shared_ptr<Work> ProcessGroup::broadcast_async(void* data, size_t count, DType dtype, int root) {
  check_rank(root, size_, "broadcast root");
  const size_t bytes = count * dtype_size(dtype);
  return impl_->submit(OpCode::Broadcast, count, dtype, root, data, [this, bytes, root](OpContext& ctx, char* d) {
    if (size_ == 1) return;
    if (config_.algo == Algo::Ring) return impl_->ring->broadcast(ctx, d, bytes, root);
    impl_->mpi_blocking(ctx, "MPI_Bcast", [&] {
      return MPI_Bcast(d, static_cast<int>(bytes), MPI_BYTE, root, impl_->comm);
    });
  });
}

std::shared_ptr<Work> ProcessGroup::reduce_async(void* data, size_t count, DType dtype, ReduceOp op, int root) {
  check_reduction(dtype, op, "reduce");
  check_rank(root, size_, "reduce root");
  return impl_->submit(OpCode::Reduce, count, dtype, root, data, [this, count, op, root, dtype](OpContext& ctx, char* d) {
    if (size_ == 1) return;
    if (config_.algo == Algo::Ring) return impl_->ring->reduce(ctx, d, count, dtype_size(dtype), op, root);
    impl_->mpi_blocking(ctx, "MPI_Reduce", [&] {
      void* send = rank_ == root ? MPI_IN_PLACE : d;
      return MPI_Reduce(send, rank_ == root ? d : nullptr, static_cast<int>(count), mpi_type(dtype),
                        mpi_reduce_op(dtype, op), root, impl_->comm);
    });
    if (op == ReduceOp::Avg && rank_ == root) {
      float* f = reinterpret_cast<float*>(d);
      for (size_t i = 0; i < count; ++i) f[i] /= static_cast<float>(size_);
    }
  }, op);
}

std::shared_ptr<Work> ProcessGroup::barrier_async() {
  return impl_->submit(OpCode::Barrier, 0, DType::F32, -1, nullptr, [this](OpContext& ctx, char*) {
    if (size_ == 1) return;
    if (config_.algo == Algo::Ring) return impl_->ring->barrier(ctx);
    impl_->mpi_blocking(ctx, "MPI_Barrier", [&] { return MPI_Barrier(impl_->comm); });
  });
}

std::shared_ptr<Work> ProcessGroup::send_async(const void* data, size_t count, DType dtype, int peer) {
  check_rank(peer, size_, "send to");
  if (peer == rank_) throw InputError(fmt::format("rank {} cannot send to itself", rank_));
  const size_t bytes = count * dtype_size(dtype);
  return impl_->submit(OpCode::Send, count, dtype, peer, const_cast<void*>(data),  // staged: copied back unchanged
                       [this, bytes, peer](OpContext& ctx, char* d) { impl_->ring->send(ctx, d, bytes, peer); });
}

std::shared_ptr<Work> ProcessGroup::recv_async(void* data, size_t count, DType dtype, int peer) {
  check_rank(peer, size_, "receive from");
  if (peer == rank_) throw InputError(fmt::format("rank {} cannot receive from itself", rank_));
  const size_t bytes = count * dtype_size(dtype);
  return impl_->submit(OpCode::Recv, count, dtype, peer, data,
                       [this, bytes, peer](OpContext& ctx, char* d) { impl_->ring->recv(ctx, d, bytes, peer); });
}

}  // namespace dpt::comm
