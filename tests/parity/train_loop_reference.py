#!/usr/bin/python3
"""PyTorch reference for the real training loop (`dpt train`).

Usage: /usr/bin/python3 tests/parity/train_loop_reference.py --out DIR

tests/test_parity.cpp's TrainLoop tests run `dpt train` on the files this
writes and compare what the run logs and saves with what PyTorch does for
the same steps. Unlike make_reference.py, whose trajectory the C++ test
replays with its own loop, this checks run_training itself: its batches,
gradient accumulation, learning-rate schedule (linear warm-up, then cosine),
gradient clipping, optimizer, metrics, final evaluation and save.

Writes into DIR (see tests/parity/README.md):
  loop_gpt_weights.safetensors  initial GPT parameters (dpt train --load)
  loop_corpus.txt               the text the run trains and evaluates on
  loop_<case>.safetensors       per case: the reference trajectory
                                (losses, grad_norms, lrs, val_loss [1],
                                final.<name>); metadata "dpt_args" holds
                                the `dpt train` flags of the case

The batches are the engine's: the C++ WindowSampler draws every window's
start as mt19937_64() % (train_bytes - T) from a generator seeded with
--seed; MT19937_64 below is that generator (checked against the value the
C++ standard fixes for it).
"""

import argparse
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_reference import GPT, GPTConfig, gpt_param_groups, reference_init, write_safetensors  # noqa: E402

# ---------------------------------------------------------------------------
# The engine's window sampler
# ---------------------------------------------------------------------------

MASK64 = (1 << 64) - 1


class MT19937_64:
    """std::mt19937_64 (the C++ standard's parameters and seeding)."""

    def __init__(self, seed):
        self.mt = [seed & MASK64]
        for i in range(1, 312):
            x = self.mt[-1]
            self.mt.append((6364136223846793005 * (x ^ (x >> 62)) + i) & MASK64)
        self.i = 312

    def _twist(self):
        mt = self.mt
        for i in range(312):
            x = (mt[i] & 0xFFFFFFFF80000000) | (mt[(i + 1) % 312] & 0x7FFFFFFF)
            mt[i] = mt[(i + 156) % 312] ^ (x >> 1) ^ (0xB5026F5AA96619E9 if x & 1 else 0)
        self.i = 0

    def __call__(self):
        if self.i >= 312:
            self._twist()
        y = self.mt[self.i]
        self.i += 1
        y ^= (y >> 29) & 0x5555555555555555
        y ^= (y << 17) & 0x71D67FFFEDA60000
        y ^= (y << 37) & 0xFFF7EEE000000000
        y ^= y >> 43
        return y & MASK64


def check_generator():
    # [rand.predef]: the 10000th value of a default-constructed (seed 5489)
    # mt19937_64 is 9981545732273789042.
    g = MT19937_64(5489)
    for _ in range(9999):
        g()
    if g() != 9981545732273789042:
        raise RuntimeError("MT19937_64 does not reproduce std::mt19937_64")


class WindowSampler:
    """src/data/batches.cpp's WindowSampler on one rank: B random windows of
    T+1 bytes of the training part per call."""

    def __init__(self, train, T, seed):
        self.train, self.T, self.rng = train, T, MT19937_64(seed)

    def next(self, B):
        starts = len(self.train) - self.T
        rows = []
        for _ in range(B):
            s = self.rng() % starts
            rows.append(list(self.train[s:s + self.T + 1]))
        w = torch.tensor(rows, dtype=torch.long)
        return w[:, :-1], w[:, 1:]


# ---------------------------------------------------------------------------
# The schedule
# ---------------------------------------------------------------------------


def schedule_lr(step, lr, min_lr, warmup, total):
    """src/optim/schedule.cpp's cosine schedule, in double: lr (step+1)/warmup
    during warm-up, then cosine from lr at step `warmup` to min_lr at `total`."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / (total - warmup))
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr - min_lr)


def check_schedule_against_torch(lr, min_lr, warmup, total):
    """The formula above is PyTorch's LinearLR warm-up followed by
    CosineAnnealingLR: both give the same rate at every step."""
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=lr)
    sched = torch.optim.lr_scheduler.SequentialLR(opt, [
        torch.optim.lr_scheduler.LinearLR(opt, start_factor=1.0 / warmup, end_factor=1.0,
                                          total_iters=warmup - 1),
        torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total - warmup, eta_min=min_lr),
    ], milestones=[warmup])
    import warnings
    for step in range(total):
        got = opt.param_groups[0]["lr"]
        want = schedule_lr(step, lr, min_lr, warmup, total)
        if abs(got - want) > 1e-12 * lr:
            raise RuntimeError(f"schedule step {step}: torch {got} vs formula {want}")
        opt.step()
        with warnings.catch_warnings():  # SequentialLR's own step(0) warns in torch 1.13
            warnings.simplefilter("ignore")
            sched.step()


# ---------------------------------------------------------------------------
# The cases
# ---------------------------------------------------------------------------

CFG = GPTConfig(vocab_size=256, n_layer=2, n_head=4, n_embd=32, block_size=16)
SEED = 7          # --seed: the window sampler's
BATCH = 8         # --batch: global, per step
ACCUM = 2         # --grad-accum: micro-batches of BATCH / ACCUM windows
STEPS = 8
WARMUP = 3
VAL_FRACTION = 0.25

# The clip sits below every pre-clip norm of the run (1.03 to 1.67 for
# AdamW, 1.10 to 2.55 for SGD, printed by this script; run_case checks it),
# so every step clips, by a factor that changes from step to step. (Under
# AdamW a clip by the same factor on every step would change nearly nothing:
# Adam's update does not depend on the gradients' common scale.)
CASES = {
    "gpt_adamw": dict(optimizer="adamw", lr=1e-2, min_lr=1e-3, clip=0.8,
                      beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1),
    "gpt_sgd": dict(optimizer="sgd", lr=0.5, min_lr=0.05, clip=0.8, momentum=0.9, weight_decay=0.0),
}


def make_corpus():
    """About 4 KB of text with some structure for the model to pick up."""
    g = torch.Generator().manual_seed(3)
    words = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "and", "runs", "away"]
    lines = []
    for i in range(160):
        n = int(torch.randint(3, 7, (1,), generator=g))
        idx = torch.randint(0, len(words), (n,), generator=g).tolist()
        lines.append(f"{i}: " + " ".join(words[k] for k in idx) + ".\n")
    return "".join(lines).encode("ascii")


def dpt_args(case):
    c = CASES[case]
    args = [f"--optimizer {c['optimizer']}", f"--lr {c['lr']}", f"--min-lr {c['min_lr']}",
            f"--schedule cosine --warmup {WARMUP}", f"--clip {c['clip']}",
            f"--weight-decay {c['weight_decay']}"]
    if c["optimizer"] == "adamw":
        args.append(f"--beta1 {c['beta1']} --beta2 {c['beta2']} --eps {c['eps']}")
    else:
        args.append(f"--momentum {c['momentum']}")
    args.append(f"--steps {STEPS} --batch {BATCH} --grad-accum {ACCUM} --seed {SEED} "
                f"--val-fraction {VAL_FRACTION} --eval-windows 0 --log-every 1")
    return " ".join(args)


def run_case(case, weights, corpus):
    c = CASES[case]
    n = len(corpus)
    val = int(math.floor(n * VAL_FRACTION))
    train_part, val_part = corpus[:n - val], corpus[n - val:]
    model = GPT(CFG)
    model.load_state_dict(weights)
    if c["optimizer"] == "adamw":
        opt = torch.optim.AdamW(gpt_param_groups(model, c["weight_decay"]), lr=c["lr"],
                                betas=(c["beta1"], c["beta2"]), eps=c["eps"])
    else:
        opt = torch.optim.SGD(model.parameters(), lr=c["lr"], momentum=c["momentum"],
                              weight_decay=c["weight_decay"])
    check_schedule_against_torch(c["lr"], c["min_lr"], WARMUP, STEPS)
    sampler = WindowSampler(train_part, CFG.block_size, SEED)
    losses, norms, lrs = [], [], []
    for step in range(STEPS):
        opt.zero_grad(set_to_none=True)
        loss = 0.0
        for _ in range(ACCUM):  # each micro-batch's mean loss, scaled by 1/ACCUM
            tokens, targets = sampler.next(BATCH // ACCUM)
            micro = model(tokens, targets)
            (micro / ACCUM).backward()
            loss += micro.item() / ACCUM
        losses.append(loss)
        # Pre-clip global norm, as the engine logs it; then clip in place.
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), c["clip"])))
        lr = schedule_lr(step, c["lr"], c["min_lr"], WARMUP, STEPS)
        lrs.append(lr)
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
    # The final evaluation: every whole window of the validation part, the
    # mean loss over all their positions.
    T = CFG.block_size
    w = torch.tensor(list(val_part[:len(val_part) // (T + 1) * (T + 1)]), dtype=torch.long).view(-1, T + 1)
    with torch.no_grad():
        val_loss = model(w[:, :-1], w[:, 1:])
    if min(norms) <= c["clip"] and c["clip"] < 1e8:
        raise RuntimeError(f"{case}: clip {c['clip']} does not clip every step (norms {norms})")
    tensors = {"losses": torch.tensor(losses), "grad_norms": torch.tensor(norms), "lrs": torch.tensor(lrs),
               "val_loss": val_loss.reshape(1)}
    for name, p in model.named_parameters():
        tensors["final." + name] = p
    for k, t in tensors.items():
        if not torch.isfinite(t).all():
            raise RuntimeError(f"{case}: {k} has non-finite values")
    return tensors, losses, norms, float(val_loss)


def corpus_loss(weights, corpus):
    """`dpt eval` on a text: the mean loss over all positions of its whole,
    non-overlapping windows of T+1 bytes."""
    model = GPT(CFG)
    model.load_state_dict(weights)
    T = CFG.block_size
    w = torch.tensor(list(corpus[:len(corpus) // (T + 1) * (T + 1)]), dtype=torch.long).view(-1, T + 1)
    with torch.no_grad():
        return model(w[:, :-1], w[:, 1:]), w.shape[0] * T


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory to write the files into")
    args = ap.parse_args()
    try:
        os.makedirs(args.out, exist_ok=True)
        torch.set_default_dtype(torch.float32)
        check_generator()
        torch.manual_seed(0)
        model = GPT(CFG)
        reference_init(model)
        weights = {n: p.detach().clone() for n, p in model.state_dict().items()}
        write_safetensors(os.path.join(args.out, "loop_gpt_weights.safetensors"), weights, CFG.metadata())
        corpus = make_corpus()
        with open(os.path.join(args.out, "loop_corpus.txt"), "wb") as f:
            f.write(corpus)
        for case in CASES:
            tensors, losses, norms, val_loss = run_case(case, weights, corpus)
            write_safetensors(os.path.join(args.out, f"loop_{case}.safetensors"), tensors,
                              {"dpt_args": dpt_args(case), "clip": str(CASES[case]["clip"])})
            fmt = lambda v: " ".join(f"{x:.4f}" for x in v)
            print(f"{case}: losses [{fmt(losses)}] grad norms [{fmt(norms)}] val loss {val_loss:.4f}")
            if case == "gpt_adamw":
                trained = {k[len("final."):]: t for k, t in tensors.items() if k.startswith("final.")}
        # For `dpt eval`: the AdamW case's trained weights (a loss well below
        # the initial ln 256) and their loss over every whole window of the
        # corpus.
        write_safetensors(os.path.join(args.out, "loop_gpt_trained.safetensors"), trained, CFG.metadata())
        loss, positions = corpus_loss(trained, corpus)
        write_safetensors(os.path.join(args.out, "loop_eval.safetensors"), {"loss": loss.reshape(1)},
                          {"positions": str(positions)})
        print(f"trained weights: loss {float(loss):.4f} over the corpus's {positions} positions")
    except Exception as e:  # one clear line instead of a traceback
        print(f"train_loop_reference.py: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
