#!/usr/bin/python3
"""Runs the dpt engine and PyTorch on the same workload and compares them.

Usage: /usr/bin/python3 bench/compare_torch.py --dpt build/dpt --workload mlp|gpt
           --threads N [--steps S] [--warmup W] [--torch-passive] [--gemm B] [--out FILE.json]

The engine runs as
    DPT train --model W --threads N --steps S --synthetic --summary-out TMP.json
and must write a JSON summary with "step_ms_median", "samples_per_s" (mlp) or
"tokens_per_s" (gpt), and "gflops". PyTorch runs through
bench/torch_workloads.py with the inherited OMP_WAIT_POLICY; --torch-passive
also runs it with OMP_WAIT_POLICY=PASSIVE and compares against the faster of
the two. The runs are sequential, so they do not compete for cores.

Prints a table and the dpt/torch ratios (> 1 means dpt is faster); --out
writes all results as one JSON file.
"""

import argparse
import os
import sys
import tempfile

from bench_util import RunError, run_and_load, write_json

HERE = os.path.dirname(os.path.abspath(__file__))
TORCH_SCRIPT = os.path.join(HERE, "torch_workloads.py")
UNIT = {"mlp": "samples_per_s", "gpt": "tokens_per_s"}


def check_keys(name, summary, keys):
    missing = [k for k in keys if not isinstance(summary.get(k), (int, float))]
    if missing:
        raise RunError(f"{name}: summary lacks numeric {', '.join(missing)}: {summary}")


def run_dpt(args, tmp):
    path = os.path.join(tmp, "dpt.json")
    cmd = [args.dpt, "train", "--model", args.workload, "--threads", str(args.threads),
           "--steps", str(args.steps), "--synthetic", "--summary-out", path]
    if args.gemm:
        cmd += ["--gemm", args.gemm]
    summary = run_and_load("dpt", cmd, path)
    check_keys("dpt", summary, ["step_ms_median", UNIT[args.workload], "gflops"])
    return summary


def run_torch(args, tmp, wait_policy):
    """Runs torch_workloads.py; wait_policy None keeps the inherited environment."""
    env = dict(os.environ)
    if wait_policy is not None:
        env["OMP_WAIT_POLICY"] = wait_policy
    path = os.path.join(tmp, f"torch_{wait_policy or 'inherited'}.json")
    cmd = [sys.executable, TORCH_SCRIPT, "--workload", args.workload,
           "--threads", str(args.threads), "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--json", path]
    summary = run_and_load("pytorch", cmd, path, env)
    check_keys("pytorch", summary, ["step_ms_median", UNIT[args.workload], "gflops"])
    return summary


def print_table(rows, unit):
    label = unit.replace("_per_s", "/s")
    w = max(len("engine"), *(len(name) for name, _ in rows))
    print(f"{'engine':<{w}} {'step ms':>10} {label:>12} {'GFLOP/s':>9}")
    for name, s in rows:
        print(f"{name:<{w}} {s['step_ms_median']:>10.2f} {s[unit]:>12.1f} {s['gflops']:>9.1f}")


def main():
    ap = argparse.ArgumentParser(description="Compare the dpt engine with PyTorch on one workload.")
    ap.add_argument("--dpt", required=True, help="path to the dpt binary")
    ap.add_argument("--workload", choices=["mlp", "gpt"], required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--steps", type=int, default=60, help="steps for both engines")
    ap.add_argument("--warmup", type=int, default=20,
                    help="unmeasured leading PyTorch steps (the engine has its own)")
    ap.add_argument("--torch-passive", action="store_true",
                    help="also run PyTorch with OMP_WAIT_POLICY=PASSIVE and use the faster run")
    ap.add_argument("--gemm", choices=["openblas", "onednn"], help="the engine's GEMM backend (default: its own)")
    ap.add_argument("--out", metavar="FILE.json", help="write all results here")
    args = ap.parse_args()
    if args.threads < 1:
        ap.error("--threads must be >= 1")
    if not 0 <= args.warmup < args.steps:
        ap.error("need 0 <= --warmup < --steps")

    unit = UNIT[args.workload]
    try:
        with tempfile.TemporaryDirectory(prefix="dpt_compare_") as tmp:
            dpt = run_dpt(args, tmp)
            torch_runs = {"inherited": run_torch(args, tmp, None)}
            if args.torch_passive:
                torch_runs["passive"] = run_torch(args, tmp, "PASSIVE")
    except RunError as e:
        print(f"compare_torch.py: {e}", file=sys.stderr)
        return 1

    best = min(torch_runs, key=lambda k: torch_runs[k]["step_ms_median"])
    ref = torch_runs[best]
    ratio = {
        "throughput": dpt[unit] / ref[unit],
        "gflops": dpt["gflops"] / ref["gflops"],
    }

    rows = [("dpt", dpt)]
    for k, s in torch_runs.items():
        policy = s["env"]["OMP_WAIT_POLICY"] or "unset"
        rows.append((f"pytorch (OMP_WAIT_POLICY={policy})" if len(torch_runs) > 1 else "pytorch", s))
    print(f"workload {args.workload}, {args.threads} threads, {args.steps} steps")
    print_table(rows, unit)
    print(f"dpt/torch: throughput {ratio['throughput']:.3f}x, GFLOP/s {ratio['gflops']:.3f}x"
          + (f" (torch: {best} run)" if len(torch_runs) > 1 else ""))

    if args.out:
        result = {"workload": args.workload, "threads": args.threads, "steps": args.steps,
                  "torch_warmup": args.warmup, "dpt": dpt, "torch": torch_runs,
                  "torch_best": best, "ratio_dpt_over_torch": ratio}
        write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
