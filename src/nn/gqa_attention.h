// Grouped-query causal self-attention (Llama, Qwen2, Mistral; multi-query
// when NKV = 1, multi-head when NKV = NH), the core between the q/k/v and
// the o projections:
//   qkv [B, T, (NH + 2 NKV) hd]: each row holds NH query heads, then NKV key
//        heads, then NKV value heads, hd channels each (the output of one
//        fused linear whose weight is q_proj's, k_proj's and v_proj's rows
//        stacked; rotary embedding, nn/rope.h, is applied to it in place
//        before this layer)
//   out [B, T, NH hd]: the query heads' outputs concatenated (o_proj's input)
//   att [B, NH, T, T]: softmax(q k^T / sqrt(hd)) with the causal mask, saved
//        for backward (entries above the diagonal are 0)
// Query head h reads key/value head h / (NH / NKV): contiguous groups, as
// Hugging Face's `repeat_kv`. hd is free (Llama's head_dim need not be
// width / NH). NH must be a multiple of NKV.
//
// GPT-2's attention (nn/attention.h) is a separate function and stays so:
// its results are the engine's recorded ones, bit for bit.
#pragma once

#include <cstdint>

namespace dpt {

void gqa_attention_forward(float* out, float* att, const float* qkv, int64_t B, int64_t T, int64_t NH,
                           int64_t NKV, int64_t hd);

// dqkv = gradient w.r.t. qkv, written (same layout as qkv). Each (batch,
// key/value head) pair is one thread's work, and a key/value head's gradient
// sums its group's query heads in head order: no two threads write the same
// element, and a given thread count gives the same bits on every run.
void gqa_attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int64_t B,
                            int64_t T, int64_t NH, int64_t NKV, int64_t hd);

}  // namespace dpt
