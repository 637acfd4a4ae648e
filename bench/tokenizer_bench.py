#!/usr/bin/env python3
"""Encoding throughput of `dpt tokens --tokenizer` against Hugging Face
`tokenizers`, one core each, on the fortunes corpus (a file is a document,
read as errors="replace", as both sides read it). A benchmark, not a test.

  /tmp/tokvenv/bin/python bench/tokenizer_bench.py [--rounds 3] [--out bench/results/tokenizer.json]

dpt: `OMP_NUM_THREADS=1 dpt tokens --tokenizer T --out tmp`; its summary's
seconds cover reading, encoding and writing the shards (not loading the
tokenizer). tokenizers: a freshly loaded tokenizer per round (so its word
cache starts cold, as dpt's does), RAYON_NUM_THREADS=1, encode(text,
add_special_tokens=False) per document, timed around the encode calls only.
The best of --rounds for each. Both tokenizers are the test fixtures
(tests/fixtures/tokenizer/, trained by scripts/make_tokenizer_fixtures.py).
"""
import argparse
import os
import platform
import re
import subprocess
import sys
import tempfile
import time

os.environ["RAYON_NUM_THREADS"] = "1"  # before tokenizers starts its pool
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import tokenizers  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_util import write_json  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
FORTUNES = "/usr/share/games/fortunes"
SUMMARY = re.compile(r"(\d+) documents, (\d+) tokens .* ([\d.]+) MB in ([\d.]+) s")


def corpus():
    names = sorted(n for n in os.listdir(FORTUNES)
                   if not n.endswith((".dat", ".u8")) and os.path.isfile(os.path.join(FORTUNES, n)))
    return [open(os.path.join(FORTUNES, n), "rb").read() for n in names]


def run_dpt(dpt, tokenizer):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as out:
        proc = subprocess.run([dpt, "tokens", "--tokenizer", tokenizer, "--out", out], env=env,
                              capture_output=True, text=True, check=True)
    m = SUMMARY.search(proc.stdout)
    if not m:
        raise SystemExit(f"no summary in dpt's output: {proc.stdout}")
    docs, tokens, _, seconds = m.groups()
    return int(docs), int(tokens), float(seconds)


def run_hf(tokenizer, texts):
    tok = Tokenizer.from_file(tokenizer)
    t0 = time.perf_counter()
    tokens = sum(len(tok.encode(t, add_special_tokens=False).ids) for t in texts)
    return tokens, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dpt", default=os.path.join(ROOT, "build", "dpt"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "tokenizer.json"))
    args = ap.parse_args()
    raw = corpus()
    texts = [r.decode("utf-8", errors="replace") for r in raw]
    mb = sum(len(r) for r in raw) / 1e6
    results = []
    for name in ("gpt2_style", "llama3_style"):
        path = os.path.join(ROOT, "tests", "fixtures", "tokenizer", name + ".json")
        dpt = min((run_dpt(args.dpt, path) for _ in range(args.rounds)), key=lambda r: r[2])
        hf = min((run_hf(path, texts) for _ in range(args.rounds)), key=lambda r: r[1])
        # dpt's count has one delimiter per document more; the rest must agree.
        if dpt[1] - dpt[0] != hf[0]:
            raise SystemExit(f"{name}: dpt wrote {dpt[1] - dpt[0]} tokens, tokenizers gave {hf[0]}")
        row = {"tokenizer": name, "documents": dpt[0], "mb": round(mb, 3),
               "dpt": {"tokens": dpt[1] - dpt[0], "seconds": dpt[2], "tokens_per_s": round((dpt[1] - dpt[0]) / dpt[2]),
                       "mb_per_s": round(mb / dpt[2], 2)},
               "tokenizers": {"tokens": hf[0], "seconds": round(hf[1], 4), "tokens_per_s": round(hf[0] / hf[1]),
                              "mb_per_s": round(mb / hf[1], 2)}}
        row["dpt_over_tokenizers"] = round(row["dpt"]["tokens_per_s"] / row["tokenizers"]["tokens_per_s"], 2)
        print(f"{name}: dpt {row['dpt']['tokens_per_s']:,} tokens/s ({row['dpt']['mb_per_s']} MB/s), tokenizers "
              f"{row['tokenizers']['tokens_per_s']:,} tokens/s ({row['tokenizers']['mb_per_s']} MB/s): "
              f"x{row['dpt_over_tokenizers']}")
        results.append(row)
    write_json(args.out, {"what": "encode throughput, one core each, fortunes corpus",
                          "tokenizers_version": tokenizers.__version__, "cpu": platform.processor() or platform.machine(),
                          "rounds": args.rounds, "results": results})


if __name__ == "__main__":
    main()
