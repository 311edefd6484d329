#!/usr/bin/env python3
"""Make tests/fixtures/dflash-tiny: a tiny random DFlash v1 draft (z-lab `DFlashDraftModel`
checkpoint layout) for the dense-tiny target, with reference draft outputs.

Usage:  python3 tools/make_dflash_fixture.py [--target tests/fixtures/dense-tiny]
                                             [--out tests/fixtures/dflash-tiny] [--device cuda]

Needs PyTorch and numpy only.  The draft math is written here from the z-lab semantics
(dflash/model.py: DFlashDraftModel, Qwen3DFlashAttention, _attention_mask), on purpose NOT by
importing tools/train/dflash_draft.py, so the two implementations stay independent:

  ctx   = hidden_norm(fc(concat of the target's tap-layer outputs))         [C, H]
  block = target.embed([anchor, MASK x (B-1)]) at positions start..start+B-1
  per layer: x += o_proj(attn(input_layernorm(x)));  x += down(silu(gate(xn)) * up(xn)),
             xn = post_attention_layernorm(x)
    attn: q = rope(q_norm(q_proj(x)))               (block rows only)
          k = rope(k_norm(k_proj([ctx; x])))        (context at 0..start-1, block after)
          v = v_proj([ctx; x])
          layer_types[l] == "sliding_attention": causal inside the block and a window of
          `sliding_window` (query position - key position < window); full_attention layers:
          bidirectional inside the block, no window (config has no is_causal).
  out   = norm(x)    (Qwen3 RMSNorm: w * x * rsqrt(mean(x^2) + eps), the draft's own eps)
  RoPE: full head dim, rotate_half pairing, theta from the draft config.

Everything runs in fp32 (TF32 off) on bf16-rounded weights.  The random numbers come from a
CPU torch.Generator, so the weights, taps and token ids do not depend on the device.

Written under --out:
  config.json, model.safetensors (bf16)     the draft checkpoint (z-lab names)
  taps.f32      [43][n_taps*H] f32   tap features of committed positions 0..42, tap order
  ref_hidden.f32        [2][B][H]    draft output (after the final norm), blocks 1 and 2
  ref_logits.f32        [2][B-1][V]  target lm_head(ref_hidden rows 1..B-1)
  ref_nowindow_hidden.f32 [2][B][H]  the same with the sliding window ignored (to prove the
                                     window changes the answer in this fixture)
  ref.json      block anchors/positions, versions, seeds
Block 1: context positions 0..39, anchor at 40.  Block 2: positions 40..42 committed (their
taps appended), anchor at 43.
"""

import argparse
import json
import math
import os
import struct
import sys

import numpy as np
import torch

SEED = 7001
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
THETA = 1000000.0
LAYER_TYPES = ["sliding_attention", "full_attention"]
CTX1, EXTRA = 40, 3
ANCHORS = [17, 301]


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        raw = np.frombuffer(data[a:b], dtype=np.uint16 if info["dtype"] == "BF16" else np.float32)
        if info["dtype"] == "BF16":
            t = torch.from_numpy((raw.astype(np.uint32) << 16).view(np.float32).copy())
        elif info["dtype"] == "F32":
            t = torch.from_numpy(raw.copy())
        else:
            raise SystemExit(f"{path}: {name}: dtype {info['dtype']} not handled")
        out[name] = t.reshape(info["shape"])
    return out


def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].to(torch.bfloat16).contiguous()
        raw = t.view(torch.int16).numpy().tobytes()
        header[name] = {"dtype": "BF16", "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    header["__metadata__"] = {"format": "pt"}
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * ((8 - len(hj) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for b in blobs:
            f.write(b)


def bf16(t):
    return t.to(torch.bfloat16).to(torch.float32)


def make_weights(g):
    w = {}

    def mat(name, rows, cols, std):
        w[name] = bf16(torch.randn(rows, cols, generator=g) * std)

    def norm(name, n):
        w[name] = bf16(1.0 + 0.2 * torch.randn(n, generator=g))

    mat("fc.weight", H, len(TAPS) * H, 1.0 / math.sqrt(len(TAPS) * H))
    norm("hidden_norm.weight", H)
    for l in range(N_LAYERS):
        p = f"layers.{l}."
        norm(p + "input_layernorm.weight", H)
        mat(p + "self_attn.q_proj.weight", HEADS * HEAD_DIM, H, 1.0 / math.sqrt(H))
        mat(p + "self_attn.k_proj.weight", KV_HEADS * HEAD_DIM, H, 1.0 / math.sqrt(H))
        mat(p + "self_attn.v_proj.weight", KV_HEADS * HEAD_DIM, H, 1.0 / math.sqrt(H))
        mat(p + "self_attn.o_proj.weight", H, HEADS * HEAD_DIM, 1.0 / math.sqrt(HEADS * HEAD_DIM))
        norm(p + "self_attn.q_norm.weight", HEAD_DIM)
        norm(p + "self_attn.k_norm.weight", HEAD_DIM)
        norm(p + "post_attention_layernorm.weight", H)
        mat(p + "mlp.gate_proj.weight", INTER, H, 1.0 / math.sqrt(H))
        mat(p + "mlp.up_proj.weight", INTER, H, 1.0 / math.sqrt(H))
        mat(p + "mlp.down_proj.weight", H, INTER, 1.0 / math.sqrt(INTER))
    norm("norm.weight", H)
    return w


def rmsnorm(x, w):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS))


def rope(x, pos):
    """x [n, heads, hd]; pos [n] -> rotated (rotate_half, full head dim)."""
    inv = 1.0 / (THETA ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.int64).float().to(x.device) / HEAD_DIM))
    f = pos.float()[:, None] * inv[None, :]
    emb = torch.cat([f, f], dim=-1)
    cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]
    x1, x2 = x[..., : HEAD_DIM // 2], x[..., HEAD_DIM // 2:]
    rot = torch.cat([-x2, x1], dim=-1)
    return x * cos + rot * sin


def draft_forward(w, taps, emb, start, use_window=True):
    """taps [start, n_taps*H] (committed positions 0..start-1); emb [B, H] block embeddings at
    start..start+B-1.  Returns the normed hidden states [B, H]."""
    ctx = rmsnorm(taps @ w["fc.weight"].T, w["hidden_norm.weight"])
    pos_c = torch.arange(start, device=emb.device)
    pos_q = torch.arange(start, start + BLOCK, device=emb.device)
    pos_k = torch.cat([pos_c, pos_q])
    x = emb
    for l in range(N_LAYERS):
        p = f"layers.{l}."
        sliding = LAYER_TYPES[l] == "sliding_attention"
        causal = sliding  # z-lab: is_causal absent -> causal iff sliding_attention
        xn = rmsnorm(x, w[p + "input_layernorm.weight"])
        q = (xn @ w[p + "self_attn.q_proj.weight"].T).view(BLOCK, HEADS, HEAD_DIM)
        kin = torch.cat([ctx, xn], dim=0)
        k = (kin @ w[p + "self_attn.k_proj.weight"].T).view(-1, KV_HEADS, HEAD_DIM)
        v = (kin @ w[p + "self_attn.v_proj.weight"].T).view(-1, KV_HEADS, HEAD_DIM)
        q = rope(rmsnorm(q, w[p + "self_attn.q_norm.weight"]), pos_q)
        k = rope(rmsnorm(k, w[p + "self_attn.k_norm.weight"]), pos_k)
        qp, kp = pos_q[:, None], pos_k[None, :]
        vis = torch.ones(BLOCK, len(pos_k), dtype=torch.bool, device=emb.device)
        if causal:
            vis &= kp <= qp
        if sliding and use_window:
            vis &= (qp - kp) < WINDOW
            if not causal:
                vis &= (kp - qp) < WINDOW
        rep = HEADS // KV_HEADS
        kk = k.repeat_interleave(rep, dim=1).transpose(0, 1)  # [heads, K, hd]
        vv = v.repeat_interleave(rep, dim=1).transpose(0, 1)
        qq = q.transpose(0, 1)                                 # [heads, B, hd]
        s = (qq @ kk.transpose(1, 2)) / math.sqrt(HEAD_DIM)
        s = s.masked_fill(~vis[None], float("-inf"))
        o = (torch.softmax(s, dim=-1) @ vv).transpose(0, 1).reshape(BLOCK, HEADS * HEAD_DIM)
        x = x + o @ w[p + "self_attn.o_proj.weight"].T
        xn = rmsnorm(x, w[p + "post_attention_layernorm.weight"])
        hmid = torch.nn.functional.silu(xn @ w[p + "mlp.gate_proj.weight"].T) * (xn @ w[p + "mlp.up_proj.weight"].T)
        x = x + hmid @ w[p + "mlp.down_proj.weight"].T
    return rmsnorm(x, w["norm.weight"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="tests/fixtures/dense-tiny")
    ap.add_argument("--out", default="tests/fixtures/dflash-tiny")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    os.makedirs(a.out, exist_ok=True)

    g = torch.Generator().manual_seed(SEED)
    w = make_weights(g)
    taps = torch.randn(CTX1 + EXTRA, len(TAPS) * H, generator=g)
    tgt = read_safetensors(os.path.join(a.target, "model.safetensors"))
    embed, head = tgt["model.embed_tokens.weight"], tgt["lm_head.weight"]

    dev = torch.device(a.device)
    wd = {k: v.to(dev) for k, v in w.items()}
    hid, nowin, logits = [], [], []
    for start, anchor in zip([CTX1, CTX1 + EXTRA], ANCHORS):
        ids = torch.tensor([anchor] + [MASK_ID] * (BLOCK - 1))
        emb = embed[ids].to(dev)
        with torch.no_grad():
            h = draft_forward(wd, taps[:start].to(dev), emb, start)
            h2 = draft_forward(wd, taps[:start].to(dev), emb, start, use_window=False)
        hid.append(h.cpu())
        nowin.append(h2.cpu())
        logits.append((h[1:] @ head.to(dev).T).cpu())

    cfg = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "hidden_act": "silu",
        "hidden_size": H,
        "intermediate_size": INTER,
        "num_hidden_layers": N_LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "max_position_embeddings": 4096,
        "rms_norm_eps": EPS,
        "rope_theta": THETA,
        "rope_scaling": None,
        "layer_types": LAYER_TYPES,
        "sliding_window": WINDOW,
        "use_sliding_window": True,
        "max_window_layers": N_LAYERS,
        "tie_word_embeddings": False,
        "vocab_size": VOCAB,
        "num_target_layers": 8,
        "block_size": BLOCK,
        "dflash_config": {"mask_token_id": MASK_ID, "target_layer_ids": TAPS},
        "torch_dtype": "bfloat16",
    }
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    write_safetensors(os.path.join(a.out, "model.safetensors"), w)
    taps.numpy().astype("<f4").tofile(os.path.join(a.out, "taps.f32"))
    torch.stack(hid).numpy().astype("<f4").tofile(os.path.join(a.out, "ref_hidden.f32"))
    torch.stack(nowin).numpy().astype("<f4").tofile(os.path.join(a.out, "ref_nowindow_hidden.f32"))
    torch.stack(logits).numpy().astype("<f4").tofile(os.path.join(a.out, "ref_logits.f32"))
    diff = max(float((x - y).abs().max() / y.abs().max()) for x, y in zip(hid, nowin))
    try:
        import transformers
        tv = transformers.__version__
    except Exception:
        tv = None
    ref = {
        "fixture": "dflash-tiny",
        "description": "random DFlash v1 draft (z-lab DFlashDraftModel layout) for dense-tiny; reference "
                       "outputs from tools/make_dflash_fixture.py's own PyTorch implementation",
        "target": "dense-tiny",
        "seed": SEED,
        "blocks": [{"start": CTX1, "anchor": ANCHORS[0]}, {"start": CTX1 + EXTRA, "anchor": ANCHORS[1]}],
        "block_size": BLOCK,
        "n_taps_rows": CTX1 + EXTRA,
        "taps_width": len(TAPS) * H,
        "files": {"taps.f32": [CTX1 + EXTRA, len(TAPS) * H], "ref_hidden.f32": [2, BLOCK, H],
                  "ref_nowindow_hidden.f32": [2, BLOCK, H], "ref_logits.f32": [2, BLOCK - 1, VOCAB]},
        "window_effect_max_rel": diff,
        "device": str(dev) + ((" " + torch.cuda.get_device_name(0)) if dev.type == "cuda" else ""),
        "torch": torch.__version__,
        "transformers": tv,
        "numpy": np.__version__,
        "python": sys.version.split()[0],
        "tf32": False,
    }
    with open(os.path.join(a.out, "ref.json"), "w") as f:
        json.dump(ref, f, indent=2)
        f.write("\n")
    print(json.dumps(ref, indent=1))


if __name__ == "__main__":
    main()
