#!/usr/bin/env python3
"""Trains the DFlash v1 draft (dflash_draft.py) on the target's own generations and measures
its acceptance.

    python3 tools/train/train_draft.py --target models/splash-demo --data G/train.npz --out DR \
        [--block 8] [--max-seconds 270] [--eval-prompts D/heldout_chat.jsonl]

Each step (SpecForge recipe, shared/spec/dflash.md "Training"): a batch of generated
sequences (prompt + answer), right-padded; one frozen target forward (bf16) gives the outputs
of the tapped layers; up to --anchors random anchors per sequence in the answer part; blocks
[anchor, MASK x (B-1)] embedded by the target's embedding; one draft forward over all blocks
with the mask "context before the anchor + own block"; cross-entropy against the tokens at
anchor+k through the target's (tied) lm_head, weighted exp(-(k-1)/gamma) (gamma 4 for B=8,
7 for B=16).  AdamW lr 6e-4, warm-up 4% then cosine to 0 over --max-seconds (time-based).

The mask token is the first id past the tokenizer's ids (151669 for the Qwen3 tokenizer; the
padded model vocabulary has rows up to 151679), read from tokenizer.json, recorded in the
draft's config.  At the end: the draft saved in the z-lab layout (bf16), then the acceptance
measured by speculative decoding in PyTorch (dflash_draft.speculative_generate) on held-out chat
prompts at temperature 0 and 1: mean tokens per cycle (accepted + 1) -> DR/acceptance.json.
"""

import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch

sys.dont_write_bytecode = True      # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common as C  # noqa: E402
import dflash_draft as D  # noqa: E402
import model as M  # noqa: E402
import prepare_data as P  # noqa: E402


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--data", required=True, help="generate.py .npz")
    ap.add_argument("--out", required=True)
    ap.add_argument("--block", type=int, default=8)
    ap.add_argument("--ffn-mult", type=int, default=0, help="draft FFN width / hidden (0: sizes.DRAFT's, 8)")
    ap.add_argument("--layers", type=int, default=0, help="draft layers (0: sizes.DRAFT's, 2)")
    ap.add_argument("--gamma", type=float, default=0.0, help="0: 4 for block 8, 7 for block 16")
    ap.add_argument("--anchors", type=int, default=64)
    ap.add_argument("--batch", type=int, default=48)
    ap.add_argument("--max-len", type=int, default=1024)
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--warmup-frac", type=float, default=0.04)
    ap.add_argument("--max-seconds", type=float, default=270)
    ap.add_argument("--seed", type=int, default=20261201)
    ap.add_argument("--log-every", type=int, default=20)
    ap.add_argument("--eval-prompts", default="")
    ap.add_argument("--eval-n", type=int, default=32)
    ap.add_argument("--eval-max-new", type=int, default=96)
    ap.add_argument("--eval-seconds", type=float, default=45, help="per temperature")
    ap.add_argument("--eval-only", action="store_true", help="load DR and measure acceptance only")
    ap.add_argument("--tokenizer", default="", help="tokenizer.json (default: the target's)")
    ap.add_argument("--stub-tokenizer", action="store_true")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    C.add_speed_args(ap)
    return ap.parse_args()


def load_sequences(path, max_len):
    z = np.load(path)
    toks, offs, plens = z["tokens"], z["offsets"], z["prompt_lens"]
    seqs = []
    for i in range(len(plens)):
        s = toks[offs[i]:offs[i + 1]][:max_len]
        if len(s) >= int(plens[i]) + 2:
            seqs.append((s.astype(np.int64), int(plens[i])))
    return seqs


def make_batch(seqs, idx, dev, pad_id):
    L = max(len(seqs[i][0]) for i in idx)
    ids = torch.full((len(idx), L), pad_id, dtype=torch.long)
    lens, starts = [], []
    for r, i in enumerate(idx):
        s, p = seqs[i]
        ids[r, :len(s)] = torch.from_numpy(s)
        lens.append(len(s))
        starts.append(p)
    return ids.to(dev), torch.tensor(lens), torch.tensor(starts)


def measure_acceptance(target, draft, prompts, max_new, stop_ids, seed, temperatures=(0.0, 1.0), blocks=None,
                       seconds=1e9):
    """Mean tokens per cycle over the prompts, per (temperature, block); each configuration stops
    taking new prompts after `seconds` (every cycle recomputes the sequence: ~0.1 s a cycle)."""
    res = {}
    for T in temperatures:
        for B in blocks or [draft.block_size]:
            gen = torch.Generator().manual_seed(seed)
            cycles, t0, n_tok, n_p = [], time.time(), 0, 0
            for p in prompts:
                if time.time() - t0 > seconds:
                    break
                n_p += 1
                out, per = D.speculative_generate(target, draft, p, max_new, temperature=T, block=B,
                                                  stop_ids=stop_ids, gen=gen)
                cycles += per
                n_tok += len(out)
            key = "T%g_B%d" % (T, B)
            res[key] = dict(mean_accept_len=round(float(np.mean(cycles)), 3) if cycles else 0.0,
                            cycles=len(cycles), tokens=n_tok, prompts=n_p, seconds=round(time.time() - t0, 1))
            print("[draft] acceptance %s: %s" % (key, res[key]), flush=True)
    return res


def main():
    a = parse()
    C.apply_speed_args(a)
    dev = C.device()
    C.fast_math(True)
    torch.manual_seed(a.seed)
    os.makedirs(a.out, exist_ok=True)
    log = C.Log(os.path.join(a.out, "train.jsonl"))
    if a.threads:
        torch.set_num_threads(a.threads)
    tok = P.Tok(path=a.tokenizer or C.tokenizer_path(a.target), stub=a.stub_tokenizer)
    target = C.load_target(a.target, dev).eval()
    for p in target.parameters():
        p.requires_grad_(False)
    mask_id = tok.n_ids                       # first id past the tokenizer's: unused, inside the padded vocab
    assert mask_id < target.spec["vocab"], "no spare id for the mask token"
    gamma = a.gamma or (4.0 if a.block <= 8 else 7.0)
    stop_ids = {tok.im_end, tok.eot}

    if a.eval_only:
        draft = D.DFlashDraft.load(a.out, dev).eval()
    else:
        cfg = D.make_config(target.spec, mask_id, a.block, a.ffn_mult, a.layers)
        draft = D.DFlashDraft(cfg)
        draft.init_weights(a.seed)
        draft.to(dev).train()
        taps = set(draft.taps)
        seqs = load_sequences(a.data, a.max_len)
        n_params = sum(p.numel() for p in draft.parameters())
        log(event="start", params=n_params, sequences=len(seqs), block=a.block, gamma=gamma, mask_token_id=mask_id,
            taps=draft.taps)
        opt_kw = dict(betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
        if dev.type == "cuda":
            opt_kw["fused"] = True
        opt = torch.optim.AdamW(draft.parameters(), lr=a.lr, **opt_kw)
        gen = torch.Generator().manual_seed(a.seed)
        W = target.model.embed_tokens.weight
        t0 = time.time()
        step, acc_w = 0, []
        while True:
            el = time.time() - t0
            if el >= a.max_seconds:
                break
            prog = el / a.max_seconds
            lr = a.lr * (prog / a.warmup_frac if prog < a.warmup_frac else
                         0.5 * (1 + math.cos(math.pi * (prog - a.warmup_frac) / (1 - a.warmup_frac))))
            for gp in opt.param_groups:
                gp["lr"] = lr
            idx = torch.randint(0, len(seqs), (a.batch,), generator=gen).tolist()
            ids, lens, starts = make_batch(seqs, idx, dev, tok.eot)
            Bsz, L = ids.shape
            with torch.no_grad(), C.autocast(dev):
                _, tapped = target.hidden(ids, taps=taps)
                feats = torch.cat([tapped[t] for t in draft.taps], dim=-1)
            block_ids, labels, pos_q, anchors = D.build_blocks(ids, lens, starts, a.anchors, a.block, mask_id, gen)
            mask = D.block_mask(anchors, L, a.block)
            with C.autocast(dev):
                emb = target.model.embed_tokens(block_ids).detach()
                ctx = draft.context(feats)
                pos_c = torch.arange(L, device=dev).unsqueeze(0).expand(Bsz, L)
                h = draft(emb, ctx, pos_q, pos_c, mask)
                wts = D.loss_weights(labels, a.block, gamma)
                loss = M.chunked_ce(h.reshape(-1, h.shape[-1]), W, labels.reshape(-1), weights=wts.reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            gn = torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
            opt.step()
            step += 1
            if step % a.log_every == 0:
                with torch.no_grad(), C.autocast(dev):
                    # top-1 accuracy of the first proposal (block position 1) on this batch
                    sel = (torch.arange(labels.shape[1], device=dev) % a.block == 1)
                    hl = h[:, sel]
                    pred = target.logits(hl).argmax(-1)
                    lab = labels[:, sel]
                    ok = lab != -100
                    acc1 = float(((pred == lab) & ok).sum()) / max(1, int(ok.sum()))
                log(step=step, loss=round(float(loss.detach()), 4), acc_pos1=round(acc1, 4), grad_norm=round(float(gn), 3),
                    lr=lr, seconds=round(time.time() - t0, 1), ctx_len=L)
        draft.save(a.out, extra={"splash_training": {"steps": step, "seconds": round(time.time() - t0, 1),
                                                      "gamma": gamma, "anchors": a.anchors, "batch": a.batch,
                                                      "seed": a.seed, "data": os.path.basename(a.data)}})
        log(event="saved", path=a.out, steps=step)
        draft.eval()

    if a.eval_prompts:
        prompts = []
        with open(a.eval_prompts) as f:
            for line in f:
                p = json.loads(line)["prompt_ids"]
                if len(p) <= 768:
                    prompts.append(p)
                if len(prompts) >= a.eval_n:
                    break
        with torch.no_grad(), C.autocast(dev):
            res = measure_acceptance(target, draft, prompts, a.eval_max_new, stop_ids, a.seed, blocks=[a.block],
                                     seconds=a.eval_seconds)
        with open(os.path.join(a.out, "acceptance.json"), "w") as f:
            json.dump(res, f, indent=1)
        log(event="acceptance", **{k: v["mean_accept_len"] for k, v in res.items()})


if __name__ == "__main__":
    main()
