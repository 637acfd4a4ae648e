#include "nn/attention.h"

#include <cmath>
#include <vector>

#include "core/cpu_level.h"
#include "nn/gemm.h"

namespace dpt {

DPT_CPU_CLONES void attention_forward(float* out, float* att, const float* qkv, int64_t B, int64_t T, int64_t C,
                       int64_t NH) {
  const int64_t hs = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  // Inside a parallel region the GEMM layer runs on the calling thread (both
  // backends), so each of these small GEMMs stays with its (b, h) pair.
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h) {
      const float* q = qkv + b * T * C3 + h * hs;
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* a = att + (b * NH + h) * T * T;
      // Row t needs only columns 0..t; the GEMM computes the full square
      // (cheaper than T small calls) and the softmax masks the rest.
      gemm(Op::N, Op::T, T, T, hs, scale, q, C3, k, C3, 0.0f, a, T);
      for (int64_t t = 0; t < T; ++t) {
        float* row = a + t * T;
        float m = row[0];
        for (int64_t s = 1; s <= t; ++s) m = row[s] > m ? row[s] : m;
        float sum = 0.0f;
        for (int64_t s = 0; s <= t; ++s) {
          row[s] = std::exp(row[s] - m);
          sum += row[s];
        }
        float inv = 1.0f / sum;
        for (int64_t s = 0; s <= t; ++s) row[s] *= inv;
        for (int64_t s = t + 1; s < T; ++s) row[s] = 0.0f;
      }
      gemm(Op::N, Op::N, T, hs, T, 1.0f, a, T, v, C3, 0.0f, out + b * T * C + h * hs, C);
    }
}

DPT_CPU_CLONES void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att,
                        int64_t B, int64_t T, int64_t C, int64_t NH) {
  const int64_t hs = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
#pragma omp parallel
  {
    // One T x T scratch per thread, kept between calls (no allocation per step).
    static thread_local std::vector<float> datt;
    datt.resize(static_cast<size_t>(T * T));
#pragma omp for collapse(2) schedule(static)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < NH; ++h) {
        const float* q = qkv + b * T * C3 + h * hs;
        const float* k = q + C;
        const float* v = q + 2 * C;
        float* dq = dqkv + b * T * C3 + h * hs;
        float* dk = dq + C;
        float* dv = dq + 2 * C;
        const float* a = att + (b * NH + h) * T * T;
        const float* dy = dout + b * T * C + h * hs;
        float* d = datt.data();
        // datt = dy v^T ; dv = att^T dy
        gemm(Op::N, Op::T, T, T, hs, 1.0f, dy, C, v, C3, 0.0f, d, T);
        gemm(Op::T, Op::N, T, hs, T, 1.0f, a, T, dy, C, 0.0f, dv, C3);
        // Softmax backward per row: dpre = att * (datt - sum(att * datt)).
        // Masked entries have att = 0, so they get no gradient.
        for (int64_t t = 0; t < T; ++t) {
          const float* ar = a + t * T;
          float* dr = d + t * T;
          float dot = 0.0f;
          for (int64_t s = 0; s <= t; ++s) dot += ar[s] * dr[s];
          for (int64_t s = 0; s <= t; ++s) dr[s] = ar[s] * (dr[s] - dot);
          for (int64_t s = t + 1; s < T; ++s) dr[s] = 0.0f;
        }
        // pre = scale q k^T  =>  dq = scale dpre k ; dk = scale dpre^T q
        gemm(Op::N, Op::N, T, hs, T, scale, d, T, k, C3, 0.0f, dq, C3);
        gemm(Op::T, Op::N, T, hs, T, scale, d, T, q, C3, 0.0f, dk, C3);
      }
  }
}

}  // namespace dpt
