#include "nn/cached_attention.h"

#include <cmath>
#include <vector>

#include "core/cpu_level.h"
#include "nn/fast_exp.h"
#include "nn/gemm.h"

namespace dpt {

namespace {

// Softmax of row[0, m) in place.
inline void softmax_prefix(float* row, int64_t m) {
  float mx = row[0];
#pragma omp simd reduction(max : mx)
  for (int64_t s = 0; s < m; ++s) mx = row[s] > mx ? row[s] : mx;
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t s = 0; s < m; ++s) {
    row[s] = fast_exp(row[s] - mx);
    sum += row[s];
  }
  const float inv = 1.0f / sum;
#pragma omp simd
  for (int64_t s = 0; s < m; ++s) row[s] *= inv;
}

// One query row of one head over cached positions [0, m): scores into
// `scores` [m], the output into y [hd].
inline void one_query(float* y, float* scores, const float* q, const float* k, const float* v, int64_t ldkv,
                      int64_t m, int64_t hd, float scale) {
  for (int64_t s = 0; s < m; ++s) {
    const float* ks = k + s * ldkv;
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int64_t i = 0; i < hd; ++i) dot += q[i] * ks[i];
    scores[s] = dot * scale;
  }
  softmax_prefix(scores, m);
  for (int64_t i = 0; i < hd; ++i) y[i] = 0.0f;
  for (int64_t s = 0; s < m; ++s) {
    const float* vs = v + s * ldkv;
    const float a = scores[s];
#pragma omp simd
    for (int64_t i = 0; i < hd; ++i) y[i] += a * vs[i];
  }
}

}  // namespace

DPT_CPU_CLONES void cached_attention_forward(float* out, const float* q, int64_t ldq, const float* kc,
                                             const float* vc, int64_t n, int64_t p0, int64_t NH, int64_t NKV,
                                             int64_t hd) {
  const int64_t ldkv = NKV * hd, ldo = NH * hd, group = NH / NKV, P = p0 + n;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
#pragma omp parallel
  {
    // Scores of one head's rows, per thread, kept between calls.
    static thread_local std::vector<float> scores;
    scores.resize(static_cast<size_t>(n * P));
    float* S = scores.data();
    // Inside the parallel region a GEMM runs on the calling thread.
#pragma omp for schedule(static)
    for (int64_t h = 0; h < NH; ++h) {
      const int64_t g = h / group;
      const float* k = kc + g * hd;
      const float* v = vc + g * hd;
      if (n == 1) {
        one_query(out + h * hd, S, q + h * hd, k, v, ldkv, P, hd, scale);
        continue;
      }
      gemm(Op::N, Op::T, n, P, hd, scale, q + h * hd, ldq, k, ldkv, 0.0f, S, P);
      for (int64_t t = 0; t < n; ++t) {
        float* row = S + t * P;
        softmax_prefix(row, p0 + t + 1);
        for (int64_t s = p0 + t + 1; s < P; ++s) row[s] = 0.0f;
      }
      gemm(Op::N, Op::N, n, hd, P, 1.0f, S, P, v, ldkv, 0.0f, out + h * hd, ldo);
    }
  }
}

}  // namespace dpt
