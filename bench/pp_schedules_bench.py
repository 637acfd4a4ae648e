#!/usr/bin/python3
"""The five pipeline schedules on 2 ranks (pp 2, M = 8): W-GPT and W-LLAMA,
gpipe, 1f1b, interleaved (v = 2), zb-h1 and zb-v, against DDP on the same
2 ranks (one thread each), and 1f1b and zb-h1 with activation
checkpointing.

Usage: python3 bench/pp_schedules_bench.py [--steps 12] [--repeat 3]
           [--out bench/results/pp_schedules.json] [--traces bench/results]

Per configuration (medians of --repeat interleaved rounds): tokens/s; the
measured cost of each kind of chunk operation (F, B, W, or BW: the
summary's pipeline.op_ms, ms per chunk and micro-batch, so F:B:W); each
rank's idle fraction measured (its waits over its operations and waits,
the executor's own count after the first step) beside the simulator's
prediction from those costs (and the run's measured transfer time) and beside the formula;
throughput against DDP x (1 - predicted idle of rank 0), and against DDP on
the pipeline's micro-batches (--micro-batches 4: 2 sequences each, the
schedules' GEMM shapes) x (1 - rank 0's, and the ranks' mean, predicted
idle); peak RSS and the
activation bytes the engine counts per rank. Also writes one Chrome trace
per W-GPT schedule (--trace-out, 2 steps) for docs/pipeline.md's pictures
(bench/plot_timeline.py draws them).
Benchmarks are run on purpose, on a quiet machine, never by the test suite.
"""

import argparse
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_util import RunError, run_and_load, write_json  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMON = ["--batch", "16", "--synthetic", "--threads", "1", "--quiet"]
WORKLOADS = {
    # W-GPT and W-LLAMA (WORKLOADS.md): 4 blocks each, 16 sequences of 128 per step.
    "W-GPT": ["--model", "gpt", "--layers", "4", "--heads", "4", "--width", "256", "--context", "128"],
    "W-LLAMA": ["--model", "llama"],
}
SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-v")
M = 8


def configs():
    out = []
    for w in WORKLOADS:
        out.append((f"{w} ddp", w, ["--strategy", "ddp"]))
        # DDP on the pipeline's micro-batches (2 sequences each: 4 per rank):
        # the same GEMM shapes, so what is left between it and a schedule is
        # the schedule's idle (and the split backward's own cost).
        out.append((f"{w} ddp m{M // 2}", w, ["--strategy", "ddp", "--micro-batches", str(M // 2)]))
        for s in SCHEDULES:
            out.append((f"{w} {s}", w, ["--pp", "2", "--pp-schedule", s, "--micro-batches", str(M)]))
    for s in ("1f1b", "zb-h1"):
        out.append((f"W-GPT {s} +ckpt", "W-GPT",
                    ["--pp", "2", "--pp-schedule", s, "--micro-batches", str(M), "--checkpoint-activations"]))
    return out


def command(dpt, workload, summary, steps, extra):
    train = [dpt, "train", *WORKLOADS[workload], *COMMON, "--steps", str(steps), "--summary-out", summary, *extra]
    return [dpt, "launch", "-n", "2", "--", *train]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dpt", default=os.path.join(ROOT, "build", "dpt"))
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "pp_schedules.json"))
    ap.add_argument("--traces", default=os.path.join(ROOT, "bench", "results"))
    a = ap.parse_args()
    load_before = os.getloadavg()
    runs = {name: [] for name, _, _ in configs()}
    with tempfile.TemporaryDirectory() as tmp:
        summary = os.path.join(tmp, "summary.json")
        for _ in range(a.repeat):  # interleaved rounds: drift on a shared machine hits every configuration
            for name, w, extra in configs():
                s = run_and_load(name, command(a.dpt, w, summary, a.steps, extra), summary, timeout=900)
                runs[name].append(s)
                print(f"{name:24s} {s['tokens_per_s']:9.0f} tokens/s", flush=True)
    rows = {}
    for name, w, extra in configs():
        ss = runs[name]
        mid = sorted(ss, key=lambda s: s["tokens_per_s"])[len(ss) // 2]
        row = {"workload": w, "flags": extra,
               "tokens_per_s": statistics.median(s["tokens_per_s"] for s in ss),
               "tokens_per_s_runs": [s["tokens_per_s"] for s in ss],
               "step_ms_median": mid["step_ms_median"],
               "peak_rss_per_rank": [r["peak_rss"] for r in mid["ranks"]]}
        if "pipeline" in mid:
            stages = [s["pipeline"]["stages"] for s in ss]
            op = {k: statistics.median(s["pipeline"]["op_ms"][k] for s in ss) for k in ("F", "B", "W", "BW")}
            row.update({
                "op_ms": op,
                "bubble_formula": mid["pipeline"]["bubble_formula"],
                "idle_measured": [statistics.median(st[r]["idle_measured"] for st in stages) for r in range(2)],
                "idle_predicted": [statistics.median(st[r]["idle_predicted"] for st in stages) for r in range(2)],
                "activation_bytes": [st["activation_bytes"] for st in mid["pipeline"]["stages"]],
                "arenas": [st["arenas"] for st in mid["pipeline"]["stages"]],
            })
        rows[name] = row
    for name, row in rows.items():
        ddp = rows[f"{row['workload']} ddp"]["tokens_per_s"]
        row["vs_ddp"] = row["tokens_per_s"] / ddp
        if "idle_predicted" in row:
            ddp_micro = rows[f"{row['workload']} ddp m{M // 2}"]["tokens_per_s"]
            mean_predicted = statistics.mean(row["idle_predicted"])
            row["vs_ddp_times_1_minus_predicted"] = row["tokens_per_s"] / (ddp * (1 - row["idle_predicted"][0]))
            row["vs_ddp_micro_times_1_minus_predicted"] = (
                row["tokens_per_s"] / (ddp_micro * (1 - row["idle_predicted"][0])))
            row["vs_ddp_micro_times_1_minus_mean_predicted"] = (
                row["tokens_per_s"] / (ddp_micro * (1 - mean_predicted)))
            # The ranks' mean idle is the pipeline's own bubble: it counts a
            # rank that idles because another holds more (the V's rank 1).
            row["vs_ddp_times_1_minus_mean_predicted"] = row["tokens_per_s"] / (ddp * (1 - mean_predicted))
            row["idle_gap_points"] = 100 * abs(row["idle_measured"][0] - row["idle_predicted"][0])
    result = {"workloads": {w: " ".join(f) for w, f in WORKLOADS.items()}, "common": " ".join(COMMON),
              "pp": 2, "micro_batches": M, "steps": a.steps, "repeat": a.repeat, "cores": os.cpu_count(),
              "load_average_before": load_before, "load_average_after": os.getloadavg(), "configs": rows}
    write_json(a.out, result)
    for name, row in rows.items():
        extra = ""
        if "idle_predicted" in row:
            o = row["op_ms"]
            costs = (f"F {o['F']:.2f} B {o['B']:.2f} W {o['W']:.2f}" if o["W"] > 0
                     else f"F {o['F']:.2f} BW {o['BW']:.2f}")
            extra = (f"  idle r0 {row['idle_measured'][0]:.3f} (sim {row['idle_predicted'][0]:.3f}, "
                     f"formula {row['bubble_formula']:.3f})  {costs}  x{row['vs_ddp_times_1_minus_predicted']:.2f} "
                     f"of DDP(1-sim), x{row['vs_ddp_times_1_minus_mean_predicted']:.2f} of DDP(1-mean sim), "
                     f"x{row['vs_ddp_micro_times_1_minus_predicted']:.2f} of DDP m{M // 2}(1-sim)")
        print(f"{name:24s} {row['tokens_per_s']:9.0f} tokens/s  x{row['vs_ddp']:.2f} DDP{extra}")
    print(f"wrote {a.out}")
    # The traces last, so a failing one cannot cost the measured rounds.
    os.makedirs(a.traces, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        summary = os.path.join(tmp, "summary.json")
        for s in SCHEDULES:
            trace = os.path.join(a.traces, f"pp_trace_{s}_m{M}.json")
            cmd = command(a.dpt, "W-GPT", summary, 4,
                          ["--pp", "2", "--pp-schedule", s, "--micro-batches", str(M), "--trace-out", trace,
                           "--trace-steps", "2"])
            run_and_load(f"trace {s}", cmd, summary, timeout=600)


if __name__ == "__main__":
    try:
        main()
    except RunError as e:
        sys.exit(str(e))
