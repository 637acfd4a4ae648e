// Rotary position embedding as Hugging Face's Llama applies it
// (transformers' `apply_rotary_pos_emb` with `rotate_half`): each head of
// hd channels is rotated as two halves, channel i with channel i + hd/2
// (not interleaved pairs, which Meta's original checkpoints use):
//   out[i]        = x[i] cos(a_i) - x[i + hd/2] sin(a_i)
//   out[i + hd/2] = x[i + hd/2] cos(a_i) + x[i] sin(a_i)
// with a_i = t * inv_freq[i] for the token at position t, i < hd/2.
//
// Layout: B*T rows of `ld` floats (row b*T + t is token t of sequence b at
// position t); the first H heads of hd channels of each row are rotated,
// the rest of the row is left alone. For grouped-query attention's fused
// qkv rows (nn/gqa_attention.h: NH query heads, then NKV key heads, then
// NKV value heads) that is H = NH + NKV, ld = (NH + 2 NKV) hd: q and k are
// rotated, v is not.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace dpt {

// Llama 3's rope scaling (config.json "rope_scaling" with "rope_type" or
// "type" "llama3").
struct RopeLlama3Scaling {
  float factor = 8.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int64_t original_max_position_embeddings = 8192;
};

// inv_freq [hd/2] = 1 / theta^(2i / hd), in fp32 as transformers'
// `_compute_default_rope_parameters`; with `llama3` (nullptr: none) then
// rescaled as transformers' `_compute_llama3_parameters`
// (src/transformers/modeling_rope_utils.py, the algorithm of Meta's
// llama-models `apply_scaling`): with wavelen = 2 pi / f,
//   wavelen < old / high_freq_factor: f unchanged (high frequencies)
//   wavelen > old / low_freq_factor:  f / factor   (low frequencies)
//   otherwise: (1 - s) f / factor + s f, s = (old / wavelen - low) / (high - low)
// where old = original_max_position_embeddings. Its attention factor is 1.
// hd must be even.
void rope_inv_freq(float* inv_freq, int64_t hd, float theta, const RopeLlama3Scaling* llama3);

// cos, sin [T, hd/2]: of the fp32 angle t * inv_freq[i] (Hugging Face
// computes the angle as an fp32 product too), rounded to fp32.
void rope_cache(float* cos, float* sin, const float* inv_freq, int64_t T, int64_t hd);

// out = the rotation of inp (layout above; both with row stride ld). out
// may alias inp (in place, the usual use); only the H rotated heads of out
// are written.
void rope_forward(float* out, const float* inp, const float* cos, const float* sin, int64_t B, int64_t T,
                  int64_t H, int64_t hd, int64_t ld);

// dinp = the inverse (transposed) rotation of dout, written, same layout;
// dinp may alias dout. Only the H rotated heads are written.
void rope_backward(float* dinp, const float* dout, const float* cos, const float* sin, int64_t B, int64_t T,
                   int64_t H, int64_t hd, int64_t ld);
// The same, and each whole row of ld elements (the rotated heads from dinp,
// the rest from dout: in place, the same) rounded to bf16 into dinp16 as it
// is made: a bf16 run's GEMM operand for q/k/v's backward, which a
// conversion pass of its own would read again. Bit for bit rope_backward
// then convert.
void rope_backward_bf16(float* dinp, bf16* dinp16, const float* dout, const float* cos, const float* sin, int64_t B,
                        int64_t T, int64_t H, int64_t hd, int64_t ld);

}  // namespace dpt
