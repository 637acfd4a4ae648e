#!/usr/bin/env python3
"""Greedy generation references for `dpt generate` and the decoder's
key/value cache (tests/test_generate.cpp): what Hugging Face `transformers`'
own generate(do_sample=False) produces, token for token, on the tiny
Llama-family fixtures of tests/fixtures/hf (made by make_hf_fixtures.py) and
on a tiny random GPT-2 written here by GPT2LMHeadModel.save_pretrained.

Pinned versions (those of make_hf_fixtures.py):
  transformers==4.45.2 safetensors==0.8.0 huggingface_hub==0.36.2
  torch 1.13 from Debian's python3-torch (NOT PyPI's torch), numpy from Debian
requirements: transformers==4.45.2 safetensors==0.8.0 huggingface_hub==0.36.2

Run by hand from the repository root, after make_hf_fixtures.py:
  /usr/bin/python3 -m venv --system-site-packages /tmp/hfvenv && /tmp/hfvenv/bin/pip install transformers==4.45.2 safetensors==0.8.0 huggingface_hub==0.36.2 && /tmp/hfvenv/bin/python scripts/make_generate_fixtures.py
Options: --out DIR (default tests/fixtures/hf). Takes a few seconds.

Deterministic (fixed seeds, float32, one thread, eager attention):
remaking reproduces every file byte for byte.

Writes:
  gpt2/config.json, gpt2/model.safetensors
      GPT2LMHeadModel(vocab 256 (bytes), n_positions 96, n_embd 32, 2 layers,
      4 heads, gelu_new, initializer_range 0.1, no dropout), the token
      embedding redrawn N(0, 0.02) (with the tied head a larger one makes
      each token predict itself: greedy output repeats one byte), layer
      norm weights 1 + 0.1 randn and biases 0.1 randn (seeded), saved by
      save_pretrained (one file; generation_config.json deleted). Its
      config.json keeps GPT2Config's eos_token_id 50256, outside the
      vocabulary, so nothing the model writes ends it.
  <model>/generate.safetensors for gpt2, llama_gqa, qwen2, by
  tests/parity/make_reference.py's writer:
      prompt     F32 [1, P]   prompt ids (integers stored as F32): gpt2 the
                              bytes of PROMPT_TEXT (P 16), the others 8 ids
                              drawn below their vocabulary 96 (seeded)
      generated  F32 [1, 64]  the new ids of model.generate(prompt,
                              do_sample=False, max_new_tokens=64) with the
                              generation config's eos_token_id set to None, so
                              all 64 are produced (llama_gqa's config.json
                              says eos 2: the ids after a 2 are what the model
                              writes past it)
      logits     F32 [64, V]  the logits each of them was the argmax of
                              (generate's output_logits: before any
                              processing), for the cache path's logits
      metadata: model, versions, and eos_token_id (the config's).
  The Llama fixtures' max_position_embeddings is 64 and P + 64 = 72
  positions: transformers' rotary embedding has no limit there; the engine
  is loaded with a context of 128 (block_size) for them.
"""
import argparse
import copy
import hashlib
import os
import shutil
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "parity"))
import make_reference  # noqa: E402  (the project's safetensors writer)

import safetensors
import transformers
from safetensors.torch import load_file
from transformers import GPT2Config, GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM

PINNED = {"transformers": "4.45.2", "safetensors": "0.8.0"}
NEW_TOKENS = 64
PROMPT_TEXT = b"Hello, dptrain! "
PROMPT_LEN, PROMPT_SEED, PROMPT_VOCAB = 8, 5678, 96
GPT2_SEED = 400


def gpt2_config():
    return GPT2Config(vocab_size=256, n_positions=96, n_embd=32, n_layer=2, n_head=4,
                      activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0,
                      attn_pdrop=0.0, initializer_range=0.1, attn_implementation="eager")


def make_gpt2(out):
    torch.manual_seed(GPT2_SEED)
    model = GPT2LMHeadModel(gpt2_config())
    g = torch.Generator().manual_seed(GPT2_SEED + 1)
    with torch.no_grad():
        # A small token embedding (GPT-2's own 0.02): with the tied head a
        # large one makes every token predict itself, and greedy output
        # repeats one byte.
        model.transformer.wte.weight.copy_(0.02 * torch.randn(model.transformer.wte.weight.shape, generator=g))
        for name, p in model.named_parameters():
            if ".ln_" in name and name.endswith(".weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    model.eval()
    model_dir = os.path.join(out, "gpt2")
    if os.path.isdir(model_dir):
        shutil.rmtree(model_dir)
    model.save_pretrained(model_dir, safe_serialization=True)
    gen = os.path.join(model_dir, "generation_config.json")
    if os.path.exists(gen):
        os.remove(gen)
    size = os.path.getsize(os.path.join(model_dir, "model.safetensors"))
    assert size < 200_000, f"gpt2 weights take {size} bytes"
    back = GPT2LMHeadModel.from_pretrained(model_dir, torch_dtype=torch.float32, attn_implementation="eager")
    for (n, a), (_, b) in zip(model.named_parameters(), back.named_parameters()):
        assert torch.equal(a, b), n
    return model_dir


def greedy(model, prompt):
    gen = copy.deepcopy(model.generation_config)
    gen.eos_token_id = None
    gen.pad_token_id = None
    with torch.no_grad():
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), generation_config=gen,
                             do_sample=False, max_new_tokens=NEW_TOKENS, output_logits=True,
                             return_dict_in_generate=True)
    ids = out.sequences
    assert ids.shape == (1, prompt.shape[1] + NEW_TOKENS), ids.shape
    assert torch.equal(ids[:, :prompt.shape[1]], prompt)
    logits = torch.cat(out.logits, dim=0)
    assert logits.shape == (NEW_TOKENS, model.config.vocab_size), logits.shape
    assert torch.equal(logits.argmax(dim=-1), ids[0, prompt.shape[1]:])
    return ids[:, prompt.shape[1]:], logits


def write(model_dir, name, model, prompt):
    generated, logits = greedy(model, prompt)
    meta = {"model": name, "transformers": transformers.__version__, "torch": torch.__version__,
            "safetensors": safetensors.__version__, "ids": "token ids are integers stored as F32",
            "generate": f"do_sample=False, max_new_tokens={NEW_TOKENS}, eos_token_id=None",
            "eos_token_id": str(model.config.eos_token_id)}
    path = os.path.join(model_dir, "generate.safetensors")
    tensors = {"prompt": prompt.to(torch.float32), "generated": generated.to(torch.float32),
               "logits": logits.contiguous()}
    make_reference.write_safetensors(path, tensors, meta)
    back = load_file(path)
    for k, v in tensors.items():
        assert torch.equal(back[k], v), k
    print(f"{name}: prompt {prompt.tolist()[0]} -> {generated.tolist()[0]} "
          f"({len(set(generated.tolist()[0]))} distinct)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    ap.add_argument("--out", default=os.path.join(root, "tests", "fixtures", "hf"))
    args = ap.parse_args()
    for mod, want in (("transformers", transformers.__version__),
                      ("safetensors", safetensors.__version__)):
        if want != PINNED[mod]:
            sys.exit(f"{mod} {want} is installed; these fixtures pin {PINNED[mod]}")
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float32)
    transformers.logging.set_verbosity_error()

    gpt2_dir = make_gpt2(args.out)
    gpt2 = GPT2LMHeadModel.from_pretrained(gpt2_dir, torch_dtype=torch.float32, attn_implementation="eager")
    write(gpt2_dir, "gpt2", gpt2.eval(), torch.tensor([list(PROMPT_TEXT)]))

    g = torch.Generator().manual_seed(PROMPT_SEED)
    prompt = torch.randint(0, PROMPT_VOCAB, (1, PROMPT_LEN), generator=g)
    for name, cls in (("llama_gqa", LlamaForCausalLM), ("qwen2", Qwen2ForCausalLM)):
        model_dir = os.path.join(args.out, name)
        model = cls.from_pretrained(model_dir, torch_dtype=torch.float32, attn_implementation="eager")
        write(model_dir, name, model.eval(), prompt)

    for name in ("gpt2", "llama_gqa", "qwen2"):
        for f in sorted(os.listdir(os.path.join(args.out, name))):
            if name != "gpt2" and f != "generate.safetensors":
                continue
            p = os.path.join(args.out, name, f)
            with open(p, "rb") as fh:
                digest = hashlib.sha256(fh.read()).hexdigest()
            print(f"{digest}  {os.path.getsize(p):7d}  {name}/{f}")


if __name__ == "__main__":
    main()
