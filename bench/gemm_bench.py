#!/usr/bin/python3
"""The GEMM layer's two backends (src/nn/gemm.h), measured.

  kernels    GFLOP/s of BM_gemm (bench_kernels) at the workloads' shapes,
             per backend, fp32 and bf16, 1 and 2 threads: the median of
             --repetitions runs of each. --coretype X also runs it with
             OPENBLAS_CORETYPE=X (the environment's own value, or none, first).
  workloads  W-GPT tokens/s and W-MLP samples/s, 1 process, 1 thread
             (`dpt train --synthetic --threads 1 --gemm B --precision P`) for
             each backend and precision, and PyTorch (torch_workloads.py,
             1 thread, fp32 and CPU autocast bf16), OpenBLAS under the
             environment's OPENBLAS_CORETYPE and under SkylakeX, in --repeat
             interleaved rounds; each figure the median of its rounds, each
             ratio the median of the ratios within a round; both also from
             each run's CPU time per step (the work, on a shared machine).

Usage:
  /usr/bin/python3 bench/gemm_bench.py kernels [--repetitions 5] [--coretype SkylakeX]
  /usr/bin/python3 bench/gemm_bench.py workloads [--repeat 3] [--steps 60] [--skip-torch]
Results: results/gemm_kernels.json, results/gemm_workloads.json (--out to change).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from bench_util import RunError, run_and_load, write_json

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TORCH_SCRIPT = os.path.join(HERE, "torch_workloads.py")
BACKENDS = ["openblas", "onednn"]
UNIT = {"mlp": "samples_per_s", "gpt": "tokens_per_s"}


def kernels(args):
    runs = {}
    coretypes = [os.environ.get("OPENBLAS_CORETYPE")] + (args.coretype or [])
    for core in coretypes:
        env = dict(os.environ)
        env.pop("OPENBLAS_CORETYPE", None)
        if core:
            env["OPENBLAS_CORETYPE"] = core
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            cmd = [args.bench, "--benchmark_filter=BM_gemm", f"--benchmark_repetitions={args.repetitions}",
                   "--benchmark_report_aggregates_only=true", f"--benchmark_min_time={args.min_time}",
                   f"--benchmark_out={out.name}", "--benchmark_out_format=json"]
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                raise RunError(f"bench_kernels failed ({proc.returncode}): {proc.stderr[-2000:]}")
            data = json.load(open(out.name))
        rows, cpu_rows = {}, {}
        for b in data["benchmarks"]:
            if b.get("aggregate_name") != "median":
                continue
            # BM_gemm/threads:1/backend:0/bf16:0/shape:0/real_time_median
            a = dict(p.split(":") for p in b["run_name"].split("/")[1:] if ":" in p)
            key = (f"{BACKENDS[int(a['backend'])]} {'bf16' if a['bf16'] == '1' else 'fp32'} "
                   f"t{a['threads']}")
            shape = b["label"].split(" ")[2]
            rows.setdefault(shape, {})[key] = b["FLOPS"] / 1e9
            # On one thread the main thread's CPU time is all the work: its
            # rate is the kernel's speed while it runs, which a busy
            # neighbour on a shared machine (time-slicing) does not lower.
            if a["threads"] == "1":
                m, n, k = (int(x) for x in shape.rstrip("+=").rstrip("TN").split("x"))
                cpu_ns = b["cpu_time"] * {"ns": 1, "us": 1e3, "ms": 1e6, "s": 1e9}[b["time_unit"]]
                cpu_rows.setdefault(shape, {})[key] = 2.0 * m * n * k / cpu_ns
        name = core or "(unset)"
        runs[name] = {"context": data["context"], "gflops_median": rows, "gflops_cpu_time_median_t1": cpu_rows}
        for title, table in [("wall-clock", rows), ("CPU time, 1 thread", cpu_rows)]:
            print(f"OPENBLAS_CORETYPE={name}: GFLOP/s ({title}), median of {args.repetitions}")
            cols = sorted({k for r in table.values() for k in r})
            print(f"{'shape':<16}" + "".join(f"{c:>18}" for c in cols))
            for shape, r in table.items():
                print(f"{shape:<16}" + "".join(f"{r.get(c, float('nan')):>18.1f}" for c in cols))
    write_json(args.out or os.path.join(HERE, "results", "gemm_kernels.json"),
               {"repetitions": args.repetitions, "runs": runs})


# Every configuration one round runs, in this order: (name, engine, GEMM
# backend, precision, OPENBLAS_CORETYPE). None keeps the environment's own
# coretype (this workplace sets Haswell); SkylakeX runs OpenBLAS's AVX-512
# kernels, for the engine's OpenBLAS backend and for PyTorch (whose fp32 GEMMs
# are OpenBLAS's in Debian's build).
CONFIGS = [
    ("dpt openblas fp32", "dpt", "openblas", "fp32", None),
    ("dpt openblas fp32 SkylakeX", "dpt", "openblas", "fp32", "SkylakeX"),
    ("dpt onednn fp32", "dpt", "onednn", "fp32", None),
    ("dpt onednn bf16", "dpt", "onednn", "bf16", None),
    ("pytorch fp32", "pytorch", None, "fp32", None),
    ("pytorch fp32 SkylakeX", "pytorch", None, "fp32", "SkylakeX"),
    ("pytorch bf16", "pytorch", None, "bf16", None),
]
# The ratios the goals are stated in (numerator, denominator).
RATIOS = [
    ("dpt onednn fp32", "pytorch fp32"),
    ("dpt onednn fp32", "pytorch fp32 SkylakeX"),
    ("dpt onednn fp32", "dpt openblas fp32"),
    ("dpt openblas fp32", "pytorch fp32"),
    ("dpt openblas fp32 SkylakeX", "pytorch fp32 SkylakeX"),
    ("dpt onednn bf16", "pytorch bf16"),
    ("dpt onednn bf16", "dpt onednn fp32"),
]


def config_env(core):
    env = dict(os.environ)
    if core:
        env["OPENBLAS_CORETYPE"] = core
    return env


def run_config(args, workload, config, tmp):
    name, engine, backend, precision, core = config
    path = os.path.join(tmp, f"{workload}_{name.replace(' ', '_')}.json")
    if engine == "dpt":
        cmd = [args.dpt, "train", "--model", workload, "--threads", "1", "--steps", str(args.steps), "--synthetic",
               "--gemm", backend, "--precision", precision, "--summary-out", path]
    else:
        cmd = [sys.executable, TORCH_SCRIPT, "--workload", workload, "--threads", "1", "--steps", str(args.steps),
               "--warmup", str(args.steps // 3), "--precision", precision, "--json", path]
    return run_and_load(f"{name} {workload}", cmd, path, env=config_env(core))


def workloads(args):
    configs = [c for c in CONFIGS if not (args.skip_torch and c[1] == "pytorch")]
    result = {"steps": args.steps, "repeat": args.repeat, "threads": 1,
              "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE"), "workloads": {}}
    for workload in args.workload:
        unit = UNIT[workload]
        rounds = []
        with tempfile.TemporaryDirectory(prefix="dpt_gemm_") as tmp:
            for r in range(args.repeat):
                row = {c[0]: run_config(args, workload, c, tmp) for c in configs}
                rounds.append(row)
                print(f"{workload} round {r + 1}: " +
                      ", ".join(f"{k} {v[unit]:.0f}" for k, v in row.items()), flush=True)
        names = list(rounds[0])
        med = {k: statistics.median(rd[k][unit] for rd in rounds) for k in names}
        ratios = {f"{a} / {b}": statistics.median(rd[a][unit] / rd[b][unit] for rd in rounds)
                  for a, b in RATIOS if a in names and b in names}
        # The same from CPU time per step (1 thread: the step's work), which
        # neighbours taking turns on a shared machine's cores do not inflate.
        def cpu_rate(run):
            return run[unit] * run["step_ms_median"] / run["step_cpu_ms_median"]
        med_cpu = {k: statistics.median(cpu_rate(rd[k]) for rd in rounds) for k in names}
        ratios_cpu = {f"{a} / {b}": statistics.median(cpu_rate(rd[a]) / cpu_rate(rd[b]) for rd in rounds)
                      for a, b in RATIOS if a in names and b in names}
        engine = [k for k in names if k.startswith("dpt")]
        mfu = {k: statistics.median(rd[k]["mfu"] for rd in rounds) for k in engine}
        peak = {k: statistics.median(rd[k]["gemm_gflops"] for rd in rounds) for k in engine}
        print(f"{workload} ({unit}, median of {args.repeat} rounds): " +
              ", ".join(f"{k} {v:.0f}" for k, v in med.items()))
        print("  ratios (median of the rounds' ratios): " + ", ".join(f"{k} {v:.2f}" for k, v in ratios.items()))
        print(f"  from CPU time ({unit}): " + ", ".join(f"{k} {v:.0f}" for k, v in med_cpu.items()))
        print("  ratios from CPU time: " + ", ".join(f"{k} {v:.2f}" for k, v in ratios_cpu.items()))
        print("  measured GEMM peak GFLOP/s: " + ", ".join(f"{k} {peak[k]:.1f} (MFU {100 * mfu[k]:.0f}%)"
                                                           for k in engine))
        result["workloads"][workload] = {"unit": unit, "median": med, "ratios": ratios, "median_cpu_time": med_cpu,
                                         "ratios_cpu_time": ratios_cpu, "mfu": mfu,
                                         "gemm_peak_gflops": peak, "rounds": rounds}
    write_json(args.out or os.path.join(HERE, "results", "gemm_workloads.json"), result)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    k = sub.add_parser("kernels")
    k.add_argument("--bench", default=os.path.join(ROOT, "build", "bench", "bench_kernels"))
    k.add_argument("--repetitions", type=int, default=5)
    k.add_argument("--min-time", type=float, default=0.2)
    k.add_argument("--coretype", action="append", help="also run with OPENBLAS_CORETYPE=this")
    k.add_argument("--out")
    w = sub.add_parser("workloads")
    w.add_argument("--dpt", default=os.path.join(ROOT, "build", "dpt"))
    w.add_argument("--workload", nargs="+", choices=["gpt", "mlp"], default=["gpt", "mlp"])
    w.add_argument("--repeat", type=int, default=3)
    w.add_argument("--steps", type=int, default=60)
    w.add_argument("--skip-torch", action="store_true")
    w.add_argument("--out")
    args = ap.parse_args()
    try:
        kernels(args) if args.what == "kernels" else workloads(args)
    except RunError as e:
        print(f"gemm_bench.py: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
