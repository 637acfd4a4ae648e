// Causal self-attention of new tokens over a key/value cache: the core of
// incremental decoding (models/decoder.h, Decoder::prefill and step). The
// n new tokens sit at positions p0 .. p0 + n - 1; the cache already holds
// the keys and values of positions 0 .. p0 + n - 1 (the new tokens' own
// included), so new token t attends to positions 0 .. p0 + t.
//   q   [n, ldq]: each row's first NH hd channels are its NH query heads
//       (the fused qkv rows of nn/gqa_attention.h, rotated where the model
//       is rotary)
//   kc, vc [p0 + n, NKV hd]: the cache's keys and values, NKV heads a row
//   out [n, NH hd]: the query heads' outputs concatenated
// Query head h reads key/value head h / (NH / NKV) (Hugging Face's
// repeat_kv; GPT-2's multi-head attention is NKV = NH). Scores are scaled
// by 1/sqrt(hd). One token (n = 1, the decoding step) is a dot product and
// an axpy per cached position and head; a chunk (a prompt) is two GEMMs
// per head, as the full pass (nn/attention.h) computes them.
#pragma once

#include <cstdint>

namespace dpt {

void cached_attention_forward(float* out, const float* q, int64_t ldq, const float* kc, const float* vc, int64_t n,
                              int64_t p0, int64_t NH, int64_t NKV, int64_t hd);

}  // namespace dpt
