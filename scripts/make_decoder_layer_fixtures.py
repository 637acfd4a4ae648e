#!/usr/bin/python3
"""Writes the PyTorch references that tests/test_decoder_layers.cpp checks the
Llama-family layers (src/nn/rmsnorm, rope, swiglu, gqa_attention) against.

Usage: /usr/bin/python3 scripts/make_decoder_layer_fixtures.py [--out DIR]
(DIR defaults to tests/fixtures/decoder_layers). Needs Debian's python3-torch
(1.13); no transformers: the layers are written here the way transformers'
modeling_llama.py (v4.45) writes them, in float32:
  LlamaRMSNorm.forward, LlamaRotaryEmbedding.forward, rotate_half,
  apply_rotary_pos_emb, repeat_kv, eager_attention_forward, LlamaMLP's
  act_fn(gate_proj(x)) * up_proj(x); and modeling_rope_utils.py's
  _compute_default_rope_parameters and _compute_llama3_parameters.
Backward passes are torch.autograd's, of L = sum(out * dout).

One file per layer, every tensor F32 (integers none); metadata holds the
shapes and settings as strings:
  rmsnorm.safetensors  x [N,C], weight [C], dout [N,C] -> out, dx, dweight
  rope.safetensors     qkv [B,T,(NH+2NKV)hd], dout; for each variant
                       (plain, llama3): inv_freq [hd/2], out, dqkv
  swiglu.safetensors   gu [N,2I] (gate | up), dout [N,I] -> out, dgu
  gqa.safetensors      qkv [B,T,(NH+2NKV)hd], dout [B,T,NH hd] -> out, att, dqkv
"""

import argparse
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "parity"))
import make_reference  # noqa: E402  (its safetensors writer)


def write_safetensors(path, tensors, metadata):
    """{name: tensor} as F32 in dict order: tests/parity/make_reference.py's
    writer, with the settings' values as strings."""
    make_reference.write_safetensors(path, tensors, {k: str(v) for k, v in metadata.items()})


def grads(out, dout, *inputs):
    return torch.autograd.grad(out, inputs, grad_outputs=dout)


# --- RMSNorm (LlamaRMSNorm) ---------------------------------------------------


def rmsnorm(x, weight, eps):
    variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(variance + eps))


def make_rmsnorm(out_dir):
    N, C, eps = 6, 40, 1e-5
    x = (torch.randn(N, C) + 0.3).requires_grad_()
    w = (1.0 + 0.2 * torch.randn(C)).requires_grad_()
    dout = torch.randn(N, C)
    out = rmsnorm(x, w, eps)
    dx, dw = grads(out, dout, x, w)
    write_safetensors(os.path.join(out_dir, "rmsnorm.safetensors"),
                      {"x": x, "weight": w, "dout": dout, "out": out, "dx": dx, "dweight": dw},
                      {"N": N, "C": C, "eps": eps})


# --- Rotary embedding ---------------------------------------------------------


def default_inv_freq(theta, dim):
    # _compute_default_rope_parameters
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def llama3_inv_freq(inv_freq, factor, low_freq_factor, high_freq_factor, old_context_len):
    # _compute_llama3_parameters (transformers/modeling_rope_utils.py)
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rope_cos_sin(inv_freq, B, T):
    # LlamaRotaryEmbedding.forward (attention_scaling 1 for default and llama3)
    position_ids = torch.arange(T)[None, :].expand(B, T)
    inv_freq_expanded = inv_freq[None, :, None].float().expand(B, -1, 1)
    position_ids_expanded = position_ids[:, None, :].float()
    freqs = (inv_freq_expanded @ position_ids_expanded).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def split_heads(qkv, NH, NKV, hd):
    """[B,T,(NH+2NKV)hd] -> q [B,NH,T,hd], k, v [B,NKV,T,hd] (HF's view + transpose)."""
    B, T, _ = qkv.shape
    q = qkv[..., : NH * hd].view(B, T, NH, hd).transpose(1, 2)
    k = qkv[..., NH * hd: (NH + NKV) * hd].view(B, T, NKV, hd).transpose(1, 2)
    v = qkv[..., (NH + NKV) * hd:].view(B, T, NKV, hd).transpose(1, 2)
    return q, k, v


def merge_heads(*heads):
    B, _, T, _ = heads[0].shape
    return torch.cat([h.transpose(1, 2).reshape(B, T, -1) for h in heads], dim=-1)


def apply_rope(qkv, inv_freq, NH, NKV, hd):
    B, T, _ = qkv.shape
    q, k, v = split_heads(qkv, NH, NKV, hd)
    cos, sin = rope_cos_sin(inv_freq, B, T)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # apply_rotary_pos_emb, unsqueeze_dim=1
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return merge_heads(q_embed, k_embed, v)


def make_rope(out_dir):
    B, T, NH, NKV, hd, theta = 2, 12, 2, 1, 16, 10000.0
    scaling = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 256}
    qkv = torch.randn(B, T, (NH + 2 * NKV) * hd).requires_grad_()
    dout = torch.randn(B, T, (NH + 2 * NKV) * hd)
    plain = default_inv_freq(theta, hd)
    scaled = llama3_inv_freq(plain, scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"],
                             scaling["original_max_position_embeddings"])
    # The small original context puts frequencies in all three of llama3's
    # bands (kept, divided, interpolated), so each branch is checked.
    kept, divided = (scaled == plain).sum().item(), (scaled == plain / scaling["factor"]).sum().item()
    assert kept > 0 and divided > 0 and kept + divided < hd // 2, (plain, scaled)
    tensors = {"qkv": qkv, "dout": dout}
    for name, inv_freq in (("plain", plain), ("llama3", scaled)):
        out = apply_rope(qkv, inv_freq, NH, NKV, hd)
        (dqkv,) = grads(out, dout, qkv)
        tensors.update({f"{name}.inv_freq": inv_freq, f"{name}.out": out, f"{name}.dqkv": dqkv})
    meta = {"B": B, "T": T, "NH": NH, "NKV": NKV, "hd": hd, "theta": theta}
    meta.update(scaling)
    write_safetensors(os.path.join(out_dir, "rope.safetensors"), tensors, meta)


# --- SwiGLU -------------------------------------------------------------------


def make_swiglu(out_dir):
    N, I = 6, 24
    gu = (2.0 * torch.randn(N, 2 * I)).requires_grad_()
    dout = torch.randn(N, I)
    out = F.silu(gu[:, :I]) * gu[:, I:]  # LlamaMLP: act_fn(gate_proj(x)) * up_proj(x)
    (dgu,) = grads(out, dout, gu)
    write_safetensors(os.path.join(out_dir, "swiglu.safetensors"), {"gu": gu, "dout": dout, "out": out, "dgu": dgu},
                      {"N": N, "I": I})


# --- Grouped-query attention --------------------------------------------------


def repeat_kv(hidden_states, n_rep):
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep, slen, head_dim)
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)


def gqa_attention(qkv, NH, NKV, hd):
    # eager_attention_forward with a causal mask
    B, T, _ = qkv.shape
    q, k, v = split_heads(qkv, NH, NKV, hd)
    key_states, value_states = repeat_kv(k, NH // NKV), repeat_kv(v, NH // NKV)
    attn_weights = torch.matmul(q, key_states.transpose(2, 3)) * hd ** -0.5
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    attn_weights = attn_weights.masked_fill(mask, torch.finfo(torch.float32).min)
    attn_weights = F.softmax(attn_weights, dim=-1, dtype=torch.float32)
    attn_output = torch.matmul(attn_weights, value_states).transpose(1, 2).reshape(B, T, NH * hd)
    return attn_output, attn_weights


def make_gqa(out_dir):
    B, T, NH, NKV, hd = 2, 12, 6, 2, 12  # groups of 3; hd is not width / NH of any width here
    qkv = torch.randn(B, T, (NH + 2 * NKV) * hd).requires_grad_()
    dout = torch.randn(B, T, NH * hd)
    out, att = gqa_attention(qkv, NH, NKV, hd)
    (dqkv,) = grads(out, dout, qkv)
    write_safetensors(os.path.join(out_dir, "gqa.safetensors"),
                      {"qkv": qkv, "dout": dout, "out": out, "att": att, "dqkv": dqkv},
                      {"B": B, "T": T, "NH": NH, "NKV": NKV, "hd": hd})


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures", "decoder_layers"))
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for i, make in enumerate((make_rmsnorm, make_rope, make_swiglu, make_gqa)):
        torch.manual_seed(i)
        make(args.out)


if __name__ == "__main__":
    main()
