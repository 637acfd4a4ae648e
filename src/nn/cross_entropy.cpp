#include "nn/cross_entropy.h"

#include <algorithm>
#include <cmath>

#include "core/cpu_level.h"

namespace dpt {

namespace {

constexpr int64_t kArgmaxBlock = 64;

// A row's largest logit, and in *arg the first column holding it (what a
// scan keeping the first strictly larger value finds), in one pass: each
// block's maximum in vectors (a scalar scan that tracks the column would
// not vectorize: it was half of the forward's time at a 50,257-word
// vocabulary), the first block whose maximum beats the earlier blocks'
// kept, and that block alone scanned for the column.
__attribute__((always_inline)) inline float row_argmax(const float* z, int64_t V, int64_t* arg) {
  float m = z[0];
  int64_t best = 0;
  for (int64_t b0 = 0; b0 < V; b0 += kArgmaxBlock) {
    const int64_t b1 = std::min(V, b0 + kArgmaxBlock);
    float bm = z[b0];
    for (int64_t v = b0 + 1; v < b1; ++v) bm = std::max(bm, z[v]);
    if (bm > m) m = bm, best = b0;
  }
  // Bounded by the block: a NaN logit (this file is built with
  // -ffast-math, whose comparisons assume none) must not run the scan off
  // the row.
  const int64_t end = std::min(V, best + kArgmaxBlock);
  int64_t v = best;
  while (v + 1 < end && z[v] != m) ++v;
  *arg = v;
  return m;
}

}  // namespace

DPT_CPU_CLONES float cross_entropy_forward(float* probs, const float* logits, const int32_t* targets, int64_t N,
                            int64_t V, int64_t* correct) {
  double loss = 0.0;
  int64_t hits = 0;
#pragma omp parallel for reduction(+ : loss, hits) schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* z = logits + n * V;
    float* p = probs + n * V;
    int64_t arg = 0;
    const float zmax = row_argmax(z, V, &arg);
    int32_t t = targets[n];
    float zt = z[t];  // read before p (which may alias z) overwrites it
    float sum = 0.0f;
    for (int64_t v = 0; v < V; ++v) {
      p[v] = std::exp(z[v] - zmax);
      sum += p[v];
    }
    float inv = 1.0f / sum;
    for (int64_t v = 0; v < V; ++v) p[v] *= inv;
    // log p[t] from the logits, not the rounded probability: exact for tiny p.
    loss += static_cast<double>(std::log(sum) - (zt - zmax));
    hits += (arg == t);
  }
  if (correct) *correct = hits;
  return N > 0 ? static_cast<float>(loss / static_cast<double>(N)) : 0.0f;
}

DPT_CPU_CLONES void cross_entropy_backward(float* dlogits, const float* probs, const int32_t* targets, int64_t N,
                            int64_t V, float scale) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* p = probs + n * V;
    float* d = dlogits + n * V;
    for (int64_t v = 0; v < V; ++v) d[v] = p[v] * scale;
    d[targets[n]] -= scale;
  }
}

DPT_CPU_CLONES void cross_entropy_backward_bf16(float* dlogits, bf16* dlogits16, int64_t ld16, const float* probs,
                                                const int32_t* targets, int64_t N, int64_t V, float scale) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* p = probs + n * V;
    bf16* d16 = dlogits16 + n * ld16;
    const int32_t t = targets[n];
    std::fill(d16 + V, d16 + ld16, bf16{0});
    if (!dlogits) {
#pragma omp simd
      for (int64_t v = 0; v < V; ++v) d16[v] = to_bf16(p[v] * scale);
      // The target's value rounded to fp32 before the one-hot is taken
      // out, as the fp32 gradient below has it: volatile keeps GCC from
      // fusing the two into one multiply-add (this file is -ffast-math).
      const volatile float pt = p[t] * scale;
      d16[t] = to_bf16(pt - scale);
      continue;
    }
    float* d = dlogits + n * V;
    for (int64_t v = 0; v < V; ++v) d[v] = p[v] * scale;
    d[t] -= scale;
#pragma omp simd
    for (int64_t v = 0; v < V; ++v) d16[v] = to_bf16(d[v]);
  }
}

}  // namespace dpt
