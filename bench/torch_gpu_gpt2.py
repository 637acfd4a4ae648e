#!/usr/bin/env python3
"""PyTorch at its best on one GPU: the reference side of issue 17's GPU table.

Usage (on the lent GPU machine): python3 bench/torch_gpu_gpt2.py --json OUT.json
           [--batches 16,32] [--steps 30] [--warmup 10] [--no-compile]

Trains GPT-2 124M (12 layers, 12 heads, width 768, context 1024, vocabulary
50257 padded to 50304, tied head, GELU-tanh, pre-LN) with bf16 autocast,
scaled_dot_product_attention (flash kernels) and fused AdamW (lr 6e-4, betas
0.9/0.95, weight decay 0.1 on matrices), eager and torch.compile, on
synthetic tokens. Also measures on the spot the device's bf16 and fp32 (no
TF32) matrix-product rates (8192^3, median of 10 after 3 warm-ups), the
rates MFU is quoted against. Writes each result to the JSON file as soon as
it has it, so a run cut off by its time limit still reports.
"""

import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, C, nh):
        super().__init__()
        self.nh = nh
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.nh, C // self.nh).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, C, nh):
        super().__init__()
        self.ln_1 = nn.LayerNorm(C)
        self.attn = Attention(C, nh)
        self.ln_2 = nn.LayerNorm(C)
        self.c_fc = nn.Linear(C, 4 * C)
        self.c_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, V, T, L, nh, C):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.h = nn.ModuleList([Block(C, nh) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C)
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.h:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))


def gemm_rate(dtype, n=8192):
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    times = []
    for _ in range(10):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        a @ b
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    return 2 * n ** 3 / statistics.median(times) / 1e12


def train_rate(B, steps, warmup, compiled):
    torch.manual_seed(0)
    V, T, L, nh, C = 50304, 1024, 12, 12, 768
    model = GPT(V, T, L, nh, C).cuda()
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), fused=True)
    step_model = torch.compile(model) if compiled else model
    data = torch.randint(0, 50257, (4, B, T + 1), device="cuda")
    torch.cuda.reset_peak_memory_stats()
    times = []
    for i in range(steps):
        seq = data[i % 4]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_model(seq[:, :-1], seq[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    tokens = B * T
    # PaLM-style model FLOPs: 6 N per token plus attention 12 L C T per token;
    # N without the position embedding (llm.c's and nanoGPT's convention).
    n_flop = n_params - T * C
    flops = (6 * n_flop + 12 * L * C * T) * tokens
    return {
        "batch": B, "context": T, "compiled": compiled, "steps": steps, "warmup": warmup,
        "step_ms_median": med * 1e3, "tokens_per_s": tokens / med,
        "tflops": flops / med / 1e12, "flops_per_step": flops, "params": n_params,
        "final_loss": loss.item(), "peak_gpu_bytes": torch.cuda.max_memory_allocated(),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", required=True)
    ap.add_argument("--batches", default="16,32")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--no-compile", action="store_true")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    out = {"framework": "pytorch", "version": torch.__version__,
           "device": torch.cuda.get_device_name(), "runs": []}

    def save():
        with open(args.json + ".tmp", "w") as f:
            json.dump(out, f, indent=2)
        os.replace(args.json + ".tmp", args.json)

    out["bf16_gemm_tflops"] = gemm_rate(torch.bfloat16)
    out["fp32_gemm_tflops"] = gemm_rate(torch.float32)
    print(f"gemm 8192^3: bf16 {out['bf16_gemm_tflops']:.1f} TFLOP/s, fp32 {out['fp32_gemm_tflops']:.1f}", flush=True)
    save()
    for compiled in ([False] if args.no_compile else [False, True]):
        for B in [int(b) for b in args.batches.split(",")]:
            try:
                r = train_rate(B, args.steps, args.warmup, compiled)
            except torch.OutOfMemoryError as e:
                r = {"batch": B, "compiled": compiled, "error": f"out of memory: {e}"[:200]}
            r["mfu_measured"] = r.get("tflops", 0) / out["bf16_gemm_tflops"]
            out["runs"].append(r)
            print(json.dumps(r), flush=True)
            save()
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
