#!/usr/bin/python3
"""Draws what lock-step costs two processes of one step, as SVG.

Usage: python3 bench/plot_lockstep.py RESULTS.json OUT.svg [--title TEXT]

RESULTS.json is build/bench/lockstep_ceiling's output. One bar per way
(free: the pair; lockstep; reduced: lock-step with DDP's in-place sums;
alone: one process), rank 0's median milliseconds per step split by phase
(forward, backward, the barrier, the sums, the update); at the right of
each bar, both processes' samples/s and its ratio to the free pair's. The
phases' medians need not add up to the step exactly. Needs nothing beyond
Python's standard library.
"""

import argparse
import json
import sys
from xml.sax.saxutils import escape

PHASES = [("forward", "#4c78a8"), ("backward", "#f58518"), ("barrier", "#b279a2"), ("sums", "#e45756"),
          ("update", "#54a24b")]
WAYS = [("free", "free (the pair)"), ("lockstep", "lock-step"), ("reduced", "lock-step + DDP's sums"),
        ("alone", "one process alone")]
ROW_H, ROW_GAP, LEFT, RIGHT, TOP, WIDTH = 26, 10, 190, 290, 70, 1000


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results")
    ap.add_argument("out")
    ap.add_argument("--title", default="")
    args = ap.parse_args()
    try:
        with open(args.results) as f:
            ways = json.load(f)["ways"]
        rows = [(label, ways[key]) for key, label in WAYS]
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.exit(f"plot_lockstep.py: {args.results} is not lockstep_ceiling's output ({e})")
    free = rows[0][1]["samples_per_s_both"]
    longest = max(sum(w["rank0_ms_per_step"][p] for p, _ in PHASES) for _, w in rows)
    scale = (WIDTH - LEFT - RIGHT) / longest
    height = TOP + len(rows) * (ROW_H + ROW_GAP) + 40
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" '
           f'font-size="12">', f'<rect width="{WIDTH}" height="{height}" fill="white"/>',
           f'<text x="10" y="20" font-size="14">{escape(args.title or "Rank 0, ms per step, by phase")}</text>']
    x = LEFT
    for phase, colour in PHASES:  # the legend
        svg.append(f'<rect x="{x}" y="34" width="12" height="12" fill="{colour}"/>')
        svg.append(f'<text x="{x + 16}" y="44">{phase}</text>')
        x += 16 + 8 * len(phase) + 20
    for i, (label, way) in enumerate(rows):
        y = TOP + i * (ROW_H + ROW_GAP)
        svg.append(f'<text x="{LEFT - 8}" y="{y + ROW_H - 8}" text-anchor="end">{escape(label)}</text>')
        x = LEFT
        for phase, colour in PHASES:
            ms = way["rank0_ms_per_step"][phase]
            if ms > 0:
                svg.append(f'<rect x="{x:.1f}" y="{y}" width="{ms * scale:.1f}" height="{ROW_H}" fill="{colour}">'
                           f'<title>{phase} {ms:.3f} ms</title></rect>')
            x += ms * scale
        rate, total = way["samples_per_s_both"], sum(way["rank0_ms_per_step"][p] for p, _ in PHASES)
        svg.append(f'<text x="{x + 8:.1f}" y="{y + ROW_H - 8}">{total:.2f} ms; '
                   f'{rate:,.0f} samples/s ({rate / free:.3f} of free)</text>')
    svg.append("</svg>")
    with open(args.out, "w") as f:
        f.write("\n".join(svg) + "\n")


if __name__ == "__main__":
    main()
