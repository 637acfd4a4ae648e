#!/usr/bin/env python3
"""W-LLAMA (shared/WORKLOADS.md): the engine against PyTorch running Hugging
Face transformers' LlamaForCausalLM on the same model, and the engine's
2-rank layouts.

  python3 bench/llama_bench.py --dpt build/dpt --torch-python /tmp/hfvenv/bin/python \\
      [--repeat 3] [--steps 40] [--out bench/results/llama.json]

1. One process, one thread, fp32 and bf16: `dpt train --model llama` and
   bench/torch_workloads.py --workload llama, alternating, `--repeat` times;
   medians of their step times, tokens/s and GFLOP/s (the same FLOP count on
   both sides, Decoder::train_flops), and the ratio. The engine's summary
   carries the GEMM peak it measured on the spot (gemm_gflops).
2. Two ranks of one thread each: DDP and ZeRO-3 (global batch 16, as one
   process's), medians of `--repeat` runs.
The torch Python must have transformers (scripts/make_hf_fixtures.py makes
such a venv over Debian's torch). Run on a quiet machine: nothing else
building or testing.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_util import write_json  # noqa: E402


def run_json(cmd, path, env=None):
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env)
    with open(path) as f:
        return json.load(f)


def dpt_run(a, tmp, precision, ranks=1, strategy=None):
    path = os.path.join(tmp, "dpt.json")
    cmd = [a.dpt, "train", "--model", "llama", "--synthetic", "--threads", "1", "--steps", str(a.steps),
           "--precision", precision, "--quiet", "--summary-out", path]
    if strategy:
        cmd += ["--strategy", strategy]
    if ranks > 1:
        cmd = [a.dpt, "launch", "-n", str(ranks), "--"] + cmd
    return run_json(cmd, path)


def torch_run(a, tmp, precision):
    path = os.path.join(tmp, "torch.json")
    cmd = [a.torch_python, os.path.join(HERE, "torch_workloads.py"), "--workload", "llama", "--threads", "1",
           "--steps", str(a.steps), "--warmup", str(a.steps // 3), "--precision", precision, "--json", path]
    return run_json(cmd, path)


def medians(runs, keys):
    return {k: statistics.median(r[k] for r in runs) for k in keys}


KEYS = ["step_ms_median", "tokens_per_s", "gflops"]


def one_thread(a, tmp):
    out = {}
    for precision in ("fp32", "bf16"):
        dpt, torch = [], []
        for _ in range(a.repeat):
            dpt.append(dpt_run(a, tmp, precision))
            torch.append(torch_run(a, tmp, precision))
        d, t = medians(dpt, KEYS + ["gemm_gflops"]), medians(torch, KEYS)
        out[precision] = {"dpt": d, "torch": t, "ratio_dpt_over_torch": d["tokens_per_s"] / t["tokens_per_s"],
                          "dpt_gemm": dpt[0]["gemm_detail"], "torch_version": torch[0]["version"]}
        print(f"W-LLAMA 1 thread {precision}: dpt {d['tokens_per_s']:.0f} tok/s ({d['gflops']:.1f} GFLOP/s, "
              f"peak {d['gemm_gflops']:.1f}), transformers {t['tokens_per_s']:.0f} tok/s "
              f"({t['gflops']:.1f} GFLOP/s): {out[precision]['ratio_dpt_over_torch']:.2f}x")
    return out


def two_ranks(a, tmp):
    out = {}
    for strategy in ("ddp", "zero3"):
        runs = [dpt_run(a, tmp, "fp32", 2, strategy) for _ in range(a.repeat)]
        out[strategy] = medians(runs, KEYS)
        print(f"W-LLAMA 2 ranks x 1 thread {strategy}: {out[strategy]['tokens_per_s']:.0f} tok/s, "
              f"{out[strategy]['step_ms_median']:.1f} ms/step")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dpt", required=True)
    ap.add_argument("--torch-python", required=True, help="a Python with torch and transformers")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--out")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = {"workload": "W-LLAMA", "steps": a.steps, "repeat": a.repeat,
                  "one_thread": one_thread(a, tmp), "two_ranks": two_ranks(a, tmp)}
    if a.out:
        write_json(a.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
