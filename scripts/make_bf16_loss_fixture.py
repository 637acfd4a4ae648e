#!/usr/bin/env python3
"""Records a W-GPT bf16 run's loss curve, so later kernels can be held to it.

Issue 36 speeds up what a bf16 step does besides its GEMMs (GELU and SiLU
approximations, conversions fused into their producers, the bf16 parameter
copy written by the optimizer): each may round differently, none may change
how the model learns. This script trains W-GPT in bf16 for 200 steps on the
bundled fortunes corpus (`dpt tokens`, as run.sh --model gpt makes it), one
thread, a fixed seed, with a given `dpt` binary (build the commit to hold the
engine to), and writes tests/fixtures/bf16_loss_curve/expected.json: the
command, the loss at every 20th step and the final validation loss, and the
machine facts the rounding depends on. tests/test_bf16_loss_curve.cpp runs
the same command and holds every logged loss within 1% of these.

  scripts/make_bf16_loss_fixture.py --dpt /path/to/old/build/dpt --commit <sha>
"""
import argparse
import json
import os
import subprocess
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "..", "tests", "fixtures", "bf16_loss_curve")
# W-GPT (the gpt preset: 4 layers, width 256, context 128, batch 16), AdamW.
TRAIN = ("--model gpt --precision bf16 --threads 1 --seed 1 --steps 200 --log-every 20 "
         "--eval-every 0 --eval-windows 8 --quiet")
MACHINE = ("gemm", "gemm_detail", "cpu_kernels", "threads")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dpt", required=True, help="the dpt binary to record")
    ap.add_argument("--commit", required=True, help="the commit it was built from")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([a.dpt, "tokens", "--out", d, "--name", "fortunes"], check=True, capture_output=True)
        metrics, summary = os.path.join(d, "m.jsonl"), os.path.join(d, "s.json")
        cmd = f"{a.dpt} train {TRAIN} --data {d} --metrics-out {metrics} --summary-out {summary}"
        env = {k: v for k, v in os.environ.items() if k not in ("DPT_GEMM", "DPT_CPU_LEVEL")}
        env["OMP_NUM_THREADS"] = "1"
        subprocess.run(cmd, shell=True, check=True, env=env)
        steps = [json.loads(line) for line in open(metrics)]
        s = json.load(open(summary))
    out = {
        "commit": a.commit,
        "made_by": "scripts/make_bf16_loss_fixture.py",
        "train": TRAIN,
        "data": "dpt tokens --out <dir> --name fortunes (the bundled corpus)",
        "machine": {k: s.get(k) for k in MACHINE},
        "losses": {str(r["step"]): r["loss"] for r in steps},
        "val_loss": s.get("val_loss"),
    }
    os.makedirs(FIXTURE, exist_ok=True)
    with open(os.path.join(FIXTURE, "expected.json"), "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
