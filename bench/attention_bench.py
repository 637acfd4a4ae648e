#!/usr/bin/env python3
"""Long-context attention (issue 35): fused against unfused, and against
PyTorch 2's scaled_dot_product_attention on the CPU.

  python3 bench/attention_bench.py --build build [--torch-python /tmp/torch2/bin/python] \\
      [--repeat 3] [--steps 3] [--contexts 128,512,2048,8192] [--out bench/results/attention.json]

1. Attention alone (build/bench/bench_kernels, BM_attention_fused and
   BM_attention_unfused): forward + backward of one sequence of T tokens,
   heads of 64, W-LLAMA's (4 query, 2 key/value) and W-GPT's (4, no
   grouping), one thread; medians of --repeat runs, and the bytes each keeps
   for backward (the unfused layer's T x T probabilities per head, the fused
   one's log-sum-exp per row). The unfused layer is not run at 8,192 (1 GiB
   per head): its bytes are given from the formula.
2. A W-LLAMA training step (`dpt train --model llama --synthetic`, one
   thread) at each context, 8,192 tokens per step (batch 8192 / T: one
   sequence at 8,192), --attention fused and unfused: the median step time
   and the summary's activation bytes. A run the memory check refuses is
   recorded as refused, with its sentence.
3. With --torch-python (a Python with torch >= 2): the same attention alone
   through torch.nn.functional.scaled_dot_product_attention (is_causal=True;
   keys and values repeated over the group, as SDPA before 2.5 takes no
   grouped heads), forward + backward, one thread.

Numbers from a shared machine are indicative only: run it on a quiet one.
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
from bench_util import RunError, run_and_load, write_json  # noqa: E402

SHAPES = {"w-llama": (4, 2), "w-gpt": (4, 4)}  # query heads, key/value heads; head dim 64
HEAD_DIM = 64
TOKENS_PER_STEP = 8192


def kernels(a, contexts):
    """Medians of BM_attention_* per (shape, T, kind), in ms, and kept bytes."""
    pattern = "BM_attention_(un)?fused(_bf16(_fma)?)?/T:({})/".format("|".join(str(t) for t in contexts))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.json")
        cmd = [os.path.join(a.build, "bench", "bench_kernels"), f"--benchmark_filter={pattern}",
               f"--benchmark_repetitions={a.repeat}", "--benchmark_report_aggregates_only=true",
               "--benchmark_format=json", f"--benchmark_out={path}"]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        with open(path) as f:
            runs = json.load(f)["benchmarks"]
    out = {}
    for r in runs:
        # Repeated: the median; once: the run itself (no aggregates).
        if r.get("aggregate_name") != "median" and not (a.repeat == 1 and r.get("run_type") == "iteration"):
            continue
        name = r["run_name"]  # BM_attention_fused/T:128/heads:4/kv:2/real_time
        parts = dict(p.split(":") for p in name.split("/")[1:4])
        kind = name.split("/")[0][len("BM_attention_"):]  # unfused, fused, fused_bf16, fused_bf16_fma
        shape = next(s for s, (h, kv) in SHAPES.items() if (h, kv) == (int(parts["heads"]), int(parts["kv"])))
        unit = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[r["time_unit"]]
        out.setdefault(shape, {}).setdefault(parts["T"], {})[kind] = {
            "ms": r["real_time"] * unit, "kept_bytes": int(round(r["saved_MiB"] * (1 << 20)))}
    for shape, (heads, kv) in SHAPES.items():
        for T in contexts:
            row = out.setdefault(shape, {}).setdefault(str(T), {})
            row.setdefault("unfused", {"ms": None, "kept_bytes": heads * T * T * 4, "not_run": "T x T per head"})
            if row.get("fused", {}).get("ms") and row["unfused"].get("ms"):
                row["fused_over_unfused"] = row["fused"]["ms"] / row["unfused"]["ms"]
            if row.get("fused", {}).get("ms") and row.get("fused_bf16", {}).get("ms"):
                row["fused_over_fused_bf16"] = row["fused"]["ms"] / row["fused_bf16"]["ms"]
    return out


def llama_step(a, T, attention):
    """Median step ms and activation bytes of W-LLAMA at context T."""
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "s.json")
        cmd = [os.path.join(a.build, "dpt"), "train", "--model", "llama", "--synthetic", "--threads", "1",
               "--context", str(T), "--batch", str(max(1, TOKENS_PER_STEP // T)), "--steps", str(a.steps),
               "--attention", attention, "--quiet", "--summary-out", path]
        for _ in range(a.repeat):
            try:
                runs.append(run_and_load(f"W-LLAMA T {T} {attention}", cmd, path, timeout=1800))
            except RunError as e:
                return {"refused": str(e).splitlines()[-1]}
    return {"step_ms": statistics.median(r["step_ms_median"] for r in runs),
            "activation_bytes": runs[0]["bytes"]["activations"], "batch": runs[0]["batch"],
            "attention": runs[0]["attention"]}


TORCH_SDPA = r"""
import json, sys, time, torch
import torch.nn.functional as F
torch.set_num_threads(1)
T, heads, kv, hd, repeat = (int(x) for x in sys.argv[1:6])
q = torch.randn(1, heads, T, hd, requires_grad=True)
k = torch.randn(1, kv, T, hd, requires_grad=True)
v = torch.randn(1, kv, T, hd, requires_grad=True)
dout = torch.randn(1, heads, T, hd)
def step():
    kk, vv = k.repeat_interleave(heads // kv, 1), v.repeat_interleave(heads // kv, 1)
    out = F.scaled_dot_product_attention(q, kk, vv, is_causal=True)
    out.backward(dout)
step()
times = []
for _ in range(repeat):
    t = time.perf_counter(); step(); times.append((time.perf_counter() - t) * 1e3)
times.sort()
print(json.dumps({"ms": times[len(times) // 2], "torch": torch.__version__}))
"""


def torch_sdpa(a, contexts):
    out = {}
    for shape, (heads, kv) in SHAPES.items():
        for T in contexts:
            proc = subprocess.run([a.torch_python, "-c", TORCH_SDPA, str(T), str(heads), str(kv), str(HEAD_DIM),
                                   str(max(3, a.repeat))], capture_output=True, text=True, timeout=1800)
            if proc.returncode != 0:
                out.setdefault(shape, {})[str(T)] = {"error": proc.stderr.strip().splitlines()[-1]}
            else:
                out.setdefault(shape, {})[str(T)] = json.loads(proc.stdout)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default="build")
    p.add_argument("--torch-python", help="a Python with torch >= 2 (scaled_dot_product_attention)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--steps", type=int, default=3, help="steps per W-LLAMA run")
    p.add_argument("--contexts", default="128,512,2048,8192")
    p.add_argument("--no-steps", action="store_true", help="attention alone only")
    p.add_argument("--out", default=os.path.join(HERE, "results", "attention.json"))
    a = p.parse_args()
    contexts = [int(t) for t in a.contexts.split(",")]
    result = {"head_dim": HEAD_DIM, "shapes": {s: {"heads": h, "kv_heads": kv} for s, (h, kv) in SHAPES.items()},
              "repeat": a.repeat, "threads": 1, "attention_alone": kernels(a, contexts)}
    for shape, rows in result["attention_alone"].items():
        for T, row in sorted(rows.items(), key=lambda x: int(x[0])):
            u, f = row["unfused"], row["fused"]
            print(f"{shape} T {T}: unfused {'-' if u['ms'] is None else format(u['ms'], '.3f')} ms "
                  f"(keeps {u['kept_bytes']} B), fused {f['ms']:.3f} ms (keeps {f['kept_bytes']} B)" +
                  "".join(f", {k} {row[k]['ms']:.3f} ms" for k in ("fused_bf16", "fused_bf16_fma") if k in row))
    if not a.no_steps:
        steps = {}
        for T in contexts:
            for attention in ("unfused", "fused"):
                steps.setdefault(str(T), {})[attention] = s = llama_step(a, T, attention)
                print(f"W-LLAMA step T {T} {attention}: {s}")
        result["w_llama_step"] = {"tokens_per_step": TOKENS_PER_STEP, "steps": a.steps, "by_context": steps}
    if a.torch_python:
        result["torch_sdpa"] = torch_sdpa(a, contexts)
        print(f"torch SDPA: {result['torch_sdpa']}")
    write_json(a.out, result)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
