#!/usr/bin/python3
"""Every layout of W-GPT at 2 ranks in one table: tokens/s, bytes held and
bytes moved per rank per step, so a user can pick one (issue 16: seed 001's
"speed ZeRO-1 > ZeRO-2 > ZeRO-3" extended to tensor and pipeline
parallelism).

Usage: python3 bench/layouts_bench.py [--steps 8] [--repeat 3] [--quick]
                                      [--out bench/results/layouts.json]

Layouts: one process, ddp, zero1, zero2, zero3, tp 2, pp 2 gpipe and 1f1b at
M = 4, 8, 16 (one thread per rank, so every layout has the same cores). HSDP
is left out: at 2 ranks its shard group is either both ranks (zero3 itself)
or one rank (ddp's replicas, reduced as shards): nothing new to measure.

Per layout: tokens/s (the median over --repeat interleaved rounds of each
run's median step), peak RSS per rank (and the plan's per stage), the bytes rank 0 accounts by category
(and per pipeline stage its parameters and activation arenas), the bytes it
sent per step (the summary's ledger), the exposed communication per step
(every rank's wait for reductions, gathers and pipeline neighbours; under tp
the all-reduces block inside forward and backward, so their time is given
from the ledger too), and `dpt plan`'s prediction for the same layout
beside each measured figure (bytes held, bytes sent, step time). --quick
runs one round of 4 steps and M = 4 and 8 only.
Benchmarks are run on purpose, never by the test suite.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_util import RunError, run_and_load, write_json  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# W-GPT (WORKLOADS.md): 4 layers, 4 heads, width 256, context 128, 16 sequences per step.
MODEL = ["--model", "gpt", "--layers", "4", "--heads", "4", "--width", "256", "--context", "128", "--batch", "16"]
TRAIN = ["--synthetic", "--threads", "1", "--quiet", "--log-every", "100000"]
CATEGORIES = ("parameters", "gradients", "optimizer", "gathered", "scratch", "activations")


def layouts(quick):
    """(name, ranks, strategy, mesh flags shared by plan and train)."""
    out = [("one process", 1, "local", [])]
    out += [(s, 2, s, []) for s in ("ddp", "zero1", "zero2", "zero3")]
    out.append(("tp2", 2, "local", ["--tp", "2"]))
    for schedule in ("gpipe", "1f1b"):
        for m in ((4, 8) if quick else (4, 8, 16)):
            out.append((f"pp2 {schedule} M={m}", 2, "local",
                        ["--pp", "2", "--pp-schedule", schedule, "--micro-batches", str(m)]))
    return out


def train_cmd(dpt, ranks, strategy, summary, steps, flags):
    train = [dpt, "train", *MODEL, *TRAIN, "--strategy", strategy, "--steps", str(steps), "--summary-out", summary,
             *flags]
    return train if ranks == 1 else [dpt, "launch", "-n", str(ranks), "--", *train]


def plan(dpt, ranks, strategy, flags, rates):
    """dpt plan's row for the layout (fp32, no checkpointing, no offload)."""
    cmd = [dpt, "plan", *MODEL, "--ranks", str(ranks), "--strategy", strategy, "--threads", "1", "--json",
           "--disk-gbs", "1", "--memory", "1T", *rates, *flags]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RunError(f"plan failed: {' '.join(cmd)}\n{proc.stderr}")
    p = json.loads(proc.stdout)
    for row in p["rows"]:
        if row["precision"] == "fp32" and not row["checkpoint_activations"] and row["offload"] == "none":
            return p, row
    raise RunError(f"plan has no plain row: {' '.join(cmd)}")


def planned_sent(row, steps):
    """Rank 0's bytes sent per step over a run of `steps` steps whose last is
    logged, as the summary counts them (tests/test_plan_cli.cpp)."""
    c = row["stages"][0]["comm"]
    return (steps * c["per_step"] + c["first_step"] + c["logged_other"] + c["logged_optimizer"]) // steps


def measured(ss):
    best = sorted(ss, key=lambda s: s["tokens_per_s"])[len(ss) // 2]
    ranks = best["ranks"]
    row = {"tokens_per_s": statistics.median(s["tokens_per_s"] for s in ss),
           "tokens_per_s_runs": [s["tokens_per_s"] for s in ss],
           "step_ms_median": best["step_ms_median"],
           "peak_rss_per_rank": [r["peak_rss"] for r in ranks],
           "bytes_rank0": {k: best["bytes"][k] for k in CATEGORIES},
           "sent_per_step_rank0": best["comm_bytes_per_step"],
           "sent_per_phase_rank0": best["comm_bytes_per_phase"],
           # Waiting for reductions, gathers and neighbours, per rank, ms per step.
           "exposed_comm_ms_per_rank": [r["comm_wait_ms"] + r["gather_wait_ms"] for r in ranks]}
    if "pipeline" in best:
        row["stages"] = [{k: st[k] for k in ("params", "arenas", "activation_bytes", "tied_copy_bytes")}
                         for st in best["pipeline"]["stages"]]
        row["bubble_formula"] = best["pipeline"]["bubble_formula"]
    return row, best


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dpt", default=os.path.join(ROOT, "build", "dpt"))
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="one round of 4 steps, M = 4 and 8")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "layouts.json"))
    a = ap.parse_args()
    if a.quick:
        a.steps, a.repeat = 4, 1
    env = dict(os.environ, OMP_NUM_THREADS="1")
    load_before = os.getloadavg()
    configs = layouts(a.quick)
    runs = {name: [] for name, *_ in configs}
    with tempfile.TemporaryDirectory() as tmp:
        summary = os.path.join(tmp, "summary.json")
        for _ in range(a.repeat):  # interleaved rounds: drift on a shared machine hits every layout
            for name, ranks, strategy, flags in configs:
                s = run_and_load(name, train_cmd(a.dpt, ranks, strategy, summary, a.steps, flags), summary, env=env,
                                 timeout=900)
                runs[name].append(s)
                print(f"{name:16s} {s['tokens_per_s']:9.0f} tokens/s", flush=True)
    # The plan's machine rates measured once (one thread per rank, 2 ranks
    # copying at once), then given to every layout's plan.
    p0, _ = plan(a.dpt, 2, "ddp", [], [])
    m = p0["machine"]
    rates = ["--gemm-gflops", str(m["gemm_gflops"]), "--copy-gbs", str(m["copy_gbs"])]
    rows = {}
    for name, ranks, strategy, flags in configs:
        row, best = measured(runs[name])
        row.update({"ranks": ranks, "flags": flags})
        if "--tp" in flags:
            # The TP all-reduces block inside forward and backward: their
            # time on the communication thread, per step (the run's whole
            # ledger over its steps).
            row["tp_all_reduce_ms_per_step"] = 1000 * best["comm"]["all_reduce"]["seconds"] / a.steps
        p, planned = plan(a.dpt, ranks, strategy, flags, rates)
        stage0 = planned["stages"][0]["bytes"]
        # Each stage's predicted peak RSS: its need plus the runtime the
        # row adds (dpt plan's own resident memory, Open MPI's).
        runtime = planned["bytes"]["peak_rss"] - planned["bytes"]["total"]
        row["plan"] = {"bytes_rank0": {k: stage0[k] for k in CATEGORIES},
                       "peak_rss_per_stage": [st["bytes"]["total"] + runtime for st in planned["stages"]],
                       "need_largest_stage": planned["bytes"]["total"],
                       "sent_per_step_rank0": planned_sent(planned, a.steps),
                       "step_s": planned["time"]["step_s"], "bubble": planned["bubble"]}
        row["plan_bytes_equal"] = row["plan"]["bytes_rank0"] == row["bytes_rank0"]
        row["plan_sent_equal"] = row["plan"]["sent_per_step_rank0"] == row["sent_per_step_rank0"]
        rows[name] = row
    ddp = rows["ddp"]["tokens_per_s"]
    for row in rows.values():
        row["vs_ddp"] = row["tokens_per_s"] / ddp
    result = {"workload": "W-GPT (4 layers, 4 heads, width 256, context 128, batch 16), synthetic, fp32, "
                         "1 thread per rank, 2 ranks",
              "steps": a.steps, "repeat": a.repeat, "cores": os.cpu_count(),
              # Other work on the machine shows here: 2-rank runs on 2 cores need both.
              "load_average_before": load_before, "load_average_after": os.getloadavg(),
              "plan_machine": m, "layouts": rows}
    write_json(a.out, result)
    mib = 1 << 20
    print(f"{'layout':16s} {'tokens/s':>9s} {'x ddp':>6s} {'RSS MiB':>8s} {'held MiB':>9s} {'plan':>6s} "
          f"{'sent MiB':>9s} {'plan':>6s} {'exposed ms':>10s}")
    for name, row in rows.items():
        held = sum(row["bytes_rank0"].values()) / mib
        held_plan = sum(row["plan"]["bytes_rank0"].values()) / mib
        print(f"{name:16s} {row['tokens_per_s']:9.0f} {row['vs_ddp']:6.2f} {max(row['peak_rss_per_rank']) / mib:8.1f} "
              f"{held:9.1f} {held_plan:6.1f} {row['sent_per_step_rank0'] / mib:9.2f} "
              f"{row['plan']['sent_per_step_rank0'] / mib:6.2f} {statistics.mean(row['exposed_comm_ms_per_rank']):10.1f}")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    try:
        main()
    except RunError as e:
        sys.exit(str(e))
