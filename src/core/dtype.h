// Element types of flat buffers: fp32, and bf16 for the compute copies of a
// mixed-precision run (docs/precision.md). F16 is a file type only: tensors
// of safetensors files may be F16 (converted to fp32 as they are read, and
// written from fp32 on request); no buffer, kernel or collective uses it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

namespace dpt {

enum class DType { F32, BF16, F16 };

constexpr size_t dtype_size(DType t) { return t == DType::F32 ? 4 : 2; }
const char* dtype_name(DType t);  // safetensors spelling: "F32", "BF16", "F16"
// A run's compute precision as flags spell it: "fp32", "bf16".
const char* precision_name(DType t);
// Throws InputError naming `flag` if the name is neither.
DType parse_precision(const std::string& name, const char* flag = "--precision");

// bfloat16: the top 16 bits of an fp32 (same exponent range, 8-bit
// significand). A struct, not an integer, so it never converts silently.
struct bf16 {
  uint16_t bits = 0;
};

inline float to_f32(bf16 x) {
  const uint32_t u = static_cast<uint32_t>(x.bits) << 16;  // exact: bf16 is a truncated fp32
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Round to nearest, ties to even (as PyTorch and oneDNN round); NaN stays a
// (quiet) NaN instead of rounding into an infinity.
inline bf16 to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<uint16_t>((u >> 16) | 0x40u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<uint16_t>(u >> 16)};
}

// The conversions a kernel templated on its compute type T (float or bf16)
// uses to write a T from an fp32 value and to read one back.
template <typename T>
T from_f32(float x);
template <>
inline float from_f32<float>(float x) { return x; }
template <>
inline bf16 from_f32<bf16>(float x) { return to_bf16(x); }
inline float to_f32(float x) { return x; }

// n elements converted, in parallel on the engine's threads.
void convert(bf16* out, const float* in, size_t n);
void convert(float* out, const bf16* in, size_t n);

}  // namespace dpt
