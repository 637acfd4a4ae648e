// Element types of flat buffers. Training runs in fp32 today; the dtype is a
// field everywhere so bf16 compute (with fp32 master weights) can follow.
#pragma once

#include <cstddef>
#include <string>

namespace dpt {

enum class DType { F32, BF16 };

constexpr size_t dtype_size(DType t) { return t == DType::F32 ? 4 : 2; }
const char* dtype_name(DType t);  // safetensors spelling: "F32", "BF16"
DType dtype_from_name(const std::string& name);  // throws InputError if unknown

}  // namespace dpt
