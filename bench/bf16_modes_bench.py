#!/usr/bin/python3
"""fp32 against bf16 with its GEMMs native and widened, one binary (--bf16-gemm).

Where a CPU runs AVX-512 BF16 dot products (vdpbf16ps) slower than fp32
FMAs (Intel's Sapphire and Emerald Rapids with AMX hidden: half the FLOP
rate), a bf16 GEMM on oneDNN's bf16 kernels is slower than the fp32 GEMM of
the same values widened; `--bf16-gemm auto` (the default) picks by the rate
the engine measures (nn/gemm.h, core/dot_rate.h). This runs `dpt train
--synthetic --threads 1` in four ways in --repeat interleaved rounds:

  fp32        --precision fp32
  native      --precision bf16 --bf16-gemm native (skipped where oneDNN has no bf16 kernels)
  widened     --precision bf16 --bf16-gemm widened
  auto        --precision bf16 (what auto chose is in the row)

and reports each one's median tokens/s, step and CPU ms, time inside GEMM
calls, the GEMM peak of the path it took (the best any run on that path
measured on the spot: a host's sag during one run's measurement does not
count), utilisation of that peak, and the ratios within each round (median):
auto / native, auto / fp32, widened / native.

Usage:
  /usr/bin/python3 bench/bf16_modes_bench.py [--dpt build/dpt] [--model gpt|llama] [--repeat 3] [--steps 40]
Result: results/bf16_modes_<model>.json (--out to change).
"""

import argparse
import json
import os
import statistics
import sys
import tempfile

from bench_util import RunError, run_and_load, write_json

HERE = os.path.dirname(os.path.abspath(__file__))
WAYS = {
    "fp32": ["--precision", "fp32"],
    "native": ["--precision", "bf16", "--bf16-gemm", "native"],
    "widened": ["--precision", "bf16", "--bf16-gemm", "widened"],
    "auto": ["--precision", "bf16"],
}
RATIOS = [("auto", "native"), ("auto", "fp32"), ("widened", "native")]


def one_run(dpt, model, way, steps, tmp):
    path = os.path.join(tmp, "summary.json")
    cmd = [dpt, "train", "--model", model, "--synthetic", "--steps", str(steps), "--threads", "1", "--quiet",
           "--summary-out", path] + WAYS[way]
    s = run_and_load(f"{model} {way}", cmd, path, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=1800)
    return {"tokens_per_s": s["tokens_per_s"], "step_ms": s["step_ms_median"], "cpu_ms": s["step_cpu_ms_median"],
            "gemm_ms": s["step_gemm_ms_median"], "peak_gflops": s["gemm_gflops"], "mfu": s["mfu"],
            "bf16_gemm": s["bf16_gemm"], "bf16_dot_over_fma": s["bf16_dot_over_fma"],
            "gemm_detail": s["gemm_detail"], "final_loss": s.get("final_loss")}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dpt", default=os.path.join(os.path.dirname(HERE), "build", "dpt"))
    ap.add_argument("--model", choices=["gpt", "llama"], default="gpt")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved rounds (default 3)")
    ap.add_argument("--steps", type=int, default=40, help="steps per run (default 40)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    out = args.out or os.path.join(HERE, "results", f"bf16_modes_{args.model}.json")
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")

    rounds = []
    ways = list(WAYS)
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeat):
            print(f"round {r + 1}/{args.repeat}", file=sys.stderr)
            row = {}
            for way in ways:
                try:
                    row[way] = one_run(args.dpt, args.model, way, args.steps, tmp)
                except RunError as e:
                    if way == "native" and "bf16 kernels" in str(e):
                        ways.remove("native")  # nothing native to compare on this CPU
                        continue
                    raise
            rounds.append(row)

    # A peak is the machine's: each path's best over every run that took it
    # (widened and auto share one where auto widens), and each run's
    # utilisation against that, so a run whose own 1024^3 runs met a sag
    # of the host does not read high.
    def path(way, run):
        return "fp32" if way == "fp32" else run["bf16_gemm"]

    best = {}
    for r in rounds:
        for way, run in r.items():
            best[path(way, run)] = max(best.get(path(way, run), 0.0), run["peak_gflops"])
    for r in rounds:
        for way, run in r.items():
            run["own_peak_gflops"], run["mfu_own_peak"] = run["peak_gflops"], run["mfu"]
            run["peak_gflops"] = best[path(way, run)]
            run["mfu"] *= run["own_peak_gflops"] / run["peak_gflops"]

    def med(way, key):
        return statistics.median(r[way][key] for r in rounds)

    table = {w: {k: med(w, k) for k in ("tokens_per_s", "step_ms", "cpu_ms", "gemm_ms", "peak_gflops", "mfu")}
             for w in ways}
    for w in ways:
        table[w]["bf16_gemm"] = rounds[0][w]["bf16_gemm"]
    ratios = {f"{a}/{b}": statistics.median(r[a]["tokens_per_s"] / r[b]["tokens_per_s"] for r in rounds)
              for a, b in RATIOS if a in ways and b in ways}
    name = {"gpt": "W-GPT", "llama": "W-LLAMA"}[args.model]
    print(f"{name}, 1 thread, {args.repeat} interleaved rounds of {args.steps} steps ({cpu}); "
          f"AVX-512 BF16 dot products at {rounds[0]['auto']['bf16_dot_over_fma']:.2f}x the fp32 FMA rate")
    print(f"{'':9}{'tokens/s':>10}{'step ms':>10}{'cpu ms':>10}{'GEMM ms':>10}{'peak':>8}{'of peak':>9}  bf16 GEMMs")
    for w in ways:
        t = table[w]
        print(f"{w:9}{t['tokens_per_s']:10.0f}{t['step_ms']:10.1f}{t['cpu_ms']:10.1f}{t['gemm_ms']:10.1f}"
              f"{t['peak_gflops']:8.1f}{100 * t['mfu']:8.0f}%  {t['bf16_gemm'] if w != 'fp32' else '-'}")
    print("  ".join(f"{k} {v:.3f}" for k, v in ratios.items()))
    write_json(out, {"workload": name, "cpu": cpu, "steps": args.steps, "repeat": args.repeat,
                     "command": " ".join(sys.argv), "medians": table, "ratios_within_rounds": ratios,
                     "rounds": rounds})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
