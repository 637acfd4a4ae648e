#include "core/dtype.h"

#include "core/cpu_level.h"
#include "core/error.h"

namespace dpt {

const char* dtype_name(DType t) { return t == DType::F32 ? "F32" : t == DType::BF16 ? "BF16" : "F16"; }

const char* precision_name(DType t) { return t == DType::F32 ? "fp32" : "bf16"; }

DType parse_precision(const std::string& name, const char* flag) {
  if (name == "fp32") return DType::F32;
  if (name == "bf16") return DType::BF16;
  throw InputError(fmt::format("{} must be fp32 or bf16, not '{}'", flag, name));
}

DPT_CPU_CLONES void convert(bf16* out, const float* in, size_t n) {
  const auto m = static_cast<int64_t>(n);
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < m; ++i) out[i] = to_bf16(in[i]);
}

DPT_CPU_CLONES void convert(float* out, const bf16* in, size_t n) {
  const auto m = static_cast<int64_t>(n);
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < m; ++i) out[i] = to_f32(in[i]);
}

}  // namespace dpt
