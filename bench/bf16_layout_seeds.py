#!/usr/bin/python3
"""How far bf16 layouts land from one bf16 process, seed by seed (not a speed benchmark).

The Llama of tests/dist/llama_cli.cpp and cp_cli.cpp (2 blocks, width 32, GQA
4/2 heads, context 16, SGD with momentum 0.9, 20 steps, bf16) trained on one
process and on 2 or 4 ranks (ddp, tp 2, dp 2 x tp 2 under zero3, and cp 2
against one process at the same 2 micro-batches), each over the tests' word
corpus; per seed and learning rate, the worst tensor's max|a - b| / max|b|
between the layout's saved weights and the one process's (the tests'
expect_within). Where the figure spreads from 1e-7 to 1e-1 over seeds, the
run amplifies the layouts' rounding differences (a loss spike) and a bound of
1e-2 is a lottery; where it stays well under, the bound tests the layouts.

Usage:
  /usr/bin/python3 bench/bf16_layout_seeds.py --dpt build/dpt [--lr 0.05,0.02] [--seeds 1-9]
Result: results/bf16_layout_seeds.json (--out to change).
"""

import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

from bench_util import write_json

WORDS = {
    "llama": "the rotary query key group gate up down norm head".split(),
    "cp": "the ring chunk keys values causal balance sum grad loss".split(),
}


def write_corpus(path, words, count=20000):
    # tests/cli_run.h's write_word_corpus: the same words in the same order.
    x, out = 1, []
    for _ in range(count):
        x = (x * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        out.append(words[(x >> 33) % len(words)])
    with open(path, "w") as f:
        f.write(" ".join(out) + " ")


def tensors(path):
    # A safetensors file: 8-byte header length, JSON header, raw data.
    with open(path, "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0]
    header, base = json.loads(blob[8:8 + n]), 8 + n
    out = {}
    for name, t in header.items():
        if name == "__metadata__" or t["dtype"] != "F32":
            continue
        s, e = t["data_offsets"]
        out[name] = struct.unpack(f"<{(e - s) // 4}f", blob[base + s:base + e])
    return out


def worst(a, b):
    ta, tb = tensors(a), tensors(b)
    w = 0.0
    for name, vb in tb.items():
        scale = max(abs(v) for v in vb) or 1.0
        w = max(w, max(abs(x - y) for x, y in zip(ta[name], vb)) / scale)
    return w


def seeds_of(text):
    if "-" in text:
        lo, hi = text.split("-")
        return list(range(int(lo), int(hi) + 1))
    return [int(s) for s in text.split(",")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dpt", required=True)
    ap.add_argument("--lr", default="0.05,0.02")
    ap.add_argument("--seeds", default="1-9")
    ap.add_argument("--bound", type=float, default=1e-2)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "bf16_layout_seeds.json"))
    args = ap.parse_args()
    dpt = os.path.abspath(args.dpt)
    env = "env -u DPT_COMM_ALGO -u DPT_COMM_TRANSPORT OMP_NUM_THREADS=1 DPT_COMM_TIMEOUT=60 "
    result = {"dpt": dpt, "bound": args.bound, "runs": []}
    with tempfile.TemporaryDirectory() as tmp:
        for corpus, words in WORDS.items():
            write_corpus(os.path.join(tmp, corpus + ".txt"), words)
        for lr in args.lr.split(","):
            for seed in seeds_of(args.seeds):
                base = (f"--model llama --layers 2 --width 32 --heads 4 --kv-heads 2 --intermediate 64 --context 16 "
                        f"--vocab 256 --seed {seed} --quiet --threads 1 --optimizer sgd --lr {lr} --momentum 0.9 "
                        f"--steps 20 --precision bf16 --batch 4")
                runs = {"one": (1, "llama", ""), "ddp2": (2, "llama", " --strategy ddp"),
                        "tp2": (2, "llama", " --tp 2"), "dp2_tp2_zero3": (4, "llama", " --tp 2 --strategy zero3"),
                        "one_m2": (1, "cp", " --micro-batches 2"), "cp2": (2, "cp", " --micro-batches 2 --cp 2")}
                for name, (n, corpus, flags) in runs.items():
                    launcher = f"{dpt} launch -n {n} -- " if n > 1 else ""
                    cmd = (f"{env}{launcher}{dpt} train --data {tmp}/{corpus}.txt {base}{flags} "
                           f"--save {tmp}/{name}.st")
                    r = subprocess.run(cmd, shell=True, capture_output=True, text=True)
                    if r.returncode:
                        sys.exit(f"{cmd}\nfailed: {r.stderr[-500:]}")
                row = {"lr": float(lr), "seed": seed}
                for name, ref in [("ddp2", "one"), ("tp2", "one"), ("dp2_tp2_zero3", "one"), ("cp2", "one_m2")]:
                    row[name] = worst(f"{tmp}/{name}.st", f"{tmp}/{ref}.st")
                result["runs"].append(row)
                print(f"lr {lr} seed {seed}: " + ", ".join(f"{k} {v:.2e}" for k, v in row.items()
                                                         if k not in ("lr", "seed")), flush=True)
    for lr in sorted({r["lr"] for r in result["runs"]}):
        rows = [r for r in result["runs"] if r["lr"] == lr]
        over = sum(1 for r in rows if max(r[k] for k in r if k not in ("lr", "seed")) > args.bound)
        print(f"lr {lr}: {over} of {len(rows)} seeds past {args.bound} on some layout")
    write_json(args.out, result)


if __name__ == "__main__":
    main()
