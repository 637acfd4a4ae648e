#!/usr/bin/env python3
"""The largest context the W-LLAMA-1B shape trains at on 2 ranks of this
host, per attention mode and under context parallelism (issue 35).

  python3 bench/long_context_lab.py --dpt build/dpt [--memory 20G] [--out bench/results/long_context_lab.json]

For each mode: `dpt plan --json` gives the largest context that fits (its
recommended row: strategy, precision, offload), `dpt train` runs one step
at that context within the same memory budget (the engine's bytes per rank,
peak RSS, each rank's forward and backward time: the CP ranks' causal
balance), and at the next context (one token more; one 2 x cp chunk step
under --cp) the memory check refuses it. Modes:

  unfused, fused, fused+ckpt   2 ranks, one sequence each (--batch 2)
  cp2 fused, cp2 fused+ckpt    2 ranks, one sequence between them (--batch 1 --cp 2)

So every mode holds one sequence's worth of rows per rank at the same bytes
per rank. Synthetic tokens, AdamW. Needs about --memory of RAM, and disk
under --offload-dir for the offloaded optimizer state; run on a quiet
machine (minutes per mode at these contexts).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_util import write_json  # noqa: E402

MODEL = ["--model", "llama-3.2-1b"]
MODES = [  # name, plan/train flags, the plan's mode key, attention
    ("unfused", ["--batch", "2"], "unfused", "unfused"),
    ("fused", ["--batch", "2"], "fused", "fused"),
    ("fused+ckpt", ["--batch", "2"], "fused+ckpt", "fused"),
    ("cp2 fused", ["--batch", "1", "--cp", "2"], "fused", "fused"),
    ("cp2 fused+ckpt", ["--batch", "1", "--cp", "2"], "fused+ckpt", "fused"),
]


def budget_mib(memory):
    units = {"G": 1024, "M": 1}
    return int(float(memory[:-1]) * units[memory[-1].upper()])


def plan(a, flags):
    out = subprocess.run([a.dpt, "plan", *MODEL, "--context", "128", *flags, "--ranks", "2", "--memory", a.memory,
                          "--strategy", "zero3", "--offload-dir", a.offload_dir, "--json"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)["largest_context"]


def train(a, flags, limits, mode_key, attention, context, tmp):
    summary = os.path.join(tmp, "s.json")
    if os.path.exists(summary):
        os.remove(summary)
    cmd = [a.dpt, "launch", "-n", "2", "--", a.dpt, "train", *MODEL, "--context", str(context), *flags,
           "--synthetic", "--steps", "1", "--quiet", "--threads", "1", "--summary-out", summary,
           "--strategy", limits["strategy"], "--precision", limits["precision"], "--attention", attention,
           "--memory-budget-mb", str(budget_mib(a.memory))]
    if limits["offload"] != "none":
        cmd += ["--offload", limits["offload"], "--offload-dir", a.offload_dir]
    if mode_key == "fused+ckpt":
        cmd += ["--checkpoint-activations"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        lines = [x for x in r.stderr.strip().splitlines() if x.startswith("dpt")]
        return {"context": context, "exit": r.returncode, "error": lines[-1] if lines else r.stderr[-400:]}
    with open(summary) as f:
        s = json.load(f)
    mib = 1 << 20
    return {"context": context, "exit": 0, "loss": s["first_loss"], "step_ms": s["step_ms_median"],
            "bytes_mib": {k: v / mib for k, v in s["bytes"].items()},
            "accounted_mib": sum(v for k, v in s["bytes"].items() if k not in ("peak_rss", "offloaded")) / mib,
            "peak_rss_mib": [q["peak_rss"] / mib for q in s["ranks"]],
            "forward_ms": [q["forward_ms"] for q in s["ranks"]],
            "backward_ms": [q["backward_ms"] for q in s["ranks"]],
            "context_parallel": s.get("context_parallel")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dpt", required=True)
    ap.add_argument("--memory", default="20G", help="the memory budget of the 2 ranks (plan and training)")
    ap.add_argument("--offload-dir", default="/var/tmp")
    ap.add_argument("--modes", default=",".join(m[0] for m in MODES))
    ap.add_argument("--out")
    a = ap.parse_args()
    wanted = a.modes.split(",")
    result = {"workload": "W-LLAMA-1B", "memory": a.memory, "ranks": 2, "modes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name, flags, key, attention in MODES:
            if name not in wanted:
                continue
            limits = plan(a, flags)
            L = limits[key]["context"]
            unit = 4 if "--cp" in flags else 1
            entry = {"plan": limits, "largest": L,
                     "trained": train(a, flags, limits, key, attention, L, tmp),
                     "next": train(a, flags, limits, key, attention, L + unit, tmp)}
            t = entry["trained"]
            if t["exit"] == 0 and len(t["forward_ms"]) == 2:
                work = [f + b for f, b in zip(t["forward_ms"], t["backward_ms"])]
                entry["rank_balance"] = max(work) / min(work)
            result["modes"][name] = entry
            print(name, "largest", L, "trained:", {k: t[k] for k in t if k != "bytes_mib"},
                  "next:", entry["next"].get("error", entry["next"]), flush=True)
            if a.out:
                write_json(a.out, result)
    for base in ("fused", "fused+ckpt"):
        if base in result["modes"] and "cp2 " + base in result["modes"]:
            result["cp2_over_cp1_" + base] = result["modes"]["cp2 " + base]["largest"] / result["modes"][base]["largest"]
    if a.out:
        write_json(a.out, result)
    print({k: v for k, v in result.items() if k.startswith("cp2_over")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
