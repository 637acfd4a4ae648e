// The backward split in B and W (zb-h1, zb-v: docs/pipeline.md) against the
// unsplit backward, on one pipeline chunk of W-GPT and of W-LLAMA as
// bench/pp_schedules_bench.py runs them (pp 2, M = 8: 2 blocks, no embedding
// or head, micro-batches of 2 x 128 tokens, one thread). Each iteration runs
// the chunk's forward (not timed) and then its backward: BW, or B then W.
//
//   build/bench/bench_split_backward --benchmark_repetitions=9
//     --benchmark_enable_random_interleaving=true --benchmark_report_aggregates_only=true
//   (one line; compare CPU times on a shared machine: one thread each)
//
// (Random interleaving spreads a shared machine's drift over both cases.)
#include <benchmark/benchmark.h>

#include <algorithm>
#include <random>
#include <vector>

#include "core/threads.h"
#include "data/batches.h"
#include "models/decoder.h"

namespace {

using namespace dpt;

DecoderConfig workload(bool llama) {
  DecoderConfig c = llama ? DecoderConfig::llama() : DecoderConfig{};
  if (!llama) c.layers = 4, c.heads = 4, c.width = 256, c.context = 128;  // W-GPT
  return c;
}

void BM_chunk_backward(benchmark::State& state, bool llama, bool split) {
  set_threads(1);
  const DecoderConfig c = workload(llama);
  DecoderStage stage;
  stage.chunks = {BlockRange{0, c.layers / 2}};
  stage.embed = false;
  stage.head = false;
  Decoder m(c, stage);
  m.init_params(3);
  m.set_fused_attention(true);  // the CPU's default
  m.set_split_backward(split);
  const int64_t B = 2, N = B * c.context;
  Batch batch;
  fill_synthetic(m, B, 7, batch);
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(N * c.width)), dy(x.size());
  for (float& v : x) v = normal(rng);
  for (float& v : dy) v = 1e-3f * normal(rng);
  m.zero_grads();
  for (auto _ : state) {
    state.PauseTiming();
    m.prepare(B, c.context);
    std::copy(x.begin(), x.end(), m.stage_input());
    m.forward(batch);
    std::copy(dy.begin(), dy.end(), m.output_grad());
    state.ResumeTiming();
    if (split) {
      m.backward_input(1.0f);
      m.backward_weights();
    } else {
      m.backward(1.0f);
    }
    benchmark::ClobberMemory();
  }
}

BENCHMARK_CAPTURE(BM_chunk_backward, wgpt_bw, false, false)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_chunk_backward, wgpt_b_w, false, true)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_chunk_backward, wllama_bw, true, false)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_chunk_backward, wllama_b_w, true, true)->Unit(benchmark::kMillisecond);

}  // namespace
