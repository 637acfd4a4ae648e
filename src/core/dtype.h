// Element types of flat buffers. Training runs in fp32 today; the dtype is a
// field everywhere so bf16 compute (with fp32 master weights) can follow.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace dpt {

enum class DType { F32, BF16 };

constexpr size_t dtype_size(DType t) { return t == DType::F32 ? 4 : 2; }
const char* dtype_name(DType t);  // safetensors spelling: "F32", "BF16"
DType dtype_from_name(const std::string& name);  // throws InputError if unknown

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

}  // namespace dpt
