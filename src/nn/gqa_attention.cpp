#include "nn/gqa_attention.h"

#include <cmath>
#include <vector>

#include "core/cpu_level.h"
#include "nn/fast_exp.h"
#include "nn/gemm.h"

namespace dpt {

namespace {

// Causal softmax of row t of a T x T score matrix, in place: columns 0..t,
// the rest set to 0.
inline void causal_softmax_row(float* row, int64_t t, int64_t T) {
  float m = row[0];
#pragma omp simd reduction(max : m)
  for (int64_t s = 0; s <= t; ++s) m = row[s] > m ? row[s] : m;
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t s = 0; s <= t; ++s) {
    row[s] = fast_exp(row[s] - m);
    sum += row[s];
  }
  const float inv = 1.0f / sum;
#pragma omp simd
  for (int64_t s = 0; s <= t; ++s) row[s] *= inv;
  for (int64_t s = t + 1; s < T; ++s) row[s] = 0.0f;
}

// Softmax backward of row t in place: d = att * (d - sum(att * d)); the
// masked columns get no gradient.
inline void causal_softmax_backward_row(float* d, const float* a, int64_t t, int64_t T) {
  float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
  for (int64_t s = 0; s <= t; ++s) dot += a[s] * d[s];
#pragma omp simd
  for (int64_t s = 0; s <= t; ++s) d[s] = a[s] * (d[s] - dot);
  for (int64_t s = t + 1; s < T; ++s) d[s] = 0.0f;
}

}  // namespace

DPT_CPU_CLONES void gqa_attention_forward(float* out, float* att, const float* qkv, int64_t B, int64_t T,
                                          int64_t NH, int64_t NKV, int64_t hd) {
  const int64_t ld = (NH + 2 * NKV) * hd, ldo = NH * hd, group = NH / NKV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  // Inside a parallel region the GEMM layer runs on the calling thread, so
  // each small GEMM stays with its (b, h) pair (as nn/attention.cpp).
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h) {
      const int64_t g = h / group;
      const float* q = qkv + b * T * ld + h * hd;
      const float* k = qkv + b * T * ld + (NH + g) * hd;
      const float* v = qkv + b * T * ld + (NH + NKV + g) * hd;
      float* a = att + (b * NH + h) * T * T;
      gemm(Op::N, Op::T, T, T, hd, scale, q, ld, k, ld, 0.0f, a, T);
      for (int64_t t = 0; t < T; ++t) causal_softmax_row(a + t * T, t, T);
      gemm(Op::N, Op::N, T, hd, T, 1.0f, a, T, v, ld, 0.0f, out + b * T * ldo + h * hd, ldo);
    }
}

DPT_CPU_CLONES void gqa_attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att,
                                           int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t hd) {
  const int64_t ld = (NH + 2 * NKV) * hd, ldo = NH * hd, group = NH / NKV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
#pragma omp parallel
  {
    // One T x T scratch per thread, kept between calls.
    static thread_local std::vector<float> datt;
    datt.resize(static_cast<size_t>(T * T));
    float* d = datt.data();
#pragma omp for collapse(2) schedule(static)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t g = 0; g < NKV; ++g) {
        const float* k = qkv + b * T * ld + (NH + g) * hd;
        const float* v = qkv + b * T * ld + (NH + NKV + g) * hd;
        float* dk = dqkv + b * T * ld + (NH + g) * hd;
        float* dv = dqkv + b * T * ld + (NH + NKV + g) * hd;
        // The group's query heads in order; the first writes dk and dv
        // (beta 0), the others add to them (beta 1).
        for (int64_t h = g * group; h < (g + 1) * group; ++h) {
          const float beta = h == g * group ? 0.0f : 1.0f;
          const float* q = qkv + b * T * ld + h * hd;
          float* dq = dqkv + b * T * ld + h * hd;
          const float* a = att + (b * NH + h) * T * T;
          const float* dy = dout + b * T * ldo + h * hd;
          // datt = dy v^T ; dv (+)= att^T dy
          gemm(Op::N, Op::T, T, T, hd, 1.0f, dy, ldo, v, ld, 0.0f, d, T);
          gemm(Op::T, Op::N, T, hd, T, 1.0f, a, T, dy, ldo, beta, dv, ld);
          for (int64_t t = 0; t < T; ++t) causal_softmax_backward_row(d + t * T, a + t * T, t, T);
          // pre = scale q k^T  =>  dq = scale dpre k ; dk (+)= scale dpre^T q
          gemm(Op::N, Op::N, T, hd, T, scale, d, T, k, ld, 0.0f, dq, ld);
          gemm(Op::T, Op::N, T, hd, T, scale, d, T, q, ld, beta, dk, ld);
        }
      }
  }
}

}  // namespace dpt
