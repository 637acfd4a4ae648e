#include "nn/linear.h"

#include <algorithm>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/cpu_level.h"
#include "core/error.h"
#include "core/threads.h"

#include "nn/gemm.h"

namespace dpt {

template <typename T>
void linear_forward(float* out, const T* inp, const T* weight, const float* bias, int64_t N, int64_t C,
                    int64_t OC) {
  if (bias)
    gemm_bias(Op::N, Op::T, N, OC, C, inp, C, weight, C, bias, out, OC);
  else
    gemm(Op::N, Op::T, N, OC, C, 1.0f, inp, C, weight, C, 0.0f, out, OC);
}

template <typename T>
void linear_backward_input(float* dinp, const T* dout, const T* weight, int64_t N, int64_t C, int64_t OC) {
  gemm(Op::N, Op::N, N, C, OC, 1.0f, dout, OC, weight, C, 0.0f, dinp, C);
}

template <typename T>
void linear_backward_weight(float* dweight, const T* dout, const T* inp, int64_t N, int64_t C, int64_t OC,
                            int64_t o0, int64_t o1) {
  // dout[:, o0:o1] is a column block of a row-major [N, OC] matrix: lda = OC.
  gemm(Op::T, Op::N, o1 - o0, C, N, 1.0f, dout + o0, OC, inp, C, 1.0f, dweight + o0 * C, C);
}

DPT_CPU_CLONES void linear_backward_bias(float* dbias, const float* dout, int64_t N, int64_t OC) {
  // Column sums; threads split the columns so no two write the same bias.
#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (int64_t o0 = 0; o0 < OC; o0 += 64) {
      int64_t o1 = o0 + 64 < OC ? o0 + 64 : OC;
      float acc[64] = {0};
      for (int64_t n = 0; n < N; ++n) {
        const float* row = dout + n * OC;
        for (int64_t o = o0; o < o1; ++o) acc[o - o0] += row[o];
      }
      for (int64_t o = o0; o < o1; ++o) dbias[o] += acc[o - o0];
    }
  }
}

DPT_CPU_CLONES void linear_backward_bias_bf16(float* dbias, bf16* dout16, const float* dout, int64_t N,
                                              int64_t OC) {
  // Rows read in order (each thread its range of whole 64-byte lines of
  // columns), each column summed from zero as linear_backward_bias sums it.
#pragma omp parallel
  {
    const auto [c0, c1] = thread_span16(OC);
    static thread_local std::vector<float> sums;
    sums.assign(static_cast<size_t>(c1 - c0), 0.0f);
    float* acc = sums.data();
    for (int64_t n = 0; n < N && c0 < c1; ++n) {
      const float* dy = dout + n * OC + c0;
      bf16* d16 = dout16 + n * OC + c0;
#pragma omp simd
      for (int64_t c = 0; c < c1 - c0; ++c) {
        d16[c] = to_bf16(dy[c]);
        acc[c] += dy[c];
      }
    }
    for (int64_t c = c0; c < c1; ++c) dbias[c] += acc[c - c0];
  }
}

template <typename T>
void linear_backward(float* dinp, float* dweight, float* dbias, const T* dout, const T* inp, const T* weight,
                     int64_t N, int64_t C, int64_t OC, const float* dout_bias) {
  // A split backward (models/decoder_split.cpp) asks for the input's
  // gradient alone (no dweight) or the parameters' alone (no dinp).
  if constexpr (std::is_same_v<T, bf16>) {
    if (dinp && dweight && !gemm_bf16_native()) {
      // Both GEMMs widen the output gradient (nn/gemm.h): widen it once
      // and run the same fp32 GEMMs on the same values (the same bits).
      static thread_local std::vector<float> d32, w32, x32;
      for (auto [v, n] : {std::pair{&d32, N * OC}, std::pair{&w32, OC * C}, std::pair{&x32, N * C}})
        if (v->size() < static_cast<size_t>(n)) v->resize(static_cast<size_t>(n));
      gemm_widen(d32.data(), dout, static_cast<size_t>(N * OC));
      gemm_widen(w32.data(), weight, static_cast<size_t>(OC * C));
      gemm_widen(x32.data(), inp, static_cast<size_t>(N * C));
      linear_backward_input(dinp, d32.data(), w32.data(), N, C, OC);
      linear_backward_weight(dweight, d32.data(), x32.data(), N, C, OC, 0, OC);
      dinp = dweight = nullptr;
    }
  }
  if (dinp) linear_backward_input(dinp, dout, weight, N, C, OC);
  if (dweight) linear_backward_weight(dweight, dout, inp, N, C, OC, 0, OC);
  if (!dbias) return;
  if constexpr (std::is_same_v<T, float>) {
    linear_backward_bias(dbias, dout_bias ? dout_bias : dout, N, OC);
  } else {
    DPT_CHECK(dout_bias != nullptr, "a bf16 linear backward needs the fp32 output gradient for its bias");
    linear_backward_bias(dbias, dout_bias, N, OC);
  }
}

#define DPT_LINEAR(T)                                                                                  \
  template void linear_forward(float*, const T*, const T*, const float*, int64_t, int64_t, int64_t);          \
  template void linear_backward_input(float*, const T*, const T*, int64_t, int64_t, int64_t);                 \
  template void linear_backward_weight(float*, const T*, const T*, int64_t, int64_t, int64_t, int64_t,        \
                                       int64_t);                                                              \
  template void linear_backward(float*, float*, float*, const T*, const T*, const T*, int64_t, int64_t, int64_t, \
                                const float*);
DPT_LINEAR(float)
DPT_LINEAR(bf16)
#undef DPT_LINEAR

}  // namespace dpt
