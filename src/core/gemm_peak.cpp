#include "core/gemm_peak.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <vector>

namespace dpt {

double best_gflops(const std::function<void()>& run, double flops, double budget_s) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  double best = 0.0;
  for (int rep = 0; rep < 64 && (rep < 4 || std::chrono::duration<double>(Clock::now() - start).count() < budget_s);
       ++rep) {
    const auto t0 = Clock::now();
    run();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (rep > 0) best = std::max(best, flops / s / 1e9);  // rep 0 warms up
  }
  return best;
}

double measure_gflops(const SquareGemm& gemm, double budget_s) {
  const int n = 1024;
  std::vector<float> a(static_cast<size_t>(n) * n, 0.5f), b(a), c(a);
  return best_gflops([&] { gemm(n, a.data(), b.data(), c.data()); }, 2.0 * n * n * n, budget_s);
}

double measure_sgemm_gflops(double budget_s) {
  return measure_gflops(
      [](int n, const float* a, const float* b, float* c) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
      },
      budget_s);
}

std::string blas_core() {
  const char* name = openblas_get_corename();
  return name ? name : "";
}

}  // namespace dpt
