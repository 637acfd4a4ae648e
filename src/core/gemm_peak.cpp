#include "core/gemm_peak.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <vector>

namespace dpt {

double measure_gflops(const SquareGemm& gemm) {
  const int n = 1024;
  std::vector<float> a(static_cast<size_t>(n) * n, 0.5f), b(a), c(a);
  double best = 0.0;
  for (int rep = 0; rep < 4; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    gemm(n, a.data(), b.data(), c.data());
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rep > 0) best = std::max(best, 2.0 * n * n * n / s / 1e9);
  }
  return best;
}

double measure_sgemm_gflops() {
  return measure_gflops([](int n, const float* a, const float* b, float* c) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
  });
}

std::string blas_core() {
  const char* name = openblas_get_corename();
  return name ? name : "";
}

}  // namespace dpt
