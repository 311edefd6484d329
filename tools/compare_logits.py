#!/usr/bin/env python3
"""compare_logits.py - two `splash eval --logits-out` dumps of the same tokens, row by row.

  python3 tools/compare_logits.py --ref CPU.f32 --test CUDA.f32 --vocab V [--tokens F] [--json OUT]

Each file is float32 [T, V] (every position's logits).  Prints, over the T rows: top-1 agreement
(argmax equal), mean and max KL(ref || test) of the softmaxes in float64, max |logit difference|,
relative L2 of the whole dump, and with --tokens (the JSON id array eval read) both perplexities
of the tokens that follow each row.  Reads rows in blocks so a dump of any length fits in memory.
"""
import argparse
import json
import sys

import numpy as np


def log_softmax(x):
    m = x.max(axis=1, keepdims=True)
    z = x - m
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ref", required=True)
    ap.add_argument("--test", required=True)
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--tokens", default="")
    ap.add_argument("--json", default="")
    ap.add_argument("--block", type=int, default=128)
    a = ap.parse_args()
    ref = np.memmap(a.ref, dtype=np.float32, mode="r")
    test = np.memmap(a.test, dtype=np.float32, mode="r")
    if ref.size != test.size or ref.size % a.vocab:
        sys.exit(f"sizes differ or are not rows of {a.vocab}: {ref.size} vs {test.size}")
    T = ref.size // a.vocab
    ref = ref.reshape(T, a.vocab)
    test = test.reshape(T, a.vocab)
    toks = json.load(open(a.tokens)) if a.tokens else None
    agree = 0
    kl_sum = kl_max = dmax = 0.0
    num = den = 0.0
    nll_ref = nll_test = 0.0
    n_nll = 0
    for r0 in range(0, T, a.block):
        x = np.asarray(ref[r0:r0 + a.block], dtype=np.float64)
        y = np.asarray(test[r0:r0 + a.block], dtype=np.float64)
        if not (np.isfinite(x).all() and np.isfinite(y).all()):
            sys.exit(f"non-finite logits in rows {r0}..{r0 + len(x)}")
        agree += int((x.argmax(axis=1) == y.argmax(axis=1)).sum())
        lx, ly = log_softmax(x), log_softmax(y)
        kl = (np.exp(lx) * (lx - ly)).sum(axis=1)
        kl_sum += float(kl.sum())
        kl_max = max(kl_max, float(kl.max()))
        dmax = max(dmax, float(np.abs(x - y).max()))
        num += float(((x - y) ** 2).sum())
        den += float((x ** 2).sum())
        if toks is not None:
            for i in range(len(x)):
                t = r0 + i
                if t + 1 < len(toks):
                    nll_ref -= lx[i, toks[t + 1]]
                    nll_test -= ly[i, toks[t + 1]]
                    n_nll += 1
    out = {"rows": T, "top1_agreement": agree / T, "kl_mean": kl_sum / T, "kl_max": kl_max,
           "max_abs_diff": dmax, "rel_l2": (num / den) ** 0.5 if den else 0.0}
    if n_nll:
        out.update(ppl_ref=float(np.exp(nll_ref / n_nll)), ppl_test=float(np.exp(nll_test / n_nll)), predictions=n_nll)
    print(json.dumps(out))
    if a.json:
        json.dump(out, open(a.json, "w"))


if __name__ == "__main__":
    main()
