#!/usr/bin/env python3
"""The target's own answers to chat prompts: the draft's training data, and samples for the
model card.

    python3 tools/train/generate.py --target models/splash-demo --prompts D/train_prompts.jsonl \
        --n 4096 --max-new 256 --temperatures 0,1 --out G/train.npz [--text-out G/train.jsonl]

The target: a Splash package (dequantised by package_io.py), an exported HF dir or a state.pt;
the tokenizer is the target's (the package's tokenizer/tokenizer.json) unless --tokenizer.

Batched cached decoding (model.py prefill / decode_step): prompts left-padded, padding
invisible to attention and zero into the GDN layers, then one token per row per step with the
recurrent GDN state, the conv state and a KV cache.  (Recomputing the whole sequence every step
would cost batch x length x steps token-forwards: about 18 minutes for 6144 answers of 256
tokens; cached, a step is a few milliseconds.)  Prompts are taken in file order (prepare_data.py
shuffled them with the seed), sorted by length into batches; row i uses temperatures[i % len]
(0 = greedy, else plain softmax sampling from a seeded generator).  Stops at <|im_end|> or
<|endoftext|>.  Decoding is StaticDecoder's fixed-shape step (one CUDA graph on CUDA),
checked first against eager decoding on 16 prompts; --no-graph decodes eagerly.

Output .npz: tokens (int32, every sequence prompt + answer back to back), offsets (int64,
n+1), prompt_lens (int32), temps (float32), stopped (bool: ended on a stop token).
"""

import argparse
import json
import os
import sys
import time

import numpy as np
import torch

sys.dont_write_bytecode = True      # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common as C  # noqa: E402
import prepare_data as P  # noqa: E402


class StaticDecoder:
    """The fixed-shape decode step (model.decode_step_static) over one batch's prefill cache:
    step(tok [B]) -> normed hidden [B, H].  On CUDA (graph=True) the step is captured once as
    a CUDA graph and replayed (eager PyTorch launches cost ~50-100 us each on the GPU machine,
    and a step is ~600 of them); elsewhere the same step runs eagerly, so the CPU checks run
    this very code.

    The object owns every tensor the graph reads or writes (the fixed-shape cache with its key
    mask, position counter and row positions, the token input, the output) for as long as it
    lives.  A captured graph holds raw device addresses, not references: the first version
    kept only the token input and the output alive, so the fixed-shape cache's key mask,
    counter and positions went back to the allocator when the capturing function returned,
    the next small allocations (argmax of the logits) took their memory, and the first replay
    filled the key mask at position "token id" (device-side assert "index out of bounds").
    The state is snapshotted around the warm-up steps, so capturing changes nothing."""

    def __init__(self, model, cache, dev, graph=True):
        self.model, self.dev = model, dev
        self.sc = model.static_cache(cache)
        b = self.sc["key_mask"].shape[0]
        self.tok = torch.zeros(b, dtype=torch.long, device=dev)
        self.count, self.limit = int(cache["n"]), int(cache["max_len"])
        self.graph, self.h_out = None, None
        if graph and dev.type == "cuda":
            self._capture()

    def _state(self):
        sc = self.sc
        return [sc["key_mask"], sc["n"], sc["pos"]] + [t for lc in sc["layers"] for t in lc.values()
                                                       if torch.is_tensor(t)]

    @torch.no_grad()
    def _capture(self):
        state = self._state()
        snap = [t.clone() for t in state]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                with C.autocast(self.dev):
                    self.model.decode_step_static(self.tok, self.sc)
        torch.cuda.current_stream().wait_stream(side)
        for t, s0 in zip(state, snap):
            t.copy_(s0)
        del snap
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            with C.autocast(self.dev):
                self.h_out = self.model.decode_step_static(self.tok, self.sc)
        self.graph = g

    @torch.no_grad()
    def __call__(self, nxt):
        if self.count >= self.limit:
            raise ValueError("cache full")
        self.tok.copy_(nxt)
        self.count += 1
        if self.graph is not None:
            self.graph.replay()
            return self.h_out
        with C.autocast(self.dev):
            return self.model.decode_step_static(self.tok, self.sc)


@torch.no_grad()
def generate_batch(model, prompts, max_new, temps, stop_ids, gen, dev, pad_id, decoder="static"):
    """Left-padded batch: one prefill, then one cached step per token (model.prefill /
    decode_step, checked against the full forward by bench.py and selftest.py).  decoder:
    "static" (StaticDecoder: a CUDA graph on CUDA) or "eager" (model.decode_step).

    Under no_grad: the first version ran without it, so every step's autograd graph hung on
    the cache (the GDN state and K/V of step t depend on step t-1) and memory grew with
    batch x steps until 134 GiB were held at 8192 prompts.  Memory is now the cache
    (B x (T + max_new) K/V, bf16) plus one step's logits, freed before the next step."""
    b = len(prompts)
    T = max(len(p) for p in prompts)
    ids = torch.full((b, T), pad_id, dtype=torch.long)
    valid = torch.zeros((b, T), dtype=torch.bool)
    for i, p in enumerate(prompts):
        ids[i, T - len(p):] = torch.tensor(p)
        valid[i, T - len(p):] = True
    ids, valid = ids.to(dev), valid.to(dev)
    t_rows = torch.tensor(temps, device=dev, dtype=torch.float32)
    greedy = t_rows <= 0
    all_greedy = bool(greedy.all())
    inv_t = (1.0 / t_rows.clamp_min(1e-6)).unsqueeze(1)
    stops = torch.tensor(sorted(stop_ids) or [-1], device=dev)
    out = torch.full((b, max_new), pad_id, dtype=torch.long, device=dev)
    end = torch.full((b,), -1, dtype=torch.long, device=dev)          # index in out of the stop token
    with C.autocast(dev):
        h, cache = model.prefill(ids, valid, T + max_new)
    del ids, valid
    step = None
    if decoder == "static":
        try:
            step = StaticDecoder(model, cache, dev, graph=True)
        except Exception as e:  # noqa: BLE001
            print("[generate] CUDA graph capture failed (%r): eager decoding" % e, flush=True)
    if step is None:
        def step(tok):
            with C.autocast(dev):
                return model.decode_step(tok, cache)
    for t in range(max_new):
        logits = model.logits(h).float()
        nxt = logits.argmax(-1)
        if not all_greedy:
            pr = torch.softmax(logits * inv_t, dim=-1)
            del logits
            nxt = torch.where(greedy, nxt, torch.multinomial(pr, 1, generator=gen).squeeze(1))
            del pr
        else:
            del logits
        running = end < 0
        nxt = torch.where(running, nxt, torch.full_like(nxt, pad_id))
        out[:, t] = nxt
        end = torch.where(running & torch.isin(nxt, stops), torch.full_like(end, t), end)
        if t % 16 == 15 and bool((end >= 0).all()):
            break
        if t + 1 < max_new:
            h = step(nxt)
    del step, cache, h
    res = []
    out, end = out.tolist(), end.tolist()
    for i, p in enumerate(prompts):
        n = end[i] + 1 if end[i] >= 0 else max_new
        res.append((list(p) + out[i][:n], end[i] >= 0))
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", required=True, help="Splash package, exported HF dir or state.pt")
    ap.add_argument("--prompts", required=True, help="jsonl with prompt_ids")
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--skip", type=int, default=0, help="start at this prompt")
    ap.add_argument("--max-new", type=int, default=256)
    ap.add_argument("--max-prompt", type=int, default=768, help="skip longer prompts")
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--max-seconds", type=float, default=1e9, help="stop starting new batches after this")
    ap.add_argument("--no-graph", action="store_true", help="eager decoding (model.decode_step), no static step")
    ap.add_argument("--temperatures", default="0,1")
    ap.add_argument("--seed", type=int, default=20261201)
    ap.add_argument("--out", required=True)
    ap.add_argument("--text-out", default="")
    ap.add_argument("--tokenizer", default="", help="tokenizer.json (default: the target's)")
    ap.add_argument("--stub-tokenizer", action="store_true")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    dev = C.device()
    C.fast_math(True)
    tok = P.Tok(path=a.tokenizer or C.tokenizer_path(a.target), stub=a.stub_tokenizer)
    model = C.load_target(a.target, dev).eval()
    prompts = []
    with open(a.prompts) as f:
        for i, line in enumerate(f):
            if i < a.skip:
                continue
            p = json.loads(line)["prompt_ids"]
            if len(p) <= a.max_prompt:
                prompts.append(p)
            if len(prompts) >= a.n:
                break
    temps_cycle = [float(x) for x in a.temperatures.split(",")]
    temps = [temps_cycle[i % len(temps_cycle)] for i in range(len(prompts))]
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))   # similar lengths per batch
    gen = torch.Generator(device=dev)
    gen.manual_seed(a.seed)
    stop_ids = {tok.im_end, tok.eot}
    decoder = "eager" if a.no_graph else "static"
    check = None
    if decoder == "static" and prompts:
        # the static step (captured on CUDA) must give what the eager step gives: greedy, the
        # shortest 16 prompts, 8 tokens (bf16 on the GPU: a near tie may flip a row)
        few = [prompts[i] for i in order[:16]]
        t1 = time.time()
        g1 = generate_batch(model, few, 8, [0.0] * len(few), set(), gen, dev, tok.eot, decoder="static")
        g0 = generate_batch(model, few, 8, [0.0] * len(few), set(), gen, dev, tok.eot, decoder="eager")
        same = sum(x[0] == y[0] for x, y in zip(g1, g0))
        check = "%d/%d" % (same, len(few))
        print("[generate] static/graph check: %s rows identical to eager (%.1f s)" % (check, time.time() - t1),
              flush=True)
        if same < 0.75 * len(few):
            print("[generate] static decoding disagrees with eager: using eager", flush=True)
            decoder = "eager"
    res = [None] * len(prompts)
    t0 = time.time()
    for j in range(0, len(order), a.batch):
        if time.time() - t0 > a.max_seconds:
            print("[generate] time budget spent: %d of %d prompts answered" % (j, len(order)), flush=True)
            break
        idx = order[j:j + a.batch]
        tb = time.time()
        outs = generate_batch(model, [prompts[i] for i in idx], a.max_new, [temps[i] for i in idx], stop_ids, gen,
                              dev, tok.eot, decoder=decoder)
        for i, o in zip(idx, outs):
            res[i] = o
        steps = max(len(o[0]) - len(prompts[i]) for i, o in zip(idx, outs))
        print("[generate] %d/%d prompts, %.1f s (batch of %d: %d steps in %.1f s)" % (
            min(j + a.batch, len(order)), len(order), time.time() - t0, len(idx), steps, time.time() - tb), flush=True)
    keep = [i for i in range(len(prompts)) if res[i] is not None]
    prompts, temps, res = [prompts[i] for i in keep], [temps[i] for i in keep], [res[i] for i in keep]
    toks, offs, plens, stopped = [], [0], [], []
    for p, (seq, st) in zip(prompts, res):
        toks.extend(seq)
        offs.append(len(toks))
        plens.append(len(p))
        stopped.append(st)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    np.savez(a.out, tokens=np.array(toks, np.int32), offsets=np.array(offs, np.int64),
             prompt_lens=np.array(plens, np.int32), temps=np.array(temps, np.float32), stopped=np.array(stopped))
    new = [len(s) - len(p) for p, (s, _) in zip(prompts, res)]
    stats = dict(prompts=len(prompts), decoder=decoder + ("+graph" if decoder == "static" and dev.type == "cuda" else ""),
                 check=check, new_tokens=int(sum(new)), mean_new=round(float(np.mean(new)), 1) if new else 0,
                 stopped_frac=round(float(np.mean(stopped)), 3) if stopped else 0, seconds=round(time.time() - t0, 1))
    stats["new_tokens_per_s"] = round(stats["new_tokens"] / max(stats["seconds"], 1e-9), 1)
    print("[generate] " + json.dumps(stats), flush=True)
    if a.text_out:
        with open(a.text_out, "w") as f:
            for p, (seq, st), t in zip(prompts, res, temps):
                f.write(json.dumps({"temperature": t, "prompt": tok.decode(p), "answer": tok.decode(seq[len(p):]),
                                    "stopped": st}) + "\n")
    with open(a.out + ".json", "w") as f:
        json.dump(stats, f)


if __name__ == "__main__":
    main()
