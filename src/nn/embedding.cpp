#include "nn/embedding.h"

#include <cstring>
#include <type_traits>

#include "core/cpu_level.h"

namespace dpt {

template <typename T>
DPT_CPU_CLONES void embedding_forward(float* out, const int32_t* ids, const T* table, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const T* row = table + static_cast<int64_t>(ids[n]) * C;
    float* o = out + n * C;
    if constexpr (std::is_same_v<T, float>)
      std::memcpy(o, row, sizeof(float) * C);
    else
      for (int64_t c = 0; c < C; ++c) o[c] = to_f32(row[c]);
  }
}
template void embedding_forward(float*, const int32_t*, const float*, int64_t, int64_t);
template void embedding_forward(float*, const int32_t*, const bf16*, int64_t, int64_t);

DPT_CPU_CLONES void embedding_backward(float* dtable, const float* dout, const int32_t* ids, int64_t N, int64_t C) {
  // Rows may repeat an id, so threads split the channels, not the rows: no
  // two threads ever write the same element.
#pragma omp parallel for schedule(static)
  for (int64_t c0 = 0; c0 < C; c0 += 16) {
    int64_t c1 = c0 + 16 < C ? c0 + 16 : C;
    for (int64_t n = 0; n < N; ++n) {
      float* d = dtable + static_cast<int64_t>(ids[n]) * C;
      const float* g = dout + n * C;
      for (int64_t c = c0; c < c1; ++c) d[c] += g[c];
    }
  }
}

template <typename P>
DPT_CPU_CLONES void position_embedding_forward(float* out, const P* pos, int64_t B, int64_t T, int64_t C) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      float* o = out + (b * T + t) * C;
      const P* p = pos + t * C;
      for (int64_t c = 0; c < C; ++c) o[c] += to_f32(p[c]);
    }
}
template void position_embedding_forward(float*, const float*, int64_t, int64_t, int64_t);
template void position_embedding_forward(float*, const bf16*, int64_t, int64_t, int64_t);

DPT_CPU_CLONES void position_embedding_backward(float* dpos, const float* dout, int64_t B, int64_t T, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < B; ++b) {
      const float* g = dout + (b * T + t) * C;
      float* d = dpos + t * C;
      for (int64_t c = 0; c < C; ++c) d[c] += g[c];
    }
}

}  // namespace dpt
