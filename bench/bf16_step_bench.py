#!/usr/bin/python3
"""W-GPT in bf16 on one thread against the bf16 GEMM rate it measures (issue 36).

Runs `dpt train --model gpt --precision bf16 --synthetic --threads 1` with two
binaries in turn (--a: the reference, e.g. main's; --b: the one measured), for
--repeat interleaved rounds (this machine's speed drifts: a ratio within a
round compares like with like). Each run's summary carries the bf16 GEMM peak
it measured on the spot (gemm_gflops: a 1024^3 GEMM with bf16 inputs) and the
model's FLOPs per second, so each run gives its own utilisation of that peak
over the whole step (mfu, the issue's goal: at least 85%). Three figures per
run, as bench/builds_bench.py has them: the median step (wall), its CPU time
(at one thread the step's work, which other tenants taking turns on the
cores do not inflate) and the fastest tenth of steps (10th percentile after
5 warm-up steps). The utilisation is given on all three. A binary whose
summary has the step budget (step_gemm_ms_median: time inside GEMM calls,
nn/gemm.h) also gives the GEMMs' share of the step and the rate the GEMMs
alone ran at (step_gemm_gflops), against the same peak.

--model llama measures W-LLAMA instead (the same figures). --extra adds
`dpt train` flags to both (another shape: "--vocab 50257 --batch
4", GPT-2's vocabulary at 4 sequences) and --precision fp32 runs the same in
fp32 (the peak is then the fp32 GEMM rate).

Usage:
  /usr/bin/python3 bench/bf16_step_bench.py --a /tmp/main/dpt --b build/dpt [--repeat 5] [--steps 60]
      [--model llama] [--precision fp32] [--extra "--vocab 50257 --batch 4"]
Result: results/bf16_step.json (--out to change).
"""

import argparse
import json
import os
import shlex
import statistics
import sys
import tempfile

from bench_util import RunError, run_and_load, write_json

HERE = os.path.dirname(os.path.abspath(__file__))


# The reference workloads by --model: `dpt train --model gpt` is W-GPT's
# shape, `--model llama` W-LLAMA's (WORKLOADS.md).
WORKLOAD = {"gpt": "W-GPT", "llama": "W-LLAMA"}


def one_run(dpt, steps, tmp, precision="bf16", extra=(), model="gpt"):
    path = os.path.join(tmp, "summary.json")
    metrics = os.path.join(tmp, "metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = [dpt, "train", "--model", model, "--precision", precision, "--synthetic", "--steps", str(steps),
           "--threads", "1", "--quiet", "--summary-out", path, "--log-every", "1", "--metrics-out", metrics] + list(extra)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    s = run_and_load(f"{dpt} {WORKLOAD[model]} {precision}", cmd, path, env=env, timeout=900)
    with open(metrics) as f:
        per_step = [json.loads(line)["step_ms"] for line in f if line.strip()][5:]
    fast = statistics.quantiles(per_step, n=10)[0]
    step, cpu, peak = s["step_ms_median"], s["step_cpu_ms_median"], s["gemm_gflops"]
    work_gflop = s["gflops"] * step * 1e-3  # the model's GFLOP per step
    out = {"tokens_per_s": s["tokens_per_s"], "step_ms": step, "step_cpu_ms": cpu, "step_ms_p10": fast,
           "gemm_peak_gflops": peak, "gemm_detail": s.get("gemm_detail"), "cpu_kernels": s.get("cpu_kernels"),
           "of_peak_wall": s["mfu"], "of_peak_cpu": work_gflop / (cpu * 1e-3) / peak,
           "of_peak_fastest_tenth": work_gflop / (fast * 1e-3) / peak, "final_loss": s["final_loss"]}
    gemm = s.get("step_gemm_ms_median")
    if gemm:
        out["step_gemm_ms"] = gemm
        out["gemm_share_of_step"] = gemm / step
        # The summary's GEMM rate counts only the GEMMs' FLOPs (a fused
        # attention's products run outside them); older summaries lack it.
        rate = s.get("step_gemm_gflops") or work_gflop / (gemm * 1e-3)
        out["gemm_alone_of_peak"] = rate / peak
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--a", required=True, help="the reference dpt binary")
    ap.add_argument("--b", required=True, help="the dpt binary compared with it")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved rounds (default 3)")
    ap.add_argument("--steps", type=int, default=60, help="steps per run (default 60; the first 20 are warm-up)")
    ap.add_argument("--precision", choices=["bf16", "fp32"], default="bf16", help="the runs' --precision (default bf16)")
    ap.add_argument("--model", choices=sorted(WORKLOAD), default="gpt", help="gpt: W-GPT (default), llama: W-LLAMA")
    ap.add_argument("--extra", default="", help='more `dpt train` flags for both, e.g. "--vocab 50257 --batch 4"')
    ap.add_argument("--out", default=os.path.join(HERE, "results", "bf16_step.json"))
    args = ap.parse_args()
    extra = shlex.split(args.extra)
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeat):
            print(f"round {r + 1}/{args.repeat}", file=sys.stderr, flush=True)
            rounds.append({side: one_run(dpt, args.steps, tmp, args.precision, extra, args.model)
                           for side, dpt in (("a", args.a), ("b", args.b))})
    med = lambda side, k: statistics.median(x[side][k] for x in rounds)  # noqa: E731
    result = {"a": os.path.abspath(args.a), "b": os.path.abspath(args.b), "repeat": args.repeat,
              "steps": args.steps, "model": args.model, "precision": args.precision, "extra": extra, "cpu": cpu_name(), "rounds": rounds,
              "medians": {}}
    for side in ("a", "b"):
        m = {k: med(side, k) for k in ("tokens_per_s", "step_ms", "step_cpu_ms", "step_ms_p10", "gemm_peak_gflops",
                                       "of_peak_wall", "of_peak_cpu", "of_peak_fastest_tenth")}
        for k in ("step_gemm_ms", "gemm_share_of_step", "gemm_alone_of_peak"):
            if all(k in x[side] for x in rounds):
                m[k] = med(side, k)
        result["medians"][side] = m
    ratios = {"b_over_a_wall": statistics.median(x["b"]["tokens_per_s"] / x["a"]["tokens_per_s"] for x in rounds),
              "b_over_a_cpu": statistics.median(x["a"]["step_cpu_ms"] / x["b"]["step_cpu_ms"] for x in rounds),
              "b_over_a_fastest_tenth": statistics.median(x["a"]["step_ms_p10"] / x["b"]["step_ms_p10"]
                                                          for x in rounds)}
    result["medians"]["ratios"] = ratios
    print(f"{WORKLOAD[args.model]} {args.precision} {' '.join(extra)}, 1 thread, {args.repeat} interleaved rounds of {args.steps} "
          f"steps ({result['cpu']})")
    print(f"{'':4} {'tokens/s':>9} {'step ms':>8} {'cpu ms':>8} {'p10 ms':>8} {'peak':>7}  "
          f"{'of peak: wall':>13} {'cpu':>5} {'p10':>5}  GEMMs: share, alone of peak")
    for side in ("a", "b"):
        m = result["medians"][side]
        gem = (f"{100 * m['gemm_share_of_step']:.0f}%, {100 * m['gemm_alone_of_peak']:.0f}%"
               if "gemm_share_of_step" in m else "(no step budget in this binary)")
        print(f"{side.upper():4} {m['tokens_per_s']:9.0f} {m['step_ms']:8.2f} {m['step_cpu_ms']:8.2f} "
              f"{m['step_ms_p10']:8.2f} {m['gemm_peak_gflops']:7.1f}  {100 * m['of_peak_wall']:12.0f}% "
              f"{100 * m['of_peak_cpu']:4.0f}% {100 * m['of_peak_fastest_tenth']:4.0f}%  {gem}")
    print(f"B/A: wall {ratios['b_over_a_wall']:.3f}, cpu {ratios['b_over_a_cpu']:.3f}, "
          f"fastest tenth {ratios['b_over_a_fastest_tenth']:.3f}")
    write_json(args.out, result)
    print(f"wrote {args.out}")


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    try:
        main()
    except RunError as e:
        sys.exit(f"bf16_step_bench: {e}")
