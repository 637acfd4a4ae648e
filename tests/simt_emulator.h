// CUDA's execution model on the CPU, for running a kernel's own source in a
// test where no GPU is (tests/test_cuda_flash_emulated.cpp runs
// src/cuda/flash_attention_kernels.cuh on it). Each block's threads are
// fibers (ucontext) on the calling thread, switched only at the points
// where CUDA threads synchronise (a switch is GCC's __builtin_setjmp and
// __builtin_longjmp, no system call: ucontext only starts a fiber):
//   __syncthreads()          every thread of the block arrives, then all go on
//   __shfl_sync, __shfl_xor_sync (full mask only)
//                            the 32 lanes of a warp exchange values (a warp
//                            barrier before reading and after)
//   __syncwarp()             the 32 lanes of a warp arrive, then all go on
// and run between them in an order the test picks (in order, reversed, or
// shuffled per round), so a read of shared memory that a missing barrier
// leaves unordered gives different values under different orders. Dynamic
// shared memory starts as NaN, so a read of what no thread wrote shows in
// the results, and is followed by a guard of NaNs: a read past the launch's
// shared bytes shows too, a write there is reported after the block. A
// float4 load (load4) from an address the GPU would fault on throws. A
// barrier that some threads never reach (one in a divergent
// branch, a thread that returns early) stops the launch with an error
// instead of hanging.
//
// Not modelled: memory-ordering between blocks (blocks run one after
// another), warp-synchronous code without shuffles, any builtin not defined
// here (a kernel using one does not compile).
#pragma once

#include <math.h>
#include <ucontext.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define DPT_UNROLL
#define DPT_DYNAMIC_SHARED(name) float* name = ::simt::shared_memory()

namespace simt {

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

enum class Order { InOrder, Reversed, Shuffled };

struct Fiber {
  ucontext_t ctx{};    // its start
  void* jump[5] = {};  // where it yielded
  bool started = false;
  std::vector<char> stack;
  Dim3 idx;
  bool done = false;
  int wait = 0;  // 0 running or runnable, 1 at the block barrier, 2 at its warp's barrier
  uint64_t gen = 0;  // the barrier's generation it waits on
};

struct State {
  Dim3 block_idx, grid_dim, block_dim;
  std::vector<Fiber> fibers;
  int current = -1;
  void* scheduler_jump[5] = {};
  std::vector<float> shared;
  int block_arrived = 0;
  uint64_t block_gen = 0;
  std::vector<int> warp_arrived;
  std::vector<uint64_t> warp_gen;
  std::vector<uint32_t> slots;  // [warp][lane] shuffle values
  std::function<void()> body;
  std::string error;
  Order order = Order::InOrder;
  std::mt19937 rng{7};
};

inline State& st() {
  static State s;
  return s;
}

inline float* shared_memory() { return st().shared.data(); }
inline Fiber& me() { return st().fibers[static_cast<size_t>(st().current)]; }

// __builtin_longjmp may not be called from the function that called
// __builtin_setjmp.
[[noreturn]] __attribute__((noinline)) inline void jump_to(void** buf) { __builtin_longjmp(buf, 1); }

// Back to the scheduler until this fiber may go on.
__attribute__((noinline)) inline void yield() {
  State& s = st();
  if (__builtin_setjmp(me().jump) == 0) jump_to(s.scheduler_jump);
}

// The scheduler side: runs fiber f until it yields or ends.
__attribute__((noinline)) inline void resume(Fiber& f) {
  State& s = st();
  if (__builtin_setjmp(s.scheduler_jump) == 0) {
    if (!f.started) {
      f.started = true;
      setcontext(&f.ctx);
    }
    jump_to(f.jump);
  }
}

inline void syncthreads() {
  State& s = st();
  Fiber& f = me();
  if (++s.block_arrived == static_cast<int>(s.fibers.size())) {
    s.block_arrived = 0;
    ++s.block_gen;
    return;
  }
  f.wait = 1;
  f.gen = s.block_gen;
  yield();
}

inline void warp_barrier() {
  State& s = st();
  Fiber& f = me();
  const unsigned w = f.idx.x / 32;
  if (++s.warp_arrived[w] == 32) {
    s.warp_arrived[w] = 0;
    ++s.warp_gen[w];
    return;
  }
  f.wait = 2;
  f.gen = s.warp_gen[w];
  yield();
}

inline uint32_t exchange(unsigned mask, uint32_t bits, unsigned src_lane) {
  if (mask != 0xffffffffu) throw std::logic_error("the emulator's shuffles take the full mask only");
  State& s = st();
  const unsigned w = me().idx.x / 32, lane = me().idx.x % 32;
  s.slots[w * 32 + lane] = bits;
  warp_barrier();
  const uint32_t got = s.slots[w * 32 + src_lane % 32];
  warp_barrier();  // every lane has read before any writes again
  return got;
}

inline bool runnable(const Fiber& f) {
  const State& s = st();
  if (f.done) return false;
  if (f.wait == 1) return s.block_gen != f.gen;
  if (f.wait == 2) return s.warp_gen[f.idx.x / 32] != f.gen;
  return true;
}

inline void entry() {
  State& s = st();
  try {
    s.body();
  } catch (const std::exception& e) {
    if (s.error.empty()) s.error = e.what();
  }
  me().done = true;
  jump_to(s.scheduler_jump);
}

// Runs the block st().block_idx: every thread to its end.
inline void run_block(unsigned threads) {
  State& s = st();
  if (threads % 32 != 0) throw std::logic_error("the emulator runs whole warps only");
  constexpr size_t kStack = 128 * 1024;
  s.fibers.resize(threads);
  s.warp_arrived.assign(threads / 32, 0);
  s.warp_gen.assign(threads / 32, 0);
  s.slots.assign(threads, 0);
  s.block_arrived = 0;
  for (unsigned t = 0; t < threads; ++t) {
    Fiber& f = s.fibers[t];
    if (f.stack.size() != kStack) f.stack.assign(kStack, 0);
    f.idx = Dim3{t, 0, 0};
    f.done = false;
    f.started = false;
    f.wait = 0;
    f.gen = 0;
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack.data();
    f.ctx.uc_stack.ss_size = f.stack.size();
    f.ctx.uc_link = nullptr;  // entry never returns: it jumps back
    makecontext(&f.ctx, entry, 0);
  }
  std::vector<int> order(threads);
  for (unsigned t = 0; t < threads; ++t) order[t] = static_cast<int>(t);
  if (s.order == Order::Reversed) std::reverse(order.begin(), order.end());
  for (;;) {
    if (s.order == Order::Shuffled) std::shuffle(order.begin(), order.end(), s.rng);
    bool ran = false, all_done = true;
    for (int t : order) {
      Fiber& f = s.fibers[static_cast<size_t>(t)];
      if (f.done) continue;
      all_done = false;
      if (!runnable(f)) continue;
      ran = true;
      f.wait = 0;
      s.current = t;
      resume(f);
      s.current = -1;
    }
    if (all_done) break;
    if (!ran) {
      int at_block = 0, at_warp = 0, done = 0;
      for (const Fiber& f : s.fibers) (f.done ? done : f.wait == 1 ? at_block : at_warp)++;
      throw std::runtime_error("deadlock in block (" + std::to_string(s.block_idx.x) + ", " +
                               std::to_string(s.block_idx.y) + ", " + std::to_string(s.block_idx.z) + "): " +
                               std::to_string(at_block) + " threads at __syncthreads, " + std::to_string(at_warp) +
                               " at a shuffle, " + std::to_string(done) + " finished");
    }
  }
  if (!s.error.empty()) throw std::runtime_error("kernel threw: " + s.error);
}

constexpr size_t kGuard = 4096;  // floats of NaN past a launch's shared memory

// kernel<<<grid, threads, bytes>>>(args...), its blocks one after another.
template <typename G, typename... P, typename... A>
void launch(void (*kernel)(P...), G grid, int threads, size_t bytes, A... args) {
  State& s = st();
  s.grid_dim = Dim3{grid.x, grid.y, grid.z};
  s.block_dim = Dim3{static_cast<unsigned>(threads), 1, 1};
  s.body = [&] { kernel(args...); };
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        s.block_idx = Dim3{x, y, z};
        const size_t n = (bytes + sizeof(float) - 1) / sizeof(float);
        s.shared.assign(n + kGuard, std::numeric_limits<float>::quiet_NaN());
        run_block(static_cast<unsigned>(threads));
        const float nan = std::numeric_limits<float>::quiet_NaN();
        for (size_t i = n; i < n + kGuard; ++i)
          if (std::memcmp(&s.shared[i], &nan, sizeof nan) != 0)
            throw std::runtime_error("a thread wrote past the launch's " + std::to_string(bytes) +
                                     " bytes of shared memory (float " + std::to_string(i) + ")");
      }
}

}  // namespace simt

#define threadIdx (::simt::me().idx)
#define blockIdx (::simt::st().block_idx)
#define gridDim (::simt::st().grid_dim)
#define blockDim (::simt::st().block_dim)

inline void __syncthreads() { ::simt::syncthreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  if (mask != 0xffffffffu) throw std::logic_error("the emulator's __syncwarp takes the full mask only");
  ::simt::warp_barrier();
}
struct float4 {
  float x, y, z, w;
};
// A 16-byte load, which the GPU faults on unless the address is a multiple of 16.
inline float4 load4(const float* p) {
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0) throw std::logic_error("a float4 load from a misaligned address");
  return float4{p[0], p[1], p[2], p[3]};
}
inline float __shfl_sync(unsigned mask, float v, int src) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  b = ::simt::exchange(mask, b, static_cast<unsigned>(src));
  std::memcpy(&v, &b, 4);
  return v;
}
inline float __shfl_xor_sync(unsigned mask, float v, int lane_mask) {
  return __shfl_sync(mask, v, static_cast<int>((::simt::me().idx.x % 32) ^ static_cast<unsigned>(lane_mask)));
}
