#!/usr/bin/env python3
"""W-LLAMA-1B (shared/WORKLOADS.md): seed 002's memory lab with a 2024
architecture, Llama-3.2-1B's shape (1,235,814,400 parameters) on 2 ranks of
one host.

  python3 bench/llama_1b_lab.py --dpt build/dpt [--memory 22G] [--out bench/results/llama_1b_lab.json]

1. `dpt plan` for the job: bytes per rank of every configuration and which fit.
2. DDP as `dpt train` is asked to run it: refused before any work, with its reason.
3. The configurations given by --runs (default: ZeRO-3 with bf16, activation
   checkpointing and the optimizer state offloaded, and the same without
   checkpointing) train 3 steps: loss, step time, bytes per rank as the
   engine accounts them and peak RSS (VmHWM), each beside the plan's row.
Context 128, 2 sequences per rank, AdamW, synthetic tokens. Needs about 18
GiB of RAM and 10 GiB of disk under --offload-dir; run on a quiet machine.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_util import write_json  # noqa: E402

JOB = ["--model", "llama-3.2-1b", "--context", "128", "--batch", "4"]
RUNS = {
    "zero3 bf16 +ckpt +offload optimizer": ["--strategy", "zero3", "--precision", "bf16",
                                            "--checkpoint-activations", "--offload", "optimizer"],
    "zero3 bf16 +offload optimizer": ["--strategy", "zero3", "--precision", "bf16", "--offload", "optimizer"],
}


def plan_rows(a):
    out = subprocess.run([a.dpt, "plan", *JOB, "--ranks", "2", "--memory", a.memory],
                         check=True, capture_output=True, text=True).stdout
    rows = {}
    for line in out.splitlines():
        m = re.match(r"^[* ] (\S.*?)\s{2,}([\d. ]+)\|\s+([\d.]+)\s+([\d.]+) .*\| (yes|no)$", line)
        if m:
            nums = [float(x) for x in m.group(2).split()]
            keys = ["params", "grads", "optim", "gathered", "scratch", "acts", "total", "peak_rss", "file"]
            rows[m.group(1).strip()] = dict(zip(keys, nums), mib_sent=float(m.group(3)), s_per_step=float(m.group(4)),
                                            fits=m.group(5) == "yes")
    return out, rows


def train(a, flags, tmp):
    summary = os.path.join(tmp, "s.json")
    cmd = [a.dpt, "launch", "-n", "2", "--", a.dpt, "train", *JOB, "--synthetic", "--steps", "3",
           "--quiet", "--summary-out", summary, *flags]
    if "--offload" in flags:
        cmd += ["--offload-dir", a.offload_dir]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return {"exit": r.returncode, "error": r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""}
    with open(summary) as f:
        s = json.load(f)
    mib = 1 << 20
    return {"exit": 0, "first_loss": s["first_loss"], "final_loss": s["final_loss"],
            "step_ms_median": s["step_ms_median"], "bytes": s["bytes"], "ranks": s["ranks"],
            "accounted_mib": sum(v for k, v in s["bytes"].items() if k not in ("peak_rss", "offloaded")) / mib,
            "peak_rss_mib": [r["peak_rss"] / mib for r in s["ranks"]]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dpt", required=True)
    ap.add_argument("--memory", default="22G", help="what the plan may use for the 2 ranks")
    ap.add_argument("--offload-dir", default="/var/tmp")
    ap.add_argument("--out")
    a = ap.parse_args()
    text, rows = plan_rows(a)
    result = {"workload": "W-LLAMA-1B", "job": " ".join(JOB), "plan_text": text, "plan": rows, "runs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        result["runs"]["ddp"] = train(a, ["--strategy", "ddp"], tmp)
        print("ddp:", result["runs"]["ddp"])
        for name, flags in RUNS.items():
            r = train(a, flags, tmp)
            r["plan"] = rows.get(name)
            result["runs"][name] = r
            print(name, {k: r[k] for k in r if k not in ("bytes", "ranks", "plan")},
                  "plan total", r["plan"]["total"] if r["plan"] else None,
                  "plan peak RSS", r["plan"]["peak_rss"] if r["plan"] else None)
    if a.out:
        write_json(a.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
