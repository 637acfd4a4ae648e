#!/usr/bin/python3
"""The first GPU run as a picture (docs/gpu.md, "What has run on a GPU").

Usage: python3 bench/plot_gpu.py [--dir bench/results/gpu_h200_20261128] [--svg docs/img/gpu_h200.svg]

Left: GPT-2 124M (bf16, AdamW, 16 x 1,024 tokens a step) on one GPU, dpt
against PyTorch eager and torch.compile from the same device call: tokens/s
as bars, device memory written on each. Right: the trajectory stage's
losses, 50 steps on the CPU and on the GPU from one seed (W-GPT and W-LLAMA,
SGD and AdamW), each pair on one axis with its largest relative gap.
Reads the routine's JSON files (scripts/device/gpu.sh) and writes SVG with
nothing beyond Python's standard library.
"""

import argparse
import json
import math
import os
from xml.sax.saxutils import escape

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load(path):
    with open(path) as f:
        return json.load(f)


def throughput_rows(d):
    """(label, tokens/s, MiB of device memory, colour) for the left panel."""
    rows = []
    for name, label in (("gpt2_dpt.json", "dpt"), ("gpt2_dpt_ckpt.json", "dpt, activation ckpt")):
        s = load(os.path.join(d, "call2", name))
        rows.append((label, s["tokens_per_s"], s["device_bytes"]["peak"] / 2**20, "#4c78a8"))
    for r in load(os.path.join(d, "call1", "torch_gpu_gpt2.json"))["runs"]:
        label = "PyTorch torch.compile" if r["compiled"] else "PyTorch eager"
        rows.append((label, r["tokens_per_s"], r["peak_gpu_bytes"] / 2**20, "#e45756"))
    return rows


def bars(rows, x0, y0, w, h):
    top = max(t for _, t, _, _ in rows) * 1.1
    out = [f'<text x="{x0}" y="{y0 - 12}" font-size="14" font-weight="bold">GPT-2 124M on one H200: tokens/s '
           f'(device memory)</text>']
    bw = w / len(rows)
    for i, (label, tps, mib, colour) in enumerate(rows):
        bh = h * tps / top
        x = x0 + i * bw + bw * 0.15
        out.append(f'<rect x="{x:.1f}" y="{y0 + h - bh:.1f}" width="{bw * 0.7:.1f}" height="{bh:.1f}" fill="{colour}"/>')
        out.append(f'<text x="{x + bw * 0.35:.1f}" y="{y0 + h - bh - 18:.1f}" font-size="12" text-anchor="middle">'
                   f'{tps:,.0f}</text>')
        out.append(f'<text x="{x + bw * 0.35:.1f}" y="{y0 + h - bh - 4:.1f}" font-size="11" text-anchor="middle" '
                   f'fill="#555">({mib / 1024:.1f} GiB)</text>')
        out.append(f'<text x="{x + bw * 0.35:.1f}" y="{y0 + h + 16:.1f}" font-size="11" text-anchor="middle">'
                   f'{escape(label)}</text>')
    out.append(f'<line x1="{x0}" y1="{y0 + h}" x2="{x0 + w}" y2="{y0 + h}" stroke="#333"/>')
    return out


def curves(t, title, x0, y0, w, h):
    a, b = t["a_losses"], t["b_losses"]
    lo = min(min(a), min(b))
    hi = max(max(a), max(b))
    n = len(a)

    def pt(i, v):
        return x0 + w * i / (n - 1), y0 + h - h * (math.log(v) - math.log(lo)) / (math.log(hi) - math.log(lo))

    out = [f'<text x="{x0}" y="{y0 - 20}" font-size="12" font-weight="bold">{escape(title)}</text>',
           f'<text x="{x0}" y="{y0 - 6}" font-size="10" fill="#333">losses within {t["loss_max_ratio"]:.1e}, '
           f'parameters within {t["param_max_ratio"]:.1e}</text>',
           f'<rect x="{x0}" y="{y0}" width="{w}" height="{h}" fill="none" stroke="#999"/>']
    for losses, colour, dash in ((a, "#4c78a8", ""), (b, "#e45756", ' stroke-dasharray="5,4"')):
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in (pt(i, v) for i, v in enumerate(losses)))
        out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>')
    out.append(f'<text x="{x0}" y="{y0 + h + 14}" font-size="10" fill="#555">step 1</text>')
    out.append(f'<text x="{x0 + w}" y="{y0 + h + 14}" font-size="10" fill="#555" text-anchor="end">step {n}</text>')
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=os.path.join(ROOT, "bench", "results", "gpu_h200_20261128"))
    ap.add_argument("--svg", default=os.path.join(ROOT, "docs", "img", "gpu_h200.svg"))
    args = ap.parse_args()
    W, H = 1100, 470
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif">',
           f'<rect width="{W}" height="{H}" fill="white"/>']
    out += bars(throughput_rows(args.dir), 30, 50, 460, 330)
    panels = [("trajectory_gpt_sgd.json", "W-GPT, SGD"), ("trajectory_gpt_adamw.json", "W-GPT, AdamW"),
              ("trajectory_llama_sgd.json", "W-LLAMA, SGD"), ("trajectory_llama_adamw.json", "W-LLAMA, AdamW")]
    out.append('<text x="540" y="38" font-size="14" font-weight="bold">50 steps, CPU (solid) and GPU (dashed), '
               'loss on a log axis</text>')
    for i, (name, title) in enumerate(panels):
        t = load(os.path.join(args.dir, "call2", name))
        out += curves(t, title, 540 + (i % 2) * 280, 85 + (i // 2) * 195, 250, 140)
    out.append('<text x="30" y="455" font-size="11" fill="#555">NVIDIA H200, 2026-11-28, one run each '
               '(bench/results/gpu_h200_20261128); dpt\'s memory is its allocations, PyTorch\'s its peak.</text>')
    out.append("</svg>")
    with open(args.svg, "w") as f:
        f.write("\n".join(out) + "\n")
    print(f"wrote {args.svg}")


if __name__ == "__main__":
    main()
