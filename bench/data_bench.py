#!/usr/bin/python3
"""The data path against what training consumes (issue 18, docs/data.md).

Usage: /usr/bin/python3 bench/data_bench.py [--steps S] [--large-gib G] [--dir DIR] [--keep]

Writes two sets of llm.c shards of random tokens below 256 (W-GPT's byte
vocabulary) under DIR (default /tmp/dpt_data_bench, removed afterwards unless
--keep; never inside the repository):
  small: 2 shards, 20 MiB together
  large: 8 shards, G GiB together (default 2)
and measures, on each:
  read:  `dpt bench data` (context 128, global batch 16, as W-GPT): the time
         to open and check every shard, and the sampler's tokens/s;
  train: W-GPT on 2 ranks (DDP, 1 thread each) for S steps (default 100):
         tokens/s and each rank's peak RSS.
Reports read tokens/s over W-GPT's tokens/s (the goal: at least 100x) and
the peak RSS of the large run minus the small run's (the goal: under
64 MiB). Results go to bench/results/data.json.
"""

import argparse
import os
import shutil
import struct
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_util import run_and_load, write_json  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 1 << 20


def write_set(folder, shards, total_bytes, seed):
    """`shards` llm.c shards of random tokens in [0, 256), total_bytes of tokens."""
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(seed)
    per = total_bytes // 2 // shards
    chunk = 1 << 24
    for i in range(shards):
        with open(os.path.join(folder, f"rand_train_{i:06d}.bin"), "wb") as f:
            f.write(struct.pack("<256i", 20240520, 1, per, *([0] * 253)))
            for at in range(0, per, chunk):
                f.write(rng.integers(0, 256, size=min(chunk, per - at), dtype=np.uint16).tobytes())


def read_rate(dpt, folder, out):
    return run_and_load("bench data", [dpt, "bench", "data", "--data", folder, "--vocab", "256", "--context", "128",
                                       "--batch", "16", "--seconds", "3", "--json", out], out)


def train(dpt, folder, steps, out):
    cmd = [dpt, "launch", "-n", "2", "--", dpt, "train", "--model", "gpt", "--threads", "1", "--quiet",
           "--data", folder, "--steps", str(steps), "--summary-out", out]
    s = run_and_load("W-GPT", cmd, out, timeout=3600)
    return {"tokens_per_s": s["tokens_per_s"], "peak_rss_per_rank": [r["peak_rss"] for r in s["ranks"]],
            "val_loss": s.get("val_loss")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--large-gib", type=float, default=2.0)
    ap.add_argument("--dir", default="/tmp/dpt_data_bench")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "data.json"))
    a = ap.parse_args()
    dpt = os.path.join(ROOT, "build", "dpt")
    sets = {"small": (2, 20 * MIB), "large": (8, int(a.large_gib * 1024 * MIB))}
    results = {"workload": "W-GPT reading llm.c shards", "ranks": 2, "threads": 1, "steps": a.steps, "sets": {}}
    try:
        for name, (shards, size) in sets.items():
            folder = os.path.join(a.dir, name)
            if not os.path.isdir(folder):
                write_set(folder, shards, size, seed=len(name))
            r = {"shards": shards, "bytes": size,
                 "read": read_rate(dpt, folder, os.path.join(a.dir, f"{name}_read.json")),
                 "train": train(dpt, folder, a.steps, os.path.join(a.dir, f"{name}_train.json"))}
            results["sets"][name] = r
            print(f"{name}: {size / MIB:.0f} MiB in {shards} shards: check {r['read']['open_check_s']:.2f} s, "
                  f"read {r['read']['tokens_per_s']:.3g} tokens/s; W-GPT {r['train']['tokens_per_s']:.0f} tokens/s, "
                  f"peak RSS {[round(x / MIB, 1) for x in r['train']['peak_rss_per_rank']]} MiB")
    finally:
        if not a.keep:
            shutil.rmtree(a.dir, ignore_errors=True)
    small, large = results["sets"]["small"], results["sets"]["large"]
    results["read_over_consumed"] = large["read"]["tokens_per_s"] / large["train"]["tokens_per_s"]
    results["peak_rss_large_minus_small"] = [l - s for l, s in zip(large["train"]["peak_rss_per_rank"],
                                                                   small["train"]["peak_rss_per_rank"])]
    print(f"read / consumed: {results['read_over_consumed']:.0f}x; peak RSS large - small per rank: "
          f"{[round(x / MIB, 1) for x in results['peak_rss_large_minus_small']]} MiB")
    write_json(a.out, results)


if __name__ == "__main__":
    main()
