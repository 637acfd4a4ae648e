#!/usr/bin/python3
"""Draws a `dpt train --trace-out` timeline as an SVG picture.

Usage: python3 bench/plot_timeline.py TRACE.json OUT.svg [--title TEXT] [--steps K]

One row per rank and thread ("rank 0 compute", "rank 0 comm", ...), time in
milliseconds from the first span drawn, one colour per phase (data, forward,
backward, or a split backward's input grad (B) and weight grad (W), comm
wait, optimizer) and the collectives on the communication rows
(DDP's all-reduces numbered by bucket, ZeRO's all-gathers and reduce-scatters
by unit; a pipeline stage's forwards and backwards by micro-batch), so what
overlaps what can be read off. --steps K
draws only the last K steps of the trace. Needs nothing beyond Python's
standard library; the trace itself is Chrome's format, so
https://ui.perfetto.dev opens it too.
"""

import argparse
import json
import os
import sys
from xml.sax.saxutils import escape

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_util import write_text  # noqa: E402

COLOURS = {
    "data": "#9e9e9e",
    "forward": "#4c78a8",
    "backward": "#f58518",
    "input grad": "#c0580a",
    "weight grad": "#ffbf79",
    "comm wait": "#e45756",
    "optimizer": "#54a24b",
    "all_reduce": "#b279a2",
    "all_gather": "#72b7b2",
    "reduce_scatter": "#9d755d",
}
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")
ROW_H, ROW_GAP, LEFT, RIGHT, TOP, WIDTH = 26, 8, 150, 20, 56, 1200


def load(path, last_steps):
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X"]
    if not spans:
        sys.exit(f"plot_timeline: {path} has no spans (was it written by dpt train --trace-out?)")
    if last_steps:
        steps = sorted({e["args"]["step"] for e in spans})
        keep = set(steps[-last_steps:])
        spans = [e for e in spans if e["args"]["step"] in keep]
    return spans


def kind(e):
    """The phase: a pipeline stage's spans carry their micro-batch ("forward 3")."""
    if "micro_batch" in e["args"]:
        return e["name"].rsplit(" ", 1)[0]
    return next((c for c in COLLECTIVES if e["name"].startswith(c)), e["name"])


def draw(spans, title):
    t0 = min(e["ts"] for e in spans)
    t1 = max(e["ts"] + e["dur"] for e in spans)
    scale = (WIDTH - LEFT - RIGHT) / max(t1 - t0, 1.0)  # px per microsecond
    rows = sorted({(e["pid"], e["tid"]) for e in spans})
    row_y = {r: TOP + i * (ROW_H + ROW_GAP) for i, r in enumerate(rows)}
    height = TOP + len(rows) * (ROW_H + ROW_GAP) + 60
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{WIDTH}" height="{height}" fill="white"/>',
           f'<text x="{LEFT}" y="22" font-size="15">{escape(title)}</text>']
    # Time axis: a tick every "nice" number of milliseconds.
    span_ms = (t1 - t0) / 1000.0
    tick = next(t for t in (0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
                if span_ms / t <= 12)
    axis_y = height - 40
    k = 0
    while k * tick <= span_ms + 1e-9:
        x = LEFT + k * tick * 1000.0 * scale
        out.append(f'<line x1="{x:.1f}" y1="{TOP - 6}" x2="{x:.1f}" y2="{axis_y}" stroke="#e0e0e0"/>')
        out.append(f'<text x="{x:.1f}" y="{axis_y + 14}" text-anchor="middle">{k * tick:g}</text>')
        k += 1
    out.append(f'<text x="{WIDTH - RIGHT}" y="{axis_y + 30}" text-anchor="end">ms</text>')
    for (pid, tid), y in row_y.items():
        label = f"rank {pid} {'comm' if tid == 1 else 'compute'}"
        out.append(f'<text x="{LEFT - 8}" y="{y + ROW_H * 0.68:.1f}" text-anchor="end">{label}</text>')
    for e in spans:
        x = LEFT + (e["ts"] - t0) * scale
        w = max(e["dur"] * scale, 0.8)
        y = row_y[(e["pid"], e["tid"])]
        k = kind(e)
        tip = f'{e["name"]} (step {e["args"]["step"]}): {e["dur"] / 1000.0:.3f} ms'
        if "bytes" in e["args"]:
            tip += f', {e["args"]["bytes"] / 2**20:.2f} MiB'
        out.append(f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{ROW_H}" fill="{COLOURS.get(k, "#333")}" '
                   f'stroke="white" stroke-width="0.5"><title>{escape(tip)}</title></rect>')
        number = e["args"].get("bucket", e["args"].get("unit", e["args"].get("micro_batch")))
        if (k in COLLECTIVES or k in ("forward", "backward", "input grad", "weight grad")) and w > 12 and number is not None:
            out.append(f'<text x="{x + w / 2:.1f}" y="{y + ROW_H * 0.68:.1f}" text-anchor="middle" '
                       f'fill="white" font-size="10">{number}</text>')
    # Legend.
    x = LEFT
    present = {kind(e) for e in spans}
    for name, colour in COLOURS.items():
        if name in COLLECTIVES and name not in present:
            continue
        label = {"all_reduce": "all_reduce (bucket no.)", "all_gather": "all_gather (unit no.)",
                 "reduce_scatter": "reduce_scatter (unit no.)"}.get(name, name)
        out.append(f'<rect x="{x}" y="32" width="12" height="12" fill="{colour}"/>')
        out.append(f'<text x="{x + 16}" y="43">{label}</text>')
        x += 30 + 7 * len(label)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description="Draw a dpt --trace-out timeline as SVG.")
    ap.add_argument("trace")
    ap.add_argument("out")
    ap.add_argument("--title", default="")
    ap.add_argument("--steps", type=int, default=0, help="only the last K steps")
    args = ap.parse_args()
    try:
        spans = load(args.trace, args.steps)
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"plot_timeline: cannot read {args.trace}: {e}")
    svg = draw(spans, args.title or args.trace)
    write_text(args.out, svg)
    print(f"wrote {args.out} ({len(spans)} spans)")


if __name__ == "__main__":
    main()
