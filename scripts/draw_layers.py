#!/usr/bin/python3
"""Draws docs/img/layers.svg: the folders under src/ as stacked layers, in the
order docs/architecture.md's "layers:" block gives them (the order
tests/test_source_rules.cpp enforces), each with what it holds and its line
count, and for each the layers below it that it includes (counted from the
#include lines of src/, so the picture cannot drift from the code).

Usage: python3 scripts/draw_layers.py   (from the repository root)
"""
import os
import re
from xml.sax.saxutils import escape

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def layers():
    text = open(os.path.join(ROOT, "docs", "architecture.md")).read().splitlines()
    start = text.index("layers:") + 1
    out = []
    for line in text[start:]:
        if not line.strip() or line.startswith("```"):
            break
        name, _, what = line.partition(" ")
        out.append((name, what.strip()))
    return out


def scan(folder):
    """Lines of code and the other folders included, for src/<folder>."""
    lines, uses = 0, set()
    for dirpath, _, files in os.walk(os.path.join(ROOT, "src", folder)):
        for f in files:
            if not f.endswith((".h", ".cpp", ".cu")):
                continue
            for line in open(os.path.join(dirpath, f), encoding="utf-8"):
                lines += 1
                m = re.match(r'\s*#\s*include\s+"([^"/]+)/', line)
                if m and m.group(1) != folder:
                    uses.add(m.group(1))
    return lines, uses


def main():
    order = layers()
    names = [n for n, _ in order]
    W, H, PAD, LEFT = 1000, 46, 6, 110
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{len(order) * H + 60}" '
           'font-family="sans-serif" font-size="12">',
           '<text x="10" y="20" font-size="15" font-weight="bold">src/: layers, top to bottom '
           '(a folder includes only those below it)</text>']
    for i, (name, what) in enumerate(order):
        y = 34 + i * H
        lines, uses = scan(name)
        below = [n for n in names if n in uses]
        shade = 235 - int(60 * i / max(1, len(order) - 1))
        svg.append(f'<rect x="10" y="{y}" width="{W - 20}" height="{H - PAD}" rx="5" '
                   f'fill="rgb({shade},{shade + 10 if shade < 245 else 250},255)" stroke="#557"/>')
        svg.append(f'<text x="20" y="{y + 17}" font-weight="bold" font-size="14">{escape(name)}</text>')
        svg.append(f'<text x="20" y="{y + 33}" fill="#555">{lines} lines</text>')
        svg.append(f'<text x="{LEFT}" y="{y + 17}">{escape(what[:140])}</text>')
        svg.append(f'<text x="{LEFT}" y="{y + 33}" fill="#335">includes: '
                   f'{escape(", ".join(below) if below else "nothing but itself")}</text>')
    svg.append("</svg>")
    path = os.path.join(ROOT, "docs", "img", "layers.svg")
    with open(path, "w") as f:
        f.write("\n".join(svg) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
