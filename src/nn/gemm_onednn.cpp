#include "nn/gemm_onednn.h"

#include <omp.h>

#include <array>
#include <atomic>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>

#include <fmt/format.h>
#include <oneapi/dnnl/dnnl.hpp>

#include "core/error.h"

namespace dpt::onednn {

namespace {

using dnnl::memory;
using Dims = memory::dims;

dnnl::engine& cpu_engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

std::atomic<int64_t> g_created{0}, g_hits{0};

// An [rows, cols] operand as stored row-major with leading dimension ld, seen
// through op: the strides go into the memory descriptor, so oneDNN reads the
// engine's buffer where it is (a transpose is just swapped strides).
memory::desc operand(int64_t rows, int64_t cols, int64_t ld, Op op, memory::data_type dt) {
  return op == Op::N ? memory::desc(Dims{rows, cols}, dt, Dims{ld, 1}) : memory::desc(Dims{rows, cols}, dt, Dims{1, ld});
}

struct FreeBytes {
  void operator()(void* p) const { std::free(p); }
};

// One primitive with its memory objects (pointed at the caller's buffers on
// every call) and its own scratchpad (allocated here, once, 64-byte aligned;
// the allocation does not move when the entry does).
struct Entry {
  dnnl::matmul prim;
  memory src, wei, dst, scratch, bias;
  std::unique_ptr<void, FreeBytes> scratch_bytes;
  // The execute arguments, built once: the C++ wrapper's execute() would
  // build a map and a vector on every call. The bias's is last, and passed
  // only by primitives that have one.
  std::array<dnnl_exec_arg_t, 5> args;
  int nargs = 4;
};

dnnl::matmul::primitive_desc make_pd(Op op_a, Op op_b, int64_t M, int64_t N, int64_t K, float alpha,
                                     int64_t lda, int64_t ldb, float beta, int64_t ldc, bool bf16, bool bias) {
  const auto in = bf16 ? memory::data_type::bf16 : memory::data_type::f32;
  dnnl::primitive_attr attr;
  // alpha as the output scale and beta as a sum post-op (oneDNN 2.x):
  // dst = alpha * (src @ wei) + beta * dst. beta = 0 adds no post-op, so C's
  // old contents are never read.
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  if (beta != 0.0f) {
    dnnl::post_ops po;
    po.append_sum(beta);
    attr.set_post_ops(po);
  }
  // A scratchpad per primitive, owned by the cache entry: nothing is
  // allocated per call, and no two threads share one.
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const memory::desc src = operand(M, K, lda, op_a, in), wei = operand(K, N, ldb, op_b, in),
                     dst(Dims{M, N}, memory::data_type::f32, Dims{ldc, 1});
  // A bias is a [1, N] row broadcast over C's rows.
  dnnl::matmul::desc d = bias ? dnnl::matmul::desc(src, wei, memory::desc(Dims{1, N}, memory::data_type::f32, Dims{N, 1}), dst)
                              : dnnl::matmul::desc(src, wei, dst);
  return dnnl::matmul::primitive_desc(d, attr, cpu_engine());
}

Entry make_entry(const dnnl::matmul::primitive_desc& pd) {
  Entry e;
  e.prim = dnnl::matmul(pd);
  dnnl::engine& eng = cpu_engine();
  e.src = memory(pd.src_desc(), eng, DNNL_MEMORY_NONE);
  e.wei = memory(pd.weights_desc(), eng, DNNL_MEMORY_NONE);
  e.dst = memory(pd.dst_desc(), eng, DNNL_MEMORY_NONE);
  if (const size_t bytes = pd.scratchpad_desc().get_size(); bytes > 0) {
    e.scratch_bytes.reset(std::aligned_alloc(64, (bytes + 63) / 64 * 64));
    DPT_CHECK(e.scratch_bytes, "cannot allocate {} bytes of oneDNN scratchpad", bytes);
  }
  e.scratch = memory(pd.scratchpad_desc(), eng, e.scratch_bytes.get());
  e.args = {{{DNNL_ARG_SRC, e.src.get()},
             {DNNL_ARG_WEIGHTS, e.wei.get()},
             {DNNL_ARG_DST, e.dst.get()},
             {DNNL_ARG_SCRATCHPAD, e.scratch.get()},
             {DNNL_ARG_BIAS, nullptr}}};
  if (pd.query_md(dnnl::query::exec_arg_md, DNNL_ARG_BIAS).get_size() > 0) {
    e.bias = memory(pd.query_md(dnnl::query::exec_arg_md, DNNL_ARG_BIAS), eng, DNNL_MEMORY_NONE);
    e.args[4].memory = e.bias.get();
    e.nargs = 5;
  }
  return e;
}

// Everything a primitive depends on. The thread count is part of it because
// oneDNN sizes its work split when the primitive is created; a call from
// inside a parallel region gets one thread's primitive of its own.
using Key = std::array<int64_t, 14>;

Key key_of(Op op_a, Op op_b, int64_t M, int64_t N, int64_t K, float alpha, int64_t lda, int64_t ldb, float beta,
           int64_t ldc, bool bf16, bool bias) {
  const bool nested = omp_in_parallel();
  return {M, N, K, lda, ldb, ldc, op_a == Op::T, op_b == Op::T, bf16, std::bit_cast<uint32_t>(alpha),
          std::bit_cast<uint32_t>(beta), nested ? 1 : omp_get_max_threads(), nested, bias};
}

}  // namespace

void matmul(Op op_a, Op op_b, int64_t M, int64_t N, int64_t K, float alpha, const void* A, int64_t lda,
            const void* B, int64_t ldb, float beta, float* C, int64_t ldc, bool bf16, const float* bias) {
  // One cache and one stream per thread: attention calls from every thread
  // of a parallel region at once, and a thread-local map needs no lock.
  // Threads of the OpenMP pool live as long as the process, and so do these.
  static thread_local std::map<Key, Entry> cache;
  static thread_local dnnl::stream stream(cpu_engine());
  DPT_CHECK(!bias || (alpha == 1.0f && beta == 0.0f), "a GEMM with a bias takes alpha 1 and beta 0");
  const Key key = key_of(op_a, op_b, M, N, K, alpha, lda, ldb, beta, ldc, bf16, bias != nullptr);
  auto it = cache.find(key);
  if (it == cache.end()) {
    it = cache.emplace(key, make_entry(make_pd(op_a, op_b, M, N, K, alpha, lda, ldb, beta, ldc, bf16, bias != nullptr)))
             .first;
    g_created.fetch_add(1, std::memory_order_relaxed);
  } else {
    g_hits.fetch_add(1, std::memory_order_relaxed);
  }
  Entry& e = it->second;
  e.src.set_data_handle(const_cast<void*>(A));
  e.wei.set_data_handle(const_cast<void*>(B));
  e.dst.set_data_handle(C);
  if (bias) e.bias.set_data_handle(const_cast<float*>(bias));
  dnnl::error::wrap_c_api(dnnl_primitive_execute(e.prim.get(), stream.get(), e.nargs, e.args.data()),
                          "oneDNN matmul failed");
  // The CPU engine runs synchronously in OpenMP builds; wait() is a no-op
  // kept for correctness under other runtimes.
  stream.wait();
}

bool bf16_supported() {
  static const bool ok = [] {
    try {
      auto pd = make_pd(Op::N, Op::N, 16, 16, 16, 1.0f, 16, 16, 0.0f, 16, true, false);
      // The reference kernel "works" everywhere at a tiny fraction of the
      // speed; only a real bf16 kernel counts.
      return std::strncmp(pd.impl_info_str(), "ref", 3) != 0;
    } catch (const dnnl::error&) {
      return false;  // unimplemented on this CPU
    }
  }();
  return ok;
}

bool avx512() {
  // The ISA values are bit sets, each containing the ones it extends
  // (avx512_core_bf16 holds avx512_core's bits; avx2_vnni does not).
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto core = static_cast<unsigned>(dnnl::cpu_isa::avx512_core);
  return (isa & core) == core;
}

bool amx() {
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto amx = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_amx);
  return (isa & amx) == amx;
}

std::string describe(const std::string& bf16) {
  const dnnl_version_t* v = dnnl_version();
  const char* isa = "unknown";
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::sse41: isa = "sse41"; break;
    case dnnl::cpu_isa::avx: isa = "avx"; break;
    case dnnl::cpu_isa::avx2: isa = "avx2"; break;
    case dnnl::cpu_isa::avx2_vnni: isa = "avx2_vnni"; break;
    case dnnl::cpu_isa::avx512_core: isa = "avx512_core"; break;
    case dnnl::cpu_isa::avx512_core_vnni: isa = "avx512_core_vnni"; break;
    case dnnl::cpu_isa::avx512_core_bf16: isa = "avx512_core_bf16"; break;
    case dnnl::cpu_isa::avx512_core_amx: isa = "avx512_core_amx"; break;
    default: break;
  }
  return fmt::format("oneDNN {}.{}.{} ({}, {})", v->major, v->minor, v->patch, isa, bf16);
}

GemmCacheStats stats() { return {g_created.load(), g_hits.load()}; }

}  // namespace dpt::onednn
