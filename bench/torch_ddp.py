#!/usr/bin/python3
"""Times the reference workloads under PyTorch DDP (gloo backend) on the CPU.

Usage: /usr/bin/python3 bench/torch_ddp.py --workload mlp|gpt [--ranks N]
           [--steps S] [--warmup W] [--nosync-steps K] [--json FILE]

Each rank is a process started with torch.multiprocessing (spawn), joined
through gloo at MASTER_ADDR=127.0.0.1 on a free port, with one thread:
OPENBLAS_NUM_THREADS=1 and OMP_NUM_THREADS=1 are set before torch is
imported (Debian's torch does its GEMMs in OpenBLAS's own pthread pool, which
torch.set_num_threads does not limit), and torch.set_num_threads(1).

The models and optimizers are those of bench/torch_workloads.py (shared with
the parity test), the global batch is that of the workload split evenly:
W-MLP 256 samples (128 per rank on 2 ranks), W-GPT 16 sequences (8 per rank).
DistributedDataParallel runs with its defaults (bucket_cap_mb=25, gradients
all-reduced by gloo during backward). Each rank has its own synthetic data,
made before timing.

Every rank times each step (forward, backward with DDP's all-reduce,
optimizer step, zero_grad(set_to_none=True)) with time.perf_counter; the
first `warmup` of the `steps` steps are not measured. The reported step time
is the slowest rank's median, and throughput is the global batch over it.

Gloo's communication cannot be timed apart from backward, so after the timed
steps each rank runs `nosync-steps` more inside DDP's no_sync() (no
all-reduce); the median backward with DDP minus the median backward without
it estimates the exposed communication (est_exposed_comm_ms). The bytes a
rank sends are not measured either: comm_bytes_per_step_model is the ring
all-reduce volume 2(N-1)/N of the gradient bytes.
"""

import os

# One thread per rank: set before torch is imported, here and in every spawned
# rank (which imports this module again).
os.environ["OPENBLAS_NUM_THREADS"] = "1"
os.environ["OMP_NUM_THREADS"] = "1"

import argparse  # noqa: E402
import hashlib  # noqa: E402
import socket  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_workloads import (  # noqa: E402
    GPT, GPT_BATCH, GPT_CONFIG, MLP_BATCH, MLP_SIZES, N_BATCHES, GPTConfig,
    gpt_flops, gpt_param_groups, make_mlp, mlp_flops, reference_init)
from bench_util import write_json  # noqa: E402

DEFAULTS = {"mlp": dict(steps=60, warmup=20), "gpt": dict(steps=30, warmup=10)}
UNIT = {"mlp": "samples_per_s", "gpt": "tokens_per_s"}


def setup(workload, ranks, rank):
    """Returns (DDP model, optimizer, step_loss(i), global flops per step,
    global samples or tokens per step). Same initial weights on every rank
    (seed 0; DDP broadcasts rank 0's anyway); data differs per rank."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1000 + rank)
    if workload == "mlp":
        local = MLP_BATCH // ranks
        model = DDP(make_mlp(MLP_SIZES))
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        xs = torch.rand(N_BATCHES, local, MLP_SIZES[0], generator=gen)
        ys = torch.randint(0, MLP_SIZES[-1], (N_BATCHES, local), generator=gen)

        def step_loss(i):
            return F.cross_entropy(model(xs[i % N_BATCHES]), ys[i % N_BATCHES])

        return model, opt, step_loss, mlp_flops(MLP_SIZES, MLP_BATCH), MLP_BATCH

    cfg = GPTConfig(**GPT_CONFIG)
    net = GPT(cfg)
    reference_init(net)
    # Param groups are taken from the bare module, before DDP wraps it, so
    # the weight-decay split is exactly torch_workloads.py's.
    groups = gpt_param_groups(net, 0.1)
    # The causal masks are bool buffers, which gloo cannot broadcast ("Invalid
    # scalar type"); they are constants, the same on every rank, so DDP is
    # told to leave them out of its parameter-and-buffer sync.
    masks = [name for name, b in net.named_buffers() if b.dtype == torch.bool]
    DDP._set_params_and_buffers_to_ignore_for_model(net, masks)
    model = DDP(net)
    opt = torch.optim.AdamW(groups, lr=3e-4, betas=(0.9, 0.95))
    T = cfg.block_size
    local = GPT_BATCH // ranks
    data = torch.randint(0, cfg.vocab_size, (N_BATCHES, local, T + 1), generator=gen)

    def step_loss(i):
        seq = data[i % N_BATCHES]
        return model(seq[:, :-1], seq[:, 1:])

    tokens = GPT_BATCH * T
    n_params = sum(p.numel() for p in net.parameters())
    return model, opt, step_loss, gpt_flops(n_params, cfg.n_layer, cfg.n_embd, T, tokens), tokens


def timed_steps(model, opt, step_loss, first, count, sync=True):
    """Runs `count` steps from index `first`; returns per-step (forward,
    backward, optimizer, step) seconds and the last loss."""
    fwd, bwd, optim, step = [], [], [], []
    loss = None
    for i in range(first, first + count):
        t0 = time.perf_counter()
        if sync:
            loss = step_loss(i)
            t1 = time.perf_counter()
            loss.backward()
        else:
            with model.no_sync():
                loss = step_loss(i)
                t1 = time.perf_counter()
                loss.backward()
        t2 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t3 = time.perf_counter()
        fwd.append(t1 - t0)
        bwd.append(t2 - t1)
        optim.append(t3 - t2)
        step.append(t3 - t0)
    return fwd, bwd, optim, step, loss


def ms(xs):
    return statistics.median(xs) * 1e3 if xs else None


def rank_main(rank, args, port, queue):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_interop_threads(1)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    try:
        model, opt, step_loss, flops, per_step = setup(args.workload, args.ranks, rank)
        model.train()
        dist.barrier()
        timed_steps(model, opt, step_loss, 0, args.warmup)
        fwd, bwd, optim, step, loss = timed_steps(model, opt, step_loss, args.warmup,
                                                  args.steps - args.warmup)
        final_loss = loss.item()
        # A check that DDP kept the replicas identical (so the timed steps
        # really synchronised): every rank's parameters, bit for bit.
        with torch.no_grad():
            flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        digest = hashlib.sha256(flat.numpy().tobytes()).hexdigest()
        digests = [None] * args.ranks
        dist.all_gather_object(digests, digest)
        # Backward without all-reduce, for the exposed-communication estimate.
        # Ranks diverge from here on; nothing after this is compared.
        dist.barrier()
        _, bwd_nosync, _, _, _ = timed_steps(model, opt, step_loss, args.steps,
                                             args.nosync_steps, sync=False)
        grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        mine = {
            "rank": rank,
            "forward_ms": ms(fwd),
            "backward_ms": ms(bwd),
            "optimizer_ms": ms(optim),
            "step_ms": ms(step),
            "step_ms_min": min(step) * 1e3,
            "backward_nosync_ms": ms(bwd_nosync),
            "final_loss": final_loss,
        }
        if mine["backward_nosync_ms"] is not None:
            mine["est_exposed_comm_ms"] = max(0.0, mine["backward_ms"] - mine["backward_nosync_ms"])
        gathered = [None] * args.ranks
        dist.all_gather_object(gathered, mine)
        if rank == 0:
            queue.put({"ok": True, "ranks": gathered, "flops": flops, "per_step": per_step,
                       "grad_bytes": grad_bytes, "replicas_identical": len(set(digests)) == 1})
        dist.barrier()
    except Exception as e:  # report it to the parent rather than hang it
        if rank == 0:
            queue.put({"ok": False, "error": f"{type(e).__name__}: {e}"})
        raise
    finally:
        dist.destroy_process_group()


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description="Time W-MLP or W-GPT under PyTorch DDP (gloo, CPU).")
    ap.add_argument("--workload", choices=["mlp", "gpt"], required=True)
    ap.add_argument("--ranks", type=int, default=2, help="processes, one thread each (default 2)")
    ap.add_argument("--steps", type=int, help="total steps, warmup included (60 mlp, 30 gpt)")
    ap.add_argument("--warmup", type=int, help="leading steps not measured (20 mlp, 10 gpt)")
    ap.add_argument("--nosync-steps", type=int, default=10,
                    help="extra steps under no_sync() for the exposed-comm estimate (0: none)")
    ap.add_argument("--json", metavar="FILE", help="write the result as JSON")
    args = ap.parse_args()
    d = DEFAULTS[args.workload]
    if args.steps is None:
        args.steps = d["steps"]
    if args.warmup is None:
        args.warmup = min(d["warmup"], args.steps // 3)
    if args.ranks < 1:
        ap.error("--ranks must be >= 1")
    global_batch = MLP_BATCH if args.workload == "mlp" else GPT_BATCH
    if global_batch % args.ranks:
        ap.error(f"the global batch {global_batch} does not split evenly over {args.ranks} ranks")
    if not 0 <= args.warmup < args.steps:
        ap.error("need 0 <= --warmup < --steps")
    if args.nosync_steps < 0:
        ap.error("--nosync-steps must be >= 0")
    # gloo picks its interface from the hostname, which a container may not
    # resolve to anything useful; every rank is local, so use loopback.
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    procs = mp.spawn(rank_main, args=(args, free_port(), queue), nprocs=args.ranks, join=False)
    try:
        while not procs.join():
            pass
    except Exception as e:  # a rank died; e carries its traceback
        print(f"torch_ddp.py: a rank failed\n{e}", file=sys.stderr)
        return 1
    got = queue.get()
    if not got["ok"]:
        print(f"torch_ddp.py: {got['error']}", file=sys.stderr)
        return 1

    ranks = got["ranks"]
    slowest = max(ranks, key=lambda r: r["step_ms"])
    step_ms = slowest["step_ms"]
    unit = UNIT[args.workload]
    n = args.ranks
    est = [r.get("est_exposed_comm_ms") for r in ranks]
    result = {
        "framework": "pytorch-ddp",
        "backend": "gloo",
        "version": torch.__version__,
        "workload": args.workload,
        "ranks": n,
        "threads_per_rank": 1,
        "global_batch": global_batch,
        "batch_per_rank": global_batch // n,
        "bucket_cap_mb": 25,
        "steps": args.steps,
        "warmup": args.warmup,
        "nosync_steps": args.nosync_steps,
        "step_ms_median": step_ms,
        unit: got["per_step"] / (step_ms / 1e3),
        "flops_per_step": got["flops"],
        "gflops": got["flops"] / (step_ms / 1e3) / 1e9,
        "grad_bytes": got["grad_bytes"],
        "comm_bytes_per_step_model": 2 * (n - 1) * got["grad_bytes"] / n,
        "est_exposed_comm_pct": (max(e / r["step_ms"] for e, r in zip(est, ranks)) * 100
                                 if None not in est else None),
        "final_loss": ranks[0]["final_loss"],
        "replicas_identical": got["replicas_identical"],
        "data": "synthetic",
        "rank_summaries": ranks,
        "env": {k: os.environ.get(k) for k in
                ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "GLOO_SOCKET_IFNAME")},
    }
    print(f"pytorch-ddp {torch.__version__} gloo {args.workload}: {n} ranks x 1 thread, "
          f"global batch {global_batch}, slowest rank's median step {step_ms:.2f} ms over "
          f"{args.steps - args.warmup} steps, {result[unit]:.1f} {unit.replace('_per_s', '/s')}, "
          f"{result['gflops']:.1f} GFLOP/s")
    for r in ranks:
        line = (f"  rank {r['rank']}: forward {r['forward_ms']:.2f}  backward {r['backward_ms']:.2f}  "
                f"optimizer {r['optimizer_ms']:.2f}  step {r['step_ms']:.2f} ms")
        if r.get("est_exposed_comm_ms") is not None:
            line += (f"  (backward without all-reduce {r['backward_nosync_ms']:.2f}: "
                     f"~{r['est_exposed_comm_ms']:.2f} ms exposed comm)")
        print(line)
    if not got["replicas_identical"]:
        print("torch_ddp.py: the ranks' parameters differ after the timed steps", file=sys.stderr)
        return 1
    if args.json:
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
