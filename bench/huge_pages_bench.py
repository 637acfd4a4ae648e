#!/usr/bin/python3
"""The engine's flat buffers on transparent huge pages, against 4 KiB pages.

core/host_alloc.h puts every CPU buffer of 2 MiB or more on a 2 MiB boundary
and advises huge pages for it; DPT_HUGE_PAGES=0 turns the advice off. This
runs the reference workloads with the same binary both ways, the two taking
turns within each of --repeat rounds (and swapping which goes first from
round to round), and reports the medians and the median of the rounds' own
ratios. Each run's summary carries its throughput; runs on one process also
give the CPU time of a step, which other tenants do not inflate.

The kernel's THP settings are recorded with the results: huge pages need
/sys/kernel/mm/transparent_hugepage/enabled at "madvise" or "always";
DDP's gradients live in a shared window (tmpfs), which takes them only where
shmem_enabled allows.

Usage:
  /usr/bin/python3 bench/huge_pages_bench.py [--dpt build/dpt] [--repeat 5]
Result: results/huge_pages.json (--out to change).
"""

import argparse
import os
import statistics
import sys
import tempfile

from bench_util import RunError, run_and_load, write_json

HERE = os.path.dirname(os.path.abspath(__file__))
WGPT = ["--model", "gpt", "--layers", "4", "--heads", "4", "--width", "256", "--context", "128", "--batch", "16"]
# name, ranks, training flags, steps
CONFIGS = [
    ("W-GPT fp32", 1, WGPT, 30),
    ("W-GPT bf16", 1, WGPT + ["--precision", "bf16"], 40),
    ("W-LLAMA bf16", 1, ["--model", "llama", "--precision", "bf16"], 40),
    ("W-MLP fp32", 1, ["--model", "mlp"], 300),
    ("W-GPT DDP 2 ranks", 2, WGPT, 40),
    ("W-MLP DDP 2 ranks", 2, ["--model", "mlp"], 300),
]


def thp_settings():
    out = {}
    for name in ("enabled", "shmem_enabled", "defrag"):
        try:
            with open(f"/sys/kernel/mm/transparent_hugepage/{name}") as f:
                out[name] = f.read().strip()
        except OSError:
            out[name] = None
    return out


def one_run(dpt, ranks, flags, steps, huge, tmp):
    path = os.path.join(tmp, "summary.json")
    train = [dpt, "train", *flags, "--synthetic", "--steps", str(steps), "--threads", "1", "--quiet",
             "--summary-out", path]
    cmd = train if ranks == 1 else [dpt, "launch", "-n", str(ranks), "--", *train]
    env = dict(os.environ, OMP_NUM_THREADS="1", DPT_HUGE_PAGES="1" if huge else "0")
    s = run_and_load(f"{' '.join(flags)} huge={huge}", cmd, path, env=env, timeout=900)
    rate = s.get("tokens_per_s") or s.get("samples_per_s")
    return {"per_s": rate, "step_ms": s["step_ms_median"], "step_cpu_ms": s.get("step_cpu_ms_median"),
            "mfu": s.get("mfu"), "peak_rss": s["bytes"]["peak_rss"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dpt", default=os.path.join(HERE, "..", "build", "dpt"))
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "huge_pages.json"))
    args = ap.parse_args()
    results = {"thp": thp_settings(), "repeat": args.repeat, "cores": os.cpu_count(),
               "load_average_before": os.getloadavg(), "configs": {}}
    runs = {name: {"4k": [], "huge": []} for name, *_ in CONFIGS}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeat):
            for name, ranks, flags, steps in CONFIGS:
                order = (False, True) if r % 2 == 0 else (True, False)
                for huge in order:
                    print(f"round {r + 1}/{args.repeat} {name} {'huge' if huge else '4k'}", file=sys.stderr)
                    runs[name]["huge" if huge else "4k"].append(one_run(args.dpt, ranks, flags, steps, huge, tmp))
    for name, rr in runs.items():
        med = {k: statistics.median(x["per_s"] for x in v) for k, v in rr.items()}
        ratios = [h["per_s"] / s["per_s"] for h, s in zip(rr["huge"], rr["4k"])]
        entry = {"per_s_4k": med["4k"], "per_s_huge": med["huge"], "huge_over_4k": statistics.median(ratios),
                 "round_ratios": ratios, "runs": rr}
        cpu = [x["step_cpu_ms"] for x in rr["4k"]], [x["step_cpu_ms"] for x in rr["huge"]]
        if all(c is not None for c in cpu[0] + cpu[1]):
            entry["step_cpu_ms_4k"], entry["step_cpu_ms_huge"] = statistics.median(cpu[0]), statistics.median(cpu[1])
        results["configs"][name] = entry
        print(f"{name:20s} 4k {med['4k']:10.0f}  huge {med['huge']:10.0f}  huge/4k {entry['huge_over_4k']:.3f} "
              f"(rounds {', '.join(f'{x:.3f}' for x in ratios)})")
    results["load_average_after"] = os.getloadavg()
    write_json(args.out, results)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    try:
        main()
    except RunError as e:
        sys.exit(f"huge_pages_bench: {e}")
