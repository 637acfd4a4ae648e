#!/usr/bin/python3
"""--offload optimizer|params: memory and time per step with and without it,
beside the disk's sequential bandwidth.

Usage:
  python3 bench/offload_bench.py [--workloads W-GPT-L W-GPT-XL] [--rounds 2] [--steps 4] [--dir DIR]
                                 [--what optimizer|params] [--precision fp32|bf16]

--what params (the fp32 master weights too) needs --precision bf16; both runs
of a row then compute in bf16.
Each workload trains with ZeRO-3 on 2 ranks (1 thread each, synthetic
batches of 2 sequences per rank), once without offload and once with
`--offload optimizer --offload-dir DIR`, in interleaved rounds. Per run:
the peak RSS of each rank (VmHWM, from the summary), and the host's memory
sampled every 0.1 s from /proc/meminfo during the run, as the rise over the
idle value just before it of
  used  = MemTotal - MemFree  (everything not free: processes and page cache)
  cache = Cached              (the page cache alone)
so a tier that filled the page cache would show in `used` though not in
RSS. The s/step is the summary's median step; the offload's own figures
(bytes read and written per step, the seconds the update waited for the
disk) come from its `offload` block. The disk is probed in DIR with
bench/checkpoint_bench.py's probe (two files written and read at once, the
ranks' pattern, buffered writes and fsync) and with O_DIRECT as the tier
reads and writes, both at the size of the offloaded state. Medians over
rounds; the optimizer step's own time (the summary's optimizer phase) is
the cleanest figure of the cost, the whole step's the most honest.

Results go to bench/results/offload.json. Run on purpose, never by the
test suite; the machine is shared, so times and host figures are noisy.
"""

import argparse
import json
import mmap
import os
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_util import RunError, run_and_load, write_json  # noqa: E402
from checkpoint_bench import WORKLOADS, disk_bandwidth  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def meminfo():
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":")
            out[k] = int(v.split()[0]) * 1024
    return out


class HostSampler:
    """Peak rise of host memory (used = total - free, and the page cache)
    over the value when it started, sampled every 0.1 s in a thread."""

    def __init__(self):
        m = meminfo()
        self.base_used, self.base_cache = m["MemTotal"] - m["MemFree"], m["Cached"]
        self.peak_used, self.peak_cache = 0, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self):
        while not self.stop.wait(0.1):
            m = meminfo()
            self.peak_used = max(self.peak_used, m["MemTotal"] - m["MemFree"] - self.base_used)
            self.peak_cache = max(self.peak_cache, m["Cached"] - self.base_cache)

    def finish(self):
        self.stop.set()
        self.thread.join()
        return self.peak_used, self.peak_cache


def run(args, workload, offload, tmp):
    summary = os.path.join(tmp, "s.json")
    cmd = [args.dpt, "launch", "-n", "2", "--", args.dpt, "train", "--model", "gpt", *WORKLOADS[workload],
           "--threads", "1", "--synthetic", "--batch", "4", "--strategy", "zero3", "--steps", str(args.steps),
           "--quiet", "--summary-out", summary, "--precision", args.precision]
    if offload:
        cmd += ["--offload", args.what, "--offload-dir", args.dir]
    time.sleep(2)  # let the page cache and the last run's memory settle
    sampler = HostSampler()
    try:
        s = run_and_load(f"{workload} offload={offload}", cmd, summary)
    finally:
        used, cache = sampler.finish()
    row = {"offload": offload, "s_per_step": s["step_ms_median"] / 1000.0,
           "peak_rss_per_rank": max(r["peak_rss"] for r in s["ranks"]),
           "host_used_rise": used, "host_cache_rise": cache,
           "optimizer_ram_bytes": s["bytes"]["optimizer"], "offloaded_bytes": s["bytes"]["offloaded"],
           "optimizer_step_s": max(r["optimizer_ms"] for r in s["ranks"]) / 1000.0}
    if offload:
        o = s["offload"]
        steps = max(1, o["streams"])
        row.update({"read_bytes_per_step": o["read_bytes"] / steps, "written_bytes_per_step": o["written_bytes"] / steps,
                    "wait_s_per_step": o["wait_s"] / steps, "direct_io": o["direct_io"],
                    "chunk_bytes": o["chunk_bytes"], "buffers": o["buffers"]})
    mib = 2 ** 20
    print(f"{workload} offload={offload}: {row['s_per_step']:.2f} s/step, peak RSS {row['peak_rss_per_rank'] / mib:.0f} "
          f"MiB/rank, host used +{used / mib:.0f} MiB, page cache +{cache / mib:.0f} MiB", flush=True)
    return row


def direct_bandwidth(directory, size, streams, block=4 << 20):
    """Sequential overwrite and read in bytes/s with O_DIRECT, the tier's own
    pattern: files written once beforehand (the tier's are fallocated and
    rewritten in place every step, so no block is allocated while timed),
    then rewritten and read in 4 MiB aligned blocks, no page cache,
    `streams` files of size / streams at the same time."""
    paths = [os.path.join(directory, f"direct_probe_{i}") for i in range(streams)]
    n = max(1, size // streams // block)

    def io(path, write):
        buf = mmap.mmap(-1, block)  # page-aligned, as O_DIRECT wants
        buf.write(os.urandom(block))
        flags = (os.O_WRONLY | os.O_CREAT) if write else os.O_RDONLY
        fd = os.open(path, flags | os.O_DIRECT, 0o600)
        try:
            for i in range(n):
                (os.pwritev if write else os.preadv)(fd, [buf], i * block)
        finally:
            os.close(fd)

    def timed(write):
        threads = [threading.Thread(target=io, args=(p, write)) for p in paths]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return streams * n * block / (time.perf_counter() - t0)

    timed(True)  # the files' blocks allocated, as the tier's are
    w, r = timed(True), timed(False)
    for p in paths:
        os.remove(p)
    return w, r


def median_row(rows):
    out = dict(rows[0])
    for k, v in rows[0].items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k] = statistics.median(r[k] for r in rows)
    out["rounds"] = len(rows)
    return out


def measure(args, workload, tmp):
    runs = {False: [], True: []}
    for _ in range(args.rounds):
        for offload in (False, True):
            runs[offload].append(run(args, workload, offload, tmp))
    off, on = median_row(runs[False]), median_row(runs[True])
    # Both ranks' files together, as the ranks use the disk together.
    size = 2 * on["offloaded_bytes"]
    disk_write, disk_read = disk_bandwidth(args.dir, size, 2)
    direct_write, direct_read = direct_bandwidth(args.dir, size, 2)
    # The disk's time for one step's traffic of both ranks, at the direct
    # probe's rates: what the optimizer step costs at least when the update
    # itself is free and nothing else uses the disk.
    io_floor = 2 * (on["read_bytes_per_step"] / direct_read + on["written_bytes_per_step"] / direct_write)
    return {"workload": workload, "strategy": "zero3", "ranks": 2, "offload": args.what, "precision": args.precision,
            "without": off, "with": on,
            "raw": {"without": runs[False], "with": runs[True]},
            "disk_write_bytes_per_s": disk_write, "disk_read_bytes_per_s": disk_read,
            "direct_write_bytes_per_s": direct_write, "direct_read_bytes_per_s": direct_read,
            "io_floor_s_per_step": io_floor,
            "rss_saved_per_rank": off["peak_rss_per_rank"] - on["peak_rss_per_rank"],
            "host_used_saved": off["host_used_rise"] - on["host_used_rise"],
            "s_per_step_added": on["s_per_step"] - off["s_per_step"],
            "optimizer_step_s_added": on["optimizer_step_s"] - off["optimizer_step_s"]}


def probe_again(args):
    with open(args.out) as f:
        result = json.load(f)
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        directory = args.dir or tmp
        for row in result["rows"]:
            size = 2 * row["with"]["offloaded_bytes"]
            row["disk_write_bytes_per_s"], row["disk_read_bytes_per_s"] = disk_bandwidth(directory, size, 2)
            row["direct_write_bytes_per_s"], row["direct_read_bytes_per_s"] = direct_bandwidth(directory, size, 2)
            on = row["with"]
            row["io_floor_s_per_step"] = 2 * (on["read_bytes_per_step"] / row["direct_read_bytes_per_s"] +
                                              on["written_bytes_per_step"] / row["direct_write_bytes_per_s"])
            mib = 2 ** 20
            print(f"{row['workload']}: buffered {row['disk_write_bytes_per_s'] / mib:.0f}/"
                  f"{row['disk_read_bytes_per_s'] / mib:.0f} MiB/s, direct {row['direct_write_bytes_per_s'] / mib:.0f}/"
                  f"{row['direct_read_bytes_per_s'] / mib:.0f} MiB/s (write/read), floor "
                  f"{row['io_floor_s_per_step']:.2f} s/step", flush=True)
    write_json(args.out, result)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dpt", default=os.path.join(ROOT, "build", "dpt"))
    ap.add_argument("--workloads", nargs="+", default=["W-GPT-L"], choices=list(WORKLOADS))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--dir", default="", help="the offload directory (default: a temporary one under /var/tmp)")
    ap.add_argument("--what", default="optimizer", choices=["optimizer", "params"])
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "offload.json"))
    ap.add_argument("--probe-only", action="store_true",
                    help="probe the disk again for the rows already in --out (training runs kept)")
    args = ap.parse_args()
    if args.what == "params" and args.precision != "bf16":
        ap.error("--what params needs --precision bf16 (the fp32 masters exist only in mixed precision)")
    if args.probe_only:
        return probe_again(args)
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        if not args.dir:
            args.dir = tmp
        try:
            rows = [measure(args, w, tmp) for w in args.workloads]
        except RunError as e:
            print(e, file=sys.stderr)
            return 1
    write_json(args.out, {"benchmark": "offload", "rows": rows})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
