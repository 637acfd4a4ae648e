// The CPU's elementwise loops of an optimizer step: the updates behind
// Kernels::sgd_update and Kernels::adamw_update (device/kernels.h says what
// they compute), the gradient norm's sum of squares, and scaling. They live
// with the other CPU kernels (compiled for AVX2 and AVX-512, picked at load;
// core/cpu_level.h); the optimizers reach them through the device layer.
#pragma once

#include <cstddef>

#include "core/dtype.h"

namespace dpt {

// Sum of squares of n values, in double (a stable global gradient norm).
// Under sharding each rank sums its shard and the sums are all-reduced.
double sum_of_squares(const float* x, size_t n);
void scale(float* x, size_t n, float factor);
// p16, when given, receives the updated p rounded to bf16 in the same pass
// (a bf16 run's compute copy; null: none).
void sgd_update(float* p, float* g, float* buf, size_t n, float lr, float momentum, float decay, bool first,
                bool consume, bf16* p16 = nullptr);
void adamw_update(float* p, float* g, float* m, float* v, size_t n, float b1, float b2, float eps, float keep,
                  float step_size, float rc2, bool consume, bf16* p16 = nullptr);

}  // namespace dpt
