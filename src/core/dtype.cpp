#include "core/dtype.h"

#include "core/error.h"

namespace dpt {

const char* dtype_name(DType t) { return t == DType::F32 ? "F32" : "BF16"; }

DType dtype_from_name(const std::string& name) {
  if (name == "F32") return DType::F32;
  if (name == "BF16") return DType::BF16;
  throw InputError(fmt::format("unsupported dtype '{}' (supported: F32, BF16)", name));
}

}  // namespace dpt
