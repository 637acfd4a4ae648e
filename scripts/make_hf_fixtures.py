#!/usr/bin/env python3
"""Remakes tests/fixtures/hf/: tiny Llama-family checkpoints written by Hugging
Face `transformers` itself (save_pretrained, sharded safetensors), the logits
its own modeling code gives for them, and short SGD and AdamW trajectories
trained with its modules, for the engine's Llama-family decoder tests.

Pinned versions (the only ones these files were made and checked with):
  transformers==4.45.2 safetensors==0.8.0 huggingface_hub==0.36.2
  torch 1.13 from Debian's python3-torch (NOT PyPI's torch), numpy from Debian
requirements: transformers==4.45.2 safetensors==0.8.0 huggingface_hub==0.36.2

Run by hand from the repository root:
  /usr/bin/python3 -m venv --system-site-packages /tmp/hfvenv && /tmp/hfvenv/bin/pip install transformers==4.45.2 safetensors==0.8.0 huggingface_hub==0.36.2 && /tmp/hfvenv/bin/python scripts/make_hf_fixtures.py
(/usr/bin/python3 and --system-site-packages so the venv sees Debian's torch 1.13:
a python3 earlier on PATH, such as pyenv's, has no torch;
huggingface_hub is pinned too because it decides how save_pretrained shards.)
Options: --out DIR (default tests/fixtures/hf). Takes a few seconds on one core.

Deterministic: fixed seeds, float32, torch.set_num_threads(1), eager
attention, single-tensor (foreach=False) optimizers; remaking with the same
versions reproduces every file byte for byte.

Per model directory (llama_gqa, llama_rope_scaled, qwen2):
  config.json, model.safetensors.index.json, model-0000k-of-0000n.safetensors
      save_pretrained(safe_serialization=True, max_shard_size="20KB"): at
      least two shards (checked). generation_config.json is deleted.
      Norm weights are 1 + 0.1 randn and biases 0.1 randn (seeded), the
      other weights transformers' init, N(0, initializer_range=0.1).
  The files below are written by tests/parity/make_reference.py's
  safetensors writer (tensors in the order listed, string metadata: model,
  versions, optimizer settings); safetensors' save_file orders metadata
  differently on every run.
  logits.safetensors
      tokens  F32 [2,12]      token ids (integers < 96 stored as F32: the
                              engine's safetensors reader takes F32/BF16 only)
      logits  F32 [2,12,96]   model(tokens).logits, eval mode, no mask/padding
  logits_unscaled.safetensors (llama_rope_scaled only)
      tokens, logits as above from the same weights with rope_scaling=None
      (rope_theta stays 500000)
  trajectory.safetensors      20 steps of torch.optim.SGD(lr=0.1)
      tokens   F32 [2,12]     inputs (the same ids as logits.safetensors)
      targets  F32 [2,12]     target ids (seeded, independent of tokens)
      losses   F32 [20]       losses[i]: loss before update i, where loss =
                              F.cross_entropy(logits.view(-1,96),
                              targets.view(-1)) (mean over 24 positions)
      grad.<name>  F32        gradient of every parameter at step 0
      final.<name> F32        every parameter after the 20th update
  trajectory_adamw.safetensors 6 steps of torch.optim.AdamW(lr=1e-3,
      betas=(0.9,0.95), eps=1e-8), weight_decay 0.1 on parameters with
      dim >= 2 (embedding, linear weights, lm_head), 0.0 on 1-D ones (norm
      weights, biases): tokens, targets, losses [6], final.<name>
<name> is the Hugging Face parameter name as model.named_parameters() gives
it; for tied models that is without lm_head.weight (the embedding's gradient
includes the head's).
"""
import argparse
import hashlib
import json
import os
import shutil
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "parity"))
import make_reference  # noqa: E402  (the project's safetensors writer)

import safetensors
import transformers
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

PINNED = {"transformers": "4.45.2", "safetensors": "0.8.0"}

VOCAB = 96
BATCH, SEQ = 2, 12
TOKENS_SEED, TARGETS_SEED = 1234, 4321
SHARD_SIZE = "20KB"
INIT_RANGE = 0.1  # weights ~ N(0, 0.1): attention far from uniform, logits O(1)

SGD = dict(lr=0.1, momentum=0.0, weight_decay=0.0, steps=20)
ADAMW = dict(lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, steps=6)

LLAMA_COMMON = dict(
    vocab_size=VOCAB, hidden_size=32, intermediate_size=56, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    rms_norm_eps=1e-5, attention_bias=False, mlp_bias=False, hidden_act="silu",
    initializer_range=INIT_RANGE, attn_implementation="eager")

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16}


def llama_gqa_config():
    return LlamaConfig(rope_theta=10000.0, tie_word_embeddings=False, **LLAMA_COMMON)


def llama_rope_scaled_config(rope_scaling=LLAMA3_ROPE):
    return LlamaConfig(rope_theta=500000.0, rope_scaling=rope_scaling,
                       tie_word_embeddings=True, **LLAMA_COMMON)


def qwen2_config():
    c = Qwen2Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=56, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True,
        use_sliding_window=False, sliding_window=64, hidden_act="silu",
        initializer_range=INIT_RANGE, attn_implementation="eager")
    # 4.45's Qwen2Config stores sliding_window=None when use_sliding_window is
    # False; Qwen2.5's published config.json files carry the number anyway
    # (with use_sliding_window false), so put it back for config.json. Only
    # flash attention reads it in 4.45; eager attention never does.
    assert c.sliding_window is None
    c.sliding_window = 64
    return c


def perturb(model, seed):
    """Norm weights to 1 + 0.1 randn, biases to 0.1 randn, in
    named_parameters order, so an ignored norm weight or bias shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))


def fixed_ids(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)


def logits_of(model, tokens):
    model.eval()
    with torch.no_grad():
        out = model(tokens).logits
    assert out.dtype == torch.float32 and out.shape == (BATCH, SEQ, VOCAB)
    return out.contiguous()


def loss_of(model, tokens, targets):
    logits = model(tokens).logits
    return F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))


def save(path, tensors, metadata):
    """F32 tensors in dict order with string metadata, by
    tests/parity/make_reference.py's writer: safetensors' own save_file
    writes the metadata in a different (hash) order on every run. The file
    is read back with the safetensors library and compared."""
    tensors = {k: v.detach().to(torch.float32).contiguous() for k, v in tensors.items()}
    make_reference.write_safetensors(path, tensors, {k: str(v) for k, v in metadata.items()})
    back = load_file(path)
    assert list(back.keys()) == list(tensors.keys())
    for k, v in tensors.items():
        assert back[k].dtype == torch.float32 and torch.equal(back[k], v), k


def common_meta(name):
    return {"model": name, "transformers": transformers.__version__,
            "torch": torch.__version__, "safetensors": safetensors.__version__,
            "ids": "token and target ids are integers stored as F32"}


def reload(cls, model_dir):
    m = cls.from_pretrained(model_dir, torch_dtype=torch.float32, attn_implementation="eager")
    assert m.config._attn_implementation == "eager"
    return m


def trajectory(cls, model_dir, tokens, targets, name, kind):
    model = reload(cls, model_dir)
    model.train()  # no dropout in these models (attention_dropout 0.0)
    params = list(model.named_parameters())
    if kind == "sgd":
        h = SGD
        opt = torch.optim.SGD([p for _, p in params], lr=h["lr"], momentum=h["momentum"],
                              weight_decay=h["weight_decay"], foreach=False)
    else:
        h = ADAMW
        decay = [p for _, p in params if p.dim() >= 2]
        no_decay = [p for _, p in params if p.dim() < 2]
        opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": h["weight_decay"]},
             {"params": no_decay, "weight_decay": 0.0}],
            lr=h["lr"], betas=(h["beta1"], h["beta2"]), eps=h["eps"], foreach=False)
    losses, grads = [], {}
    for step in range(h["steps"]):
        opt.zero_grad(set_to_none=True)
        loss = loss_of(model, tokens, targets)
        losses.append(loss.detach().clone())
        loss.backward()
        if step == 0 and kind == "sgd":
            grads = {f"grad.{n}": p.grad.detach().clone() for n, p in params}
        opt.step()
    tensors = {"tokens": tokens, "targets": targets, "losses": torch.stack(losses)}
    tensors.update(grads)
    tensors.update({f"final.{n}": p for n, p in params})
    meta = common_meta(name)
    meta.update({"optimizer": kind, **h})
    if kind == "adamw":
        meta["weight_decay_groups"] = "0.1 on dim>=2 parameters, 0.0 on dim<2"
    meta["loss"] = "F.cross_entropy(logits.view(-1,V), targets.view(-1)), mean"
    meta["losses"] = "losses[i] is the loss before update i"
    fname = "trajectory.safetensors" if kind == "sgd" else "trajectory_adamw.safetensors"
    save(os.path.join(model_dir, fname), tensors, meta)
    return torch.stack(losses)


def save_model(model, model_dir):
    if os.path.isdir(model_dir):
        shutil.rmtree(model_dir)
    model.save_pretrained(model_dir, safe_serialization=True, max_shard_size=SHARD_SIZE)
    gen = os.path.join(model_dir, "generation_config.json")
    if os.path.exists(gen):
        os.remove(gen)
    with open(os.path.join(model_dir, "model.safetensors.index.json")) as f:
        index = json.load(f)
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) >= 2, f"{model_dir}: only {len(shards)} shard(s)"
    total = sum(os.path.getsize(os.path.join(model_dir, s)) for s in shards)
    assert total < 150_000, f"{model_dir}: weights take {total} bytes"
    return index


def check_roundtrip(cls, model, model_dir, tokens, want):
    """The files on disk are the model: reloading gives the same parameters
    and the same logits, bit for bit."""
    back = reload(cls, model_dir)
    a, b = dict(model.named_parameters()), dict(back.named_parameters())
    assert a.keys() == b.keys(), (sorted(a.keys() ^ b.keys()))
    for n in a:
        assert torch.equal(a[n], b[n]), n
    assert torch.equal(logits_of(back, tokens), want)


def make_model(name, cls, config, seed, out, tokens, targets, state_from=None):
    model_dir = os.path.join(out, name)
    torch.manual_seed(seed)
    model = cls(config)
    if state_from is None:
        perturb(model, seed + 1)
    else:
        # Tied model: take everything but lm_head, which is the embedding.
        sd = {k: v for k, v in state_from.items() if k != "lm_head.weight"}
        missing, unexpected = model.load_state_dict(sd, strict=False)
        assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
        assert model.lm_head.weight is model.model.embed_tokens.weight
    model.eval()
    logits = logits_of(model, tokens)
    index = save_model(model, model_dir)
    save(os.path.join(model_dir, "logits.safetensors"), {"tokens": tokens, "logits": logits},
         common_meta(name))
    check_roundtrip(cls, model, model_dir, tokens, logits)
    sgd = trajectory(cls, model_dir, tokens, targets, name, "sgd")
    adamw = trajectory(cls, model_dir, tokens, targets, name, "adamw")
    print(f"{name}: {len(set(index['weight_map'].values()))} shards, "
          f"{len(list(model.named_parameters()))} parameters, |logits| max "
          f"{logits.abs().max().item():.3f}; SGD loss {sgd[0].item():.4f} -> {sgd[-1].item():.4f}, "
          f"AdamW {adamw[0].item():.4f} -> {adamw[-1].item():.4f}")
    return model, logits


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    ap.add_argument("--out", default=os.path.join(root, "tests", "fixtures", "hf"))
    args = ap.parse_args()

    for mod, want in (("transformers", transformers.__version__),
                      ("safetensors", safetensors.__version__)):
        if want != PINNED[mod]:
            sys.exit(f"{mod} {want} is installed; these fixtures pin {PINNED[mod]}")
    if not torch.__version__.startswith("1.13"):
        print(f"warning: torch {torch.__version__}, not Debian's 1.13: "
              "files may differ in the last bits", file=sys.stderr)

    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float32)
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    os.makedirs(args.out, exist_ok=True)

    tokens = fixed_ids(TOKENS_SEED)
    targets = fixed_ids(TARGETS_SEED)

    gqa, _ = make_model("llama_gqa", LlamaForCausalLM, llama_gqa_config(), 100,
                        args.out, tokens, targets)

    scaled, scaled_logits = make_model(
        "llama_rope_scaled", LlamaForCausalLM, llama_rope_scaled_config(), 200,
        args.out, tokens, targets, state_from=gqa.state_dict())
    unscaled = LlamaForCausalLM(llama_rope_scaled_config(rope_scaling=None))
    unscaled.load_state_dict(scaled.state_dict())
    unscaled_logits = logits_of(unscaled, tokens)
    diff = (scaled_logits - unscaled_logits).abs().max().item()
    assert diff > 1e-2, f"llama3 rope scaling changes the logits by only {diff}"
    meta = common_meta("llama_rope_scaled")
    meta["rope_scaling"] = "None (rope_theta 500000)"
    save(os.path.join(args.out, "llama_rope_scaled", "logits_unscaled.safetensors"),
         {"tokens": tokens, "logits": unscaled_logits}, meta)
    print(f"llama_rope_scaled: scaled vs unscaled logits differ by up to {diff:.4f}")

    make_model("qwen2", Qwen2ForCausalLM, qwen2_config(), 300, args.out, tokens, targets)

    for dirpath, _, files in sorted(os.walk(args.out)):
        for f in sorted(files):
            p = os.path.join(dirpath, f)
            with open(p, "rb") as fh:
                digest = hashlib.sha256(fh.read()).hexdigest()
            print(f"{digest}  {os.path.getsize(p):7d}  {os.path.relpath(p, args.out)}")


if __name__ == "__main__":
    main()
