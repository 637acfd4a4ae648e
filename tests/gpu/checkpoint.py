#!/usr/bin/env python3
"""Checkpoints on the device a run computes on (issue 34).

Usage: checkpoint.py DPT WORKDIR [--device cuda|cpu] [--steps 8] [--precision fp32|bf16] [--tol 1e-5]
                     [--optimizer adamw|sgd] [--across]

W-GPT (synthetic batches, --optimizer: AdamW lr 1e-3 or SGD lr 0.03, clipping, seed 7) on --device:
  straight   --steps N, the weights saved at the end
  written    the same run writing a checkpoint at step N/2 (--checkpoint-every): it must not
             change the run (weights bitwise those of `straight`)
  resumed    a new run resuming that checkpoint on the same device: bitwise `straight`
             (every later step's loss and every weight)
With --across (--device cuda, fp32), also across devices: the GPU's checkpoint resumed on the
CPU, and a CPU run's checkpoint resumed on the GPU, each within --tol of the run that did not stop
("within r": max|b - a| <= r * max|a| per tensor and per step's loss). Take SGD for that bar:
under AdamW an element whose gradient is rounding noise (GPT-2's key bias, which softmax
ignores) moves by about lr a step in the noise's direction, so two devices' weights part by
up to 2 lr a step there whatever the kernels (tests/gpu/trajectory.py).

Prints what it compared and writes WORKDIR/checkpoint.json. Exit 0: all held; 1: not; 77: no
GPU here (CTest counts that as skipped; with DPT_REQUIRE_GPU=1 a missing GPU is 1).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from trajectory import safetensors  # noqa: E402  (the same reader)


class NoGpu(Exception):
    pass


def run(dpt, workdir, tag, device, args, extra):
    w = os.path.join(workdir, tag)
    cmd = [dpt, "train", "--model", "gpt", "--synthetic", "--steps", str(args.steps), "--batch", "8",
           "--optimizer", args.optimizer, "--lr", "1e-3" if args.optimizer == "adamw" else "0.03", "--clip", "1.0",
           "--seed", "7", "--log-every", "1",
           "--precision", args.precision, "--device", device, "--metrics-out", w + ".jsonl",
           "--save", w + ".safetensors"] + extra
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        if device == "cuda" and ("no CUDA device" in p.stderr or "built without CUDA" in p.stderr):
            raise NoGpu(p.stderr.strip())
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr}")
    with open(w + ".jsonl") as f:
        losses = {j["step"]: j["loss"] for j in map(json.loads, filter(str.strip, f)) if "loss" in j}
    return losses, safetensors(w + ".safetensors")


def worst(a, b):
    """The largest per-tensor max|b - a| / max|a| over the weights, and over the losses both runs logged."""
    (la, pa), (lb, pb) = a, b
    if set(pa) != set(pb):
        raise SystemExit(f"the runs saved different tensors: {sorted(set(pa) ^ set(pb))[:5]}")
    ratios = {n: max(abs(x - y) for x, y in zip(pa[n], pb[n])) / (max(abs(x) for x in pa[n]) or 1.0) for n in pa}
    name = max(ratios, key=ratios.get)
    steps = sorted(set(la) & set(lb))
    loss = max(abs(la[s] - lb[s]) / abs(la[s]) for s in steps)
    return {"weights": ratios[name], "tensor": name, "loss": loss, "steps": steps}


def bitwise(a, b):
    (la, pa), (lb, pb) = a, b
    return all(la[s] == lb[s] for s in set(la) & set(lb)) and all(pa[n] == pb[n] for n in pa) and set(pa) == set(pb)


def stop_and_resume(dpt, workdir, device, args, resume_on):
    """A run on `device` that writes a checkpoint at N/2, and one on `resume_on` that resumes it."""
    ck = os.path.join(workdir, f"ck_{device}")
    shutil.rmtree(ck, ignore_errors=True)
    half = max(1, args.steps // 2)
    written = run(dpt, workdir, f"written_{device}", device, args,
                  ["--checkpoint-dir", ck, "--checkpoint-every", str(half)])
    resumed = run(dpt, workdir, f"resumed_{device}_on_{resume_on}", resume_on, args, ["--resume", ck])
    if min(resumed[0]) != half + 1:
        raise SystemExit(f"the resumed run's first logged step is {min(resumed[0])}, not {half + 1}")
    return written, resumed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dpt")
    ap.add_argument("workdir")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--tol", type=float, default=1e-5)
    ap.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw")
    ap.add_argument("--across", action="store_true", help="also resume across devices (--device cuda, fp32)")
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    d = args.device
    result = {"device": d, "steps": args.steps, "precision": args.precision, "tol": args.tol,
              "optimizer": args.optimizer}
    ok = True
    try:
        straight = run(args.dpt, args.workdir, f"straight_{d}", d, args, [])
        written, resumed = stop_and_resume(args.dpt, args.workdir, d, args, d)
        result["writing_leaves_the_run_alone"] = bitwise(straight, written)
        result["resumed_bitwise"] = bitwise(straight, resumed)
        ok = result["writing_leaves_the_run_alone"] and result["resumed_bitwise"]
        print(f"{d} {args.precision} {args.optimizer}: a checkpoint at step {args.steps // 2} of {args.steps} "
              f"{'leaves' if result['writing_leaves_the_run_alone'] else 'CHANGES'} the run; resumed on {d}: "
              f"{'bitwise' if result['resumed_bitwise'] else 'NOT bitwise'} the run that did not stop "
              f"({worst(straight, resumed)})")
        if args.across and d == "cuda" and args.precision == "fp32":
            _, on_cpu = stop_and_resume(args.dpt, args.workdir, "cuda", args, "cpu")
            cpu_straight = run(args.dpt, args.workdir, "straight_cpu", "cpu", args, [])
            _, on_gpu = stop_and_resume(args.dpt, args.workdir, "cpu", args, "cuda")
            for tag, ref, got in [("gpu_checkpoint_on_cpu", straight, on_cpu),
                                  ("cpu_checkpoint_on_gpu", cpu_straight, on_gpu)]:
                result[tag] = worst(ref, got)
                held = result[tag]["weights"] <= args.tol and result[tag]["loss"] <= args.tol
                ok = ok and held
                print(f"{tag}: weights within {result[tag]['weights']:.2e} ({result[tag]['tensor']}), losses "
                      f"within {result[tag]['loss']:.2e}; bar {args.tol:g}: {'held' if held else 'NOT held'}")
    except NoGpu as e:
        if os.environ.get("DPT_REQUIRE_GPU") == "1":
            print(f"no GPU, and DPT_REQUIRE_GPU=1: {e}", file=sys.stderr)
            return 1
        print(f"skipped: {e}")
        return 77
    result["held"] = ok
    with open(os.path.join(args.workdir, "checkpoint.json"), "w") as f:
        json.dump(result, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
