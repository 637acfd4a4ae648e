#include "device/gemm_rate.h"

#include <new>
#include <vector>

#include "core/gemm_peak.h"
#include "device/kernels.h"
#include "nn/gemm.h"

namespace dpt {

namespace {

// n x n operands on the device (fp32 or bf16 inputs, fp32 out), freed on
// every way out.
struct SquareOperands {
  const Kernels& k;
  void *a, *b;
  float* c;
  SquareOperands(const Kernels& kernels, int64_t n, size_t in_bytes)
      : k(kernels), a(nullptr), b(nullptr), c(nullptr) {
    const auto count = static_cast<size_t>(n * n);
    try {
      a = k.alloc(count * in_bytes);
      b = k.alloc(count * in_bytes);
      c = static_cast<float*>(k.alloc(count * sizeof(float)));
    } catch (...) {
      release();
      throw;
    }
  }
  ~SquareOperands() { release(); }
  void release() {
    k.free(a);
    k.free(b);
    k.free(c);
    a = b = c = nullptr;
  }
  SquareOperands(const SquareOperands&) = delete;
  SquareOperands& operator=(const SquareOperands&) = delete;
};

double measure_gpu(const Kernels& k, DType inputs, double budget_s, int64_t n) {
  const bool bf = inputs == DType::BF16;
  const SquareOperands m(k, n, bf ? sizeof(bf16) : sizeof(float));
  // Values of both signs, not the allocation's zeros: a GPU draws less
  // power multiplying zeros and may clock higher than a real step lets it.
  const auto count = static_cast<size_t>(n * n);
  std::vector<float> host(count);
  for (size_t i = 0; i < count; ++i) host[i] = static_cast<float>(static_cast<int>(i % 251) - 125) / 125.0f;
  if (bf) {
    std::vector<bf16> host16(count);
    convert(host16.data(), host.data(), count);
    k.upload(m.a, host16.data(), count * sizeof(bf16));
    k.upload(m.b, host16.data(), count * sizeof(bf16));
  } else {
    k.upload(m.a, host.data(), count * sizeof(float));
    k.upload(m.b, host.data(), count * sizeof(float));
  }
  auto product = [&] {
    if (bf)
      k.linear_forward(m.c, static_cast<const bf16*>(m.a), static_cast<const bf16*>(m.b), nullptr, n, n, n);
    else
      k.linear_forward(m.c, static_cast<const float*>(m.a), static_cast<const float*>(m.b), nullptr, n, n, n);
    k.synchronize();
  };
  return best_gflops(product, 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n),
                     budget_s);
}

}  // namespace

double measure_device_gemm_gflops(Device d, DType inputs, double budget_s) {
  if (d == Device::CPU) return measure_gemm_gflops(inputs, budget_s);
  // A run that filled the device leaves no room for 8192^2 operands: a
  // smaller product then (slower per FLOP: a lower bound on the peak, so a
  // higher MFU), and none (0: no MFU) where even 2048^2 does not fit.
  for (int64_t n : {8192, 4096, 2048}) {
    try {
      return measure_gpu(kernels(d), inputs, budget_s, n);
    } catch (const std::bad_alloc&) {
    }
  }
  return 0.0;
}

const char* device_gemm_name(Device d) { return d == Device::CPU ? gemm_backend_name(gemm_backend()) : device_name(d); }

}  // namespace dpt
