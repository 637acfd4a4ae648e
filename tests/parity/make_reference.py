#!/usr/bin/python3
"""Writes PyTorch reference data for the C++ parity test.

Usage: /usr/bin/python3 tests/parity/make_reference.py --out DIR

Writes four safetensors files into DIR (see tests/parity/README.md):
  gpt_weights.safetensors  initial GPT parameters (nanoGPT state_dict names)
  gpt_io.safetensors       GPT batch, loss, gradients, AdamW trajectory
  mlp_weights.safetensors  initial MLP parameters (nn.Sequential names)
  mlp_io.safetensors       MLP batch, loss, gradients, SGD trajectory

Everything is computed and stored in float32, like the C++ engine.

The GPT and MLP definitions here are also imported by bench/torch_workloads.py,
so the benchmark times exactly the model that the parity test checks.
"""

import argparse
import json
import math
import os
import struct
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

# ---------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------


class GPTConfig:
    def __init__(self, vocab_size, n_layer, n_head, n_embd, block_size):
        if n_embd % n_head != 0:
            raise ValueError(f"n_embd {n_embd} is not divisible by n_head {n_head}")
        self.vocab_size = vocab_size
        self.n_layer = n_layer
        self.n_head = n_head
        self.n_embd = n_embd
        self.block_size = block_size

    def metadata(self):
        """The __metadata__ entries that describe this config to the C++ loader."""
        return {
            "dpt.model": "gpt",
            "vocab_size": str(self.vocab_size),
            "n_layer": str(self.n_layer),
            "n_head": str(self.n_head),
            "n_embd": str(self.n_embd),
            "block_size": str(self.block_size),
        }


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_head = cfg.n_head
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)  # q, k, v stacked
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        # True above the diagonal: positions a query must not attend to.
        # Not persistent, so it stays out of the state_dict.
        mask = torch.ones(cfg.block_size, cfg.block_size, dtype=torch.bool).triu(1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        hs = C // self.n_head
        q, k, v = self.c_attn(x).split(C, dim=2)
        # [B, T, C] -> [B, nh, T, hs]
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = att.masked_fill(self.mask[:T, :T], float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLPBlock(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    """Pre-LayerNorm transformer block."""

    def __init__(self, cfg):
        super().__init__()
        # Attribute order fixes the state_dict order: ln_1, attn, ln_2, mlp.
        self.ln_1 = nn.LayerNorm(cfg.n_embd, eps=1e-5)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, eps=1e-5)
        self.mlp = MLPBlock(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    """GPT with the LM head tied to the token embedding (no lm_head parameter)."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(cfg.vocab_size, cfg.n_embd),
            wpe=nn.Embedding(cfg.block_size, cfg.n_embd),
            h=nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)]),
            ln_f=nn.LayerNorm(cfg.n_embd, eps=1e-5),
        ))

    def forward(self, tokens, targets):
        """Mean cross-entropy over all B*T positions."""
        B, T = tokens.shape
        if T > self.cfg.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.cfg.block_size}")
        tr = self.transformer
        pos = torch.arange(T, device=tokens.device)
        x = tr.wte(tokens) + tr.wpe(pos)
        for block in tr.h:
            x = block(x)
        logits = tr.ln_f(x) @ tr.wte.weight.t()  # tied LM head, no bias
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def reference_init(model):
    """The parity-test init: N(0, 0.02) weights, non-zero biases on purpose so
    that every bias gradient is exercised, LayerNorm weights near 1."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                m.weight.normal_(0.0, 0.02)
                if getattr(m, "bias", None) is not None:
                    m.bias.uniform_(-0.1, 0.1)
            elif isinstance(m, nn.LayerNorm):
                m.weight.copy_(1.0 + torch.empty_like(m.weight).uniform_(-0.1, 0.1))
                m.bias.uniform_(-0.1, 0.1)


def make_mlp(sizes):
    """Linear/ReLU stack: state_dict names 0.weight, 0.bias, 2.weight, ..."""
    layers = []
    for i in range(len(sizes) - 1):
        if i > 0:
            layers.append(nn.ReLU())
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
    return nn.Sequential(*layers)


def gpt_param_groups(model, weight_decay):
    """AdamW groups: decay every parameter with dim >= 2 (all matrices,
    including wte and wpe); no decay for biases and LayerNorm parameters."""
    params = list(model.parameters())
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


# ---------------------------------------------------------------------------
# safetensors writer (Debian has no safetensors package)
# ---------------------------------------------------------------------------


def write_safetensors(path, tensors, metadata):
    """Writes {name: tensor} as F32 in dict order, with string metadata.

    Layout: u64 little-endian header length, JSON header padded with spaces to
    a multiple of 8 bytes, then the raw little-endian float32 data of every
    tensor, contiguous and in header order."""
    header = {}
    blobs = []
    offset = 0
    for name, t in tensors.items():
        data = t.detach().to(torch.float32).contiguous().cpu().numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    for k, v in metadata.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError(f"metadata must map str to str, got {k!r}: {v!r}")
    header["__metadata__"] = metadata
    head = json.dumps(header, separators=(",", ":")).encode("utf-8")
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for data in blobs:
            f.write(data)


# ---------------------------------------------------------------------------
# Reference computation
# ---------------------------------------------------------------------------

STEPS = 3  # optimizer steps in the recorded trajectory


def run_trajectory(model, loss_fn, optimizer, clip):
    """Runs STEPS optimizer steps on one fixed batch.

    Returns (losses [STEPS+1], grads at the initial weights, pre-clip global
    grad norms [STEPS] or None without clipping). losses[i] is the loss before
    step i; losses[STEPS] is the loss after the last step."""
    losses, norms = [], []
    grads = None
    for step in range(STEPS + 1):
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn()
        losses.append(loss.detach().clone())
        if step == STEPS:
            break
        loss.backward()
        if grads is None:  # before clipping: the raw d loss / d param
            grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        if clip > 0:
            norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), clip).detach().clone())
        optimizer.step()
    return torch.stack(losses), grads, (torch.stack(norms) if clip > 0 else None)


def io_tensors(inputs, losses, grads, model, norms):
    out = dict(inputs)
    out["loss"] = losses[0].reshape(1)
    for n, g in grads.items():
        out["grad." + n] = g
    out["losses"] = losses
    if norms is not None:
        out["grad_norms"] = norms
    for n, p in model.named_parameters():
        out["final." + n] = p
    return out


def make_gpt(out_dir):
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=256, n_layer=2, n_head=4, n_embd=32, block_size=16)
    B, T = 3, 16
    lr, betas, eps, wd, clip = 1e-3, (0.9, 0.95), 1e-8, 0.1, 0.5  # norms are ~0.9: 0.5 makes clipping act

    model = GPT(cfg)
    reference_init(model)
    tokens = torch.randint(0, cfg.vocab_size, (B, T))
    targets = torch.randint(0, cfg.vocab_size, (B, T))
    weights = {n: p.detach().clone() for n, p in model.state_dict().items()}

    opt = torch.optim.AdamW(gpt_param_groups(model, wd), lr=lr, betas=betas, eps=eps)
    losses, grads, norms = run_trajectory(model, lambda: model(tokens, targets), opt, clip)

    write_safetensors(os.path.join(out_dir, "gpt_weights.safetensors"), weights, cfg.metadata())
    io = io_tensors({"tokens": tokens.float(), "targets": targets.float()},
                    losses, grads, model, norms)
    meta = {"optimizer": "adamw", "lr": str(lr), "beta1": str(betas[0]),
            "beta2": str(betas[1]), "eps": str(eps), "weight_decay": str(wd),
            "weight_decay_params": "dim>=2", "clip": str(clip), "steps": str(STEPS)}
    write_safetensors(os.path.join(out_dir, "gpt_io.safetensors"), io, meta)
    return io


def make_mlp_reference(out_dir):
    torch.manual_seed(0)
    sizes = [784, 64, 32, 10]
    B = 8
    lr, momentum = 0.05, 0.9

    model = make_mlp(sizes)  # PyTorch default init
    x = torch.rand(B, sizes[0])
    labels = torch.randint(0, sizes[-1], (B,))
    weights = {n: p.detach().clone() for n, p in model.state_dict().items()}

    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    losses, grads, _ = run_trajectory(model, lambda: F.cross_entropy(model(x), labels), opt, 0)

    write_safetensors(os.path.join(out_dir, "mlp_weights.safetensors"), weights,
                      {"dpt.model": "mlp", "sizes": ",".join(map(str, sizes))})
    io = io_tensors({"x": x, "labels": labels.float()}, losses, grads, model, None)
    meta = {"optimizer": "sgd", "lr": str(lr), "momentum": str(momentum),
            "clip": "0", "steps": str(STEPS)}
    write_safetensors(os.path.join(out_dir, "mlp_io.safetensors"), io, meta)
    return io


def check_finite(name, tensors):
    for k, t in tensors.items():
        if not torch.isfinite(t).all():
            raise RuntimeError(f"{name}: tensor {k} has non-finite values")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory to write the four files into")
    args = ap.parse_args()
    try:
        os.makedirs(args.out, exist_ok=True)
        torch.set_default_dtype(torch.float32)
        gpt = make_gpt(args.out)
        mlp = make_mlp_reference(args.out)
        check_finite("gpt_io", gpt)
        check_finite("mlp_io", mlp)
    except Exception as e:  # one clear line instead of a traceback
        print(f"make_reference.py: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    fmt = lambda t: " ".join(f"{v:.4f}" for v in t.tolist())
    print(f"wrote reference data to {args.out}: gpt losses [{fmt(gpt['losses'])}] "
          f"grad norms [{fmt(gpt['grad_norms'])}], mlp losses [{fmt(mlp['losses'])}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
