#include "parallel/replicas.h"

#include <cstring>
#include <vector>

#include "comm/types.h"
#include "core/error.h"

namespace dpt {

namespace {
uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A 64-bit hash of a buffer of 4-byte-aligned bytes (a multiple of 2
// bytes): equal hashes mean identical replicas, barring a 2^-64 accident.
uint64_t bytes_hash(const void* data, size_t bytes) {
  // Each 32-bit word mixed with its position, then summed: order-free, so
  // threads can split the buffer. A trailing half word counts on its own.
  const uint32_t* w = static_cast<const uint32_t*>(data);
  const size_t n = bytes / 4;
  uint64_t h = 0;
#pragma omp parallel for reduction(+ : h) schedule(static)
  for (size_t i = 0; i < n; ++i) h += mix((static_cast<uint64_t>(i) << 32) | w[i]);
  if (bytes % 4 >= 2) h += mix((static_cast<uint64_t>(n) << 32) | static_cast<const uint16_t*>(data)[2 * n]);
  return h;
}

// The model's parameters where the host can read them: its own buffer, or
// (a GPU model) a downloaded copy in `host`.
const float* host_params(const Model& model, std::vector<float>& host) {
  if (model.device() == Device::CPU) return model.params();
  host.resize(model.param_count());
  model.download_params(0, host.size(), host.data());
  return host.data();
}
}  // namespace

void verify_replicas(const Model& model, comm::ProcessGroup& pg, int64_t step) {
  if (pg.size() == 1) return;
  std::vector<float> host;
  verify_replicas(host_params(model, host), model.param_count() * sizeof(float), pg, step);
}

void verify_replicas(const void* data, size_t bytes, comm::ProcessGroup& pg, int64_t step) {
  if (pg.size() == 1) return;
  std::vector<uint64_t> all(static_cast<size_t>(pg.size()));
  all[static_cast<size_t>(pg.rank())] = bytes_hash(data, bytes);
  pg.all_gather(all.data(), all.size() * 2, DType::F32);
  for (size_t r = 1; r < all.size(); ++r)
    if (all[r] != all[0])
      throw InternalError(fmt::format("replicas differ after step {}: rank {}'s parameters hash {:016x}, rank 0's {:016x}",
                                      step, r, all[r], all[0]));
}

void gather_optimizer_state(Optimizer& opt, comm::ProcessGroup& pg, size_t piece) {
  const size_t n = opt.numel(), tensors = opt.state_names().size();
  if (pg.size() == 1 || tensors == 0) return;
  bool in_ram = true;
  for (size_t i = 0; i < tensors; ++i) in_ram = in_ram && opt.ram_state(i) != nullptr;
  if (in_ram) {  // one all-gather per tensor, in place
    for (size_t i = 0; i < tensors; ++i) pg.all_gather(opt.ram_state(i), n, DType::F32);
    return;
  }
  // Offloaded: each rank's chunk in turn, a piece at a time, broadcast from
  // the rank that read it and written into every other rank's tier.
  std::vector<float> buf(std::min(piece, n));
  for (int root = 0; root < pg.size(); ++root) {
    const comm::Range c = comm::chunk_range(n, pg.size(), root);
    for (size_t i = 0; i < tensors; ++i)
      for (size_t done = 0; done < c.size;) {
        const size_t m = std::min(buf.size(), c.size - done);
        if (pg.rank() == root) opt.read_state(i, c.begin + done, m, buf.data());
        pg.broadcast(buf.data(), m, DType::F32, root);
        if (pg.rank() != root) opt.write_state(i, c.begin + done, m, buf.data());
        done += m;
      }
  }
}

}  // namespace dpt
