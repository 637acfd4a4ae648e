#!/usr/bin/python3
"""Draws where a data-parallel step's time goes, beside one process's, as SVG.

Usage: python3 bench/plot_step_budget.py SINGLE.json DDP.json OUT.svg [--title TEXT]

SINGLE.json and DDP.json are `dpt train --summary-out` files of the same
workload and global batch: one process, and a run on N ranks. One bar per
row, in milliseconds, split by phase (the medians of data, forward,
backward, the comm wait in its two parts (waiting for a slower rank, and
communicating: src/train/lockstep.h), optimizer, and "rest": the median step
less those medians. Per step, the phases leave only microseconds out (see a
--metrics-out file with --log-every 1); the rest is the phases' spread, as
the medians of the parts do not add up to the median of the whole):

  1 process            the whole batch on one rank
  perfect scaling      every phase of that bar divided by N
  rank r               each rank of the N-rank run

Two dashed lines mark the step that perfect scaling would give
(1 process / N) and the one that 90% scaling needs (1 process / (0.9 N)):
where a rank's bar ends against them is its scaling, and the phases that
did not shrink by N say why. Needs nothing beyond Python's standard library.
"""

import argparse
import json
import os
import sys
from xml.sax.saxutils import escape

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_util import write_text  # noqa: E402

# The comm wait is drawn in its two parts (the lock-step split,
# src/train/lockstep.h): waiting for a slower rank's forward and backward,
# and communicating.
PHASES = [("data_ms", "data", "#9e9e9e"), ("forward_ms", "forward", "#4c78a8"),
          ("backward_ms", "backward", "#f58518"),
          ("comm_wait_slower_rank_ms", "wait for a slower rank", "#b279a2"),
          ("comm_wait_communicating_ms", "communicating", "#e45756"),
          ("optimizer_ms", "optimizer", "#54a24b"), (None, "rest", "#bab0ac")]
# A summary whose comm wait is not split (one process, which never waits; a
# pipeline or tensor-parallel run, docs/ddp.md; a summary from before the
# split) draws the whole wait where the two parts stand.
UNSPLIT_PHASES = [("comm_wait_ms", "comm wait", "#e45756") if key == "comm_wait_slower_rank_ms" else (key, label, c)
                  for key, label, c in PHASES if key != "comm_wait_communicating_ms"]
# The legend's order: the phases', the unsplit wait just before its parts.
LEGEND_ORDER = [label for _, label, _ in PHASES]
LEGEND_ORDER.insert(LEGEND_ORDER.index("wait for a slower rank"), "comm wait")
ROW_H, ROW_GAP, LEFT, RIGHT, TOP, WIDTH = 26, 10, 170, 50, 70, 1000


def segments(rank):
    """(label, colour, ms) of one rank's median step; rest = step - the phases."""
    phases = PHASES if "comm_wait_communicating_ms" in rank else UNSPLIT_PHASES
    parts = [(label, colour, rank.get(key, 0.0)) for key, label, colour in phases if key]
    rest = rank["step_ms"] - sum(ms for _, _, ms in parts)
    return parts + [("rest", PHASES[-1][2], max(rest, 0.0))]


def load(path):
    with open(path) as f:
        s = json.load(f)
    if not s.get("ranks"):
        raise ValueError("no per-rank times (is it a dpt train --summary-out file?)")
    return s


def draw(single, ddp, title):
    n = ddp.get("world", len(ddp["ranks"]))
    one = segments(single["ranks"][0])
    rows = [("1 process", one), (f"perfect scaling (/{n})", [(l, c, ms / n) for l, c, ms in one])]
    rows += [(f"rank {r}", segments(rank)) for r, rank in enumerate(ddp["ranks"])]
    single_ms = single["ranks"][0]["step_ms"]
    longest = max(sum(ms for _, _, ms in segs) for _, segs in rows)
    scale = (WIDTH - LEFT - RIGHT) / longest
    height = TOP + len(rows) * (ROW_H + ROW_GAP) + 70
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{WIDTH}" height="{height}" fill="white"/>',
           f'<text x="{LEFT}" y="22" font-size="15">{escape(title)}</text>']
    x = LEFT
    used = {name: colour for _, segs in rows for name, colour, ms in segs if ms > 0 or name == "rest"}
    for label, colour in sorted(used.items(), key=lambda item: LEGEND_ORDER.index(item[0])):
        out.append(f'<rect x="{x}" y="34" width="12" height="12" fill="{colour}"/>')
        out.append(f'<text x="{x + 16}" y="45">{label}</text>')
        x += 30 + 7 * len(label)
    for i, (label, segs) in enumerate(rows):
        y = TOP + i * (ROW_H + ROW_GAP)
        out.append(f'<text x="{LEFT - 8}" y="{y + ROW_H * 0.68:.1f}" text-anchor="end">{escape(label)}</text>')
        x = LEFT
        for name, colour, ms in segs:
            w = ms * scale
            out.append(f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{ROW_H}" fill="{colour}" '
                       f'stroke="white" stroke-width="0.5"><title>{escape(f"{name}: {ms:.3f} ms")}</title></rect>')
            x += w
        total = sum(ms for _, _, ms in segs)
        out.append(f'<text x="{x + 4:.1f}" y="{y + ROW_H * 0.68:.1f}">{total:.2f}</text>')
    bottom = TOP + len(rows) * (ROW_H + ROW_GAP)
    for ms, label in ((single_ms / n, "perfect"), (single_ms / (0.9 * n), "90%")):
        x = LEFT + ms * scale
        out.append(f'<line x1="{x:.1f}" y1="{TOP - 8}" x2="{x:.1f}" y2="{bottom}" stroke="#333" '
                   f'stroke-dasharray="4,3"/>')
        out.append(f'<text x="{x:.1f}" y="{bottom + 14}" text-anchor="middle">{label}</text>')
    scaling = single_ms / (n * ddp["step_ms_median"])
    out.append(f'<text x="{LEFT}" y="{height - 16}">milliseconds per step (medians); scaling = 1 process step / '
               f'({n} x rank step) = {scaling:.3f}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("single")
    ap.add_argument("ddp")
    ap.add_argument("out")
    ap.add_argument("--title", default="")
    args = ap.parse_args()
    try:
        single, ddp = load(args.single), load(args.ddp)
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"plot_step_budget: cannot read a summary: {e}")
    svg = draw(single, ddp, args.title or f"{ddp.get('model', '')}: where a step's time goes")
    write_text(args.out, svg)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
