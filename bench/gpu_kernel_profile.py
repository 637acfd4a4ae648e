#!/usr/bin/env python3
"""Where a GPU step's time goes, kernel by kernel, from Nsight Compute.

Usage: gpu_kernel_profile.py --one ONE.csv --two TWO.csv [--json OUT.json] [--top 25]

ONE.csv and TWO.csv are `ncu --csv --metrics gpu__time_duration.sum
--print-units base --print-kernel-base function` of the same `dpt train`
command with --steps 1 and --steps 2 (scripts/device/gpu.sh's `profile`
stage). Everything but the second step is the same in both runs (set-up,
the first step's plans, the GEMM peak measured at the end), so the second
step's kernels are the difference of the two: per kernel name, the time
and launch count of TWO less ONE. Prints the step's kernel time by group
(GEMMs, attention, elementwise, optimizer, ...) and the top kernels, and
writes them as JSON. ncu serialises kernels, so the sum is the step's GPU
busy time with no overlap and no launch gaps: hold it against the step's
wall time to see what the host adds.
"""
import argparse
import csv
import json
import re
import sys
from collections import defaultdict

UNITS_MS = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0, "second": 1e3}

# The first pattern a kernel's name matches names its group.
GROUPS = [
    ("gemm (cuBLAS/cuBLASLt)", r"gemm|xmma|cutlass|sm90_|sm80_|nvjet|cublas|splitK|reduce_1Block"),
    ("attention", r"softmax|flash|attention|attend|lse|rotary"),
    ("norms", r"layernorm|layer_norm|rmsnorm|rms_norm|norm_kernel|squares|sum_sq"),
    ("optimizer", r"adamw|sgd|clip|scale_kernel"),
    ("embedding and loss", r"embedding|position|cross_entropy|logit|iota|RadixSort|radix"),
    ("conversions and copies", r"bf16|convert|copy|gather_rows|scatter_rows|pack|unpack|transpose"),
    ("elementwise", r"gelu|relu|silu|swiglu|residual|bias|add|fill|zero"),
]


def read(path):
    """Per kernel name: (total ms, launches)."""
    lines = []
    with open(path, errors="replace") as f:
        lines = [line for line in f if line.startswith('"')]
    if not lines:
        raise SystemExit(f"{path}: no ncu CSV rows (is it the output of ncu --csv?)")
    rows = csv.DictReader(lines)
    out = defaultdict(lambda: [0.0, 0])
    for r in rows:
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = r.get("Metric Unit", "nsecond")
        if unit not in UNITS_MS:
            raise SystemExit(f"{path}: unknown time unit {unit!r}")
        value = float(r["Metric Value"].replace(",", "")) * UNITS_MS[unit]
        out[r["Kernel Name"]][0] += value
        out[r["Kernel Name"]][1] += 1
    if not out:
        raise SystemExit(f"{path}: no gpu__time_duration.sum rows")
    return out


def group_of(name):
    for group, pattern in GROUPS:
        if re.search(pattern, name, re.IGNORECASE):
            return group
    return "other"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--one", required=True)
    ap.add_argument("--two", required=True)
    ap.add_argument("--json")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    one, two = read(args.one), read(args.two)
    step = {}
    for name, (ms, n) in two.items():
        ms1, n1 = one.get(name, (0.0, 0))
        if n - n1 > 0:
            step[name] = (ms - ms1, n - n1)
    total = sum(ms for ms, _ in step.values())
    groups = defaultdict(lambda: [0.0, 0])
    for name, (ms, n) in step.items():
        groups[group_of(name)][0] += ms
        groups[group_of(name)][1] += n
    print(f"one step's kernels: {sum(n for _, n in step.values())} launches, {total:.2f} ms of GPU time")
    for g, (ms, n) in sorted(groups.items(), key=lambda kv: -kv[1][0]):
        print(f"  {g:28s} {ms:9.2f} ms  {100 * ms / total:5.1f}%  {n:6d} launches")
    top = sorted(step.items(), key=lambda kv: -kv[1][0])[: args.top]
    for name, (ms, n) in top:
        print(f"  {ms:9.3f} ms {n:5d}x  {name[:100]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"step_kernel_ms": total, "groups": {g: {"ms": v[0], "launches": v[1]} for g, v in groups.items()},
                       "kernels": [{"name": k, "ms": v[0], "launches": v[1], "group": group_of(k)}
                                   for k, v in sorted(step.items(), key=lambda kv: -kv[1][0])]}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
