#!/usr/bin/python3
"""Writes a GPT-2 in Hugging Face's layout and its loss, for the C++ test
of published-weight loading (tests/test_hf_weights.cpp).

Usage: /usr/bin/python3 tests/parity/hf_gpt2_reference.py --out DIR

The model is GPT-2 as Hugging Face's modeling_gpt2 computes it: Conv1D
layers (y = x @ W + b with W stored [in, out]), pre-LayerNorm blocks, GELU in
its tanh form (HF's "gelu_new"), learned positions, the LM head tied to wte.
Small sizes keep the test fast; the vocabulary (300) is above 256 so token
ids past a byte are exercised. Writes:

  DIR/hf/model.safetensors      names as published (h.0.attn.c_attn.weight,
                                wte.weight, ...; no prefix), Conv1D weights
                                [in, out], the causal-mask buffers h.N.attn.bias,
                                metadata {"format": "pt"} only
  DIR/hf/config.json            n_layer, n_head, n_embd, n_positions, vocab_size
  DIR/prefixed/model.safetensors  the same with GPT2LMHeadModel's names
                                (transformer.h.0...) and lm_head.weight = wte;
                                no config.json beside it
  DIR/tokens.bin                an llm.c shard of 20 windows of 17 tokens
  DIR/hf_loss.json              {"loss": mean cross-entropy over every
                                window's 16 positions, in float64}
"""

import argparse
import json
import math
import os
import struct

import torch
import torch.nn.functional as F

V, L, NH, C, T = 300, 2, 4, 32, 16
WINDOWS = 20


def write_safetensors(path, tensors, metadata):
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        data = t.detach().to(torch.float32).contiguous().numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    header["__metadata__"] = metadata
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for b in blobs:
            f.write(b)


def make_weights(gen):
    """HF GPT-2 state_dict (no prefix), float32, with non-zero biases."""
    def normal(*shape):
        return torch.randn(*shape, generator=gen) * 0.02

    def uniform(*shape, lo=-0.1, hi=0.1):
        return lo + (hi - lo) * torch.rand(*shape, generator=gen)

    w = {"wte.weight": normal(V, C), "wpe.weight": normal(T, C)}
    for i in range(L):
        p = f"h.{i}."
        w[p + "ln_1.weight"] = 1 + uniform(C)
        w[p + "ln_1.bias"] = uniform(C)
        w[p + "attn.c_attn.weight"] = normal(C, 3 * C)   # Conv1D: [in, out]
        w[p + "attn.c_attn.bias"] = uniform(3 * C)
        w[p + "attn.c_proj.weight"] = normal(C, C)
        w[p + "attn.c_proj.bias"] = uniform(C)
        w[p + "ln_2.weight"] = 1 + uniform(C)
        w[p + "ln_2.bias"] = uniform(C)
        w[p + "mlp.c_fc.weight"] = normal(C, 4 * C)
        w[p + "mlp.c_fc.bias"] = uniform(4 * C)
        w[p + "mlp.c_proj.weight"] = normal(4 * C, C)
        w[p + "mlp.c_proj.bias"] = uniform(C)
    w["ln_f.weight"] = 1 + uniform(C)
    w["ln_f.bias"] = uniform(C)
    return w


def gpt2_loss(w, tokens, targets):
    """HF GPT-2's forward (float64), mean cross-entropy over all positions."""
    w = {k: v.double() for k, v in w.items()}
    B, Tn = tokens.shape
    x = w["wte.weight"][tokens] + w["wpe.weight"][:Tn]
    mask = torch.ones(Tn, Tn, dtype=torch.bool).triu(1)
    hs = C // NH
    for i in range(L):
        p = f"h.{i}."
        h = F.layer_norm(x, (C,), w[p + "ln_1.weight"], w[p + "ln_1.bias"], eps=1e-5)
        q, k, v = (h @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]).split(C, dim=2)
        q, k, v = (t.view(B, Tn, NH, hs).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = F.softmax(att.masked_fill(mask, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, Tn, C)
        x = x + y @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        h = F.layer_norm(x, (C,), w[p + "ln_2.weight"], w[p + "ln_2.bias"], eps=1e-5)
        h = F.gelu(h @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"], approximate="tanh")
        x = x + h @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    x = F.layer_norm(x, (C,), w["ln_f.weight"], w["ln_f.bias"], eps=1e-5)
    logits = x @ w["wte.weight"].t()
    return F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1)).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    out = ap.parse_args().out
    gen = torch.Generator().manual_seed(18)
    w = make_weights(gen)
    os.makedirs(os.path.join(out, "hf"), exist_ok=True)
    os.makedirs(os.path.join(out, "prefixed"), exist_ok=True)
    published = dict(w)
    for i in range(L):  # the causal-mask buffers older published files carry
        published[f"h.{i}.attn.bias"] = torch.ones(T, T).tril().view(1, 1, T, T)
    write_safetensors(os.path.join(out, "hf", "model.safetensors"), published, {"format": "pt"})
    with open(os.path.join(out, "hf", "config.json"), "w") as f:
        json.dump({"model_type": "gpt2", "activation_function": "gelu_new", "n_layer": L, "n_head": NH,
                   "n_embd": C, "n_positions": T, "vocab_size": V, "layer_norm_epsilon": 1e-5}, f, indent=2)
    prefixed = {"transformer." + k: v for k, v in w.items()}
    prefixed["lm_head.weight"] = w["wte.weight"]
    write_safetensors(os.path.join(out, "prefixed", "model.safetensors"), prefixed, {"format": "pt"})

    n = WINDOWS * T + 1
    tokens = torch.randint(0, V, (n,), generator=gen)
    with open(os.path.join(out, "tokens.bin"), "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
        f.write(tokens.numpy().astype("<u2").tobytes())
    # Windows of T+1 tokens at multiples of T, as the engine reads them.
    starts = torch.arange(WINDOWS) * T
    idx = starts[:, None] + torch.arange(T + 1)[None, :]
    win = tokens[idx]
    loss = gpt2_loss(w, win[:, :-1], win[:, 1:])
    with open(os.path.join(out, "hf_loss.json"), "w") as f:
        json.dump({"loss": loss, "positions": WINDOWS * T}, f)
    print(f"loss {loss:.8f}")


if __name__ == "__main__":
    main()
