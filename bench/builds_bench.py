#!/usr/bin/python3
"""Two builds of dpt on the same work: what a build option gives.

For instance the elementwise kernels' AVX-512 copies (src/core/cpu_level.h):
build a second tree with -DDPT_KERNEL_CLONES=OFF and compare it with the
default build, or a -DDPT_NATIVE=ON tree against the default.

Runs W-GPT (fp32 and bf16) and W-MLP (fp32), 1 process, 1 thread,
`dpt train --synthetic`, and with --ddp also both workloads in fp32 under
2-rank DDP (`dpt launch -n 2`, 1 thread a rank, the same global batch),
with each binary in turn, for --repeat interleaved
rounds (this machine's speed drifts: a ratio within a round compares like
with like). Reports each configuration's median throughput and the median
of the rounds' own ratios (B / A: > 1 means B is faster) on three figures:
the run's median step, its CPU time per step, and its fastest tenth of
steps (the 10th percentile of the per-step times, after 5 warm-up steps:
on a host whose other tenants take the cores for moments at a time, the
quiet steps show a build's own speed best). With --ddp it also gives each
binary's scaling efficiency, DDP throughput / (2 x its own 1-process
throughput), as the median of the rounds' own figures, and the same on the
fastest tenth of steps (1-process p10 step / (2 x DDP p10 step): lock-step
ranks wait for whichever core another tenant took, so on a shared host the
quiet steps are what the engine itself scales to).

Usage:
  /usr/bin/python3 bench/builds_bench.py --a /tmp/noclones/dpt --b build/dpt [--repeat 5] [--ddp]
Result: results/builds.json (--out to change).
"""

import argparse
import json
import os
import statistics
import sys
import tempfile

from bench_util import RunError, run_and_load, write_json

HERE = os.path.dirname(os.path.abspath(__file__))
UNIT = {"mlp": "samples_per_s", "gpt": "tokens_per_s"}
# (model, precision, steps, ranks)
WORK = [("gpt", "fp32", 30, 1), ("gpt", "bf16", 50, 1), ("mlp", "fp32", 200, 1)]
DDP_WORK = [("gpt", "fp32", 30, 2), ("mlp", "fp32", 300, 2)]


def key_of(model, precision, ranks):
    return f"{model}_{precision}" + (f"_ddp{ranks}" if ranks > 1 else "")


def one_run(dpt, model, precision, steps, ranks, tmp):
    path = os.path.join(tmp, "summary.json")
    metrics = os.path.join(tmp, "metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = [dpt, "train", "--model", model, "--synthetic", "--steps", str(steps), "--threads", "1",
           "--precision", precision, "--quiet", "--summary-out", path, "--log-every", "1", "--metrics-out", metrics]
    if ranks > 1:
        cmd = [dpt, "launch", "-n", str(ranks), "--"] + cmd
    label = f"{dpt} {model} {precision}" + (f" on {ranks} ranks" if ranks > 1 else "")
    s = run_and_load(label, cmd, path, timeout=900)
    with open(metrics) as f:
        per_step = [json.loads(line)["step_ms"] for line in f if line.strip()][5:]
    fast = statistics.quantiles(per_step, n=10)[0]
    return {"throughput": s[UNIT[model]], "step_ms": s["step_ms_median"], "step_cpu_ms": s["step_cpu_ms_median"],
            "step_ms_p10": fast, "mfu": s["mfu"], "cpu_kernels": s.get("cpu_kernels"),
            "final_loss": s["final_loss"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--a", required=True, help="the reference dpt binary")
    ap.add_argument("--b", required=True, help="the dpt binary compared with it")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved rounds (default 3)")
    ap.add_argument("--ddp", action="store_true", help="add 2-rank DDP runs and each binary's scaling")
    ap.add_argument("--only-mlp", action="store_true", help="W-MLP alone (with --ddp: its scaling alone)")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "builds.json"))
    args = ap.parse_args()
    work = WORK + (DDP_WORK if args.ddp else [])
    if args.only_mlp:
        work = [w for w in work if w[0] == "mlp"]
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeat):
            row = {}
            for model, precision, steps, ranks in work:
                key = key_of(model, precision, ranks)
                print(f"round {r + 1}/{args.repeat} {key}", file=sys.stderr, flush=True)
                row[key] = {side: one_run(dpt, model, precision, steps, ranks, tmp)
                            for side, dpt in (("a", args.a), ("b", args.b))}
            rounds.append(row)
    result = {"a": os.path.abspath(args.a), "b": os.path.abspath(args.b), "repeat": args.repeat,
              "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE"), "rounds": rounds, "medians": {}}
    print(f"{'workload':14} {'A':>10} {'B':>10} {'B/A':>6} {'B/A cpu':>8} {'B/A p10':>8}  kernels A / B")
    for model, precision, _, ranks in work:
        key = key_of(model, precision, ranks)
        runs = [r[key] for r in rounds]
        med = {side: statistics.median(x[side]["throughput"] for x in runs) for side in ("a", "b")}
        ratio = statistics.median(x["b"]["throughput"] / x["a"]["throughput"] for x in runs)
        ratio_cpu = statistics.median(x["a"]["step_cpu_ms"] / x["b"]["step_cpu_ms"] for x in runs)
        ratio_fast = statistics.median(x["a"]["step_ms_p10"] / x["b"]["step_ms_p10"] for x in runs)
        result["medians"][key] = {"a": med["a"], "b": med["b"], "b_over_a": ratio, "b_over_a_cpu": ratio_cpu,
                                  "b_over_a_fastest_tenth": ratio_fast,
                                  "unit": UNIT[model], "mfu_b": statistics.median(x["b"]["mfu"] for x in runs)}
        print(f"{key:14} {med['a']:10.0f} {med['b']:10.0f} {ratio:6.3f} {ratio_cpu:8.3f} {ratio_fast:8.3f}  "
              f"{runs[0]['a']['cpu_kernels']} / {runs[0]['b']['cpu_kernels']}")
    for model, precision, _, ranks in work:
        single = key_of(model, precision, 1)
        if ranks == 1 or single not in rounds[0]:
            continue
        key = key_of(model, precision, ranks)
        scaling = {side: statistics.median(x[key][side]["throughput"] / (ranks * x[single][side]["throughput"])
                                           for x in rounds) for side in ("a", "b")}
        fast = {side: statistics.median(x[single][side]["step_ms_p10"] / (ranks * x[key][side]["step_ms_p10"])
                                        for x in rounds) for side in ("a", "b")}
        result["medians"][key]["scaling"] = scaling
        result["medians"][key]["scaling_fastest_tenth"] = fast
        print(f"{key}: scaling = tput / ({ranks} x 1 process): A {scaling['a']:.3f}, B {scaling['b']:.3f}; "
              f"on the fastest tenth of steps: A {fast['a']:.3f}, B {fast['b']:.3f}")
    write_json(args.out, result)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    try:
        main()
    except RunError as e:
        sys.exit(f"builds_bench: {e}")
