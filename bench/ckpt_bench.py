#!/usr/bin/env python3
"""Activation checkpointing: activation bytes, peak RSS, s/step and the
bytes communicated per step, with and without --checkpoint-activations, on
W-GPT-L (ZeRO-3, 2 ranks, --synthetic). Medians over the run's steady steps;
the machine is shared, so times are noisy. Writes bench/results/ckpt.json.

Usage: bench/ckpt_bench.py [--dpt build/dpt] [--steps 4] [--xl]
"""
import argparse
import json
import os
import subprocess
import tempfile

W_GPT_L = ["--layers", "12", "--heads", "12", "--width", "768", "--context", "128"]
W_GPT_XL = ["--layers", "20", "--heads", "16", "--width", "2048", "--context", "128"]


def run(dpt, model, steps, checkpoint, tmp):
    summary = os.path.join(tmp, "s.json")
    cmd = [dpt, "launch", "-n", "2", "--", dpt, "train", "--model", "gpt", "--threads", "1", "--quiet",
           "--summary-out", summary, *model, "--strategy", "zero3", "--synthetic", "--steps", str(steps)]
    if checkpoint:
        cmd.append("--checkpoint-activations")
    subprocess.run(cmd, check=True)
    with open(summary) as f:
        s = json.load(f)
    return {"checkpoint_activations": checkpoint, "activation_bytes": s["bytes"]["activations"],
            "peak_rss_bytes": s["bytes"]["peak_rss"], "s_per_step_median": s["step_ms_median"] / 1000.0,
            "comm_bytes_per_step": s["comm_bytes_per_step"], "batch": s["batch"], "steps": s["steps"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dpt", default="build/dpt")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--xl", action="store_true", help="also W-GPT-XL (3 steps)")
    a = ap.parse_args()
    out = {"note": "ZeRO-3, 2 ranks, 1 thread each, --synthetic; shared 2-core machine: times are noisy"}
    with tempfile.TemporaryDirectory() as tmp:
        out["W-GPT-L"] = [run(a.dpt, W_GPT_L, a.steps, c, tmp) for c in (False, True)]
        if a.xl:
            out["W-GPT-XL"] = [run(a.dpt, W_GPT_XL, 3, c, tmp) for c in (False, True)]
    os.makedirs("bench/results", exist_ok=True)
    with open("bench/results/ckpt.json", "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
