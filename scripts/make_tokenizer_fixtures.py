#!/usr/bin/env python3
"""Remakes tests/fixtures/tokenizer/: two byte-level BPE tokenizers trained by
Hugging Face `tokenizers` on the fortunes corpus, the documents the C++
tokenizer is checked on, and the ids `tokenizers` gives for them.

Run by hand, in a virtual environment with the pinned wheel:
  python3 -m venv /tmp/tokvenv && /tmp/tokvenv/bin/pip install tokenizers==0.21.1
  /tmp/tokvenv/bin/python scripts/make_tokenizer_fixtures.py

Files (all little-endian, *.bin.z are zlib-compressed):
  gpt2_style.json          tokenizer.json: ByteLevel pre-tokenizer (GPT-2's
                           split), <|endoftext|>, merges written as "a b"
                           strings (the older format)
  gpt2_style_files/        the same model as GPT-2's vocab.json + merges.txt
  llama3_style.json        tokenizer.json: Split(Llama 3's pattern) then
                           ByteLevel(use_regex=false), ignore_merges, Llama 3's
                           special tokens, merges as [a, b] pairs (newer format)
  docs.bin.z               the hostile documents: u32 count, then per document
                           u32 name length, name, u32 raw length, raw bytes
                           (may be invalid UTF-8; both sides decode them as
                           Python's errors="replace" does)
  <tokenizer>_ids.bin.z    per document (the fortunes files first, in name
                           order, then docs.bin.z's, then the 1 MB word):
                           u32 n, u32 form, then for form 0 the n u32 ids of
                           encode(text, add_special_tokens=False), for form 1
                           (n > 4096) one u64 FNV-1a hash of the ids' bytes per
                           block of 4096 ids
  fixtures.json            versions, and each fortunes file's size and FNV-1a
                           hash, so a test on a different corpus skips instead
                           of failing
"""
import json
import os
import random
import struct
import sys
import unicodedata
import zlib

import tokenizers
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

FORTUNES = "/usr/share/games/fortunes"
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "tokenizer")
BLOCK = 4096
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def fortunes_files():
    # The files data/byte_corpus.cpp's text_files takes: regular files by name, no .dat/.u8.
    names = sorted(n for n in os.listdir(FORTUNES)
                   if not n.endswith((".dat", ".u8")) and os.path.isfile(os.path.join(FORTUNES, n)))
    return [(n, open(os.path.join(FORTUNES, n), "rb").read()) for n in names]


def fnv1a(data):
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def one_megabyte_word():
    # Syllables picked by a 64-bit LCG (tests/test_tokenizer.cpp makes the
    # same word): one word, no space, 2^20 bytes.
    syl = ["an", "the", "ing", "qu", "x", "zo", "er", "ti", "on", "ble", "str", "a"]
    x, parts, n = 33, [], 0
    while n < (1 << 20):
        x = (x * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
        s = syl[(x >> 33) % len(syl)]
        parts.append(s)
        n += len(s)
    return "".join(parts)[: 1 << 20].encode()


def fuzz_docs(rng):
    # Short strings over the characters the split patterns treat differently.
    alphabet = (list("aZs'tSTrReEvVmMlLdD 0123456789.,!?-_()<|>\t\r\n") +
                ["\u00a0", "\u3000", "\u2028", "\u0085", "\u000b", "\u000c", "\u001c", "\u200b", "\u202f",
                 "\u017f", "\u0301", "\u0308", "é", "ß", "ж", "λ", "ש", "م", "中", "ー", "한", "٣", "²", "½", "Ⅻ",
                 "😀", "🏽", "\u200d", "𝔘", "𠜎", "\ufffd", "'", "’"])
    docs = []
    for i in range(400):
        n = rng.randrange(0, 60)
        docs.append((f"fuzz_{i}", "".join(rng.choice(alphabet) for _ in range(n)).encode()))
    for i in range(200):
        # Raw bytes biased to UTF-8's lead and continuation ranges: invalid UTF-8 of every kind.
        pool = [0x61, 0x20, 0x0a, 0x27, 0x73, 0x80, 0x8f, 0x90, 0x9f, 0xa0, 0xbf, 0xc0, 0xc1, 0xc2, 0xdf, 0xe0, 0xe1,
                0xec, 0xed, 0xee, 0xef, 0xf0, 0xf1, 0xf3, 0xf4, 0xf5, 0xf8, 0xfe, 0xff]
        docs.append((f"bytes_{i}", bytes(rng.choice(pool) for _ in range(rng.randrange(0, 24)))))
    return docs


def hostile_docs():
    d = [
        ("empty", ""),
        ("emoji", "Hello 👋🏽 world 🇫🇷 family 👨‍👩‍👧‍👦 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𠜎𠜱 ok😀😀😀 ❤️"),
        ("combining", "e\u0301te\u0301 cafe\u0301 n\u0303o Z̤͔ͧ̑̓ä͖̭̈̇lͮ̒ͫǧ̗͚̚o̙̔ͮ̇͐̇ \u0301start"),
        ("rtl", "שלום עולם! مرحبا بالعالم 123 ١٢٣٤٥ \u202bembedded\u202c \u200fmark"),
        ("crlf", "line one\r\nline two\r\n\r\n  \r\nend\r\r\rx\r"),
        ("spaces", "a  b   c    \n\n\n   \t\t x \u00a0\u3000y   "),
        ("newlines", "\n\n\n\nx\n \n  \n\t\n \r\n"),
        ("only_spaces", "     "),
        ("digits", "1234567890 3.14159 1,000,000 ٣٤٥ ⅫⅩ ² ½ 0x1F 12ab34"),
        ("contractions", "I'm you're he's they've we'll I'd don't CAN'T WE'RE We'Re 'S' ''s O'Neil' ſ 'ſ 'ſa it’s 'Tis 'TWAS 'Really 'LLama"),
        ("specials", "before <|endoftext|> after <|begin_of_text|>x<|end_of_text|><|endoftext|>"),
        ("scripts", "中文字符 日本語のテキスト 한국어 ภาษาไทย Ελληνικά Русский हिन्दी"),
        ("whitespace_zoo", "a\u000bb\u000cc\u001cd\u0085e\u2028f\u2029g\u200bh\u202fi\u205fj\u1680k \u00a0l"),
        ("punctuation", "!!! ... ??? --- ((( ))) \"quoted\" «guillemets» — – ‘single’ “double” #$%&*+/=@^_`{|}~"),
        ("code", "def f(x):\n    return x**2  # comment\n\tif (a && b) { c++; }\n"),
    ]
    d = [(n, s.encode()) for n, s in d]
    d.append(("invalid_utf8", b"ab\xff\xfe c\xc3( \xe2\x82 \xf0\x9f\x98 \xed\xa0\x80 \xc0\xaf \xf4\x90\x80\x80 end\x80"))
    return d


def train(pre_tokenizer, specials, ignore_merges, vocab, texts):
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return tok


def write_z(path, data):
    with open(path, "wb") as f:
        f.write(zlib.compress(data, 9))


def ids_blob(tok, texts):
    out = bytearray()
    for t in texts:
        ids = tok.encode(t, add_special_tokens=False).ids
        if len(ids) <= BLOCK:
            out += struct.pack("<II", len(ids), 0) + struct.pack(f"<{len(ids)}I", *ids)
        else:  # a long document: one hash per block of ids keeps the fixture small
            out += struct.pack("<II", len(ids), 1)
            for b in range(0, len(ids), BLOCK):
                chunk = ids[b:b + BLOCK]
                out += struct.pack("<Q", fnv1a(struct.pack(f"<{len(chunk)}I", *chunk)))
    return bytes(out)


def main():
    os.makedirs(OUT, exist_ok=True)
    fortunes = fortunes_files()
    docs = hostile_docs() + fuzz_docs(random.Random(33))
    texts = [raw.decode("utf-8", errors="replace") for _, raw in fortunes + docs]
    texts.append(one_megabyte_word().decode())
    corpus = texts[: len(fortunes)]

    gpt2 = train(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True), ["<|endoftext|>"], False,
                 2000, corpus)
    llama3 = train(pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
        ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>"], True, 3000, corpus)

    for name, tok in (("gpt2_style", gpt2), ("llama3_style", llama3)):
        spec = json.loads(tok.to_str())
        if name == "gpt2_style":  # the older "a b" form of merges, as GPT-2's own file has
            spec["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in spec["model"]["merges"]]
            os.makedirs(os.path.join(OUT, "gpt2_style_files"), exist_ok=True)
            with open(os.path.join(OUT, "gpt2_style_files", "vocab.json"), "w", encoding="utf-8") as f:
                json.dump(spec["model"]["vocab"], f, ensure_ascii=False)
            with open(os.path.join(OUT, "gpt2_style_files", "merges.txt"), "w", encoding="utf-8") as f:
                f.write("#version: 0.2\n" + "".join(m + "\n" for m in spec["model"]["merges"]))
        with open(os.path.join(OUT, name + ".json"), "w", encoding="utf-8") as f:
            json.dump(spec, f, ensure_ascii=False)
        write_z(os.path.join(OUT, name + "_ids.bin.z"), ids_blob(tok, texts))

    blob = bytearray(struct.pack("<I", len(docs)))
    for n, raw in docs:
        blob += struct.pack("<I", len(n)) + n.encode() + struct.pack("<I", len(raw)) + raw
    write_z(os.path.join(OUT, "docs.bin.z"), bytes(blob))
    meta = {"tokenizers": tokenizers.__version__, "python": sys.version.split()[0],
            "unicode": unicodedata.unidata_version,
            "fortunes": [{"name": n, "bytes": len(raw), "fnv1a": f"{fnv1a(raw):016x}"} for n, raw in fortunes]}
    with open(os.path.join(OUT, "fixtures.json"), "w") as f:
        json.dump(meta, f, indent=1)


if __name__ == "__main__":
    main()
