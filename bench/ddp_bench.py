#!/usr/bin/python3
"""Data-parallel benchmark: the engine's DDP and DP on 2 ranks, against a
single process and against PyTorch.

Usage: /usr/bin/python3 bench/ddp_bench.py [--dpt build/dpt] [--workload mlp|gpt|all]
           [--steps N] [--skip-torch] [--only KEY,...] [--repeat K] [--out FILE.json]

For each workload it runs, one after the other (each configuration once):

  engine DDP, 2 ranks x 1 thread   dpt launch -n 2 -- dpt train --threads 1 ...
    default (overlapped, 25 MiB buckets; on one host the all-reduce runs
    in place in a shared window), DPT_COMM_IN_PLACE=0 (through the ring's
    slots), --no-overlap, --per-param, and --bucket-mb 0.25, 1, 4, 25
  engine DP, 2 replica threads     dpt train --strategy dp --dp-replicas 2 --threads 1
  2 independent processes          dpt train --threads 1 --batch B/2, both at
                                   once: the ceiling for 2 ranks, no comm
  engine, 1 process                dpt train --threads 1, and --threads 2
  PyTorch DDP (gloo), 2 ranks      bench/torch_ddp.py
  PyTorch, 1 process               bench/torch_workloads.py --threads 1, and
                                   --threads 2 with OMP_WAIT_POLICY=PASSIVE

All engine runs use --synthetic and the workload's global batch (W-MLP 256,
W-GPT 16), split evenly over the ranks. --steps is the engine's step count
(default 80 mlp, 40 gpt; the engine skips its first step in the median);
PyTorch runs 60 steps with 20 warm-up for mlp and 30 with 10 for gpt, or, when
--steps is given, --steps steps with a quarter of them warm-up.

Prints a table (throughput, median step ms, exposed communication as a share
of the step, bytes sent per step per rank) and the ratios
  engine DDP / PyTorch DDP, engine DDP / PyTorch's best single process,
  scaling efficiency = throughput(2 ranks) / (2 * throughput(1 process, 1 thread)),
  the ceiling = throughput(2 independent processes) / (2 * throughput(1 process)),
With --repeat K every configuration runs K times, in K interleaved rounds
(so slow phases of a shared machine hit every configuration alike); a row is
the run with the median throughput, every round's metrics are kept under
"rounds", and each ratio is the median of the rounds' own ratios. --only
runs a subset of the configurations (by key; see --help).

It writes every summary to --out (default bench/results/ddp_<workload>.json;
with --workload all and no --out, one file per workload).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import bench_util
from bench_util import RunError, run_and_load

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TORCH_SINGLE = os.path.join(HERE, "torch_workloads.py")
TORCH_DDP = os.path.join(HERE, "torch_ddp.py")
UNIT = {"mlp": "samples_per_s", "gpt": "tokens_per_s"}
ENGINE_STEPS = {"mlp": 80, "gpt": 40}
GLOBAL_BATCH = {"mlp": 256, "gpt": 16}
TORCH_STEPS = {"mlp": (60, 20), "gpt": (30, 10)}
BUCKETS_MB = [0.25, 1, 4, 25]
RANKS = 2
TIMEOUT_S = 900


def configurations(args, workload, tmp):
    """(key, label, kind, cmd, summary path, env) for every run, in order.
    kind: 'engine' (rank summaries), 'dp', 'torch_ddp' or 'torch'."""
    dpt = args.dpt
    steps = args.steps or ENGINE_STEPS[workload]
    if args.steps:
        t_steps, t_warm = args.steps, args.steps // 4
    else:
        t_steps, t_warm = TORCH_STEPS[workload]
    out = []

    def path(key):
        return os.path.join(tmp, f"{workload}_{key}.json")

    def train(key, *extra):
        return [dpt, "train", "--model", workload, "--synthetic", "--steps", str(steps),
                "--quiet", "--summary-out", path(key), *extra]

    def ddp(key, label, *extra):
        cmd = [dpt, "launch", "-n", str(RANKS), "--"] + train(key, "--threads", "1", *extra)
        out.append((key, label, "engine", cmd, path(key), None))

    ddp("ddp", "engine DDP (overlap, 25 MiB buckets)")
    env = dict(os.environ, DPT_COMM_IN_PLACE="0")
    out.append(("ddp_slots", "engine DDP, all-reduce through the ring's slots", "engine",
                [dpt, "launch", "-n", str(RANKS), "--"] + train("ddp_slots", "--threads", "1"),
                path("ddp_slots"), env))
    ddp("ddp_no_overlap", "engine DDP --no-overlap", "--no-overlap")
    ddp("ddp_per_param", "engine DDP --per-param", "--per-param")
    for mb in BUCKETS_MB:
        ddp(f"ddp_bucket_{mb:g}mb", f"engine DDP --bucket-mb {mb:g}", "--bucket-mb", f"{mb:g}")
    out.append(("dp", "engine DP (2 replica threads)", "dp",
                train("dp", "--strategy", "dp", "--dp-replicas", str(RANKS), "--threads", "1"),
                path("dp"), None))
    # The ceiling: RANKS independent processes at 1/RANKS of the batch each,
    # side by side, no communication at all (what the cores give together).
    pair = [train(f"pair_{i}", "--threads", "1", "--batch", str(GLOBAL_BATCH[workload] // RANKS))
            for i in range(RANKS)]
    out.append(("pair", f"{RANKS} independent processes, 1/{RANKS} batch each (no comm)", "pair", pair,
                [path(f"pair_{i}") for i in range(RANKS)], None))
    for t in (1, 2):
        out.append((f"single_t{t}", f"engine 1 process, {t} thread{'s' if t > 1 else ''}", "engine",
                    train(f"single_t{t}", "--threads", str(t)), path(f"single_t{t}"), None))
    if not args.skip_torch:
        py = "/usr/bin/python3"
        out.append(("torch_ddp", "PyTorch DDP gloo (2 ranks x 1 thread)", "torch_ddp",
                    [py, TORCH_DDP, "--workload", workload, "--ranks", str(RANKS),
                     "--steps", str(t_steps), "--warmup", str(t_warm), "--json", path("torch_ddp")],
                    path("torch_ddp"), None))
        for t, policy in ((1, None), (2, "PASSIVE")):
            env = dict(os.environ)
            if policy:
                env["OMP_WAIT_POLICY"] = policy
            label = f"PyTorch 1 process, {t} thread{'s' if t > 1 else ''}"
            if policy:
                label += f" (OMP_WAIT_POLICY={policy})"
            out.append((f"torch_t{t}", label, "torch",
                        [py, TORCH_SINGLE, "--workload", workload, "--threads", str(t),
                         "--steps", str(t_steps), "--warmup", str(t_warm), "--json", path(f"torch_t{t}")],
                        path(f"torch_t{t}"), env))
    return out


def row_metrics(kind, s, unit):
    """Throughput, step ms, exposed comm % (and whether it is an estimate),
    bytes sent per step per rank (and whether it is a model) of one summary."""
    m = {"throughput": s.get(unit), "step_ms": s.get("step_ms_median"),
         "comm_pct": None, "comm_pct_note": "", "bytes": None, "bytes_note": "", "buckets": None}
    if kind == "engine":
        ranks = s.get("ranks") or []
        if isinstance(s.get("ddp"), dict):
            m["buckets"] = len(s["ddp"].get("buckets") or [])
        if ranks and s.get("world", 1) > 1:
            worst = max(ranks, key=lambda r: r["comm_wait_ms"] / r["step_ms"])
            m["comm_pct"] = worst["comm_wait_ms"] / worst["step_ms"] * 100
            # Of that rank's wait, the part a slower rank's forward and
            # backward explain (the lock-step split, src/train/lockstep.h).
            if "comm_wait_slower_rank_ms" in worst:
                m["comm_pct_slower_rank"] = worst["comm_wait_slower_rank_ms"] / worst["step_ms"] * 100
            m["bytes"] = s.get("comm_bytes_per_step")
    elif kind == "dp":
        # No collectives: replica 0's serial gather + broadcast of the weights.
        if s.get("step_ms_median"):
            m["comm_pct"] = (s.get("gather_ms", 0) + s.get("broadcast_ms", 0)) / s["step_ms_median"] * 100
            m["comm_pct_note"] = "g+b"
    elif kind == "torch_ddp":
        m["comm_pct"] = s.get("est_exposed_comm_pct")
        m["comm_pct_note"] = "~"
        m["bytes"] = s.get("comm_bytes_per_step_model")
        m["bytes_note"] = "~"
    return m


def fmt(v, spec, note=""):
    return "-" if v is None else f"{note}{v:{spec}}"


def print_table(workload, rows, unit):
    label = unit.replace("_per_s", "/s")
    w = max(len("configuration"), *(len(r["label"]) for r in rows))
    print(f"\nworkload {workload}, {RANKS} ranks (1 thread each) unless the row says otherwise")
    print(f"{'configuration':<{w}} {label:>12} {'step ms':>9} {'exp. comm %':>19} {'MiB sent/step':>14} {'buckets':>8}")
    for r in rows:
        if r.get("error"):
            print(f"{r['label']:<{w}} FAILED")
            continue
        m = r["metrics"]
        comm = fmt(m["comm_pct"], ".1f", "~" if m["comm_pct_note"] == "~" else "")
        if m["comm_pct_note"] == "g+b":
            comm += " (g+b)"
        if m.get("comm_pct_slower_rank") is not None:
            comm += f" ({m['comm_pct_slower_rank']:.1f})"
        mib = None if m["bytes"] is None else m["bytes"] / 2**20
        print(f"{r['label']:<{w}} {fmt(m['throughput'], '.1f'):>12} {fmt(m['step_ms'], '.2f'):>9} "
              f"{comm:>19} {fmt(mib, '.2f', m['bytes_note']):>14} {fmt(m['buckets'], 'd'):>8}")


def ratio(a, b):
    return a / b if a and b else None


def run_one(workload, unit, key, label, kind, cmd, path, env, tag):
    """One configuration once: its row (summary and metrics, or error)."""
    print(f"[{workload}]{tag} {label} ...", file=sys.stderr, flush=True)
    row = {"key": key, "label": label, "kind": kind, "cmd": cmd,
           "env": {"OMP_WAIT_POLICY": env.get("OMP_WAIT_POLICY")} if env else None}
    try:
        if kind == "pair":
            row["summary"] = run_side_by_side(label, cmd, path, unit)
        else:
            row["summary"] = run_and_load(label, cmd, path, env, TIMEOUT_S)
        row["metrics"] = row_metrics(kind, row["summary"], unit)
        if row["metrics"]["throughput"] is None:
            raise RunError(f"summary lacks {unit}")
    except RunError as e:
        print(f"ddp_bench.py: {label}: {e}", file=sys.stderr)
        row["error"] = str(e)
    return row


def run_side_by_side(label, cmds, paths, unit):
    """Starts every command at once, waits for all; one summary for them:
    the summed throughput, the slowest median step, each process's own."""
    procs = [subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for c in cmds]
    errors = []
    for c, p in zip(cmds, procs):
        try:
            _, err = p.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            p.kill()
            err = "timed out"
        if p.returncode != 0:
            errors.append(f"{' '.join(c)}: exit {p.returncode}: {err.strip()}")
    if errors:
        raise RunError(f"{label}: " + "; ".join(errors))
    parts = []
    for path in paths:
        try:
            with open(path) as f:
                parts.append(json.load(f))
        except (OSError, ValueError) as e:
            raise RunError(f"{label}: no valid JSON summary at {path}: {e}") from e
    return {unit: sum(p[unit] for p in parts), "step_ms_median": max(p["step_ms_median"] for p in parts),
            "processes": parts}


def median_row(runs):
    """The rounds of one configuration as one row: the run with the median
    throughput stands for them (its summary and metrics), every round's
    metrics are kept under "rounds"."""
    ok = [r for r in runs if not r.get("error")]
    if not ok:
        return runs[0]
    ok.sort(key=lambda r: r["metrics"]["throughput"])
    row = dict(ok[(len(ok) - 1) // 2])
    if len(runs) > 1:
        row["rounds"] = [r.get("metrics") or {"error": r.get("error")} for r in runs]
    return row


def ratios_of(by):
    """The headline ratios from one set of throughputs (key -> value)."""
    torch_best_key = max((k for k in ("torch_t1", "torch_t2") if k in by), key=by.get, default=None)
    return {
        "engine_ddp_over_torch_ddp": ratio(by.get("ddp"), by.get("torch_ddp")),
        "engine_ddp_over_torch_best_single": ratio(by.get("ddp"), by.get(torch_best_key)),
        "torch_best_single": torch_best_key,
        "scaling_efficiency_engine_ddp": ratio(by.get("ddp"), RANKS * by["single_t1"])
        if "single_t1" in by else None,
        "scaling_efficiency_engine_dp": ratio(by.get("dp"), RANKS * by["single_t1"])
        if "single_t1" in by else None,
        "scaling_efficiency_torch_ddp": ratio(by.get("torch_ddp"), RANKS * by["torch_t1"])
        if "torch_t1" in by else None,
        "engine_ddp_over_engine_single_t2": ratio(by.get("ddp"), by.get("single_t2")),
        # What the cores give with no communication, and DDP's share of it.
        "scaling_ceiling_independent_processes": ratio(by.get("pair"), RANKS * by["single_t1"])
        if "single_t1" in by else None,
        "engine_ddp_over_ceiling": ratio(by.get("ddp"), by.get("pair")),
        "engine_ddp_in_place_over_slots": ratio(by.get("ddp"), by.get("ddp_slots")),
    }


def bench_workload(args, workload):
    unit = UNIT[workload]
    rounds = []  # per round: key -> row
    with tempfile.TemporaryDirectory(prefix="dpt_ddp_bench_") as tmp:
        configs = configurations(args, workload, tmp)
        if args.only:
            wanted = args.only.split(",")
            unknown = sorted(set(wanted) - {c[0] for c in configs})
            if unknown:
                sys.exit(f"ddp_bench.py: --only: unknown configuration {', '.join(unknown)} "
                         f"(known: {', '.join(c[0] for c in configs)})")
            configs = [c for c in configs if c[0] in wanted]
        for i in range(args.repeat):
            tag = f" round {i + 1}/{args.repeat}" if args.repeat > 1 else ""
            rounds.append({c[0]: run_one(workload, unit, *c, tag) for c in configs})
    rows = [median_row([rnd[c[0]] for rnd in rounds]) for c in configs]

    # Ratios are taken within each round (configurations run minutes apart
    # at most), then the median over rounds is reported.
    per_round = [ratios_of({k: r["metrics"]["throughput"] for k, r in rnd.items() if not r.get("error")})
                 for rnd in rounds]
    # The best PyTorch single process is named from the median rows.
    ratios = ratios_of({r["key"]: r["metrics"]["throughput"] for r in rows if not r.get("error")})
    for name in ratios:
        values = [pr[name] for pr in per_round if isinstance(pr[name], float)]
        if name != "torch_best_single":
            ratios[name] = statistics.median(values) if values else None
    torch_best_key = ratios["torch_best_single"]

    print_table(workload, rows, unit)
    if args.repeat > 1:
        print(f"  rows: the median of {args.repeat} rounds; ratios: the median of the rounds' own ratios")
    print("  exp. comm %: max over ranks of comm_wait_ms / step_ms, in brackets the part of it that rank spent "
          "waiting for a slower rank's\n  forward and backward (the summary's comm_wait_slower_rank_ms, "
          "src/train/lockstep.h); ~ PyTorch: backward minus "
          "backward under no_sync() (an estimate);\n  (g+b) DP: replica 0's gather + broadcast. "
          "MiB sent/step: per rank, from the engine's ledger; ~ PyTorch: ring model 2(N-1)/N.\n  buckets: the engine's all-reduce buckets (--per-param: one per tensor).")

    def show(name, v, suffix="x"):
        print(f"  {name}: {'-' if v is None else f'{v:.3f}{suffix}'}")

    show("engine DDP / PyTorch DDP (throughput)", ratios["engine_ddp_over_torch_ddp"])
    show(f"engine DDP / PyTorch best single process ({torch_best_key or '-'})",
         ratios["engine_ddp_over_torch_best_single"])
    show("engine DDP / engine 1 process 2 threads", ratios["engine_ddp_over_engine_single_t2"])
    show("scaling efficiency, engine DDP = tput(2 ranks) / (2 * tput(1 process, 1 thread))",
         ratios["scaling_efficiency_engine_ddp"], "")
    show("scaling ceiling = tput(independent processes, half batch each, side by side) / (2 * tput(1 process))",
         ratios["scaling_ceiling_independent_processes"], "")
    show("engine DDP / that ceiling", ratios["engine_ddp_over_ceiling"], "")
    show("engine DDP in place / through the ring's slots", ratios["engine_ddp_in_place_over_slots"])
    show("scaling efficiency, engine DP", ratios["scaling_efficiency_engine_dp"], "")
    show("scaling efficiency, PyTorch DDP (against PyTorch 1 thread)",
         ratios["scaling_efficiency_torch_ddp"], "")

    return {
        "workload": workload, "ranks": RANKS, "unit": unit,
        "engine_steps": args.steps or ENGINE_STEPS[workload], "rounds": args.repeat,
        "runs": rows, "ratios": ratios, "ratios_per_round": per_round,
        "failed": [r["key"] for r in rows if r.get("error")],
    }


def write_json(path, obj):
    bench_util.write_json(path, obj)
    print(f"wrote {path}")


def main():
    ap = argparse.ArgumentParser(description="Benchmark the engine's DDP/DP against one process and PyTorch.")
    ap.add_argument("--dpt", default=os.path.join(ROOT, "build", "dpt"), help="the dpt binary (build/dpt)")
    ap.add_argument("--workload", choices=["mlp", "gpt", "all"], default="all")
    ap.add_argument("--steps", type=int, help="engine steps (default 80 mlp, 40 gpt); "
                    "also PyTorch's, with a quarter warm-up")
    ap.add_argument("--skip-torch", action="store_true", help="run only the engine configurations")
    ap.add_argument("--only", metavar="KEY,...",
                    help="run only these configurations (keys: ddp, ddp_slots, ddp_no_overlap, ddp_per_param, "
                         "ddp_bucket_<mb>mb, dp, pair, single_t1, single_t2, torch_ddp, torch_t1, torch_t2)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="rounds of every configuration, interleaved; medians reported (default 1)")
    ap.add_argument("--out", metavar="FILE.json",
                    help="results file (default bench/results/ddp_<workload>.json)")
    args = ap.parse_args()
    if args.steps is not None and args.steps < 4:
        ap.error("--steps must be >= 4")
    if args.repeat < 1:
        ap.error("--repeat must be >= 1")
    if not os.access(args.dpt, os.X_OK):
        ap.error(f"{args.dpt} is not an executable (build it: cmake --build build --target dpt)")

    workloads = ["mlp", "gpt"] if args.workload == "all" else [args.workload]
    results = {w: bench_workload(args, w) for w in workloads}
    if args.out:
        write_json(args.out, results[workloads[0]] if len(workloads) == 1 else results)
    else:
        for w, r in results.items():
            write_json(os.path.join(HERE, "results", f"ddp_{w}.json"), r)
    return 1 if any(r["failed"] for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
