#include "nn/vocab_parallel.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

namespace dpt {

template <typename T>
void vocab_embedding_forward(float* out, const int32_t* ids, const T* table, int64_t lo, int64_t rows, int64_t N,
                             int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    float* o = out + n * C;
    const int64_t r = static_cast<int64_t>(ids[n]) - lo;
    if (r < 0 || r >= rows) {
      std::memset(o, 0, sizeof(float) * static_cast<size_t>(C));
      continue;
    }
    const T* row = table + r * C;
    if constexpr (std::is_same_v<T, float>)
      std::memcpy(o, row, sizeof(float) * static_cast<size_t>(C));
    else
      for (int64_t c = 0; c < C; ++c) o[c] = to_f32(row[c]);
  }
}
template void vocab_embedding_forward(float*, const int32_t*, const float*, int64_t, int64_t, int64_t, int64_t);
template void vocab_embedding_forward(float*, const int32_t*, const bf16*, int64_t, int64_t, int64_t, int64_t);

void vocab_embedding_backward(float* dtable, const float* dout, const int32_t* ids, int64_t lo, int64_t rows,
                              int64_t N, int64_t C) {
  // As embedding_backward: threads split the channels, so a repeated id
  // never has two writers.
#pragma omp parallel for schedule(static)
  for (int64_t c0 = 0; c0 < C; c0 += 16) {
    const int64_t c1 = c0 + 16 < C ? c0 + 16 : C;
    for (int64_t n = 0; n < N; ++n) {
      const int64_t r = static_cast<int64_t>(ids[n]) - lo;
      if (r < 0 || r >= rows) continue;
      float* d = dtable + r * C;
      const float* g = dout + n * C;
      for (int64_t c = c0; c < c1; ++c) d[c] += g[c];
    }
  }
}

void vocab_ce_max(float* zmax, const float* logits, int64_t N, int64_t width, int64_t live) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* z = logits + n * width;
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t v = 0; v < live; ++v) m = z[v] > m ? z[v] : m;
    zmax[n] = m;
  }
}

void vocab_ce_exp(float* logits, float* sums, const float* zmax, const int32_t* targets, int64_t lo, int64_t N,
                  int64_t width, int64_t live) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    float* z = logits + n * width;
    const int64_t t = static_cast<int64_t>(targets[n]) - lo;
    // Read before the exponentials overwrite it; exact in the group's sum,
    // where every other rank adds 0.
    sums[N + n] = t >= 0 && t < live ? z[t] : 0.0f;
    float sum = 0.0f;
    for (int64_t v = 0; v < live; ++v) {
      z[v] = std::exp(z[v] - zmax[n]);
      sum += z[v];
    }
    for (int64_t v = live; v < width; ++v) z[v] = 0.0f;
    sums[n] = sum;
  }
}

float vocab_ce_loss(float* logits, const float* sums, const float* zmax, int64_t N, int64_t width, int64_t live,
                    int64_t* correct) {
  double loss = 0.0;
  int64_t hits = 0;
#pragma omp parallel for reduction(+ : loss, hits) schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    float* p = logits + n * width;
    const float inv = 1.0f / sums[n];
    for (int64_t v = 0; v < live; ++v) p[v] *= inv;
    // log p[t] from the logits, as cross_entropy_forward: exact for tiny p.
    const float zt = sums[N + n];
    loss += static_cast<double>(std::log(sums[n]) - (zt - zmax[n]));
    hits += zt == zmax[n];
  }
  if (correct) *correct = hits;
  return N > 0 ? static_cast<float>(loss / static_cast<double>(N)) : 0.0f;
}

void vocab_ce_backward(float* probs, const int32_t* targets, int64_t lo, int64_t N, int64_t width, int64_t live,
                       float scale) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    float* d = probs + n * width;
    for (int64_t v = 0; v < live; ++v) d[v] *= scale;
    const int64_t t = static_cast<int64_t>(targets[n]) - lo;
    if (t >= 0 && t < live) d[t] -= scale;
  }
}

}  // namespace dpt
