#!/usr/bin/env python3
"""Make tests/fixtures/dflash2-tiny: a tiny random DFlash 2 draft (z-lab `DFlash2DraftModel`
checkpoint layout) for the dense-tiny target, with reference outputs of the draft forward and of
the candidate selector.

Usage:  python3 tools/make_dflash2_fixture.py [--target tests/fixtures/dense-tiny]
                                              [--out tests/fixtures/dflash2-tiny] [--device cuda]

Needs PyTorch and numpy (safetensors is not needed: the checkpoint is written by hand).  The math
is written here from the descriptions of the two references (z-lab dflash/model.py:
DFlash2DraftModel, GroupedDynamicCausalConv, CandidateSelector; llama.cpp src/models/dflash.cpp:
build_dflash2_conv, build_dflash2_selector), not from Splash's C code nor from
tools/make_dflash_fixture.py, so the implementations stay independent:

  ctx   = hidden_norm(fc(concat of the target's tap-layer outputs))        [C, H]
  x     = input_embedding_scale * target.embed([anchor, MASK x (B-1)])    [B, H]
  per layer (both sublayers wrapped by a grouped dynamic causal conv):
    xn = input_layernorm(x);   dyn = attention_conv.kernel_projection(xn) as [B, 2, K, H/group]
    a  = attn(conv(xn, dyn[:, 0], base[0]))          q, k, v of the block from the conv output;
                                                     context k, v from ctx (no conv)
    x  = x + conv(o_proj(a), dyn[:, 1], base[1])
    xn = post_attention_layernorm(x);  dyn = mlp_conv.kernel_projection(xn)
    x  = x + conv(mlp(conv(xn, dyn[:, 0], base[0])), dyn[:, 1], base[1])
    conv(y, d, b)[t, c] = sum_{o < K} (b[o, c] + d[t, o, c // group]) * y[t - o, c], y[t - o] = 0
                          for t - o < 0 (the block is the whole sequence: nothing before row 0)
    attention: Qwen3 (q_norm / k_norm, full-dim rotate_half RoPE, GQA), keys = [ctx ; block] at
      positions 0..start-1, start..start+B-1; every layer sliding_attention with is_causal false:
      bidirectional inside the block, a query at position p sees keys at positions > p - window.
  h      = norm(x)                                 (Qwen3 RMSNorm: w * x * rsqrt(mean(x^2) + eps))
  logits = tanh(output_multiplier * lm_head(h) / cap) * cap,  cap = final_logit_softcapping
  selector, rows 1..B-1 (z-lab CandidateSelector.select):
    cand  = the 16 largest logits of the row (sorted here: descending, equal logits by lower id)
    score = logit[cand] + < pred_codebook[prev] * hidden_projection(h), succ_codebook[cand] >
    prev  = anchor for the first row, then the previous row's pick
    greedy: pick = argmax(score) (first of equals);
    sampled: q = softmax(score / T) over the 16, pick = first k with u < q_0 + ... + q_k, one
      uniform u per row (given in ref.json, so the C test can replay the draw).

Everything runs in fp32 (TF32 off) on bf16-rounded weights.  The random numbers come from a CPU
torch.Generator, so weights, taps and uniforms do not depend on the device.

Written under --out (< 1 MB in all):
  config.json, model.safetensors (bf16)   the draft checkpoint (z-lab names: the codebooks are
                                          stored without ".weight", as z-lab's checkpoints do)
  taps.f32            [43][n_taps*H] f32  tap features of committed positions 0..42, tap order
  ref_hidden.f32      [2][B][H]     draft output (after the final norm), blocks 1 and 2
  ref_noconv_hidden.f32 [2][B][H]   the same with every conv replaced by the identity (to prove
                                    the conv changes the answer in this fixture)
  ref_logits.f32      [2][B-1][V]   draft logits (multiplier and soft cap applied), rows 1..B-1
  ref_greedy_scores.f32 [2][B-1][16]  selector scores along the greedy path, candidate order
  ref_sample_q.f32    [2][B-1][16]  q along the sampled path, candidate order
  ref.json            blocks, candidates, greedy / sampled picks, uniforms, margins, versions
Block 1: context positions 0..39, anchor at 40.  Block 2: positions 40..42 committed (their taps
appended), anchor at 43.
"""

import argparse
import json
import math
import os
import struct
import sys

import numpy as np
import torch

SEED = 7102
H = 128
N_LAYERS = 2
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 32
INTER = 256
BLOCK = 8
WINDOW = 16
TAPS = [1, 4, 6]
MASK_ID = 511
VOCAB = 512
EPS = 1e-5
THETA = 500000.0
CONV_K, CONV_GROUP = 2, 16
RANK, TOP_K = 64, 16
OUT_MULT, SOFTCAP, EMB_SCALE = 3.0, 6.0, 1.25
TEMPERATURE = 0.8
CTX1, EXTRA = 40, 3
ANCHORS = [17, 301]
MIN_MARGIN = 1e-3  # picks must not hinge on differences below this (fp32 noise between backends)


# ---- safetensors by hand -----------------------------------------------------------------------

def load_target(path):
    """embed and lm_head of the target checkpoint (bf16 or f32) as fp32 tensors."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        blob = f.read()
    out = {}
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        info = header[name]
        a, b = info["data_offsets"]
        if info["dtype"] == "BF16":
            u = np.frombuffer(blob[a:b], dtype="<u2").astype(np.uint32) << 16
            arr = u.view(np.float32)
        elif info["dtype"] == "F32":
            arr = np.frombuffer(blob[a:b], dtype="<f4").copy()
        else:
            raise SystemExit(f"{path}: {name} has dtype {info['dtype']}")
        out[name] = torch.from_numpy(arr.reshape(info["shape"]).copy())
    return out["model.embed_tokens.weight"], out["lm_head.weight"]


def save_bf16_safetensors(path, tensors):
    names = sorted(tensors)
    header, chunks, pos = {}, [], 0
    for name in names:
        t = tensors[name].contiguous().to(torch.bfloat16)
        raw = t.view(torch.int16).numpy().astype("<i2").tobytes()
        header[name] = {"dtype": "BF16", "shape": list(t.shape), "data_offsets": [pos, pos + len(raw)]}
        chunks.append(raw)
        pos += len(raw)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for c in chunks:
            f.write(c)


# ---- weights ------------------------------------------------------------------------------------

def bf16_round(t):
    return t.to(torch.bfloat16).float()


def random_weights(gen):
    w = {}

    def gauss(shape, std, mean=0.0):
        return bf16_round(mean + std * torch.randn(*shape, generator=gen))

    groups = H // CONV_GROUP
    w["fc.weight"] = gauss((H, len(TAPS) * H), 1.0 / math.sqrt(len(TAPS) * H))
    w["hidden_norm.weight"] = gauss((H,), 0.2, 1.0)
    for l in range(N_LAYERS):
        p = f"layers.{l}."
        w[p + "input_layernorm.weight"] = gauss((H,), 0.2, 1.0)
        w[p + "self_attn.q_proj.weight"] = gauss((HEADS * HEAD_DIM, H), 1.0 / math.sqrt(H))
        w[p + "self_attn.k_proj.weight"] = gauss((KV_HEADS * HEAD_DIM, H), 1.0 / math.sqrt(H))
        w[p + "self_attn.v_proj.weight"] = gauss((KV_HEADS * HEAD_DIM, H), 1.0 / math.sqrt(H))
        w[p + "self_attn.o_proj.weight"] = gauss((H, HEADS * HEAD_DIM), 1.0 / math.sqrt(HEADS * HEAD_DIM))
        w[p + "self_attn.q_norm.weight"] = gauss((HEAD_DIM,), 0.2, 1.0)
        w[p + "self_attn.k_norm.weight"] = gauss((HEAD_DIM,), 0.2, 1.0)
        w[p + "post_attention_layernorm.weight"] = gauss((H,), 0.2, 1.0)
        w[p + "mlp.gate_proj.weight"] = gauss((INTER, H), 1.0 / math.sqrt(H))
        w[p + "mlp.up_proj.weight"] = gauss((INTER, H), 1.0 / math.sqrt(H))
        w[p + "mlp.down_proj.weight"] = gauss((H, INTER), 1.0 / math.sqrt(INTER))
        for conv in ("attention_conv", "mlp_conv"):
            # tap 0 near identity, tap 1 a real mix of the previous row; dynamic part ~0.3
            base = torch.cat([1.0 + 0.2 * torch.randn(2, 1, H, generator=gen),
                              0.4 * torch.randn(2, CONV_K - 1, H, generator=gen)], dim=1)
            w[p + conv + ".base_kernel"] = bf16_round(base)
            w[p + conv + ".kernel_projection.weight"] = gauss((2 * CONV_K * groups, H), 0.3 / math.sqrt(H))
    w["norm.weight"] = gauss((H,), 0.2, 1.0)
    w["candidate_selector.hidden_projection.weight"] = gauss((RANK, H), 1.0 / math.sqrt(H))
    w["candidate_selector.predecessor_codebook"] = gauss((VOCAB, RANK), 0.35)
    w["candidate_selector.successor_codebook"] = gauss((VOCAB, RANK), 0.35)
    return w


# ---- the draft ---------------------------------------------------------------------------------

def rms(x, weight):
    return weight * (x * torch.rsqrt(torch.mean(x * x, dim=-1, keepdim=True) + EPS))


def rotate(x, positions):
    """x [n, heads, hd], positions [n]: RoPE on the full head dim, halves rotated."""
    half = HEAD_DIM // 2
    freq = THETA ** (-torch.arange(half, dtype=torch.float32, device=x.device) * 2.0 / HEAD_DIM)
    ang = positions.to(torch.float32)[:, None] * freq[None, :]
    cos = torch.cat([ang.cos(), ang.cos()], dim=-1)[:, None, :]
    sin = torch.cat([ang.sin(), ang.sin()], dim=-1)[:, None, :]
    lo, hi = x[..., :half], x[..., half:]
    return x * cos + torch.cat([-hi, lo], dim=-1) * sin


def dyn_conv(y, dyn, base, enabled=True):
    """y [B, H]; dyn [B, K, H/group]; base [K, H] -> [B, H], causal inside the block only."""
    if not enabled:
        return y
    out = torch.zeros_like(y)
    for o in range(CONV_K):
        shifted = torch.cat([torch.zeros(o, H, device=y.device), y[: y.shape[0] - o]], dim=0)
        weight = base[o][None, :] + dyn[:, o, :].repeat_interleave(CONV_GROUP, dim=1)
        out = out + weight * shifted
    return out


def attention(w, p, x_block, ctx, start):
    n_ctx = ctx.shape[0]
    q = (x_block @ w[p + "self_attn.q_proj.weight"].t()).reshape(BLOCK, HEADS, HEAD_DIM)
    both = torch.cat([ctx, x_block], dim=0)
    k = (both @ w[p + "self_attn.k_proj.weight"].t()).reshape(n_ctx + BLOCK, KV_HEADS, HEAD_DIM)
    v = (both @ w[p + "self_attn.v_proj.weight"].t()).reshape(n_ctx + BLOCK, KV_HEADS, HEAD_DIM)
    qpos = torch.arange(start, start + BLOCK, device=x_block.device)
    kpos = torch.arange(0, start + BLOCK, device=x_block.device)
    q = rotate(rms(q, w[p + "self_attn.q_norm.weight"]), qpos)
    k = rotate(rms(k, w[p + "self_attn.k_norm.weight"]), kpos)
    # bidirectional inside the block (is_causal false), window on both sides
    dist = qpos[:, None] - kpos[None, :]
    allowed = (dist < WINDOW) & (-dist < WINDOW)
    group = HEADS // KV_HEADS
    out = torch.empty(BLOCK, HEADS, HEAD_DIM, device=x_block.device)
    for head in range(HEADS):
        kh = head // group
        s = (q[:, head, :] @ k[:, kh, :].t()) * HEAD_DIM ** -0.5
        s = torch.where(allowed, s, torch.full_like(s, -math.inf))
        out[:, head, :] = torch.softmax(s, dim=-1) @ v[:, kh, :]
    return out.reshape(BLOCK, HEADS * HEAD_DIM) @ w[p + "self_attn.o_proj.weight"].t()


def draft_hidden(w, taps, emb, start, use_conv=True):
    groups = H // CONV_GROUP
    ctx = rms(taps @ w["fc.weight"].t(), w["hidden_norm.weight"])
    x = emb * EMB_SCALE
    for l in range(N_LAYERS):
        p = f"layers.{l}."
        xn = rms(x, w[p + "input_layernorm.weight"])
        dyn = (xn @ w[p + "attention_conv.kernel_projection.weight"].t()).reshape(BLOCK, 2, CONV_K, groups)
        base = w[p + "attention_conv.base_kernel"]
        a = attention(w, p, dyn_conv(xn, dyn[:, 0], base[0], use_conv), ctx, start)
        x = x + dyn_conv(a, dyn[:, 1], base[1], use_conv)
        xn = rms(x, w[p + "post_attention_layernorm.weight"])
        dyn = (xn @ w[p + "mlp_conv.kernel_projection.weight"].t()).reshape(BLOCK, 2, CONV_K, groups)
        base = w[p + "mlp_conv.base_kernel"]
        xm = dyn_conv(xn, dyn[:, 0], base[0], use_conv)
        m = (torch.nn.functional.silu(xm @ w[p + "mlp.gate_proj.weight"].t()) * (xm @ w[p + "mlp.up_proj.weight"].t())
             ) @ w[p + "mlp.down_proj.weight"].t()
        x = x + dyn_conv(m, dyn[:, 1], base[1], use_conv)
    return rms(x, w["norm.weight"])


def draft_logits(h, head):
    z = (h @ head.t()) * OUT_MULT
    return torch.tanh(z / SOFTCAP) * SOFTCAP


def walk(w, h, logits, anchor, uniforms=None):
    """The selector over rows h [R, H], logits [R, V].  Returns candidates [R][16], picks [R],
    per-row scores [R][16] and (sampled) q [R][16], and the smallest decision margin."""
    order = torch.sort(-logits, dim=-1, stable=True).indices      # descending, lower id first on ties
    cands = order[:, :TOP_K]
    gate = h @ w["candidate_selector.hidden_projection.weight"].t()
    margin = float((logits.gather(1, order[:, TOP_K - 1:TOP_K]) - logits.gather(1, order[:, TOP_K:TOP_K + 1])).min())
    prev = anchor
    picks, scores_all, q_all = [], [], []
    for r in range(h.shape[0]):
        c = cands[r]
        cond = w["candidate_selector.predecessor_codebook"][prev] * gate[r]
        score = logits[r, c] + w["candidate_selector.successor_codebook"][c] @ cond
        if uniforms is None:
            k = int(torch.argmax(score))
            top2 = torch.topk(score, 2).values
            margin = min(margin, float(top2[0] - top2[1]))
            q = torch.zeros(TOP_K, device=h.device)
            q[k] = 1.0
        else:
            q = torch.softmax(score / TEMPERATURE, dim=-1)
            cum = torch.cumsum(q.double(), dim=0)
            k = int((cum <= uniforms[r]).sum())  # first k with u < cum[k]
            if k == TOP_K:  # rounding left none: the last candidate of positive q
                k = int(torch.nonzero(q > 0).max())
            margin = min(margin, float((cum - uniforms[r]).abs().min()))
        picks.append(int(c[k]))
        scores_all.append(score)
        q_all.append(q)
        prev = int(c[k])
    return cands, picks, torch.stack(scores_all), torch.stack(q_all), margin


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="tests/fixtures/dense-tiny")
    ap.add_argument("--out", default="tests/fixtures/dflash2-tiny")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    os.makedirs(a.out, exist_ok=True)

    gen = torch.Generator().manual_seed(SEED)
    w = random_weights(gen)
    taps = torch.randn(CTX1 + EXTRA, len(TAPS) * H, generator=gen)
    uniforms = torch.rand(2, BLOCK - 1, generator=gen).double()
    embed, head = load_target(os.path.join(a.target, "model.safetensors"))

    dev = torch.device(a.device)
    wd = {k: v.to(dev) for k, v in w.items()}
    head_d = head.to(dev)
    hid, noconv, logits, blocks = [], [], [], []
    greedy_scores, sample_q = [], []
    margin = math.inf
    changed = 0
    for b, (start, anchor) in enumerate(zip([CTX1, CTX1 + EXTRA], ANCHORS)):
        ids = torch.tensor([anchor] + [MASK_ID] * (BLOCK - 1))
        emb = embed[ids].to(dev)
        with torch.no_grad():
            h = draft_hidden(wd, taps[:start].to(dev), emb, start)
            h0 = draft_hidden(wd, taps[:start].to(dev), emb, start, use_conv=False)
            lg = draft_logits(h[1:], head_d)
            cands, g_picks, g_scores, _, m1 = walk(wd, h[1:], lg, anchor)
            _, s_picks, _, s_q, m2 = walk(wd, h[1:], lg, anchor, uniforms[b].tolist())
        margin = min(margin, m1, m2)
        changed += sum(int(p != int(x)) for p, x in zip(g_picks, torch.argmax(lg, dim=-1).tolist()))
        hid.append(h.cpu())
        noconv.append(h0.cpu())
        logits.append(lg.cpu())
        greedy_scores.append(g_scores.cpu())
        sample_q.append(s_q.cpu())
        blocks.append({"start": start, "anchor": anchor, "candidates": cands.cpu().tolist(),
                       "greedy": g_picks, "sampled": s_picks,
                       "uniforms": [float(u) for u in uniforms[b].float().tolist()]})
    if margin < MIN_MARGIN:
        raise SystemExit(f"a pick hinges on a margin of {margin:.3g} (< {MIN_MARGIN}): change SEED")

    cfg = {
        "architectures": ["DFlash2DraftModel"],
        "model_type": "qwen3",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "is_causal": False,
        "dflash_config": {
            "block_size": BLOCK,
            "conv_group_size": CONV_GROUP,
            "conv_kernel_size": CONV_K,
            "final_logit_softcapping": SOFTCAP,
            "input_embedding_scale": EMB_SCALE,
            "mask_token_id": MASK_ID,
            "output_multiplier": OUT_MULT,
            "selector_rank": RANK,
            "selector_top_k": TOP_K,
            "target_layer_ids": TAPS,
        },
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "hidden_size": H,
        "intermediate_size": INTER,
        "layer_types": ["sliding_attention"] * N_LAYERS,
        "max_position_embeddings": 4096,
        "max_window_layers": N_LAYERS,
        "num_attention_heads": HEADS,
        "num_hidden_layers": N_LAYERS,
        "num_key_value_heads": KV_HEADS,
        "num_target_layers": 8,
        "rms_norm_eps": EPS,
        "rope_parameters": {"rope_theta": THETA, "rope_type": "default"},
        "sliding_window": WINDOW,
        "tie_word_embeddings": False,
        "use_sliding_window": True,
        "vocab_size": VOCAB,
        "dtype": "bfloat16",
    }
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    save_bf16_safetensors(os.path.join(a.out, "model.safetensors"), w)

    def dump(name, t):
        t.numpy().astype("<f4").tofile(os.path.join(a.out, name))

    dump("taps.f32", taps)
    dump("ref_hidden.f32", torch.stack(hid))
    dump("ref_noconv_hidden.f32", torch.stack(noconv))
    dump("ref_logits.f32", torch.stack(logits))
    dump("ref_greedy_scores.f32", torch.stack(greedy_scores))
    dump("ref_sample_q.f32", torch.stack(sample_q))

    conv_effect = max(float((x - y).norm() / y.norm()) for x, y in zip(hid, noconv))
    q_sum_err = float((torch.stack(sample_q).double().sum(-1) - 1).abs().max())
    ref = {
        "fixture": "dflash2-tiny",
        "description": "random DFlash 2 draft (z-lab DFlash2DraftModel layout) for dense-tiny; reference outputs "
                       "from tools/make_dflash2_fixture.py's own PyTorch implementation",
        "target": "dense-tiny",
        "seed": SEED,
        "block_size": BLOCK,
        "temperature": TEMPERATURE,
        "blocks": blocks,
        "n_taps_rows": CTX1 + EXTRA,
        "files": {"taps.f32": [CTX1 + EXTRA, len(TAPS) * H], "ref_hidden.f32": [2, BLOCK, H],
                  "ref_noconv_hidden.f32": [2, BLOCK, H], "ref_logits.f32": [2, BLOCK - 1, VOCAB],
                  "ref_greedy_scores.f32": [2, BLOCK - 1, TOP_K], "ref_sample_q.f32": [2, BLOCK - 1, TOP_K]},
        "self_check": {"conv_effect_rel_l2": conv_effect, "min_decision_margin": margin,
                       "selector_differs_from_argmax_rows": changed, "q_sum_max_err": q_sum_err,
                       "max_abs_logit": float(torch.stack(logits).abs().max()), "softcap": SOFTCAP},
        "device": str(dev) + ((" " + torch.cuda.get_device_name(0)) if dev.type == "cuda" else ""),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "python": sys.version.split()[0],
        "tf32": False,
    }
    with open(os.path.join(a.out, "ref.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    total = sum(os.path.getsize(os.path.join(a.out, n)) for n in os.listdir(a.out))
    print(json.dumps(ref["self_check"], indent=1))
    print(f"self-check: conv changes the output by {conv_effect:.3g} (rel L2), logits within +-{SOFTCAP}: "
          f"{ref['self_check']['max_abs_logit'] < SOFTCAP}, q sums to 1 within {q_sum_err:.2g}, "
          f"selector != argmax on {changed} of {2 * (BLOCK - 1)} rows, smallest margin {margin:.3g}, "
          f"{total} bytes written")
    ok = conv_effect > 1e-2 and ref["self_check"]["max_abs_logit"] < SOFTCAP and q_sum_err < 1e-5 and total < 2 << 20
    if not ok:
        raise SystemExit("self-check failed")


if __name__ == "__main__":
    main()
