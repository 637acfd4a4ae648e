#!/usr/bin/env python3
"""Activation checkpointing on W-GPT-L and W-GPT-XL (shared/WORKLOADS.md: 2
sequences per rank, AdamW fp32, --synthetic), ZeRO-3 on 2 ranks of 1 thread:
the activation bytes the engine accounts, the measured peak RSS, the step
time (median of the steps) and the bytes sent per step, with and without
--checkpoint-activations. One run per configuration: the machine is shared,
so times are rough; the bytes are exact. Writes bench/results/ckpt.json.

Usage: bench/ckpt_bench.py [--dpt build/dpt] [--steps 3] [--no-xl]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_util import run_and_load, write_json  # noqa: E402

MODELS = {
    "W-GPT-L": ["--layers", "12", "--heads", "12", "--width", "768", "--context", "128"],
    "W-GPT-XL": ["--layers", "20", "--heads", "16", "--width", "2048", "--context", "128"],
}
BATCH = 4  # 2 sequences per rank


def run(dpt, name, steps, checkpoint, summary):
    cmd = [dpt, "launch", "-n", "2", "--", dpt, "train", "--model", "gpt", *MODELS[name], "--batch", str(BATCH),
           "--strategy", "zero3", "--synthetic", "--steps", str(steps), "--threads", "1", "--quiet",
           "--log-every", "100", "--summary-out", summary]
    if checkpoint:
        cmd.append("--checkpoint-activations")
    s = run_and_load(f"{name} checkpoint={checkpoint}", cmd, summary, timeout=3600)
    return {"checkpoint_activations": checkpoint, "activation_bytes": s["bytes"]["activations"],
            "peak_rss_bytes": s["bytes"]["peak_rss"], "s_per_step_median": s["step_ms_median"] / 1000.0,
            "comm_bytes_per_step": s["comm_bytes_per_step"], "batch": s["batch"], "steps": s["steps"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dpt", default="build/dpt")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--no-xl", action="store_true", help="W-GPT-L only")
    ap.add_argument("--out", default="bench/results/ckpt.json")
    a = ap.parse_args()
    out = {"note": f"ZeRO-3, 2 ranks x 1 thread, batch {BATCH} (2 per rank), --synthetic, {a.steps} steps, one run "
                   "each; shared 2-core machine: times are rough"}
    summary = f"{a.out}.summary.tmp"
    for name in ["W-GPT-L"] + ([] if a.no_xl else ["W-GPT-XL"]):
        without, with_ = [run(a.dpt, name, a.steps, c, summary) for c in (False, True)]
        out[name] = {
            "runs": [without, with_],
            "activation_ratio": without["activation_bytes"] / with_["activation_bytes"],
            "peak_rss_saved_bytes": without["peak_rss_bytes"] - with_["peak_rss_bytes"],
            "time_cost": with_["s_per_step_median"] / without["s_per_step_median"] - 1.0,
        }
        print(name, out[name], flush=True)
        write_json(a.out, out)  # what is measured so far survives a failure of the next model
    os.remove(summary)


if __name__ == "__main__":
    main()
