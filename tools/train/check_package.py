#!/usr/bin/env python3
"""Checks package_io.py against the engine: the dequantised package in model.py (float32, CPU)
must give the logits `splash eval --cpu-activations fp32` gives on the same tokens.

    python3 tools/train/check_package.py [--package models/splash-demo] [--splash build/splash]
        [--tokens 300] [--text FILE] [--export DIR]

The tokens are the first --tokens ids of --text (default: this file's model.py) as
`splash tokenize --model PKG` encodes it.  Prints the relative L2 error of the whole [T, V]
logits, the worst position's, the two mean NLLs and the argmax agreement; fails above
--limit (1e-4).  With --export (the bf16 checkpoint the package was packed from) it also
checks every dequantised weight against its source: within half a quantisation step of the
bf16 value for q4/q8 matrices, exact for the f32 tensors (norms back from 1 + w).

    python3 tools/train/check_package.py --eval-dir E [--activations fp32,auto]

compares instead the engine's perplexity on evaluate.py's windows (E/windows/*.json) with the
fp32 reference in E/ref.json (evaluate.py run on the package: the same weights), per set and
per activation mode of `splash eval`.
"""

import argparse
import glob
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

sys.dont_write_bytecode = True      # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import package_io  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))


def check_weights(pkg, export):
    import st_io
    m = package_io.read_manifest(pkg)
    spec, sd = package_io.hf_state(pkg, m)
    ref = st_io.load_file(os.path.join(export, "model.safetensors"))
    if set(ref) != set(sd):
        raise SystemExit("tensor names differ: %s" % sorted(set(ref) ^ set(sd))[:8])
    dtypes = {package_io.hf_name(t["name"])[0]: t["dtype"] for t in m["tensors"] if not t["name"].startswith("mtp.")}
    worst = 0.0
    for name in sorted(ref):
        r = ref[name].float().numpy()
        a = sd[name]
        if r.shape != a.shape:
            raise SystemExit("%s: shape %s vs %s" % (name, a.shape, r.shape))
        d = np.abs(a - r)
        if dtypes[name] in ("q4", "q8"):
            # within half a step of the group's range, (max - min) / levels / 2; the outward bf16
            # rounding of the scale and bias may add a little
            g = r.reshape(r.shape[0], -1, 64)
            step = (g.max(-1) - g.min(-1)) / (15 if dtypes[name] == "q4" else 255)
            lim = (step * 0.5 * 1.02 + 1e-7)[..., None]
            over = float((d.reshape(g.shape) > lim).mean())
            if over:
                raise SystemExit("%s: %.2e of the weights off by more than half a step" % (name, over))
        elif d.max() > 1e-6 * max(1.0, float(np.abs(r).max())):
            raise SystemExit("%s: plain tensor differs by %.3g" % (name, float(d.max())))
        worst = max(worst, float(d.max()))
    kinds = {}
    for t in m["tensors"]:
        kinds[t["dtype"]] = kinds.get(t["dtype"], 0) + 1
    print("[check] weights: %d tensors %s within half a step of the export (largest difference %.4g)"
          % (len(ref), kinds, worst), flush=True)


def engine_nll(splash, pkg, path, act, threads):
    r = subprocess.run([splash, "eval", "--model", pkg, "--tokens-file", path, "--cpu-activations", act,
                        "--threads", str(threads)], capture_output=True, text=True)
    m = re.search(r"mean_nll ([-+0-9.eE]+)", r.stdout)
    if r.returncode or not m:
        raise SystemExit("splash eval %s failed: %s" % (path, (r.stderr or r.stdout)[-2000:]))
    return float(m.group(1))


def check_eval_dir(a):
    with open(os.path.join(a.eval_dir, "ref.json")) as f:
        ref = json.load(f)
    acts = [x for x in a.activations.split(",") if x]
    print("| set | windows x tokens | fp32 reference (PyTorch) | " + " | ".join("engine %s" % x for x in acts) + " |")
    print("|---|---|---|" + "---|" * len(acts))
    worst = 0.0
    for name in ("heldout", "chat"):
        if name not in ref:
            continue
        files = sorted(glob.glob(os.path.join(a.eval_dir, "windows", name + "-*.json")))
        ours = [r["ours"] for r in ref[name]["per_window_nll"]][:len(files)]
        cols = []
        for act in acts:
            nll = [engine_nll(a.splash, a.package, p, act, a.threads) for p in files]
            if act == "fp32":
                worst = max(worst, max(abs(x - y) for x, y in zip(nll, ours)))
            cols.append("%.4f (NLL %.5f)" % (math.exp(sum(nll) / len(nll)), sum(nll) / len(nll)))
        print("| %s | %d x %d | %.4f (NLL %.5f) | %s |" % (name, len(files), ref["seq"], math.exp(sum(ours) / len(ours)),
                                                          sum(ours) / len(ours), " | ".join(cols)))
    if "fp32" in acts:
        print("[check] largest per-window NLL difference, engine fp32 vs reference: %.2e" % worst)
        if worst > 1e-3:
            raise SystemExit("check_package: engine and reference disagree on the windows")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--package", default=os.path.join(ROOT, "models/splash-demo"))
    ap.add_argument("--splash", default=os.environ.get("SPLASH_BIN", os.path.join(ROOT, "build/splash")))
    ap.add_argument("--tokens", type=int, default=300)
    ap.add_argument("--text", default=os.path.join(HERE, "model.py"))
    ap.add_argument("--export", default="", help="the bf16 checkpoint the package was packed from")
    ap.add_argument("--limit", type=float, default=1e-4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--eval-dir", default="", help="evaluate.py's output: compare perplexities on its windows")
    ap.add_argument("--activations", default="fp32,auto", help="--cpu-activations modes for --eval-dir")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if a.eval_dir:
        return check_eval_dir(a)
    if a.export:
        check_weights(a.package, a.export)
    with open(a.text, "rb") as f:
        text = f.read()
    ids = json.loads(subprocess.run([a.splash, "tokenize", "--model", a.package], input=text, check=True,
                                    capture_output=True).stdout)[:a.tokens]
    with tempfile.TemporaryDirectory() as tmp:
        tf, lf = os.path.join(tmp, "tokens.json"), os.path.join(tmp, "logits.f32")
        with open(tf, "w") as f:
            json.dump(ids, f)
        t0 = time.time()
        r = subprocess.run([a.splash, "eval", "--model", a.package, "--tokens-file", tf, "--cpu-activations", "fp32",
                            "--logits-out", lf, "--threads", str(a.threads)], capture_output=True, text=True)
        if r.returncode:
            raise SystemExit("splash eval failed: " + r.stderr[-2000:])
        t_engine = time.time() - t0
        eng = np.fromfile(lf, np.float32)
    t0 = time.time()
    m = package_io.load_target(a.package)
    t_load = time.time() - t0
    V = m.spec["vocab"]
    eng = torch.from_numpy(eng.reshape(len(ids), V)).double()
    with torch.no_grad():
        ours = m(torch.tensor([ids]))[0].double()
    rel = float((ours - eng).norm() / eng.norm())
    per = ((ours - eng).norm(dim=-1) / eng.norm(dim=-1)).max().item()
    tgt = torch.tensor(ids[1:])

    def nll(lg):
        return float(torch.nn.functional.cross_entropy(lg[:-1], tgt))
    agree = float((ours.argmax(-1) == eng.argmax(-1)).double().mean())
    print("[check] %d tokens of %s: logits rel err %.2e (worst position %.2e), NLL ours %.6f engine %.6f, "
          "argmax agree %.4f; engine %.1f s, package load %.1f s"
          % (len(ids), os.path.relpath(a.text, ROOT), rel, per, nll(ours), nll(eng), agree, t_engine, t_load),
          flush=True)
    if not rel <= a.limit:
        raise SystemExit("check_package: logits differ from splash eval by %.2e (limit %.0e)" % (rel, a.limit))
    print("check_package: passed")


if __name__ == "__main__":
    main()
