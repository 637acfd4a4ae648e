#!/usr/bin/python3
"""Replays a pipeline run's trace: where does its idle come from?

Usage: python3 bench/pp_replay.py TRACE.json [--json OUT]

TRACE is `dpt train --pp N --trace-out TRACE` (each compute span names its
micro-batch and chunk). For each traced step, every rank's operations (F, B,
W, or BW) run again in the rank's own order, each taking the time it
actually took in that step, starting when its rank is free and its input is
there (the previous chunk's F, the next chunk's B; transfers free). Printed
per step and rank: the idle measured in the trace (the rank's waits over its
operations and waits, the engine's definition) beside the replay's (1 -
busy / the replayed step).

The run's summary predicts idle from each chunk's *mean* costs
(pipeline.stages[].idle_predicted). Where the replay matches the trace and
the mean-cost prediction does not, the difference is the operations'
spread: a rank waits whenever the operation it waits for runs long, and
means do not see that. What the replay itself leaves out is the time
between the end of an operation and the start of the next one on another
rank that it feeds (the transfer, the receiving rank's wake-up).

After the steps, the means over them (the first step left out, as the
summary leaves it) and two replays of the lists alone: "means", every
operation at its kind and chunk's mean over the steps (what the summary's
simulator reads, less the transfers); "spread", the mean over --trials runs
in which every operation takes that mean times a factor drawn at random
from its rank's relative durations (each operation's over its kind and
chunk's mean in the same step); and "positions", every operation at its
own mean over the steps (the same place in the same rank's list). Where
"spread" lands on the replayed
figure, independent jitter of the operations explains the gap; where it
does not, something else does (jitter that is not independent, or the
order the operations meet the host).
"""

import argparse
import collections
import json
import random
import statistics
import sys


def load_steps(path):
    """{step: {rank: [span, ...] in time order}} of the compute thread's spans."""
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    steps = collections.defaultdict(lambda: collections.defaultdict(list))
    for e in events:
        if e.get("ph") == "X" and e.get("tid") == 0 and "step" in e.get("args", {}):
            steps[e["args"]["step"]][e["pid"]].append(e)
    for ranks in steps.values():
        for spans in ranks.values():
            spans.sort(key=lambda e: e["ts"])
    return steps


KIND = {"forward": "F", "input": "B", "weight": "W", "backward": "BW"}


def operations(spans):
    """The rank's operations in order: (kind, chunk, micro-batch, duration us)."""
    out = []
    for e in spans:
        kind = KIND.get(e["name"].split()[0])
        if kind and "chunk" in e["args"]:
            out.append((kind, e["args"]["chunk"], e["args"]["micro_batch"], e["dur"]))
    return out


def replay(ops, chunks):
    """Each rank's busy time and the replayed step (us)."""
    last = chunks - 1
    end, free, nxt, busy = {}, {r: 0.0 for r in ops}, {r: 0 for r in ops}, {r: 0.0 for r in ops}

    def ready(kind, c, m):
        if kind == "F":
            return 0.0 if c == 0 else end.get(("F", c - 1, m))
        if kind == "W":
            return end.get(("B", c, m))
        own = end.get(("F", c, m))
        if own is None or c == last:
            return own
        grad = end.get(("B", c + 1, m))
        return None if grad is None else max(own, grad)

    progress = True
    while progress:
        progress = False
        for r in ops:
            while nxt[r] < len(ops[r]):
                kind, c, m, dur = ops[r][nxt[r]]
                at = ready(kind, c, m)
                if at is None:
                    break
                free[r] = max(free[r], at) + dur
                busy[r] += dur
                end[("B" if kind == "BW" else kind, c, m)] = free[r]
                nxt[r] += 1
                progress = True
    if any(nxt[r] < len(ops[r]) for r in ops):
        sys.exit("the trace's lists do not replay to the end (an incomplete step?)")
    return busy, max(free.values())


def steady_means(steps):
    """For the replays of the lists alone (the docstring's): a function from
    a cost rule (rank, index, kind, chunk) -> us to each rank's idle; the
    kinds' means; each operation's own mean; each rank's relative durations.
    steps: [{rank: ops}], the first step left out."""
    durs, ratios = collections.defaultdict(list), collections.defaultdict(list)
    at = collections.defaultdict(list)  # (rank, index in its list): durations
    for ops in steps:
        for r, o in ops.items():
            for i, op in enumerate(o):
                at[(r, i)].append(op[3])
            per = collections.defaultdict(list)
            for kind, c, _, d in o:
                per[(kind, c)].append(d)
                durs[(kind, c)].append(d)
            for kind, c, _, d in o:
                if len(per[(kind, c)]) > 1:
                    ratios[r].append(d / statistics.mean(per[(kind, c)]))
    mean = {k: statistics.mean(v) for k, v in durs.items()}
    own = {k: statistics.mean(v) for k, v in at.items()}
    lists = steps[0]
    chunks = 1 + max(c for o in lists.values() for _, c, _, _ in o)

    def idle(cost):
        ops = {r: [(kind, c, m, cost(r, i, kind, c)) for i, (kind, c, m, _) in enumerate(o)] for r, o in lists.items()}
        busy, total = replay(ops, chunks)
        return [1 - busy[r] / total for r in sorted(ops)]

    return idle, mean, own, ratios


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--json", help="write the per-step figures here")
    ap.add_argument("--trials", type=int, default=200, help="runs of the spread replay (default 200)")
    a = ap.parse_args()
    rows, kept = [], []
    for step, ranks in sorted(load_steps(a.trace).items()):
        ops = {r: operations(spans) for r, spans in ranks.items()}
        if not all(ops.values()):
            continue
        chunks = 1 + max(c for o in ops.values() for _, c, _, _ in o)
        measured = {}
        for r, spans in ranks.items():
            work = sum(e["dur"] for e in spans if KIND.get(e["name"].split()[0]))
            wait = sum(e["dur"] for e in spans if e["name"].startswith("comm wait"))
            measured[r] = wait / (work + wait)
        busy, total = replay(ops, chunks)
        row = {"step": step, "idle_measured": [measured[r] for r in sorted(ops)],
               "idle_replayed": [1 - busy[r] / total for r in sorted(ops)]}
        rows.append(row)
        kept.append(ops)
        print(f"step {step}: idle measured " + " / ".join(f"{100 * x:.1f}%" for x in row["idle_measured"]) +
              ", replayed " + " / ".join(f"{100 * x:.1f}%" for x in row["idle_replayed"]))
    out = {"trace": a.trace, "steps": rows}
    if len(rows) > 1:
        idle, mean, own, ratios = steady_means(kept[1:])
        rng = random.Random(0)
        trials = [idle(lambda r, i, kind, c: mean[(kind, c)] * (rng.choice(ratios[r]) if ratios[r] else 1.0))
                  for _ in range(a.trials)]
        out["steady"] = {
            "idle_measured": [statistics.mean(x) for x in zip(*(w["idle_measured"] for w in rows[1:]))],
            "idle_replayed": [statistics.mean(x) for x in zip(*(w["idle_replayed"] for w in rows[1:]))],
            "idle_means": idle(lambda r, i, kind, c: mean[(kind, c)]),
            "idle_spread": [statistics.mean(x) for x in zip(*trials)],
            "idle_positions": idle(lambda r, i, kind, c: own[(r, i)]),
            "relative_duration_sd": [statistics.pstdev(ratios[r]) if ratios[r] else 0.0 for r in sorted(ratios)]}
        print("steps after the first, idle per rank: " + "; ".join(
            f"{k[5:]} " + " / ".join(f"{100 * x:.1f}%" for x in out["steady"][k])
            for k in ("idle_measured", "idle_replayed", "idle_means", "idle_spread", "idle_positions")))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
