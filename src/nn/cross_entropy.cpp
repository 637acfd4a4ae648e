#include "nn/cross_entropy.h"

#include <cmath>

#include "core/cpu_level.h"

namespace dpt {

DPT_CPU_CLONES float cross_entropy_forward(float* probs, const float* logits, const int32_t* targets, int64_t N,
                            int64_t V, int64_t* correct) {
  double loss = 0.0;
  int64_t hits = 0;
#pragma omp parallel for reduction(+ : loss, hits) schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* z = logits + n * V;
    float* p = probs + n * V;
    float zmax = z[0];
    int64_t arg = 0;
    for (int64_t v = 1; v < V; ++v)
      if (z[v] > zmax) zmax = z[v], arg = v;
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

DPT_CPU_CLONES void cross_entropy_backward_bf16(float* dlogits, bf16* dlogits16, const float* probs,
                                                const int32_t* targets, int64_t N, int64_t V, float scale) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* p = probs + n * V;
    float* d = dlogits + n * V;
    bf16* d16 = dlogits16 + n * V;
    for (int64_t v = 0; v < V; ++v) d[v] = p[v] * scale;
    d[targets[n]] -= scale;
#pragma omp simd
    for (int64_t v = 0; v < V; ++v) d16[v] = to_bf16(d[v]);
  }
}

}  // namespace dpt
