#!/usr/bin/env python3
"""The target's own answers to chat prompts: the draft's training data, and samples for the
model card.

    python3 tools/train/generate.py --target CK/export --prompts D/train_prompts.jsonl \
        --n 4096 --max-new 256 --temperatures 0,1 --out G/train.npz [--text-out G/train.jsonl]

Batched cached decoding (model.py prefill / decode_step): prompts left-padded, padding
invisible to attention and zero into the GDN layers, then one token per row per step with the
recurrent GDN state, the conv state and a KV cache.  (Recomputing the whole sequence every step
would cost batch x length x steps token-forwards: about 18 minutes for 6144 answers of 256
tokens; cached, a step is a few milliseconds.)  Prompts are taken in file order (prepare_data.py
shuffled them with the seed), sorted by length into batches; row i uses temperatures[i % len]
(0 = greedy, else plain softmax sampling from a seeded generator).  Stops at <|im_end|> or
<|endoftext|>.

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


@torch.no_grad()
def graphed_decoder(model, cache, b, dev):
    """One decode step captured as a CUDA graph (eager PyTorch launches cost ~50-100 us each on
    the GPU machine, and a step is ~600 of them): returns step(tok) -> hidden [B, H].  The state
    is snapshotted around the warm-up steps, so capturing changes nothing."""
    sc = model.static_cache(cache)
    tok = torch.zeros(b, dtype=torch.long, device=dev)
    state = [sc["key_mask"], sc["n"], sc["pos"]] + [t for lc in sc["layers"] for t in lc.values()
                                                     if torch.is_tensor(t)]
    snap = [t.clone() for t in state]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(2):
            with C.autocast(dev):
                model.decode_step_static(tok, sc)
    torch.cuda.current_stream().wait_stream(side)
    for t, s0 in zip(state, snap):
        t.copy_(s0)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g), torch.no_grad():
        with C.autocast(dev):
            h_out = model.decode_step_static(tok, sc)
    limit = sc["max_len"]
    count = [int(sc["n"])]

    def step(nxt):
        if count[0] >= limit:
            raise ValueError("cache full")
        tok.copy_(nxt)
        g.replay()
        count[0] += 1
        return h_out
    return step


def generate_batch(model, prompts, max_new, temps, stop_ids, gen, dev, pad_id, graph=True):
    """Left-padded batch: one prefill, then one cached step per token (model.prefill /
    decode_step, checked against the full forward by bench.py and selftest.py)."""
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
    stops = torch.tensor(sorted(stop_ids), device=dev)
    out = torch.full((b, max_new), pad_id, dtype=torch.long, device=dev)
    end = torch.full((b,), -1, dtype=torch.long, device=dev)          # index in out of the stop token
    with C.autocast(dev):
        h, cache = model.prefill(ids, valid, T + max_new)
    step = None
    if graph and dev.type == "cuda":
        try:
            step = graphed_decoder(model, cache, b, dev)
        except Exception as e:  # noqa: BLE001
            print("[generate] CUDA graph capture failed (%r): eager decoding" % e, flush=True)
    if step is None:
        def step(tok):
            with C.autocast(dev):
                return model.decode_step(tok, cache)
    for t in range(max_new):
        logits = model.logits(h).float()
        nxt = logits.argmax(-1)
        if not bool(greedy.all()):
            pr = torch.softmax(logits / t_rows.clamp_min(1e-6).unsqueeze(1), dim=-1)
            nxt = torch.where(greedy, nxt, torch.multinomial(pr, 1, generator=gen).squeeze(1))
        running = end < 0
        nxt = torch.where(running, nxt, torch.full_like(nxt, pad_id))
        out[:, t] = nxt
        end = torch.where(running & torch.isin(nxt, stops), torch.full_like(end, t), end)
        if t % 16 == 15 and bool((end >= 0).all()):
            break
        if t + 1 < max_new:
            h = step(nxt)
    res = []
    out, end = out.tolist(), end.tolist()
    for i, p in enumerate(prompts):
        n = end[i] + 1 if end[i] >= 0 else max_new
        res.append((list(p) + out[i][:n], end[i] >= 0))
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", required=True, help="exported HF dir or state.pt")
    ap.add_argument("--prompts", required=True, help="jsonl with prompt_ids")
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--skip", type=int, default=0, help="start at this prompt")
    ap.add_argument("--max-new", type=int, default=256)
    ap.add_argument("--max-prompt", type=int, default=768, help="skip longer prompts")
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--max-seconds", type=float, default=1e9, help="stop starting new batches after this")
    ap.add_argument("--no-graph", action="store_true", help="eager decoding (no CUDA graph)")
    ap.add_argument("--temperatures", default="0,1")
    ap.add_argument("--seed", type=int, default=20261201)
    ap.add_argument("--out", required=True)
    ap.add_argument("--text-out", default="")
    ap.add_argument("--stub-tokenizer", action="store_true")
    a = ap.parse_args()
    dev = C.device()
    C.fast_math(True)
    tok = P.Tok(stub=a.stub_tokenizer)
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
    use_graph = not a.no_graph and dev.type == "cuda"
    if use_graph:   # the captured step must give what the eager step gives (first 16 prompts, 8 tokens)
        few = [prompts[i] for i in order[:16]]
        g1 = generate_batch(model, few, 8, [0.0] * len(few), set(), gen, dev, tok.eot, graph=True)
        g0 = generate_batch(model, few, 8, [0.0] * len(few), set(), gen, dev, tok.eot, graph=False)
        same = sum(x[0] == y[0] for x, y in zip(g1, g0))
        print("[generate] graph check: %d/%d rows identical to eager" % (same, len(few)), flush=True)
        if same < 0.75 * len(few):
            print("[generate] graph decoding disagrees with eager: using eager", flush=True)
            use_graph = False
    res = [None] * len(prompts)
    t0 = time.time()
    for j in range(0, len(order), a.batch):
        if time.time() - t0 > a.max_seconds:
            print("[generate] time budget spent: %d of %d prompts answered" % (j, len(order)), flush=True)
            break
        idx = order[j:j + a.batch]
        outs = generate_batch(model, [prompts[i] for i in idx], a.max_new, [temps[i] for i in idx], stop_ids, gen,
                              dev, tok.eot, graph=use_graph)
        for i, o in zip(idx, outs):
            res[i] = o
        print("[generate] %d/%d prompts, %.1f s" % (min(j + a.batch, len(order)), len(order), time.time() - t0),
              flush=True)
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
    stats = dict(prompts=len(prompts), graph=use_graph, new_tokens=int(sum(new)), mean_new=round(float(np.mean(new)), 1) if new else 0,
                 stopped_frac=round(float(np.mean(stopped)), 3) if stopped else 0, seconds=round(time.time() - t0, 1))
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
