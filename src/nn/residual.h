// Residual (skip) connection: out = a + b, elementwise over n values.
//
// Its backward is the identity into both inputs. The models realise it
// without a kernel: the residual stream keeps one gradient buffer, the
// branch reads it as its output gradient, and the branch's input gradient
// is accumulated into it (layernorm_backward's `dinp +=`).
#pragma once

#include <cstdint>

namespace dpt {

void residual_forward(float* out, const float* a, const float* b, int64_t n);

}  // namespace dpt
