// Fused softmax + cross-entropy, averaged over the N rows.
//   logits [N, V] -> probs [N, V] (may alias logits), targets [N] in [0, V)
// Returns the mean loss; `correct` (if not null) gets the number of rows
// whose argmax equals the target.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace dpt {

float cross_entropy_forward(float* probs, const float* logits, const int32_t* targets, int64_t N,
                            int64_t V, int64_t* correct);

// dlogits = (probs - onehot(targets)) * scale, written; scale is 1/N for a
// mean over this batch. dlogits may alias probs.
void cross_entropy_backward(float* dlogits, const float* probs, const int32_t* targets, int64_t N,
                            int64_t V, float scale);
// The same, each row also rounded to bf16 into dlogits16 as it is written:
// a bf16 run's operand for the head's GEMMs, which a conversion pass of its
// own would read again. Bit for bit cross_entropy_backward then convert.
// dlogits null: the bf16 copy alone (the probabilities' lines are read, not
// written back: a bf16 run's GEMMs read only the copy).
// ld16 (>= V): dlogits16's row stride, its columns [V, ld16) written zero
// (a padded vocabulary's rows, as unpack_rows leaves them).
void cross_entropy_backward_bf16(float* dlogits, bf16* dlogits16, int64_t ld16, const float* probs,
                                 const int32_t* targets, int64_t N, int64_t V, float scale);

}  // namespace dpt
