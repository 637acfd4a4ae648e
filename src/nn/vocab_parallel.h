// The token embedding and the cross-entropy when the vocabulary is split
// over tensor-parallel ranks (Megatron-LM's vocabulary-parallel embedding
// and parallel cross-entropy; docs/tensor_parallel.md): a rank holds rows
// [lo, lo + rows) of wte and computes only those columns of the logits, so
// no rank ever holds a [N, V] buffer. Each function is one rank's part;
// the caller sums (or takes the maximum) over the group between them.
// CPU only (--tp runs on the CPU).
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace dpt {

// out[n, :] = table[ids[n] - lo, :] for the ids this rank holds, 0 for the
// others (written): the sum over the group is the whole embedding.
//   ids [N], table [rows, C], out [N, C]
template <typename T>
void vocab_embedding_forward(float* out, const int32_t* ids, const T* table, int64_t lo, int64_t rows, int64_t N,
                             int64_t C);
// dtable[ids[n] - lo, :] += dout[n, :] for the ids this rank holds.
void vocab_embedding_backward(float* dtable, const float* dout, const int32_t* ids, int64_t lo, int64_t rows,
                              int64_t N, int64_t C);

// The cross-entropy of logits [N, width] that are this rank's columns
// [lo, lo + live) of the vocabulary (columns past `live` are pad rows of
// wte: no part of the softmax). In three passes:
//   1. vocab_ce_max:  zmax[n] = the max of the row's live logits (-inf if
//      none)                                   -> the group's Max of zmax
//   2. vocab_ce_exp:  logits[n, v] = exp(z - zmax[n]) in place (0 for pad);
//      sums[n] = their sum, sums[N + n] = the target's logit if this rank
//      holds it, else 0                          -> the group's Sum of sums
//   3. vocab_ce_loss: logits become probabilities in place; returns the
//      mean loss; *correct (if not null) counts rows whose target logit is
//      the row's maximum.
void vocab_ce_max(float* zmax, const float* logits, int64_t N, int64_t width, int64_t live);
void vocab_ce_exp(float* logits, float* sums, const float* zmax, const int32_t* targets, int64_t lo, int64_t N,
                  int64_t width, int64_t live);
float vocab_ce_loss(float* logits, const float* sums, const float* zmax, int64_t N, int64_t width, int64_t live,
                    int64_t* correct);
// dlogits = (probs - onehot(targets)) * scale over this rank's columns,
// written in place of probs (pad columns 0).
void vocab_ce_backward(float* probs, const int32_t* targets, int64_t lo, int64_t N, int64_t width, int64_t live,
                       float scale);

}  // namespace dpt
