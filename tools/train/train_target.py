#!/usr/bin/env python3
"""Trains the default model's target (tools/train/model.py) on prepare_data.py's streams.

    python3 tools/train/train_target.py --data D --out CK [--size B] [--total-seconds 840]
        [--max-seconds 560] [--cuda-graph] [--export CK/export]

Resumable: CK/state.pt holds the fp32 weights, the AdamW state and the counters (step, tokens,
training seconds); a run that finds it continues from it, and the batches are a function of
(seed, step), so a resumed run sees what an uninterrupted one would have.  A run stops when the
whole budget (--total-seconds of training, counted across runs) is spent, or when this run
has used --max-seconds, saving state either way (and every --save-every seconds).

Schedule: linear warm-up over --warmup steps, constant, then a linear decay to
--min-lr-frac over the last --decay-frac of the training seconds (time-based, so the decay
lands at the end of the budget whatever the throughput turns out to be).  AdamW (0.9, 0.95),
weight decay on matrices, gradient clipping at 1.0, bf16 autocast, TF32.  --cuda-graph captures
the whole step (forward, backward, clipping, fused AdamW with a tensor learning rate) in one
CUDA graph: the model is small, so launches, not arithmetic, bound an eager step.

Logs JSON lines to CK/train.jsonl: loss, lr, tokens/s; held-out NLL and perplexity (all
held-out text, and the chat samples alone) every --eval-every seconds and at the end.
At the end of the budget, --export writes the Hugging Face checkpoint (bf16) that `splash pack`
and transformers read.
"""

import argparse
import json
import math
import os
import sys
import time

import torch

sys.dont_write_bytecode = True      # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common as C  # noqa: E402
import model as M  # noqa: E402
import sizes  # noqa: E402


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--size", default=sizes.CHOSEN, choices=sorted(sizes.CANDIDATES) + sorted(sizes.TEST))
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=32, help="sequences per step")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.05)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--decay-frac", type=float, default=0.3)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=20261201)
    ap.add_argument("--total-seconds", type=float, default=840)
    ap.add_argument("--max-seconds", type=float, default=1e9)
    ap.add_argument("--save-every", type=float, default=240)
    ap.add_argument("--eval-every", type=float, default=120)
    ap.add_argument("--eval-windows", type=int, default=64)
    ap.add_argument("--log-every", type=int, default=20)
    ap.add_argument("--cuda-graph", action="store_true")
    ap.add_argument("--export", default="")
    C.add_speed_args(ap)
    return ap.parse_args()


def lr_at(a, step, train_sec):
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    frac = train_sec / a.total_seconds
    if frac < 1 - a.decay_frac:
        return a.lr
    return a.lr * max(a.min_lr_frac, (1 - frac) / a.decay_frac)


def main():
    a = parse()
    t_run = time.time()
    C.apply_speed_args(a)
    dev = C.device()
    C.fast_math(True)
    os.makedirs(a.out, exist_ok=True)
    log = C.Log(os.path.join(a.out, "train.jsonl"))
    state_path = os.path.join(a.out, "state.pt")
    resume = os.path.exists(state_path)
    if resume:
        st = torch.load(state_path, map_location="cpu", weights_only=False)
        s = st["spec"]
        model = M.Qwen35LM(s)
        model.load_state_dict(st["model"])
        meta = st["meta"]
    else:
        s = sizes.spec(a.size)
        model = M.Qwen35LM(s)
        model.init_weights(a.seed)
        meta = dict(step=0, tokens=0, train_seconds=0.0, seed=a.seed, size=a.size, seq=a.seq, batch=a.batch,
                    runs=0)
    meta["runs"] += 1
    model.to(dev).train()
    graph = a.cuda_graph and dev.type == "cuda"
    lr_t = torch.tensor(lr_at(a, meta["step"], meta["train_seconds"]), device=dev) if graph else None
    opt_kw = dict(betas=(0.9, 0.95), eps=1e-8)
    if dev.type == "cuda":
        opt_kw["fused"] = True
    if graph:
        opt_kw["capturable"] = True
    opt = torch.optim.AdamW(M.param_groups(model, a.wd), lr=lr_t if graph else a.lr, **opt_kw)
    if resume:
        opt.load_state_dict(st["opt"])
        if graph:
            for gp in opt.param_groups:
                gp["lr"] = lr_t
        del st
    n_params = sum(p.numel() for p in model.parameters())
    log(event="start", resume=resume, size=meta["size"], params=n_params, step=meta["step"],
        tokens=meta["tokens"], train_seconds=round(meta["train_seconds"], 1), graph=graph, device=str(dev))

    train = C.load_stream(os.path.join(a.data, "train.u32"), dev)
    held = C.load_stream(os.path.join(a.data, "heldout.u32"), dev)
    held_chat_path = os.path.join(a.data, "heldout_chat.u32")
    held_chat = C.load_stream(held_chat_path, dev) if os.path.getsize(held_chat_path) > 4 * (a.seq + 1) else None
    ev = C.eval_windows(held, meta["seq"], a.eval_windows)
    ev_chat = C.eval_windows(held_chat, meta["seq"], a.eval_windows) if held_chat is not None else None
    seq, batch = meta["seq"], meta["batch"]
    n_stream = train.numel()

    def batch_for(step):
        g = torch.Generator(device=dev)
        g.manual_seed(meta["seed"] * 1000003 + step)
        offs = torch.randint(0, n_stream - seq - 1, (batch,), device=dev, generator=g)
        return C.windows(train, offs, seq)

    static_x = batch_for(meta["step"]).clone()
    params = [p for p in model.parameters()]

    def step_body():
        with C.autocast(dev):
            loss = model.loss(static_x[:, :-1], static_x[:, 1:])
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(params, a.clip, **({"foreach": True} if dev.type == "cuda" else {}))
        opt.step()
        return loss.detach(), gn.detach()

    def evaluate():
        r = {}
        nll, n = C.mean_nll(model, ev, max(1, 16 * 2048 // seq), dev)
        r.update(heldout_nll=round(nll, 4), heldout_ppl=round(math.exp(nll), 3), heldout_tokens=n)
        if ev_chat is not None:
            nll, n = C.mean_nll(model, ev_chat, max(1, 16 * 2048 // seq), dev)
            r.update(chat_nll=round(nll, 4), chat_ppl=round(math.exp(nll), 3))
        return r

    def save():
        t = time.time()
        C.save_state(state_path, {"spec": s, "model": model.state_dict(), "opt": opt.state_dict(), "meta": meta})
        return time.time() - t

    g = None
    if graph:
        t = time.time()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):      # warm-up steps are real steps
                static_x.copy_(batch_for(meta["step"]))
                lr_t.fill_(lr_at(a, meta["step"], meta["train_seconds"]))
                opt.zero_grad(set_to_none=True)
                step_body()
                meta["step"] += 1
                meta["tokens"] += batch * seq
        torch.cuda.current_stream().wait_stream(side)
        opt.zero_grad(set_to_none=True)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static_loss, static_gn = step_body()
        torch.cuda.synchronize()
        meta["train_seconds"] += time.time() - t
        log(event="graph_captured", seconds=round(time.time() - t, 1))

    last_eval = last_save = time.time()
    t_win, tok_win = time.time(), 0
    done = False
    while True:
        if meta["train_seconds"] >= a.total_seconds:
            done = True
            break
        if time.time() - t_run >= a.max_seconds:
            break
        t0 = time.time()
        lr = lr_at(a, meta["step"], meta["train_seconds"])
        if graph:
            static_x.copy_(batch_for(meta["step"]))
            lr_t.fill_(lr)
            g.replay()
            loss, gn = static_loss, static_gn
        else:
            static_x.copy_(batch_for(meta["step"]))
            for gp in opt.param_groups:
                gp["lr"] = lr
            opt.zero_grad(set_to_none=True)
            loss, gn = step_body()
        meta["step"] += 1
        meta["tokens"] += batch * seq
        tok_win += batch * seq
        if meta["step"] % a.log_every == 0:
            lv, gv = float(loss), float(gn)     # syncs
            now = time.time()
            log(step=meta["step"], tokens=meta["tokens"], loss=round(lv, 4), grad_norm=round(gv, 3), lr=lr,
                tok_per_s=round(tok_win / (now - t_win)), train_seconds=round(meta["train_seconds"], 1))
            if not math.isfinite(lv):
                raise SystemExit("loss is not finite")
            t_win, tok_win = now, 0
        else:
            if dev.type == "cuda":
                torch.cuda.synchronize()
        meta["train_seconds"] += time.time() - t0
        if time.time() - last_eval >= a.eval_every:
            t = time.time()
            log(event="eval", step=meta["step"], tokens=meta["tokens"], **evaluate())
            last_eval = time.time()
            t_win += time.time() - t
        if time.time() - last_save >= a.save_every:
            t = time.time()
            log(event="saved", seconds=round(save(), 1))
            last_save = time.time()
            t_win += time.time() - t

    r = evaluate()
    log(event="eval", step=meta["step"], tokens=meta["tokens"], final=done, **r)
    meta["last_eval"] = r
    log(event="saved", seconds=round(save(), 1), done=done, step=meta["step"], tokens=meta["tokens"],
        train_seconds=round(meta["train_seconds"], 1))
    if done and a.export:
        C.export_hf(model, a.export, meta={"step": meta["step"], "tokens": meta["tokens"], "seed": meta["seed"]})
        with open(os.path.join(a.export, "train_meta.json"), "w") as f:
            json.dump(meta, f, indent=1)
        log(event="exported", path=a.export)
    with open(os.path.join(a.out, "DONE" if done else "PARTIAL"), "w") as f:
        json.dump(meta, f)


if __name__ == "__main__":
    main()
