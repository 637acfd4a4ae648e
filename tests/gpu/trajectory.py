#!/usr/bin/env python3
"""GPU training follows the CPU: issue 17's trajectory check.

Usage: trajectory.py DPT WORKDIR [--steps 50] [--precision fp32] [--tol 1e-4]
                     [--mode device|local|ddp|zero3] [--offload] [--model gpt|llama]
                     [--optimizer adamw|sgd] [--loss-only] [--on cuda|cpu]

Trains W-GPT (--model llama: W-LLAMA) on tests/fixtures/gpt_bitwise/text.txt
(one data file, so one rank and two see the same global batches; --synthetic
draws a batch per rank) with clipping for --steps steps twice from the same
seed, then checks that every step's loss and every saved parameter tensor
agree "within r": max|b - a| <= r * max|a| per tensor (and per step's loss).
--mode device (default): `--device cpu` (a) against `--device cuda` (b).
--mode ddp / zero3: one rank (a) against DDP / ZeRO-3 on two ranks sharing
the GPU (b, host-staged collectives), the same global --batch. --mode local:
one rank against one rank. --on cpu runs the last three on CPU ranks (the
harness's own check, on any machine). --offload adds `--offload optimizer`
to run b (the update on the host's cores; its arithmetic differs from the
GPU's only in rounding).

--optimizer adamw (default, lr 1e-3) or sgd (lr 0.03). Runs whose arithmetic
differs in rounding (CPU against GPU, one rank against two, the update on
the host) are held to the parameter bar with SGD: AdamW divides each
gradient by its own running magnitude, so an element whose gradient is
rounding noise (GPT-2's key bias: softmax ignores it, so its exact gradient
is zero) moves by about lr a step in the noise's direction on each side, and
its parameters part by up to 2 lr a step whatever the kernels. --loss-only
reports the parameters but holds only the losses (AdamW's runs).
Prints the largest ratios and writes them to WORKDIR/trajectory.json.
Exit 0: within; 1: not; 77: no GPU here (CTest counts that as skipped;
with DPT_REQUIRE_GPU=1, as on the GPU machine, a missing GPU is 1).
"""
import argparse
import json
import os
import struct
import subprocess
import sys
from array import array


def safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        if t["dtype"] != "F32":
            raise SystemExit(f"{path}: {name} is {t['dtype']}, expected F32")
        a, b = t["data_offsets"]
        out[name] = array("f", data[a:b])
    return out


def losses(path):
    with open(path) as f:
        return [json.loads(line)["loss"] for line in f if line.strip()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dpt")
    ap.add_argument("workdir")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--model", choices=["gpt", "llama"], default="gpt", help="W-GPT or W-LLAMA")
    ap.add_argument("--mode", choices=["device", "local", "ddp", "zero3"], default="device")
    ap.add_argument("--offload", action="store_true", help="run b with --offload optimizer")
    ap.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw")
    ap.add_argument("--loss-only", action="store_true", help="hold the losses to --tol, report the parameters")
    ap.add_argument("--on", choices=["cuda", "cpu"], default="cuda", help="the device of modes local, ddp, zero3")
    args = ap.parse_args()
    data = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "gpt_bitwise", "text.txt")
    lr = "1e-3" if args.optimizer == "adamw" else "0.03"
    os.makedirs(args.workdir, exist_ok=True)
    if args.mode == "device":
        pair = [("a", "cpu", "local", 1), ("b", "cuda", "local", 1)]
    elif args.mode == "local":
        pair = [("a", args.on, "local", 1), ("b", args.on, "local", 1)]
    else:
        pair = [("a", args.on, "local", 1), ("b", args.on, args.mode, 2)]
    runs = {}
    # The GPU run first: where there is none, the skip costs nothing.
    for tag, device, strategy, ranks in reversed(pair):
        w = os.path.join(args.workdir, tag)
        cmd = [args.dpt, "train", "--model", args.model, "--data", data, "--steps", str(args.steps), "--batch", "8",
               "--optimizer", args.optimizer, "--lr", lr, "--clip", "1.0", "--seed", "7", "--log-every", "1",
               "--precision", args.precision, "--device", device, "--strategy", strategy,
               "--metrics-out", w + ".jsonl", "--save", w + ".safetensors"]
        if args.offload and tag == "b":
            cmd += ["--offload", "optimizer", "--summary-out", w + ".json"]
        if ranks > 1:
            cmd = [args.dpt, "launch", "-n", str(ranks), "--"] + cmd
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            no_gpu = "no CUDA device" in p.stderr or "built without CUDA" in p.stderr
            if device == "cuda" and no_gpu and os.environ.get("DPT_REQUIRE_GPU") != "1":
                print(f"skipped: {p.stderr.strip()}")
                return 77
            print(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr}", file=sys.stderr)
            return 1
        runs[tag] = (losses(w + ".jsonl"), safetensors(w + ".safetensors"))
    (lc, pc), (lg, pg) = runs["a"], runs["b"]
    if len(lc) != args.steps or len(lg) != args.steps:
        print(f"expected {args.steps} losses, got {len(lc)} (cpu) and {len(lg)} (cuda)", file=sys.stderr)
        return 1
    loss_ratio = max(abs(g - c) / abs(c) for c, g in zip(lc, lg))
    param_ratio = {}
    for name, c in pc.items():
        g = pg[name]
        scale = max(abs(x) for x in c) or 1.0
        param_ratio[name] = max(abs(x - y) for x, y in zip(c, g)) / scale
    worst = max(param_ratio, key=param_ratio.get)
    result = {"mode": args.mode, "offload": args.offload, "model": args.model, "optimizer": args.optimizer,
              "loss_only": args.loss_only, "runs": [p[1:] for p in pair], "steps": args.steps, "precision": args.precision,
              "tol": args.tol, "loss_max_ratio": loss_ratio, "param_max_ratio": param_ratio[worst],
              "param_worst": worst, "a_losses": lc, "b_losses": lg}
    with open(os.path.join(args.workdir, "trajectory.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(f"{args.mode}: {pair[0][1:]} vs {pair[1][1:]}, {args.steps} steps {args.precision} {args.optimizer}: loss within "
          f"{loss_ratio:.2e}, parameters within {param_ratio[worst]:.2e} ({worst}); bar {args.tol:g}; "
          f"final loss {lc[-1]:.6f} vs {lg[-1]:.6f}{' (losses held, parameters reported)' if args.loss_only else ''}")
    return 0 if loss_ratio <= args.tol and (args.loss_only or param_ratio[worst] <= args.tol) else 1


if __name__ == "__main__":
    sys.exit(main())
