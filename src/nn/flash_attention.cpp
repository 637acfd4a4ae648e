#include "nn/flash_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/cpu_level.h"
#include "nn/fast_exp.h"
#include "nn/gemm.h"

namespace dpt {

namespace {

struct Shape {
  int64_t B, T, NH, NKV, hd;
  int64_t ld() const { return (NH + 2 * NKV) * hd; }
  int64_t ldo() const { return NH * hd; }
  int64_t group() const { return NH / NKV; }
};

// One query tile [i0, i0 + ni) of head h against every key tile up to the
// diagonal, into out's rows; lse of its rows.
// (Compiled twice, as the kernels are: its exp and rescaling loops are
// most of the fused kernel's non-GEMM time.)
DPT_CPU_CLONES void forward_tile(const Shape& s, const float* q, const float* k, const float* v, float* o,
                                 float* lse, int64_t i0, int64_t ni, float scale, std::vector<float>& scratch) {
  const int64_t ld = s.ld(), ldo = s.ldo(), Bk = kFlashTile;
  scratch.resize(static_cast<size_t>(ni * Bk + 2 * ni));
  float *S = scratch.data(), *m = S + ni * Bk, *l = m + ni;
  std::fill(m, m + ni, -std::numeric_limits<float>::infinity());
  std::fill(l, l + ni, 0.0f);
  for (int64_t r = 0; r < ni; ++r) std::fill(o + (i0 + r) * ldo, o + (i0 + r) * ldo + s.hd, 0.0f);
  for (int64_t j0 = 0; j0 < i0 + ni; j0 += Bk) {
    const int64_t nj = std::min(Bk, s.T - j0);
    gemm(Op::N, Op::T, ni, nj, s.hd, scale, q + i0 * ld, ld, k + j0 * ld, ld, 0.0f, S, Bk);
    for (int64_t r = 0; r < ni; ++r) {
      float* row = S + r * Bk;
      const int64_t live = std::clamp<int64_t>(i0 + r + 1 - j0, 0, nj);  // keys j0 .. t
      float mx = m[r];
      for (int64_t c = 0; c < live; ++c) mx = std::max(mx, row[c]);
      const float keep = live > 0 ? fast_exp(m[r] - mx) : 1.0f;
      float sum = 0.0f;
      for (int64_t c = 0; c < live; ++c) sum += (row[c] = fast_exp(row[c] - mx));
      std::fill(row + live, row + nj, 0.0f);
      if (live > 0) {
        float* orow = o + (i0 + r) * ldo;
        for (int64_t d = 0; d < s.hd; ++d) orow[d] *= keep;
        l[r] = l[r] * keep + sum;
        m[r] = mx;
      }
    }
    gemm(Op::N, Op::N, ni, s.hd, nj, 1.0f, S, Bk, v + j0 * ld, ld, 1.0f, o + i0 * ldo, ldo);
  }
  for (int64_t r = 0; r < ni; ++r) {
    const float inv = 1.0f / l[r];
    float* orow = o + (i0 + r) * ldo;
    for (int64_t d = 0; d < s.hd; ++d) orow[d] *= inv;
    lse[i0 + r] = m[r] + std::log(l[r]);
  }
}

// Scratch of one backward tile pair.
struct BackScratch {
  std::vector<float> P, dP, D;
};

// Query tile [i0, i0 + ni) of one head against key tile [j0, j0 + nj):
// the probabilities again from lse, then dV, dQ and dK of the pair.
DPT_CPU_CLONES void backward_pair(const Shape& s, const float* q, const float* k, const float* v,
                                  const float* dout, const float* lse, const float* D, float* dq, float* dk, float* dv,
                                  int64_t i0, int64_t ni, int64_t j0, int64_t nj, float scale, BackScratch& w) {
  const int64_t ld = s.ld(), ldo = s.ldo(), Bk = kFlashTile;
  float *P = w.P.data(), *dP = w.dP.data();
  gemm(Op::N, Op::T, ni, nj, s.hd, scale, q + i0 * ld, ld, k + j0 * ld, ld, 0.0f, P, Bk);
  gemm(Op::N, Op::T, ni, nj, s.hd, 1.0f, dout + i0 * ldo, ldo, v + j0 * ld, ld, 0.0f, dP, Bk);
  for (int64_t r = 0; r < ni; ++r) {
    const int64_t live = std::clamp<int64_t>(i0 + r + 1 - j0, 0, nj);
    float *p = P + r * Bk, *dp = dP + r * Bk;
    for (int64_t c = 0; c < live; ++c) {
      p[c] = fast_exp(p[c] - lse[i0 + r]);
      dp[c] = p[c] * (dp[c] - D[i0 + r]) * scale;  // dS, with the score's scale
    }
    std::fill(p + live, p + nj, 0.0f);
    std::fill(dp + live, dp + nj, 0.0f);
  }
  gemm(Op::T, Op::N, nj, s.hd, ni, 1.0f, P, Bk, dout + i0 * ldo, ldo, 1.0f, dv + j0 * ld, ld);
  gemm(Op::N, Op::N, ni, s.hd, nj, 1.0f, dP, Bk, k + j0 * ld, ld, 1.0f, dq + i0 * ld, ld);
  gemm(Op::T, Op::N, nj, s.hd, ni, 1.0f, dP, Bk, q + i0 * ld, ld, 1.0f, dk + j0 * ld, ld);
}

}  // namespace

DPT_CPU_CLONES void flash_attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T,
                                            int64_t NH, int64_t NKV, int64_t hd) {
  const Shape s{B, T, NH, NKV, hd};
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t tiles = (T + kFlashTile - 1) / kFlashTile;
#pragma omp parallel
  {
    static thread_local std::vector<float> scratch;
#pragma omp for collapse(3) schedule(static)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < NH; ++h)
        for (int64_t i = 0; i < tiles; ++i) {
          const float* base = qkv + b * T * s.ld();
          const int64_t g = h / s.group(), i0 = i * kFlashTile;
          forward_tile(s, base + h * hd, base + (NH + g) * hd, base + (NH + NKV + g) * hd,
                       out + b * T * s.ldo() + h * hd, lse + (b * NH + h) * T, i0, std::min(kFlashTile, T - i0),
                       scale, scratch);
        }
  }
}

DPT_CPU_CLONES void flash_attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                                             const float* lse, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                                             int64_t hd) {
  const Shape s{B, T, NH, NKV, hd};
  const int64_t ld = s.ld(), ldo = s.ldo(), Bt = kFlashTile;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
#pragma omp parallel
  {
    static thread_local BackScratch w;
    w.P.resize(static_cast<size_t>(Bt * Bt));
    w.dP.resize(static_cast<size_t>(Bt * Bt));
    w.D.resize(static_cast<size_t>(T));
#pragma omp for collapse(2) schedule(static)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t g = 0; g < NKV; ++g) {
        const float* base = qkv + b * T * ld;
        float* dbase = dqkv + b * T * ld;
        for (int64_t t = 0; t < T; ++t) {  // this pair's dk, dv rows and its heads' dq rows start at zero
          std::fill(dbase + t * ld + (NH + g) * hd, dbase + t * ld + (NH + g + 1) * hd, 0.0f);
          std::fill(dbase + t * ld + (NH + NKV + g) * hd, dbase + t * ld + (NH + NKV + g + 1) * hd, 0.0f);
          std::fill(dbase + t * ld + g * s.group() * hd, dbase + t * ld + (g + 1) * s.group() * hd, 0.0f);
        }
        for (int64_t h = g * s.group(); h < (g + 1) * s.group(); ++h) {
          const float* o = out + b * T * ldo + h * hd;
          const float* dO = dout + b * T * ldo + h * hd;
          for (int64_t t = 0; t < T; ++t) {  // D = rowsum(dO * O)
            float d = 0.0f;
            for (int64_t c = 0; c < hd; ++c) d += dO[t * ldo + c] * o[t * ldo + c];
            w.D[static_cast<size_t>(t)] = d;
          }
          for (int64_t i0 = 0; i0 < T; i0 += Bt)
            for (int64_t j0 = 0; j0 <= i0; j0 += Bt)
              backward_pair(s, base + h * hd, base + (NH + g) * hd, base + (NH + NKV + g) * hd, dO,
                            lse + (b * NH + h) * T, w.D.data(), dbase + h * hd, dbase + (NH + g) * hd,
                            dbase + (NH + NKV + g) * hd, i0, std::min(Bt, T - i0), j0, std::min(Bt, T - j0), scale,
                            w);
        }
      }
  }
}

}  // namespace dpt
