#!/usr/bin/env python3
"""bf16 mixed precision against fp32 (docs/precision.md), measured in one run:

- W-GPT (the reference workload, 200 steps on the bundled text, 1 process):
  validation loss at step 200 in each precision (the issue's bar: within
  0.03), median s/step and tokens/s, and the bytes accounted per category;
- ZeRO-3 on 2 ranks (--synthetic): communication bytes per step by phase,
  the forward (parameter all-gathers only) halved in bf16.

Writes bench/results/precision.json. On a CPU without AVX512-BF16 the bf16
GEMMs widen their operands to fp32 (nn/gemm.h), so bf16 is slower here; the
speed-up needs a CPU with bf16 instructions and --gemm onednn.

Usage: bench/precision_bench.py [--dpt build/dpt] [--steps 200] [--threads 2]
"""
import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_util import RunError, run_and_load, write_json  # noqa: E402


def train(dpt, tmp, name, args):
    summary = os.path.join(tmp, name + ".json")
    return run_and_load(name, [*args, "--quiet", "--summary-out", summary], summary)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dpt", default="build/dpt")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="bench/results/precision.json")
    a = ap.parse_args()
    out = {"workload": "W-GPT (gpt defaults), 1 process, bundled text", "steps": a.steps, "threads": a.threads,
           "runs": {}, "zero3_2ranks": {}}
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for p in ("fp32", "bf16"):
                s = train(a.dpt, tmp, "wgpt_" + p, [a.dpt, "train", "--model", "gpt", "--steps", str(a.steps),
                                                   "--threads", str(a.threads), "--precision", p])
                out["runs"][p] = {"val_loss": s["val_loss"], "final_loss": s["final_loss"],
                                  "step_ms_median": s["step_ms_median"], "tokens_per_s": s["tokens_per_s"],
                                  "gemm": s["gemm_detail"], "bytes": s["bytes"]}
                print(p, out["runs"][p], flush=True)
            for p in ("fp32", "bf16"):
                s = train(a.dpt, tmp, "zero3_" + p, [a.dpt, "launch", "-n", "2", "--", a.dpt, "train", "--model", "gpt",
                                                    "--synthetic", "--steps", "6", "--threads", "1",
                                                    "--strategy", "zero3", "--precision", p])
                out["zero3_2ranks"][p] = {"comm_bytes_per_step": s["comm_bytes_per_step"],
                                          "comm_bytes_per_phase": s["comm_bytes_per_phase"], "bytes": s["bytes"],
                                          "step_ms_median": s["step_ms_median"]}
                print("zero3", p, out["zero3_2ranks"][p], flush=True)
        except RunError as e:
            sys.exit(str(e))
    f, h = out["runs"]["fp32"], out["runs"]["bf16"]
    out["val_loss_difference"] = h["val_loss"] - f["val_loss"]
    out["bf16_speed_ratio"] = f["step_ms_median"] / h["step_ms_median"]
    z = out["zero3_2ranks"]
    out["zero3_forward_bytes_ratio"] = z["bf16"]["comm_bytes_per_phase"]["forward"] / z["fp32"]["comm_bytes_per_phase"]["forward"]
    write_json(a.out, out)
    print(f"val loss fp32 {f['val_loss']:.4f} bf16 {h['val_loss']:.4f} (difference {out['val_loss_difference']:+.4f}); "
          f"bf16 speed {out['bf16_speed_ratio']:.2f}x fp32; ZeRO-3 forward bytes ratio {out['zero3_forward_bytes_ratio']:.3f}")


if __name__ == "__main__":
    main()
