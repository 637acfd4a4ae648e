#include "train/gemm_rate.h"

#include <new>
#include <vector>

#include "core/gemm_peak.h"
#include "device/kernels.h"
#include "nn/gemm.h"
#include "tensor/flat_buffer.h"

namespace dpt {

namespace {

double measure_gpu(Device d, DType inputs, double budget_s, int64_t n) {
  const Kernels& k = kernels(d);
  const auto count = static_cast<size_t>(n * n);
  FlatBuffer a(count, inputs, d), b(count, inputs, d), c(count, DType::F32, d);  // freed on every way out
  // Values of both signs, not the allocation's zeros: a GPU draws less
  // power multiplying zeros and may clock higher than a real step lets it.
  std::vector<float> values(count);
  for (size_t i = 0; i < count; ++i) values[i] = static_cast<float>(static_cast<int>(i % 251) - 125) / 125.0f;
  const bool bf = inputs == DType::BF16;
  if (bf) {
    std::vector<bf16> values16(count);
    convert(values16.data(), values.data(), count);
    k.upload(a.b16(), values16.data(), a.bytes());
    k.upload(b.b16(), values16.data(), b.bytes());
  } else {
    k.upload(a.f32(), values.data(), a.bytes());
    k.upload(b.f32(), values.data(), b.bytes());
  }
  auto product = [&] {
    if (bf)
      k.linear_forward(c.f32(), a.b16(), b.b16(), nullptr, n, n, n);
    else
      k.linear_forward(c.f32(), a.f32(), b.f32(), nullptr, n, n, n);
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
      return measure_gpu(d, inputs, budget_s, n);
    } catch (const std::bad_alloc&) {
    }
  }
  return 0.0;
}

const char* device_gemm_name(Device d) { return d == Device::CPU ? gemm_backend_name(gemm_backend()) : device_name(d); }

}  // namespace dpt
