#!/usr/bin/python3
"""Draws bench/bf16_modes_bench.py's result as SVG: one step per way.

Usage: python3 bench/plot_bf16_modes.py RESULT.json OUT.svg [--title TEXT]

One bar per way (fp32, bf16 on the bf16 kernels, bf16 widened to fp32, and
what --bf16-gemm auto chose), in milliseconds per step (the medians of the
interleaved rounds): the time inside GEMM calls (with the widening passes
where the GEMMs are widened) and everything else. A tick on each bar marks
the step its model FLOPs would take at the GEMM peak that way measured (the
bar's length times its utilisation); to the right, its tokens/s and that
utilisation of that peak. Needs nothing beyond Python's standard library.
"""

import argparse
import json
import os
import sys
from xml.sax.saxutils import escape

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_util import write_text  # noqa: E402

WIDTH, LEFT, RIGHT, TOP, ROW_H, ROW_GAP = 940, 150, 300, 62, 26, 12
WAYS = [("fp32", "fp32"), ("native", "bf16, bf16 kernels"), ("widened", "bf16, widened"), ("auto", "bf16, auto")]
PARTS = [("GEMM calls (widening included)", "#4c78a8"), ("everything else", "#f58518")]


def rows_of(result):
    med = result["medians"]
    rows = []
    for key, label in WAYS:
        m = med.get(key)
        if not m:
            continue  # native is skipped where oneDNN has no bf16 kernels
        if key == "auto":
            label += f" ({m['bf16_gemm']})"
        rows.append((label, m["gemm_ms"], m["step_ms"] - m["gemm_ms"], m))
    if not rows:
        raise ValueError("no ways in its medians")
    return rows


def draw(result, title):
    rows = rows_of(result)
    scale = (WIDTH - LEFT - RIGHT) / max(g + o for _, g, o, _ in rows)
    height = TOP + len(rows) * (ROW_H + ROW_GAP) + 50
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{WIDTH}" height="{height}" fill="white"/>',
           f'<text x="{LEFT}" y="22" font-size="15">{escape(title)}</text>']
    x = LEFT
    for name, colour in PARTS + [("the step at 100% of its peak", None)]:
        if colour:
            out.append(f'<rect x="{x}" y="34" width="12" height="12" fill="{colour}"/>')
        else:
            out.append(f'<line x1="{x + 6}" y1="32" x2="{x + 6}" y2="48" stroke="#111" stroke-width="2"/>')
        out.append(f'<text x="{x + 16}" y="45">{escape(name)}</text>')
        x += 30 + 7 * len(name)
    for i, (label, gemm_ms, other_ms, m) in enumerate(rows):
        y = TOP + i * (ROW_H + ROW_GAP)
        out.append(f'<text x="{LEFT - 8}" y="{y + ROW_H * 0.68:.1f}" text-anchor="end">{escape(label)}</text>')
        x = LEFT
        for (name, colour), ms in zip(PARTS, (gemm_ms, other_ms)):
            out.append(f'<rect x="{x:.2f}" y="{y}" width="{ms * scale:.2f}" height="{ROW_H}" fill="{colour}" '
                       f'stroke="white" stroke-width="0.5"><title>{escape(f"{name}: {ms:.1f} ms")}</title></rect>')
            x += ms * scale
        ideal = LEFT + (gemm_ms + other_ms) * m["mfu"] * scale
        out.append(f'<line x1="{ideal:.1f}" y1="{y - 3}" x2="{ideal:.1f}" y2="{y + ROW_H + 3}" stroke="#111" '
                   f'stroke-width="2"/>')
        out.append(f'<text x="{x + 6:.1f}" y="{y + ROW_H * 0.68:.1f}">{gemm_ms + other_ms:.0f} ms, '
                   f'{m["tokens_per_s"]:,.0f} tokens/s, {100 * m["mfu"]:.0f}% of {m["peak_gflops"]:.0f} GFLOP/s</text>')
    out.append(f'<text x="{LEFT}" y="{height - 16}">milliseconds per step, medians of {result.get("repeat", "?")} '
               f'interleaved rounds of {result.get("steps", "?")} steps; {escape(result.get("cpu", ""))}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("result")
    ap.add_argument("out")
    ap.add_argument("--title", default="")
    args = ap.parse_args()
    try:
        with open(args.result) as f:
            result = json.load(f)
        svg = draw(result, args.title or f"{result.get('workload', '')}: one step, fp32 and bf16's ways")
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"plot_bf16_modes: cannot read {args.result} as a bf16_modes_bench.py result: {e}")
    write_text(args.out, svg)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
