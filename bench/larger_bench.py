#!/usr/bin/python3
"""Seed 002's "FSDP same-model-larger" as a number: the deepest GPT of the
W-GPT-XL family (width 2048, 16 heads, context 128, vocabulary 256, 2
sequences per rank, AdamW) that trains on this machine at 2 ranks, for
DDP, ZeRO-3, and ZeRO-3 with bf16, activation checkpointing and
`--offload params`.

Usage: python3 bench/larger_bench.py [--dir DIR] [--steps 2] [--no-train]
                                     [--out bench/results/larger.json]

The depth is found by bisection on the engine's own memory check (the
`dpt train` refusal "needs about X GiB per rank ... but Y GiB is available",
computed by parallel/rank_bytes.cpp, the planner's code): a depth fits when
the run is not refused within a few seconds. Then the deepest fitting model
of each configuration trains --steps steps for real, and its summary's peak
RSS per rank and s/step are recorded beside the host's memory, so the claim
"it fits" is measured, not only predicted. Run on purpose: the last runs
hold most of the machine's memory for minutes.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_util import RunError, run_and_load, write_json  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAMILY = ["--model", "gpt", "--heads", "16", "--width", "2048", "--context", "128", "--batch", "4",
          "--synthetic", "--optimizer", "adamw", "--threads", "1"]
# The engine's refusals: memory (rank_bytes against the host's available
# memory) and, with offload, the disk (the offloaded bytes against DIR's free
# space).
NEEDS = re.compile(r"needs about ([0-9.]+) GiB per rank .* but ([0-9.]+) GiB is available")
DISK = re.compile(r"([0-9.]+) GiB free, but the ranks on this host offload ([0-9.]+) GiB")


def configs(offload_dir):
    return {
        "ddp": ["--strategy", "ddp"],
        "zero3": ["--strategy", "zero3"],
        "zero3+bf16+checkpointing+offload": ["--strategy", "zero3", "--precision", "bf16",
                                             "--checkpoint-activations", "--offload", "params",
                                             "--offload-dir", offload_dir],
    }


def settle():
    """Waits until no rank of an earlier probe holds memory, so every probe
    sees the same available memory."""
    for _ in range(100):
        if subprocess.run(["pgrep", "-f", "dpt train"], capture_output=True).returncode != 0:
            break
        time.sleep(0.2)
    time.sleep(1)


def refused(dpt, flags, layers):
    """The memory check's verdict for `layers`: the refusal's (needed,
    available) GiB, or None when the run got past the check."""
    settle()
    cmd = [dpt, "launch", "-n", "2", "--", dpt, "train", *FAMILY, *flags, "--layers", str(layers), "--steps", "1",
           "--quiet"]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, err = p.communicate(timeout=8)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        p.communicate()
        return None
    m = NEEDS.search(err)
    if m:
        return {"limit": "memory", "needed_gib_per_rank": float(m.group(1)), "available_gib": float(m.group(2))}
    m = DISK.search(err)
    if m:
        return {"limit": "disk", "offloaded_gib": float(m.group(2)), "free_gib": float(m.group(1))}
    if p.returncode != 0:
        raise RunError(f"{' '.join(cmd)} failed otherwise:\n{err[:2000]}")
    return None


def deepest(dpt, flags, hi=512):
    lo = 0  # fits (0: nothing does)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if refused(dpt, flags, mid) is None:
            lo = mid
        else:
            hi = mid
    # The available memory moves a little between probes: confirm upwards.
    while refused(dpt, flags, lo + 1) is None:
        lo += 1
    return lo


def params_of(layers):
    return 256 * 2048 + 128 * 2048 + layers * (12 * 2048 ** 2 + 13 * 2048) + 2 * 2048


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dpt", default=os.path.join(ROOT, "build", "dpt"))
    ap.add_argument("--dir", default="/var/tmp", help="where --offload-dir files go (a local disk)")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--no-train", action="store_true", help="only the memory check's depths")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "larger.json"))
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(dir=args.dir) as off, tempfile.TemporaryDirectory() as tmp:
        try:
            for name, flags in configs(off).items():
                layers = deepest(args.dpt, flags)
                row = {"config": name, "layers": layers, "params": params_of(layers),
                       "next_refused": refused(args.dpt, flags, layers + 1)}
                print(f"{name}: {layers} layers ({params_of(layers) / 1e9:.2f} B parameters) fit; {layers + 1} "
                      f"refused: {row['next_refused']}", flush=True)
                if not args.no_train and layers > 0:
                    # The host's available memory moves by about a GiB between
                    # runs (page cache): at the edge, a depth the probe let
                    # through can be refused a minute later; then one less.
                    for _ in range(3):
                        summary = os.path.join(tmp, f"{len(rows)}.json")
                        cmd = [args.dpt, "launch", "-n", "2", "--", args.dpt, "train", *FAMILY, *flags, "--layers",
                               str(layers), "--steps", str(args.steps), "--quiet", "--summary-out", summary]
                        settle()
                        try:
                            s = run_and_load(name, cmd, summary, timeout=3600)
                            break
                        except RunError as e:
                            if not NEEDS.search(str(e)):
                                raise
                            print(f"  {layers} layers refused at training time; trying {layers - 1}", flush=True)
                            layers -= 1
                    else:
                        raise RunError(f"{name}: refused at every depth tried")
                    row.update({"trained_layers": layers, "trained_params": params_of(layers),
                                "peak_rss_per_rank": max(r["peak_rss"] for r in s["ranks"]),
                                "s_per_step": s["step_ms_median"] / 1000.0, "bytes": s["bytes"],
                                "final_loss": s["final_loss"]})
                    print(f"  trained {layers} layers {args.steps} steps: peak RSS "
                          f"{row['peak_rss_per_rank'] / 2**30:.2f} GiB per rank, {row['s_per_step']:.1f} s/step",
                          flush=True)
                rows.append(row)
        except RunError as e:
            print(e, file=sys.stderr)
            return 1
    mem_total = int(open("/proc/meminfo").readline().split()[1]) * 1024
    write_json(args.out, {"benchmark": "same-model-larger", "family": "W-GPT-XL (width 2048, 16 heads, context 128)",
                          "ranks": 2, "host_memory_bytes": mem_total, "rows": rows})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
