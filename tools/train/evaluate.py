#!/usr/bin/env python3
"""The fp32 reference perplexity of a target, and the token windows to compare the q4 package
against with `splash eval`.

    python3 tools/train/evaluate.py --target models/splash-demo --data D --out E [--windows 16] [--seq 1024]

Reference = our network in float32, TF32 off, on the target's weights: a Splash package's
dequantised q4 weights (package_io.py: the very numbers `splash eval --cpu-activations fp32`
multiplies, so its perplexity on the same windows should agree to ~1e-5), or an export's bf16
weights, and then, where transformers is installed, Qwen3_5ForCausalLM.from_pretrained(export)
the same way (models.md "The reference").  Windows: the first N non-overlapping windows of seq+1 tokens of the held-out
stream (heldout.u32) and of the held-out chat samples (heldout_chat.u32).  Writes
E/windows/{heldout,chat}-NN.json (JSON arrays of ids: `splash eval --tokens-file`) and
E/ref.json (mean NLL and perplexity per window and overall, for both implementations).
"""

import argparse
import json
import math
import os
import sys

import torch

sys.dont_write_bytecode = True      # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common as C  # noqa: E402
import model as M  # noqa: E402
import package_io  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--windows", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    is_pkg = package_io.is_package(a.target)
    dev = C.device()
    C.fast_math(False)
    os.makedirs(os.path.join(a.out, "windows"), exist_ok=True)
    ours = C.load_target(a.target, dev).eval()
    hf = None
    if not a.no_hf and not is_pkg:
        try:
            import transformers
            hf = transformers.Qwen3_5ForCausalLM.from_pretrained(a.target, dtype=torch.float32,
                                                                 attn_implementation="eager").to(dev).eval()
        except Exception as e:  # noqa: BLE001
            print("[eval] transformers reference unavailable: %r" % e, flush=True)
    res = {"seq": a.seq, "target": a.target,
           "reference": "fp32 on the %s weights, TF32 off" % ("dequantised q4 package" if is_pkg else "exported bf16")}
    for name, fn in (("heldout", "heldout.u32"), ("chat", "heldout_chat.u32")):
        path = os.path.join(a.data, fn)
        if os.path.getsize(path) < 4 * (a.seq + 1):
            continue
        wins = C.eval_windows(C.load_stream(path, dev), a.seq, a.windows)
        rows = []
        for i in range(wins.shape[0]):
            w = wins[i:i + 1]
            with open(os.path.join(a.out, "windows", "%s-%02d.json" % (name, i)), "w") as f:
                json.dump(w[0].tolist(), f)
            with torch.no_grad():
                r = {"ours": float(ours.loss(w[:, :-1], w[:, 1:]))}
                if hf is not None:
                    h = hf.model(input_ids=w[:, :-1]).last_hidden_state
                    r["hf"] = float(M.chunked_ce(h[0], hf.lm_head.weight, w[0, 1:]))
            rows.append(r)
        mean = {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}
        res[name] = {"windows": len(rows), "per_window_nll": rows,
                     "mean_nll": mean, "ppl": {k: math.exp(v) for k, v in mean.items()}}
        print("[eval] %s: %d windows of %d, ppl %s" % (name, len(rows), a.seq, res[name]["ppl"]), flush=True)
    with open(os.path.join(a.out, "ref.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
