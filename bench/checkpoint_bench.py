#!/usr/bin/python3
"""Checkpoint write and load speed beside the disk's own bandwidth.

Usage:
  python3 bench/checkpoint_bench.py [--workloads W-GPT-L W-GPT-XL] [--dir DIR]

For each workload, ZeRO-3 on 2 ranks (synthetic batches: the data is not the
subject): a run of 2 steps writes one checkpoint after step 1 (every rank
its own file, in parallel); the checkpoint's pages are then dropped from the
page cache (posix_fadvise DONTNEED, so the load reads the disk, not memory)
and a second run resumes from it and trains one more step. The summaries
give the seconds and bytes of the write and of the load.

The disk's sequential bandwidth is measured on the spot in the same
directory: a file of the checkpoint's size written in 64 MiB blocks and
fsynced (as the engine's files are), then dropped from the cache and read
back. The cost of --checkpoint-every K as a share of training time is
write / (write + K x step) from the measured step time.

Results go to bench/results/checkpoint.json. Benchmarks are run on purpose,
never by the test suite.
"""

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_util import RunError, run_and_load, write_json  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKLOADS = {
    "W-GPT-L": ["--layers", "12", "--heads", "12", "--width", "768", "--context", "128"],
    "W-GPT-XL": ["--layers", "20", "--heads", "16", "--width", "2048", "--context", "128"],
}
BLOCK = 64 << 20


def drop_cache(path):
    """Drops the (clean, fsynced) pages of a file or of every file below a directory."""
    files = [path] if os.path.isfile(path) else [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def disk_bandwidth(directory, size):
    """Sequential write (64 MiB blocks, then fsync) and read, in bytes/s."""
    path = os.path.join(directory, "disk_probe")
    block = os.urandom(BLOCK)
    n = max(1, size // BLOCK)
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        for _ in range(n):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
    write = n * BLOCK / (time.perf_counter() - t0)
    drop_cache(path)
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.read(BLOCK):
            pass
    read = n * BLOCK / (time.perf_counter() - t0)
    os.remove(path)
    return write, read


def train(dpt, summary, workload, *args):
    return [dpt, "launch", "-n", "2", "--", dpt, "train", "--model", "gpt", *WORKLOADS[workload], "--threads", "1",
            "--synthetic", "--batch", "4", "--strategy", "zero3", "--lr", "3e-5", "--quiet", "--summary-out", summary,
            *args]


def measure(args, workload, tmp):
    ck = os.path.join(args.dir, f"ck_{workload}")
    shutil.rmtree(ck, ignore_errors=True)
    s = run_and_load(workload + " write", train(args.dpt, os.path.join(tmp, "w.json"), workload, "--steps", "2",
                                               "--checkpoint-dir", ck, "--checkpoint-every", "1"),
                     os.path.join(tmp, "w.json"))
    c = s["checkpoints"]
    drop_cache(ck)
    r = run_and_load(workload + " load", train(args.dpt, os.path.join(tmp, "r.json"), workload, "--steps", "3",
                                              "--resume", ck), os.path.join(tmp, "r.json"))
    size = c["write_bytes"]
    disk_write, disk_read = disk_bandwidth(args.dir, size)
    shutil.rmtree(ck, ignore_errors=True)
    step_s = s["step_ms_median"] / 1000.0
    row = {
        "workload": workload, "strategy": "zero3", "ranks": 2, "bytes": size,
        "write_s": c["write_s"], "write_bytes_per_s": size / c["write_s"],
        "load_s": r["checkpoints"]["resume_s"], "load_bytes_per_s": size / r["checkpoints"]["resume_s"],
        "disk_write_bytes_per_s": disk_write, "disk_read_bytes_per_s": disk_read,
        "step_s": step_s,
        "every_k_share": {str(k): c["write_s"] / (c["write_s"] + k * step_s) for k in (10, 100, 1000)},
    }
    row["write_vs_disk"] = row["write_bytes_per_s"] / disk_write
    row["load_vs_disk"] = row["load_bytes_per_s"] / disk_read
    gib = 2 ** 30
    print(f"{workload}: {size / gib:.2f} GiB; write {c['write_s']:.2f} s = {row['write_bytes_per_s'] / gib:.2f} GiB/s "
          f"({100 * row['write_vs_disk']:.0f}% of the disk's {disk_write / gib:.2f}); load {row['load_s']:.2f} s = "
          f"{row['load_bytes_per_s'] / gib:.2f} GiB/s ({100 * row['load_vs_disk']:.0f}% of {disk_read / gib:.2f}); "
          f"step {step_s:.2f} s; every 100 steps costs {100 * row['every_k_share']['100']:.2f}%", flush=True)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dpt", default=os.path.join(ROOT, "build", "dpt"))
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    ap.add_argument("--dir", default="", help="where checkpoints go (default: a temporary directory)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "checkpoint.json"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if not args.dir:
            args.dir = tmp
        try:
            rows = [measure(args, w, tmp) for w in args.workloads]
        except RunError as e:
            print(e, file=sys.stderr)
            return 1
    write_json(args.out, {"benchmark": "checkpoint", "rows": rows})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
