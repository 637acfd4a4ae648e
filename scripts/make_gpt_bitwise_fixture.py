#!/usr/bin/env python3
"""Records what GPT-2 training saves, so later commits can be held to it bit for bit.

Issue 31 made the transformer one decoder configured by its architecture; with
the GPT-2 configuration the weights saved after 20 steps must stay exactly
those of the commit before it, under local, DDP, ZeRO-3, --tp 2 and --pp 2.
This script runs those five jobs with a given `dpt` binary (build the commit
to hold the engine to) and writes tests/fixtures/gpt_bitwise/expected.json:
for each run its flags and the FNV-1a 64 hash of the saved file's tensor
bytes (the data after the safetensors header), and the machine facts the
bits depend on (GEMM backend and its kernels, the CPU kernel level, threads),
which tests/dist/gpt_bitwise_cli.cpp compares before it compares hashes.

  scripts/make_gpt_bitwise_fixture.py --dpt /path/to/old/build/dpt --commit <sha>
"""
import argparse
import json
import os
import random
import struct
import subprocess
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "..", "tests", "fixtures", "gpt_bitwise")
MODEL = "--model gpt --layers 2 --width 32 --heads 4 --context 16 --seed 5 --threads 1 --steps 20 --quiet --eval-windows 8"
RUNS = {  # name: (ranks, flags); the global batch is 8 sequences everywhere
    "local": (1, "--batch 8"),
    "ddp": (2, "--batch 8 --strategy ddp"),
    "zero3": (2, "--batch 8 --strategy zero3"),
    "tp2": (2, "--batch 8 --tp 2"),
    "pp2": (2, "--batch 8 --pp 2 --grad-accum 2"),
}
MACHINE = ("gemm", "gemm_detail", "blas_core", "cpu_kernels", "threads")


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def tensor_bytes(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    return raw[8 + n:]


def write_text(path):
    rng = random.Random(31)
    words = ["the", "decoder", "holds", "every", "bit", "of", "its", "weights", "as", "before", "rank", "stage"]
    with open(path, "w") as f:
        f.write(" ".join(rng.choice(words) for _ in range(3000)) + "\n")


def run(dpt, ranks, flags, text, out_dir):
    save = os.path.join(out_dir, "w.safetensors")
    summary = os.path.join(out_dir, "s.json")
    cmd = f"{dpt} train {MODEL} {flags} --data {text} --save {save} --summary-out {summary}"
    if ranks > 1:
        cmd = f"{dpt} launch -n {ranks} -- {cmd}"
    subprocess.run(cmd, shell=True, check=True, stdout=subprocess.DEVNULL)
    return format(fnv1a64(tensor_bytes(save)), "016x"), json.load(open(summary))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dpt", required=True)
    ap.add_argument("--commit", required=True, help="the commit the binary was built from")
    a = ap.parse_args()
    os.makedirs(FIXTURE, exist_ok=True)
    text = os.path.join(FIXTURE, "text.txt")
    write_text(text)
    expected = {"commit": a.commit, "model": MODEL, "runs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (ranks, flags) in RUNS.items():
            digest, summary = run(a.dpt, ranks, flags, text, tmp)
            expected["runs"][name] = {"ranks": ranks, "flags": flags, "fnv1a64": digest}
            for key in MACHINE:
                expected.setdefault("machine", {})[key] = summary[key]
            print(name, digest)
    with open(os.path.join(FIXTURE, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
