#!/usr/bin/python3
"""Peak RSS per rank by strategy and technique, as a picture (docs/memory.md).

Usage: python3 bench/plot_memory.py [--dpt build/dpt] [--steps 2] [--dir DIR]
           [--json bench/results/memory_matrix.json] [--svg docs/img/memory_peak_rss.svg]
       python3 bench/plot_memory.py --from-json FILE --svg OUT.svg   (redraw only)

Trains W-GPT-L (12 layers, width 768, context 128; 2 sequences per rank,
AdamW, synthetic batches) on 2 ranks under each strategy and memory
technique, one thread per rank, and draws one bar per run: the bytes the
engine accounts per category (parameters, gradients, optimizer state,
gathered units, communication scratch, activations), stacked, with the
measured peak RSS marked beside it. Writes the runs' figures as JSON and the
picture as SVG with nothing beyond Python's standard library.
"""

import argparse
import json
import os
import sys
import tempfile
from xml.sax.saxutils import escape

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_util import RunError, run_and_load, write_json  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WGPT_L = ["--model", "gpt", "--layers", "12", "--heads", "12", "--width", "768", "--context", "128", "--batch", "4",
          "--synthetic", "--optimizer", "adamw", "--threads", "1"]
CATEGORIES = [("parameters", "#4c78a8"), ("gradients", "#f58518"), ("optimizer", "#54a24b"),
              ("gathered", "#72b7b2"), ("scratch", "#9d755d"), ("activations", "#e45756")]


def runs(offload_dir):
    return [
        ("DDP", ["--strategy", "ddp"]),
        ("ZeRO-1", ["--strategy", "zero1"]),
        ("ZeRO-2", ["--strategy", "zero2"]),
        ("ZeRO-3", ["--strategy", "zero3"]),
        ("ZeRO-3 + ckpt", ["--strategy", "zero3", "--checkpoint-activations"]),
        ("ZeRO-3 + offload opt", ["--strategy", "zero3", "--offload", "optimizer", "--offload-dir", offload_dir]),
        ("ZeRO-3 bf16", ["--strategy", "zero3", "--precision", "bf16"]),
        ("ZeRO-3 bf16 + ckpt + offload params", ["--strategy", "zero3", "--precision", "bf16",
                                                 "--checkpoint-activations", "--offload", "params",
                                                 "--offload-dir", offload_dir]),
    ]


def measure(args):
    rows = []
    with tempfile.TemporaryDirectory(dir=args.dir) as off, tempfile.TemporaryDirectory() as tmp:
        for label, flags in runs(off):
            summary = os.path.join(tmp, "s.json")
            cmd = [args.dpt, "launch", "-n", "2", "--", args.dpt, "train", *WGPT_L, *flags, "--steps",
                   str(args.steps), "--quiet", "--summary-out", summary]
            s = run_and_load(label, cmd, summary, timeout=1800)
            row = {"label": label, "flags": flags[:-1] if "--offload-dir" in flags else flags,
                   "bytes": {k: s["bytes"][k] for k, _ in CATEGORIES}, "offloaded": s["bytes"]["offloaded"],
                   "peak_rss_per_rank": max(r["peak_rss"] for r in s["ranks"]), "s_per_step": s["step_ms_median"] / 1e3}
            rows.append(row)
            print(f"{label}: peak RSS {row['peak_rss_per_rank'] / 2**20:.0f} MiB per rank, accounted "
                  f"{sum(row['bytes'].values()) / 2**20:.0f} MiB, {row['s_per_step']:.2f} s/step", flush=True)
    return {"benchmark": "memory matrix", "workload": "W-GPT-L, 2 ranks, 2 sequences per rank", "rows": rows}


def svg(result):
    rows = result["rows"]
    mib = 2 ** 20
    top = max(max(r["peak_rss_per_rank"], sum(r["bytes"].values())) for r in rows) / mib * 1.1
    W, H, left, bottom, bar = 900, 420, 70, 120, 60
    gap = (W - left - 20) / len(rows)
    y = lambda v: H - bottom - v / top * (H - bottom - 40)  # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">',
           f'<text x="{W / 2}" y="18" text-anchor="middle" font-size="14">{escape(result["workload"])}: '
           'accounted bytes per rank (stacked), measured peak RSS (line)</text>']
    step = 200 if top > 800 else 100
    for v in range(0, int(top) + 1, step):
        out.append(f'<line x1="{left}" x2="{W - 20}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v}</text>')
    out.append(f'<text x="16" y="{(H - bottom) / 2}" transform="rotate(-90 16 {(H - bottom) / 2})" '
               'text-anchor="middle">MiB per rank</text>')
    for i, r in enumerate(rows):
        x = left + i * gap + (gap - bar) / 2
        base = 0.0
        for name, colour in CATEGORIES:
            v = r["bytes"][name] / mib
            if v > 0:
                out.append(f'<rect x="{x:.1f}" y="{y(base + v):.1f}" width="{bar}" height="{y(base) - y(base + v):.1f}" '
                           f'fill="{colour}"><title>{name}: {v:.0f} MiB</title></rect>')
            base += v
        rss = r["peak_rss_per_rank"] / mib
        out.append(f'<line x1="{x - 6:.1f}" x2="{x + bar + 6:.1f}" y1="{y(rss):.1f}" y2="{y(rss):.1f}" stroke="black" '
                   f'stroke-width="2"><title>peak RSS {rss:.0f} MiB</title></line>')
        out.append(f'<text x="{x + bar / 2:.1f}" y="{y(rss) - 4:.1f}" text-anchor="middle">{rss:.0f}</text>')
        lines = r["label"].replace(" + ", "\n+ ").split("\n")
        for k, line in enumerate(lines):
            out.append(f'<text x="{x + bar / 2:.1f}" y="{H - bottom + 16 + 13 * k}" text-anchor="middle">'
                       f'{escape(line)}</text>')
    for k, (name, colour) in enumerate(CATEGORIES):
        lx = left + k * 130
        out.append(f'<rect x="{lx}" y="{H - 28}" width="12" height="12" fill="{colour}"/>')
        out.append(f'<text x="{lx + 16}" y="{H - 18}">{name}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dpt", default=os.path.join(ROOT, "build", "dpt"))
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--dir", default="/var/tmp", help="where the offload files go (a local disk)")
    ap.add_argument("--json", default=os.path.join(ROOT, "bench", "results", "memory_matrix.json"))
    ap.add_argument("--svg", default=os.path.join(ROOT, "docs", "img", "memory_peak_rss.svg"))
    ap.add_argument("--from-json", help="redraw from this file instead of running")
    args = ap.parse_args()
    if args.from_json:
        with open(args.from_json) as f:
            result = json.load(f)
    else:
        try:
            result = measure(args)
        except RunError as e:
            print(e, file=sys.stderr)
            return 1
        write_json(args.json, result)
    with open(args.svg, "w") as f:
        f.write(svg(result))
    print(f"wrote {args.svg}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
