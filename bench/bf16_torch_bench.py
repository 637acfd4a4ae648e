#!/usr/bin/python3
"""W-GPT in bf16 on one thread: dpt against PyTorch's CPU autocast, eager and
compiled (issue 36: the ratio to the better of PyTorch 1.13 and PyTorch 2.x).

Each of --repeat rounds runs, in turn: `dpt train --model gpt --precision bf16
--synthetic --threads 1` (bench/bf16_step_bench.py's run: tokens/s and its
utilisation of the bf16 GEMM peak it measures on the spot), then
bench/torch_workloads.py --workload gpt --precision bf16 --threads 1 under each
--torch Python (eager), and under each of those with PyTorch 2.2 or later
also with --compile (torch.compile; its compilation runs in the warm-up
steps). Medians over the rounds, and dpt's ratio to the fastest PyTorch.

Usage:
  /usr/bin/python3 bench/bf16_torch_bench.py --dpt build/dpt --torch /usr/bin/python3 \\
      --torch /path/to/torch2-venv/bin/python [--repeat 3] [--steps 60] [--out results/bf16_torch.json]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from bench_util import write_json
from bf16_step_bench import one_run

HERE = os.path.dirname(os.path.abspath(__file__))


def torch_run(python, steps, compiled, tmp):
    out = os.path.join(tmp, "torch.json")
    cmd = [python, os.path.join(HERE, "torch_workloads.py"), "--workload", "gpt", "--precision", "bf16",
           "--threads", "1", "--steps", str(steps), "--warmup", str(max(10, steps // 3)), "--json", out]
    if compiled:
        cmd.append("--compile")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        return {"error": r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}"}
    with open(out) as f:
        j = json.load(f)
    return {"tokens_per_s": j["tokens_per_s"], "step_ms": j["step_ms_median"], "version": j["version"],
            "compiled": compiled}


def torch_version(python):
    r = subprocess.run([python, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True)
    return r.stdout.strip()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dpt", required=True)
    ap.add_argument("--torch", action="append", default=[], help="a Python with torch (repeatable)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "bf16_torch.json"))
    a = ap.parse_args()
    configs = [("dpt", None, False)]
    for py in a.torch:
        v = torch_version(py)
        configs.append((f"torch {v} eager", py, False))
        major, minor = (int(x) for x in v.split(".")[:2])
        if (major, minor) >= (2, 2):
            configs.append((f"torch {v} compile", py, True))
    rounds = {name: [] for name, _, _ in configs}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.repeat):
            for name, py, compiled in configs:
                res = one_run(a.dpt, a.steps, tmp) if py is None else torch_run(py, a.steps, compiled, tmp)
                rounds[name].append(res)
                print(f"round {r + 1} {name}: {res.get('tokens_per_s', res.get('error'))}", flush=True)
    medians = {name: statistics.median(x["tokens_per_s"] for x in runs if "tokens_per_s" in x)
               for name, runs in rounds.items() if any("tokens_per_s" in x for x in runs)}
    best = max((v, k) for k, v in medians.items() if k != "dpt")
    result = {"workload": "W-GPT bf16, 1 thread", "repeat": a.repeat, "steps": a.steps,
              "load_average": os.getloadavg(), "rounds": rounds, "tokens_per_s_median": medians,
              "dpt_of_peak_median": statistics.median(x["of_peak_wall"] for x in rounds["dpt"]),
              "fastest_torch": best[1], "dpt_over_fastest_torch": medians["dpt"] / best[0]}
    write_json(a.out, result)
    print(json.dumps({k: result[k] for k in ("tokens_per_s_median", "dpt_of_peak_median", "fastest_torch",
                                             "dpt_over_fastest_torch")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
