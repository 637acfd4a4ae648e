// Micro-benchmarks of the engine's CPU kernels at the shapes of the
// reference workloads:
//   W-GPT: B=16, T=128, C=256, NH=4, V=256 (N = B*T = 2048 rows),
//          3,257,856 parameters, AdamW
//   W-MLP: batch 256, 784 -> 1024 -> 1024 -> 10, SGD
//
// Every benchmark takes the thread count as its argument (threads:1 and
// threads:2) and calls dpt::set_threads with it first, so GEMM and the
// kernels' OpenMP loops use that many threads. Times are wall-clock
// (UseRealTime): the default, the main thread's CPU time, would leave out
// the other threads' work and overstate every rate at 2 threads.
//
// Counters:
//   FLOPS           GEMM benchmarks: floating-point operations per second,
//                   2*M*N*K per GEMM (bias adds and sums not counted).
//   bytes_per_second the other kernels: the bytes each kernel must read and
//                   write at minimum (every input read once, every output
//                   written once, accumulated outputs read and written),
//                   per second. Caches hold some of these buffers, so this
//                   is a lower bound on traffic, not a DRAM bandwidth.
//
// Inputs are allocated and filled (deterministic pseudo-random values) once,
// outside the timed loop. Buffers are FlatBuffers, 64-byte aligned as in the
// engine. Outputs never alias inputs here (the engine runs gelu_backward and
// cross_entropy in place), so every iteration sees the same input values.
//
// Build and run (see bench/README.md):
//   cmake -S . -B build && cmake --build build --target bench_kernels
//   build/bench/bench_kernels --benchmark_filter=gelu

#include <benchmark/benchmark.h>
#include <cblas.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include <fmt/format.h>

#include "core/rng.h"
#include "core/threads.h"
#include "nn/activations.h"
#include "nn/activations_avx512.h"
#include "nn/swiglu.h"
#include "nn/gemm.h"
#include "nn/attention.h"
#include "nn/flash_attention.h"
#include "nn/gqa_attention.h"
#include "nn/cross_entropy.h"
#include "nn/layernorm.h"
#include "nn/linear.h"
#include "optim/optimizer.h"
#include "tensor/flat_buffer.h"
#include "tensor/layout.h"

namespace {

// W-GPT
constexpr int64_t kB = 16, kT = 128, kC = 256, kNH = 4, kV = 256;
constexpr int64_t kN = kB * kT;
constexpr int64_t kGptParams = 3'257'856;
// W-MLP
constexpr int64_t kMlpBatch = 256, kMlpIn = 784, kMlpHidden = 1024;
constexpr int64_t kMlpParams = 1'863'680;  // 784-1024-1024-10 with biases, rounded down to whole rows of 1024

constexpr int64_t kF32 = sizeof(float), kI32 = sizeof(int32_t);

// n floats uniform in [lo, hi), the same for the same seed.
dpt::FlatBuffer random_buffer(int64_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  dpt::FlatBuffer buf(static_cast<size_t>(n));
  dpt::Rng rng(seed);
  float* p = buf.f32();
  for (int64_t i = 0; i < n; ++i) p[i] = lo + (hi - lo) * rng.uniform();
  return buf;
}

dpt::FlatBuffer zero_buffer(int64_t n) { return dpt::FlatBuffer(static_cast<size_t>(n)); }

std::vector<int32_t> random_targets(int64_t n, int64_t V, uint64_t seed) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  dpt::Rng rng(seed);
  for (auto& x : t) x = static_cast<int32_t>(rng.below(static_cast<uint64_t>(V)));
  return t;
}

void thread_counts(benchmark::internal::Benchmark* b) {
  b->ArgName("threads")->Arg(1)->Arg(2)->UseRealTime();
}

void start(benchmark::State& state) { dpt::set_threads(static_cast<int>(state.range(0))); }

void report_flops(benchmark::State& state, double flops_per_iteration) {
  state.counters["FLOPS"] =
      benchmark::Counter(flops_per_iteration, benchmark::Counter::kIsIterationInvariantRate);
}

void report_bytes(benchmark::State& state, int64_t bytes_per_iteration) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * bytes_per_iteration);
}

// ---------------------------------------------------------------- GEMM

// The raw OpenBLAS sgemm rate, C = A B with square 1024 matrices: the
// ceiling the linear layers are measured against.
void BM_sgemm(benchmark::State& state) {
  start(state);
  constexpr int64_t n = 1024;
  auto a = random_buffer(n * n, 1), b = random_buffer(n * n, 2);
  auto c = zero_buffer(n * n);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.f32(), n, b.f32(), n,
                0.0f, c.f32(), n);
    benchmark::DoNotOptimize(c.f32());
    benchmark::ClobberMemory();
  }
  report_flops(state, 2.0 * n * n * n);
}
BENCHMARK(BM_sgemm)->Apply(thread_counts);

// The GEMM layer (nn/gemm.h) at the workloads' shapes, per backend and input
// dtype: M x N x K with the engine's layout for each (linear forward is NT,
// an input gradient NN, a weight gradient TN). Arguments: threads, backend (0 openblas, 1 onednn),
// dtype (0 fp32, 1 bf16: bf16 A and B, fp32 C), shape (index below).
struct GemmShape {
  int64_t M, N, K;
  dpt::Op op_a, op_b;
  float beta = 0.0f;  // 1: accumulate into C, as the weight gradients do
};
constexpr GemmShape kGemmShapes[] = {
    {1024, 1024, 1024, dpt::Op::N, dpt::Op::T},  // the peak's shape
    {kN, 4 * kC, kC, dpt::Op::N, dpt::Op::T},    // W-GPT c_fc forward, 2048x1024x256
    {kN, kC, 4 * kC, dpt::Op::N, dpt::Op::N},    // W-GPT c_fc input gradient, 2048x256x1024
    {kMlpBatch, kMlpHidden, kMlpIn, dpt::Op::N, dpt::Op::T},  // W-MLP fc1 forward, 256x1024x784
    {4 * kC, kC, kN, dpt::Op::T, dpt::Op::N},    // W-GPT c_fc weight gradient (dout^T inp), 1024x256x2048
    // ... accumulated (beta 1), as linear_backward_weight runs it, and the
    // same product were the output gradient stored transposed (NN)
    {4 * kC, kC, kN, dpt::Op::T, dpt::Op::N, 1.0f},
    {4 * kC, kC, kN, dpt::Op::N, dpt::Op::N, 1.0f},
};

void BM_gemm(benchmark::State& state) {
  start(state);
  const auto backend = state.range(1) ? dpt::GemmBackend::OneDnn : dpt::GemmBackend::OpenBlas;
  dpt::set_gemm_backend(backend);
  const bool bf16 = state.range(2) != 0;
  const GemmShape s = kGemmShapes[state.range(3)];
  const int64_t lda = s.op_a == dpt::Op::N ? s.K : s.M, ldb = s.op_b == dpt::Op::N ? s.N : s.K;
  auto a = random_buffer(s.M * s.K, 1), b = random_buffer(s.K * s.N, 2);
  auto c = zero_buffer(s.M * s.N);
  std::vector<dpt::bf16> a16(static_cast<size_t>(s.M * s.K)), b16(static_cast<size_t>(s.K * s.N));
  for (size_t i = 0; i < a16.size(); ++i) a16[i] = dpt::to_bf16(a.f32()[i]);
  for (size_t i = 0; i < b16.size(); ++i) b16[i] = dpt::to_bf16(b.f32()[i]);
  for (auto _ : state) {
    if (bf16)
      dpt::gemm(s.op_a, s.op_b, s.M, s.N, s.K, 1.0f, a16.data(), lda, b16.data(), ldb, s.beta, c.f32(), s.N);
    else
      dpt::gemm(s.op_a, s.op_b, s.M, s.N, s.K, 1.0f, a.f32(), lda, b.f32(), ldb, s.beta, c.f32(), s.N);
    benchmark::DoNotOptimize(c.f32());
    benchmark::ClobberMemory();
  }
  report_flops(state, 2.0 * s.M * s.N * s.K);
  state.SetLabel(fmt::format("{} {} {}x{}x{}{}{}{}", dpt::gemm_backend_name(backend), bf16 ? "bf16" : "fp32", s.M,
                             s.N, s.K, s.op_a == dpt::Op::T ? "TN" : "", s.beta != 0.0f ? "+=" : "",
                             bf16 && !dpt::gemm_bf16_native() ? " (widened to fp32)" : ""));
  dpt::set_gemm_backend(dpt::default_gemm_backend());
}
BENCHMARK(BM_gemm)
    ->ArgNames({"threads", "backend", "bf16", "shape"})
    ->ArgsProduct({{1, 2}, {0, 1}, {0, 1}, {0, 1, 2, 3, 4, 5, 6}})
    ->UseRealTime();

// out [N, OC] = inp [N, C] @ weight [OC, C]^T + bias: one GEMM.
void BM_linear_forward(benchmark::State& state, int64_t N, int64_t C, int64_t OC) {
  start(state);
  auto inp = random_buffer(N * C, 11), weight = random_buffer(OC * C, 12, -0.05f, 0.05f);
  auto bias = random_buffer(OC, 13, -0.05f, 0.05f);
  auto out = zero_buffer(N * OC);
  for (auto _ : state) {
    dpt::linear_forward(out.f32(), inp.f32(), weight.f32(), bias.f32(), N, C, OC);
    benchmark::DoNotOptimize(out.f32());
    benchmark::ClobberMemory();
  }
  report_flops(state, 2.0 * N * C * OC);
}
BENCHMARK_CAPTURE(BM_linear_forward, gpt_c_fc, kN, kC, 4 * kC)->Apply(thread_counts);
BENCHMARK_CAPTURE(BM_linear_forward, mlp_fc1, kMlpBatch, kMlpIn, kMlpHidden)->Apply(thread_counts);

// dinp = dout @ weight (skipped when need_dinp is false, as for the MLP's
// first layer, whose input is data), dweight += dout^T @ inp, dbias += sums:
// two GEMMs or one.
void BM_linear_backward(benchmark::State& state, int64_t N, int64_t C, int64_t OC,
                        bool need_dinp) {
  start(state);
  auto dout = random_buffer(N * OC, 21, -0.01f, 0.01f), inp = random_buffer(N * C, 22);
  auto weight = random_buffer(OC * C, 23, -0.05f, 0.05f);
  auto dinp = zero_buffer(N * C), dweight = zero_buffer(OC * C), dbias = zero_buffer(OC);
  float* dinp_ptr = need_dinp ? dinp.f32() : nullptr;
  for (auto _ : state) {
    dpt::linear_backward(dinp_ptr, dweight.f32(), dbias.f32(), dout.f32(), inp.f32(),
                         weight.f32(), N, C, OC);
    benchmark::DoNotOptimize(dweight.f32());
    benchmark::DoNotOptimize(dinp_ptr);
    benchmark::ClobberMemory();
  }
  report_flops(state, (need_dinp ? 4.0 : 2.0) * N * C * OC);
}
BENCHMARK_CAPTURE(BM_linear_backward, gpt_c_fc, kN, kC, 4 * kC, true)->Apply(thread_counts);
BENCHMARK_CAPTURE(BM_linear_backward, mlp_fc1, kMlpBatch, kMlpIn, kMlpHidden, false)
    ->Apply(thread_counts);

// c_fc's weight gradient alone (dW += dout^T inp, accumulated into dW) at a
// pipeline micro-batch's rows (256: 2 sequences of 128) and DDP's (1024),
// with dW in cache or not. Between micro-batches a step runs every other
// layer, so each micro-batch's dW GEMM meets its gradient evicted (the
// inputs it has just made or read stay warm): what micro-batching costs
// beside the GEMMs' own shapes (docs/pipeline.md).
void BM_weight_grad(benchmark::State& state, bool cold_grad) {
  dpt::set_threads(1);
  const int64_t N = state.range(0), C = kC, OC = 4 * kC;
  auto dout = random_buffer(N * OC, 21, -0.01f, 0.01f), inp = random_buffer(N * C, 22);
  auto dweight = zero_buffer(OC * C);
  std::vector<float> evict(size_t{12} << 20, 1.0f);  // 48 MiB: past the L3
  float sink = 0.0f;
  for (auto _ : state) {
    if (cold_grad) {
      state.PauseTiming();
      for (size_t i = 0; i < evict.size(); i += 16) sink += (evict[i] += 1.0f);
      for (const dpt::FlatBuffer* b : {&dout, &inp})
        for (int64_t i = 0; i < static_cast<int64_t>(b->numel()); i += 16) sink += b->f32()[i];
      state.ResumeTiming();
    }
    dpt::linear_backward_weight(dweight.f32(), dout.f32(), inp.f32(), N, C, OC, 0, OC);
    benchmark::DoNotOptimize(dweight.f32());
    benchmark::ClobberMemory();
  }
  benchmark::DoNotOptimize(sink);
  report_flops(state, 2.0 * N * C * OC);
}
BENCHMARK_CAPTURE(BM_weight_grad, hot, false)->ArgName("rows")->Arg(256)->Arg(1024)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_weight_grad, cold, true)->ArgName("rows")->Arg(256)->Arg(1024)->Unit(benchmark::kMicrosecond);

// ---------------------------------------------------------------- GELU
// Over W-GPT's MLP hidden activations, N * 4C elements.

void BM_gelu_forward(benchmark::State& state) {
  start(state);
  const int64_t n = kN * 4 * kC;
  auto inp = random_buffer(n, 31, -4.0f, 4.0f);
  auto out = zero_buffer(n);
  for (auto _ : state) {
    dpt::gelu_forward(out.f32(), inp.f32(), n);
    benchmark::DoNotOptimize(out.f32());
    benchmark::ClobberMemory();
  }
  // read inp, write out
  report_bytes(state, 2 * n * kF32);
}
BENCHMARK(BM_gelu_forward)->Apply(thread_counts);

// The bf16 paths' kernels: nn/activations_avx512.h's where the CPU has
// AVX-512 BF16 ("avx512"), the portable ones (nn/fast_tanh.h's tanh) else or
// when turned off ("portable"). Returns false (the case skipped) where the
// kernels asked for cannot run.
bool bf16_kernels(benchmark::State& state, bool avx512) {
  dpt::avx512_activations::set_off(!avx512);
  if (avx512 && !dpt::avx512_activations::enabled()) {
    state.SkipWithError("this CPU has no AVX-512 BF16");
    return false;
  }
  return true;
}

// The bf16 run's forward: bf16 out (c_proj's GEMM operand).
void BM_gelu_forward_bf16(benchmark::State& state, bool avx512) {
  start(state);
  if (!bf16_kernels(state, avx512)) return;
  const int64_t n = kN * 4 * kC;
  auto inp = random_buffer(n, 31, -4.0f, 4.0f);
  std::vector<dpt::bf16> out(static_cast<size_t>(n));
  for (auto _ : state) {
    dpt::gelu_forward(out.data(), inp.f32(), n);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  // read inp, write out
  report_bytes(state, n * kF32 + n * 2);
  dpt::avx512_activations::set_off(false);
}
BENCHMARK_CAPTURE(BM_gelu_forward_bf16, portable, false)->Apply(thread_counts);
BENCHMARK_CAPTURE(BM_gelu_forward_bf16, avx512, true)->Apply(thread_counts);

// What memory alone allows for the same traffic: fp32 in, bf16 out.
void BM_convert_bf16(benchmark::State& state) {
  start(state);
  const int64_t n = kN * 4 * kC;
  auto inp = random_buffer(n, 31, -4.0f, 4.0f);
  std::vector<dpt::bf16> out(static_cast<size_t>(n));
  for (auto _ : state) {
    dpt::convert(out.data(), inp.f32(), static_cast<size_t>(n));
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  report_bytes(state, n * kF32 + n * 2);
}
BENCHMARK(BM_convert_bf16)->Apply(thread_counts);

void BM_gelu_backward(benchmark::State& state) {
  start(state);
  const int64_t n = kN * 4 * kC;
  auto inp = random_buffer(n, 32, -4.0f, 4.0f), dout = random_buffer(n, 33);
  auto dinp = zero_buffer(n);
  for (auto _ : state) {
    dpt::gelu_backward(dinp.f32(), dout.f32(), inp.f32(), n);
    benchmark::DoNotOptimize(dinp.f32());
    benchmark::ClobberMemory();
  }
  // read dout and inp, write dinp
  report_bytes(state, 3 * n * kF32);
}
BENCHMARK(BM_gelu_backward)->Apply(thread_counts);

// GPT's MLP backward after c_proj, in a bf16 run: the GELU gradient, c_fc's
// bias gradient and the bf16 operand of c_fc's GEMMs. Unfused: three
// kernels, three passes; fused: the one pass of Kernels::gelu_backward.
void gelu_backward_bf16_case(benchmark::State& state, bool fused) {
  start(state);
  const int64_t N = kN, OC = 4 * kC, n = N * OC;
  auto inp = random_buffer(n, 32, -4.0f, 4.0f), dout = random_buffer(n, 33);
  auto dinp = zero_buffer(n), dbias = zero_buffer(OC);
  std::vector<dpt::bf16> dinp16(static_cast<size_t>(n));
  for (auto _ : state) {
    if (fused) {
      dpt::gelu_backward(dinp.f32(), dinp16.data(), dbias.f32(), dout.f32(), inp.f32(), N, OC);
    } else {
      dpt::gelu_backward(dinp.f32(), dout.f32(), inp.f32(), n);
      dpt::linear_backward_bias(dbias.f32(), dinp.f32(), N, OC);
      dpt::convert(dinp16.data(), dinp.f32(), static_cast<size_t>(n));
    }
    benchmark::DoNotOptimize(dinp16.data());
    benchmark::ClobberMemory();
  }
  // at least: read dout and inp, write dinp and its bf16 copy
  report_bytes(state, 3 * n * kF32 + n * 2);
}
void BM_gelu_backward_bias_bf16_unfused(benchmark::State& state) { gelu_backward_bf16_case(state, false); }
void BM_gelu_backward_bias_bf16_fused(benchmark::State& state) { gelu_backward_bf16_case(state, true); }
BENCHMARK(BM_gelu_backward_bias_bf16_unfused)->Apply(thread_counts);
BENCHMARK(BM_gelu_backward_bias_bf16_fused)->Apply(thread_counts);

// The same fused pass without the fp32 gradient (dinp null): what a bf16
// run's GEMMs read is the bf16 copy alone.
void BM_gelu_backward_bias_bf16_only(benchmark::State& state, bool avx512) {
  start(state);
  if (!bf16_kernels(state, avx512)) return;
  const int64_t N = kN, OC = 4 * kC, n = N * OC;
  auto inp = random_buffer(n, 32, -4.0f, 4.0f), dout = random_buffer(n, 33);
  auto dbias = zero_buffer(OC);
  std::vector<dpt::bf16> dinp16(static_cast<size_t>(n));
  for (auto _ : state) {
    dpt::gelu_backward(nullptr, dinp16.data(), dbias.f32(), dout.f32(), inp.f32(), N, OC);
    benchmark::DoNotOptimize(dinp16.data());
    benchmark::ClobberMemory();
  }
  // read dout and inp, write the bf16 copy
  report_bytes(state, 2 * n * kF32 + n * 2);
  dpt::avx512_activations::set_off(false);
}
BENCHMARK_CAPTURE(BM_gelu_backward_bias_bf16_only, portable, false)->Apply(thread_counts);
BENCHMARK_CAPTURE(BM_gelu_backward_bias_bf16_only, avx512, true)->Apply(thread_counts);

// ---------------------------------------------------------------- SwiGLU
// A bf16 run's SwiGLU over N rows of I = 4C (gate | up in, bf16 out; and
// the backward's bf16 copy alone, as a bf16 run on the CPU asks).

void BM_swiglu_forward_bf16(benchmark::State& state, bool avx512) {
  start(state);
  if (!bf16_kernels(state, avx512)) return;
  const int64_t N = kN, I = 4 * kC;
  auto gu = random_buffer(N * 2 * I, 34, -4.0f, 4.0f);
  std::vector<dpt::bf16> out(static_cast<size_t>(N * I));
  for (auto _ : state) {
    dpt::swiglu_forward(out.data(), gu.f32(), N, I);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  // read gate and up, write out
  report_bytes(state, 2 * N * I * kF32 + N * I * 2);
  dpt::avx512_activations::set_off(false);
}
BENCHMARK_CAPTURE(BM_swiglu_forward_bf16, portable, false)->Apply(thread_counts);
BENCHMARK_CAPTURE(BM_swiglu_forward_bf16, avx512, true)->Apply(thread_counts);

void BM_swiglu_backward_bf16(benchmark::State& state, bool avx512) {
  start(state);
  if (!bf16_kernels(state, avx512)) return;
  const int64_t N = kN, I = 4 * kC;
  auto gu = random_buffer(N * 2 * I, 35, -4.0f, 4.0f), dout = random_buffer(N * I, 36);
  std::vector<dpt::bf16> dgu16(static_cast<size_t>(N * 2 * I));
  for (auto _ : state) {
    dpt::swiglu_backward(nullptr, dgu16.data(), dout.f32(), gu.f32(), N, I);
    benchmark::DoNotOptimize(dgu16.data());
    benchmark::ClobberMemory();
  }
  // read gate, up and dout, write both halves' bf16 copy
  report_bytes(state, 3 * N * I * kF32 + 2 * N * I * 2);
  dpt::avx512_activations::set_off(false);
}
BENCHMARK_CAPTURE(BM_swiglu_backward_bf16, portable, false)->Apply(thread_counts);
BENCHMARK_CAPTURE(BM_swiglu_backward_bf16, avx512, true)->Apply(thread_counts);

// ---------------------------------------------------------------- LayerNorm
// [N, C] = [2048, 256].

void BM_layernorm_forward(benchmark::State& state) {
  start(state);
  const int64_t N = kN, C = kC;
  auto inp = random_buffer(N * C, 41, -2.0f, 2.0f);
  auto weight = random_buffer(C, 42, 0.5f, 1.5f), bias = random_buffer(C, 43, -0.1f, 0.1f);
  auto out = zero_buffer(N * C), mean = zero_buffer(N), rstd = zero_buffer(N);
  for (auto _ : state) {
    dpt::layernorm_forward(out.f32(), mean.f32(), rstd.f32(), inp.f32(), weight.f32(), bias.f32(),
                           N, C);
    benchmark::DoNotOptimize(out.f32());
    benchmark::ClobberMemory();
  }
  // read inp [N, C], weight and bias [C]; write out [N, C], mean and rstd [N]
  report_bytes(state, (2 * N * C + 2 * C + 2 * N) * kF32);
}
BENCHMARK(BM_layernorm_forward)->Apply(thread_counts);

void BM_layernorm_backward(benchmark::State& state) {
  start(state);
  const int64_t N = kN, C = kC;
  auto inp = random_buffer(N * C, 44, -2.0f, 2.0f), dout = random_buffer(N * C, 45, -0.01f, 0.01f);
  auto weight = random_buffer(C, 46, 0.5f, 1.5f), bias = random_buffer(C, 47, -0.1f, 0.1f);
  auto out = zero_buffer(N * C), mean = zero_buffer(N), rstd = zero_buffer(N);
  dpt::layernorm_forward(out.f32(), mean.f32(), rstd.f32(), inp.f32(), weight.f32(), bias.f32(), N,
                         C);
  auto dinp = zero_buffer(N * C), dweight = zero_buffer(C), dbias = zero_buffer(C);
  for (auto _ : state) {
    dpt::layernorm_backward(dinp.f32(), dweight.f32(), dbias.f32(), dout.f32(), inp.f32(),
                            weight.f32(), mean.f32(), rstd.f32(), N, C);
    benchmark::DoNotOptimize(dinp.f32());
    benchmark::ClobberMemory();
  }
  // read dout, inp [N, C], weight [C], mean, rstd [N];
  // read and write (accumulated) dinp [N, C], dweight and dbias [C]
  report_bytes(state, (4 * N * C + 5 * C + 2 * N) * kF32);
}
BENCHMARK(BM_layernorm_backward)->Apply(thread_counts);

// ---------------------------------------------------------------- attention
// qkv [B, T, 3C], out [B, T, C], att [B, NH, T, T].

void BM_attention_forward(benchmark::State& state) {
  start(state);
  const int64_t B = kB, T = kT, C = kC, NH = kNH;
  auto qkv = random_buffer(B * T * 3 * C, 51);
  auto out = zero_buffer(B * T * C), att = zero_buffer(B * NH * T * T);
  for (auto _ : state) {
    dpt::attention_forward(out.f32(), att.f32(), qkv.f32(), B, T, C, NH);
    benchmark::DoNotOptimize(out.f32());
    benchmark::ClobberMemory();
  }
  // read qkv; write out and att (all of it: the masked half is written as 0)
  report_bytes(state, (3 * B * T * C + B * T * C + B * NH * T * T) * kF32);
}
BENCHMARK(BM_attention_forward)->Apply(thread_counts);

void BM_attention_backward(benchmark::State& state) {
  start(state);
  const int64_t B = kB, T = kT, C = kC, NH = kNH;
  auto qkv = random_buffer(B * T * 3 * C, 52), dout = random_buffer(B * T * C, 53, -0.01f, 0.01f);
  auto out = zero_buffer(B * T * C), att = zero_buffer(B * NH * T * T);
  dpt::attention_forward(out.f32(), att.f32(), qkv.f32(), B, T, C, NH);
  auto dqkv = zero_buffer(B * T * 3 * C);
  for (auto _ : state) {
    dpt::attention_backward(dqkv.f32(), dout.f32(), qkv.f32(), att.f32(), B, T, C, NH);
    benchmark::DoNotOptimize(dqkv.f32());
    benchmark::ClobberMemory();
  }
  // read dout [B, T, C], qkv [B, T, 3C], att [B, NH, T, T]; write dqkv [B, T, 3C]
  report_bytes(state, (B * T * C + 3 * B * T * C + B * NH * T * T + 3 * B * T * C) * kF32);
}
BENCHMARK(BM_attention_backward)->Apply(thread_counts);

// ---------------------------------------------------------------- cross-entropy
// logits [N, V]: W-GPT's [2048, 256], and GPT-2's vocabulary (50,257) at 4
// sequences of 128, where the loss is a tenth of a bf16 step; targets [N].
constexpr int64_t kGpt2Vocab = 50'257, kGpt2VocabRows = 512;

void BM_cross_entropy_forward(benchmark::State& state, int64_t N, int64_t V) {
  start(state);
  auto logits = random_buffer(N * V, 61, -3.0f, 3.0f);
  auto targets = random_targets(N, V, 62);
  auto probs = zero_buffer(N * V);
  int64_t correct = 0;
  for (auto _ : state) {
    float loss =
        dpt::cross_entropy_forward(probs.f32(), logits.f32(), targets.data(), N, V, &correct);
    benchmark::DoNotOptimize(loss);
    benchmark::DoNotOptimize(correct);
    benchmark::ClobberMemory();
  }
  // read logits [N, V] and targets [N] (int32); write probs [N, V]
  report_bytes(state, 2 * N * V * kF32 + N * kI32);
}
BENCHMARK_CAPTURE(BM_cross_entropy_forward, w_gpt, kN, kV)->Apply(thread_counts);
BENCHMARK_CAPTURE(BM_cross_entropy_forward, gpt2_vocab, kGpt2VocabRows, kGpt2Vocab)->Apply(thread_counts);

void BM_cross_entropy_backward(benchmark::State& state) {
  start(state);
  const int64_t N = kN, V = kV;
  auto logits = random_buffer(N * V, 63, -3.0f, 3.0f);
  auto targets = random_targets(N, V, 64);
  auto probs = zero_buffer(N * V), dlogits = zero_buffer(N * V);
  dpt::cross_entropy_forward(probs.f32(), logits.f32(), targets.data(), N, V, nullptr);
  const float scale = 1.0f / static_cast<float>(N);
  for (auto _ : state) {
    dpt::cross_entropy_backward(dlogits.f32(), probs.f32(), targets.data(), N, V, scale);
    benchmark::DoNotOptimize(dlogits.f32());
    benchmark::ClobberMemory();
  }
  // read probs [N, V] and targets [N] (int32); write dlogits [N, V]
  report_bytes(state, 2 * N * V * kF32 + N * kI32);
}
BENCHMARK(BM_cross_entropy_backward)->Apply(thread_counts);

// A bf16 run's backward at GPT-2's vocabulary, in place over the
// probabilities as the decoder runs it: with the fp32 gradient written
// beside the bf16 copy (what runs on a GPU) or the copy alone (the CPU's).
void BM_cross_entropy_backward_bf16(benchmark::State& state, bool with_fp32) {
  start(state);
  const int64_t N = kGpt2VocabRows, V = kGpt2Vocab;
  auto probs = random_buffer(N * V, 65, 0.0f, 2.0f / static_cast<float>(V));
  auto targets = random_targets(N, V, 66);
  std::vector<dpt::bf16> d16(static_cast<size_t>(N * V));
  const float scale = 1.0f / static_cast<float>(N);
  for (auto _ : state) {
    // In place, the fp32 gradient replaces the probabilities: later
    // iterations read gradients, the same traffic.
    dpt::cross_entropy_backward_bf16(with_fp32 ? probs.f32() : nullptr, d16.data(), V, probs.f32(), targets.data(),
                                     N, V, scale);
    benchmark::DoNotOptimize(d16.data());
    benchmark::ClobberMemory();
  }
  // read probs [N, V]; write the bf16 copy [N, V] (and the fp32 gradient)
  report_bytes(state, N * V * (kF32 + 2 + (with_fp32 ? kF32 : 0)));
}
BENCHMARK_CAPTURE(BM_cross_entropy_backward_bf16, with_fp32, true)->Apply(thread_counts);
BENCHMARK_CAPTURE(BM_cross_entropy_backward_bf16, copy_alone, false)->Apply(thread_counts);

// ---------------------------------------------------------------- AdamW
// One step over W-GPT's parameter count, as one 2-D slot with weight decay.

void BM_adamw_step(benchmark::State& state) {
  start(state);
  static_assert(kGptParams % kC == 0);
  dpt::Layout layout;
  layout.begin_unit("all");
  layout.add("weight", {kGptParams / kC, kC}, true);
  dpt::OptimizerConfig config;
  config.name = "adamw";
  config.weight_decay = 0.1f;
  auto opt = dpt::make_optimizer(config, layout, 0, layout.numel());
  const auto n = static_cast<int64_t>(layout.numel());
  auto params = random_buffer(n, 71, -0.1f, 0.1f), grads = random_buffer(n, 72, -0.01f, 0.01f);
  for (auto _ : state) {
    opt->step(params.f32(), grads.f32(), 3e-4f);
    benchmark::DoNotOptimize(params.f32());
    benchmark::ClobberMemory();
  }
  // read grads; read and write params and the two moments m, v
  report_bytes(state, 7 * n * kF32);
}
BENCHMARK(BM_adamw_step)->Apply(thread_counts);

// One SGD-with-momentum step over W-MLP's parameter count (its optimizer),
// as one 2-D slot, with weight decay (W-MLP's default has none; it moves no
// more memory: p is read anyway), and what the next step needs of the
// gradients: zeros. Arg zeroed 0: the update keeps them and a memset clears
// them (the replicated strategies before GradsAfter::Zeroed); 1: the update
// clears them as it reads them.
void BM_sgd_step(benchmark::State& state) {
  start(state);
  const bool zeroed = state.range(1) != 0;
  constexpr int64_t rows = kMlpParams / kMlpHidden;
  dpt::Layout layout;
  layout.begin_unit("all");
  layout.add("weight", {rows, kMlpHidden}, true);
  dpt::OptimizerConfig config;
  config.weight_decay = 1e-4f;
  auto opt = dpt::make_optimizer(config, layout, 0, layout.numel());
  const auto n = static_cast<int64_t>(layout.numel());
  auto params = random_buffer(n, 73, -0.1f, 0.1f), grads = random_buffer(n, 74, -0.01f, 0.01f);
  for (auto _ : state) {
    if (zeroed) {
      opt->step(params.f32(), grads.f32(), 0.01f, dpt::GradsAfter::Zeroed);
    } else {
      opt->step(params.f32(), grads.f32(), 0.01f);
      std::memset(grads.f32(), 0, static_cast<size_t>(n) * kF32);
    }
    benchmark::DoNotOptimize(params.f32());
    benchmark::ClobberMemory();
  }
  // read grads; read and write params and the momentum; write the zeros
  report_bytes(state, 6 * n * kF32);
}
BENCHMARK(BM_sgd_step)->ArgNames({"threads", "zeroed"})->ArgsProduct({{1, 2}, {0, 1}})->UseRealTime();

// ---------------------------------------------------------------- long-context attention

// Causal grouped-query attention forward + backward, one sequence of T
// tokens, heads of 64: W-LLAMA's (4 query heads, 2 key/value heads) and
// W-GPT's (4 heads, no grouping): the unfused layer (probabilities kept,
// T x T per head) against the fused one (log-sum-exp kept). Args: T, query
// heads, key/value heads; one thread. (The --attention default's rule,
// docs/memory.md, is read off these.) The fused one also with a bf16 run's
// products (FlashProducts::BF16): on vdpbf16ps where the CPU has it, and
// through fp32 FMAs on the bf16 values (_fma: what runs without it).
void attention_case(benchmark::State& state, bool fused, dpt::FlashProducts products = dpt::FlashProducts::F32) {
  dpt::set_threads(1);
  const int64_t T = state.range(0), NH = state.range(1), NKV = state.range(2), hd = 64, ld = (NH + 2 * NKV) * hd;
  auto qkv = random_buffer(T * ld, 1), dout = random_buffer(T * NH * hd, 2);
  auto out = zero_buffer(T * NH * hd), dqkv = zero_buffer(T * ld);
  auto saved = zero_buffer(fused ? NH * T : NH * T * T);
  for (auto _ : state) {
    if (fused) {
      dpt::flash_attention_forward(out.f32(), saved.f32(), qkv.f32(), 1, T, NH, NKV, hd, products);
      dpt::flash_attention_backward(dqkv.f32(), dout.f32(), qkv.f32(), out.f32(), saved.f32(), 1, T, NH, NKV, hd,
                                    products);
    } else {
      dpt::gqa_attention_forward(out.f32(), saved.f32(), qkv.f32(), 1, T, NH, NKV, hd);
      dpt::gqa_attention_backward(dqkv.f32(), dout.f32(), qkv.f32(), saved.f32(), 1, T, NH, NKV, hd);
    }
    benchmark::DoNotOptimize(dqkv.f32());
  }
  state.counters["saved_MiB"] = static_cast<double>(saved.bytes()) / (1 << 20);
  // Causal: about half of the 4 T^2 hd multiply-adds of each of the 2
  // forward and 5 backward products (QK^T, PV; recompute, dV, dP, dQ, dK).
  report_flops(state, 2.0 * NH * T * T * hd * 7.0 / 2.0);
}
void BM_attention_unfused(benchmark::State& state) { attention_case(state, false); }
void BM_attention_fused(benchmark::State& state) { attention_case(state, true); }
void BM_attention_fused_bf16(benchmark::State& state) {
  state.counters["dpbf16"] = dpt::flash_attention_dpbf16() ? 1 : 0;
  attention_case(state, true, dpt::FlashProducts::BF16);
}
void BM_attention_fused_bf16_fma(benchmark::State& state) {
  dpt::set_flash_attention_no_dpbf16_for_testing(true);
  attention_case(state, true, dpt::FlashProducts::BF16);
  dpt::set_flash_attention_no_dpbf16_for_testing(false);
}
void attention_shapes(benchmark::internal::Benchmark* b, int64_t max_T) {
  b->ArgNames({"T", "heads", "kv"});
  for (int64_t T : {16, 32, 64, 128, 256, 512, 2048, 8192})
    if (T <= max_T)
      for (int64_t kv : {2, 4}) b->Args({T, 4, kv});
  b->UseRealTime();
}
// The unfused layer at 8192 would hold 1 GiB per head: not run.
BENCHMARK(BM_attention_unfused)->Apply([](benchmark::internal::Benchmark* b) { attention_shapes(b, 2048); });
BENCHMARK(BM_attention_fused)->Apply([](benchmark::internal::Benchmark* b) { attention_shapes(b, 8192); });
BENCHMARK(BM_attention_fused_bf16)->Apply([](benchmark::internal::Benchmark* b) { attention_shapes(b, 8192); });
BENCHMARK(BM_attention_fused_bf16_fma)->Apply([](benchmark::internal::Benchmark* b) { attention_shapes(b, 8192); });

}  // namespace
