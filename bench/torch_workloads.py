#!/usr/bin/python3
"""Times the reference training workloads in PyTorch on the CPU.

Usage: /usr/bin/python3 bench/torch_workloads.py --workload mlp|gpt|llama
(llama: Hugging Face transformers' LlamaForCausalLM at W-LLAMA's shape; run
it with a Python that has transformers, e.g. the venv of
scripts/make_hf_fixtures.py)
           --threads N --steps S [--warmup W] [--precision bf16] [--compile] [--json FILE]

W-MLP: 784-1024-1024-10 ReLU MLP, cross-entropy, SGD (lr 0.05, momentum 0.9),
       batch 256, fp32.
W-GPT: GPT (tied head, pre-LN, GELU-tanh) with vocab 256, 4 layers, 4 heads,
       width 256, context 128, batch 16 sequences, AdamW (lr 3e-4,
       betas 0.9/0.95, weight decay 0.1 on parameters with dim >= 2), fp32.
--precision bf16 runs the forward and loss under torch.autocast("cpu",
dtype=torch.bfloat16): bf16 matrix products (oneDNN), fp32 parameters,
gradients and optimizer, as PyTorch's CPU mixed precision is used.

Data is synthetic and generated before timing, so data loading costs nothing.
Each step (forward, backward, optimizer step, zero_grad(set_to_none=True)) is
timed with time.perf_counter; `steps` counts all steps, of which the first
`warmup` are not measured. Reports the median step time, throughput and
achieved GFLOP/s against a model-FLOP count (see mlp_flops / gpt_flops).
"""

import argparse
import os
import statistics
import sys
import time


def _pin_blas_threads():
    """Debian's torch does its GEMMs in OpenBLAS's own pthread pool, which
    torch.set_num_threads does not limit: without this a "1 thread" run uses
    every core for GEMM. The pool reads OPENBLAS_NUM_THREADS when the library
    loads, so it is set from --threads before torch is imported."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--threads", type=int)
    known, _ = pre.parse_known_args()
    if known.threads and known.threads > 0:
        os.environ["OPENBLAS_NUM_THREADS"] = str(known.threads)
        os.environ["OMP_NUM_THREADS"] = str(known.threads)


_pin_blas_threads()

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

# The GPT and MLP definitions are shared with the parity reference, so the
# benchmark times the same model that the parity test checks.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "parity"))
from make_reference import GPT, GPTConfig, gpt_param_groups, make_mlp, reference_init  # noqa: E402
from bench_util import write_json  # noqa: E402  (this folder is on sys.path when run as a script)

MLP_SIZES = [784, 1024, 1024, 10]
MLP_BATCH = 256
GPT_CONFIG = dict(vocab_size=256, n_layer=4, n_head=4, n_embd=256, block_size=128)
GPT_BATCH = 16
N_BATCHES = 8  # distinct synthetic batches, cycled through


def mlp_flops(sizes, batch):
    """Model FLOPs of one training step: forward GEMMs, weight-gradient GEMMs,
    and input-gradient GEMMs for every layer but the first (its input gradient
    is not needed): 2*batch*(2*sum(in*out) + sum(in*out except layer 0))."""
    mac = [a * b for a, b in zip(sizes[:-1], sizes[1:])]
    return 2 * batch * (2 * sum(mac) + sum(mac[1:]))


def gpt_flops(n_params, n_layer, n_embd, context, tokens):
    """PaLM estimate: 6*N*tokens + 12*n_layer*C*T*tokens, N = all parameters
    (the tied embedding counted once)."""
    return 6 * n_params * tokens + 12 * n_layer * n_embd * context * tokens


def setup_mlp():
    """Returns (model, optimizer, step_loss(i), flops per step, samples per step)."""
    model = make_mlp(MLP_SIZES)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    xs = torch.rand(N_BATCHES, MLP_BATCH, MLP_SIZES[0])
    ys = torch.randint(0, MLP_SIZES[-1], (N_BATCHES, MLP_BATCH))

    def step_loss(i):
        return F.cross_entropy(model(xs[i % N_BATCHES]), ys[i % N_BATCHES])

    return model, opt, step_loss, mlp_flops(MLP_SIZES, MLP_BATCH), MLP_BATCH


def setup_gpt():
    """Returns (model, optimizer, step_loss(i), flops per step, tokens per step)."""
    cfg = GPTConfig(**GPT_CONFIG)
    model = GPT(cfg)
    reference_init(model)
    opt = torch.optim.AdamW(gpt_param_groups(model, 0.1), lr=3e-4, betas=(0.9, 0.95))
    T = cfg.block_size
    data = torch.randint(0, cfg.vocab_size, (N_BATCHES, GPT_BATCH, T + 1))

    def step_loss(i):
        seq = data[i % N_BATCHES]
        return model(seq[:, :-1], seq[:, 1:])

    tokens = GPT_BATCH * T
    n_params = sum(p.numel() for p in model.parameters())
    flops = gpt_flops(n_params, cfg.n_layer, cfg.n_embd, T, tokens)
    return model, opt, step_loss, flops, tokens


# W-LLAMA (shared/WORKLOADS.md), as transformers configures it.
LLAMA_CONFIG = dict(vocab_size=256, hidden_size=256, intermediate_size=704, num_hidden_layers=4,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                    rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
                    attention_bias=False, mlp_bias=False, hidden_act="silu")


def llama_flops(c, context, tokens):
    """The engine's count (Decoder::train_flops): 6 FLOPs per GEMM parameter
    per token (q, k, v, o, gate, up, down and the head) plus 12 * layers * T *
    (heads x head size) per token for attention's two products."""
    C, L, H = c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"]
    hd, KV, F = C // H, c["num_key_value_heads"], c["intermediate_size"]
    layer = (H + 2 * KV) * hd * C + H * hd * C + 3 * C * F
    return 6 * (L * layer + c["vocab_size"] * C) * tokens + 12 * L * context * H * hd * tokens


def setup_llama():
    """Returns (model, optimizer, step_loss(i), flops per step, tokens per step)."""
    from transformers import LlamaConfig, LlamaForCausalLM  # only this workload needs it
    cfg = LlamaConfig(**LLAMA_CONFIG, attn_implementation="eager")
    model = LlamaForCausalLM(cfg)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95))
    T = LLAMA_CONFIG["max_position_embeddings"]
    data = torch.randint(0, LLAMA_CONFIG["vocab_size"], (N_BATCHES, GPT_BATCH, T + 1))

    def step_loss(i):
        seq = data[i % N_BATCHES]
        logits = model(seq[:, :-1]).logits
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), seq[:, 1:].reshape(-1))

    tokens = GPT_BATCH * T
    return model, opt, step_loss, llama_flops(LLAMA_CONFIG, T, tokens), tokens


def main():
    ap = argparse.ArgumentParser(description="Time the reference workloads in PyTorch (CPU).")
    ap.add_argument("--workload", choices=["mlp", "gpt", "llama"], required=True)
    ap.add_argument("--threads", type=int, required=True, help="torch intra-op threads")
    ap.add_argument("--steps", type=int, default=60, help="total steps, warmup included")
    ap.add_argument("--warmup", type=int, default=20, help="leading steps not measured")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                    help="bf16: forward and loss under torch.autocast('cpu', dtype=torch.bfloat16)")
    ap.add_argument("--compile", action="store_true",
                    help="PyTorch 2: the model's forward through torch.compile (nn.Module.compile, in place); "
                         "the compilation runs in the warm-up steps")
    ap.add_argument("--json", metavar="FILE", help="write the result as JSON")
    args = ap.parse_args()
    if args.threads < 1:
        ap.error("--threads must be >= 1")
    if not 0 <= args.warmup < args.steps:
        ap.error("need 0 <= --warmup < --steps")

    # Inter-op threads must be set before any parallel work starts.
    torch.set_num_interop_threads(1)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    setup = {"mlp": setup_mlp, "gpt": setup_gpt, "llama": setup_llama}[args.workload]
    model, opt, step_loss, flops, per_step = setup()
    model.train()
    if args.compile:
        if not hasattr(model, "compile"):
            print(f"torch_workloads.py: --compile needs PyTorch 2.2 or later, not {torch.__version__}",
                  file=sys.stderr)
            return 1
        model.compile()

    times, cpu_times = [], []
    for i in range(args.steps):
        c0 = time.process_time()
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            loss = step_loss(i)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t1 = time.perf_counter()
        c1 = time.process_time()
        if i >= args.warmup:
            times.append(t1 - t0)
            cpu_times.append(c1 - c0)
    if not torch.isfinite(loss):
        print(f"torch_workloads.py: non-finite loss {loss.item()}", file=sys.stderr)
        return 1

    median = statistics.median(times)
    unit = "samples_per_s" if args.workload == "mlp" else "tokens_per_s"
    result = {
        "framework": "pytorch",
        "version": torch.__version__,
        "workload": args.workload,
        "threads": args.threads,
        "precision": args.precision,
        "compiled": args.compile,
        "steps": args.steps,
        "warmup": args.warmup,
        "step_ms_median": median * 1e3,
        "step_ms_min": min(times) * 1e3,
        # CPU time of the process per step (all threads): at 1 thread the
        # step's work, which other programs sharing the cores do not inflate.
        "step_cpu_ms_median": statistics.median(cpu_times) * 1e3,
        unit: per_step / median,
        "flops_per_step": flops,
        "gflops": flops / median / 1e9,
        "final_loss": loss.item(),
        "data": "synthetic",
        "env": {k: os.environ.get(k) for k in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")},
    }
    print(f"pytorch {torch.__version__} {args.workload} {args.precision}{' compiled' if args.compile else ''}: "
          f"threads {args.threads}, "
          f"median step {result['step_ms_median']:.2f} ms over {len(times)} steps, "
          f"{result[unit]:.1f} {unit.replace('_per_s', '/s')}, {result['gflops']:.1f} GFLOP/s")
    if args.json:
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
