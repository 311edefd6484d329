"""DFlash v1 draft in plain PyTorch, laid out as the z-lab `dflash` code lays it out
(dflash/model.py: DFlashDraftModel, Qwen3DFlashAttention, Qwen3DFlashDecoderLayer), so that a
checkpoint saved here is a z-lab checkpoint: config.json with architectures
["DFlashDraftModel"], block_size, dflash_config {mask_token_id, target_layer_ids}, and
safetensors tensors fc.weight [H, n_taps*H], hidden_norm.weight, layers.N.* (Qwen3 layer names),
norm.weight.  No embedding, no lm_head: the target's embed_tokens and (tied) lm_head are used.

The math (z-lab, shared/spec/dflash.md):
  ctx = hidden_norm(fc(concat of the target's layer outputs at target_layer_ids))   [B, C, H]
  block = target.embed([anchor, MASK, ..., MASK])                                   [B, Q, H]
  per layer: queries from the block only; keys/values = [k_proj(ctx); k_proj(block)] (same for
  v), k_norm on both, q_norm on q, full-dim RoPE (Qwen3 rotate_half) with context keys at their
  real positions and the block at anchor .. anchor+B-1; full_attention layers are
  bidirectional inside the block (z-lab: is_causal absent and not sliding -> not causal).
  Norms are plain Qwen3 RMSNorm (w * x_hat, w starts at 1), eps and rope_theta from the config.
  out = norm(h); logits = target lm_head(out).

Training (SpecForge recipe, dflash.md "Training"): random anchors in the answer part of the
target's own generations, one block per anchor, all blocks of a sequence in one query sequence
with a mask: block j sees context positions < anchor_j and its own block only; labels at block
position k are the tokens at anchor+k; loss weights exp(-(k-1)/gamma).
"""

import json
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

import model as M
import sizes
import st_io


class RMSNorm(nn.Module):
    """Qwen3RMSNorm: w * (x * rsqrt(mean(x^2) + eps)), fp32 inside, w starts at 1."""

    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        dt = x.dtype
        xf = x.float()
        return self.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(dt)


class DraftAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        H = cfg["hidden_size"]
        self.nh, self.nkv, self.hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        self.q_proj = nn.Linear(H, self.nh * self.hd, bias=False)
        self.k_proj = nn.Linear(H, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(H, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, H, bias=False)
        self.q_norm = RMSNorm(self.hd, cfg["rms_norm_eps"])
        self.k_norm = RMSNorm(self.hd, cfg["rms_norm_eps"])

    def forward(self, x, ctx, rope_q, rope_k, mask):
        """x [B, Q, H] block; ctx [B, C, H]; rope_q cos/sin [B, Q, hd]; rope_k [B, C+Q, hd];
        mask bool [B, 1, Q, C+Q] (True = visible) or None (everything visible)."""
        B, Q, _ = x.shape
        C = ctx.shape[1]
        q = self.q_norm(self.q_proj(x).view(B, Q, self.nh, self.hd)).transpose(1, 2)
        k = torch.cat([self.k_proj(ctx), self.k_proj(x)], dim=1).view(B, C + Q, self.nkv, self.hd)
        v = torch.cat([self.v_proj(ctx), self.v_proj(x)], dim=1).view(B, C + Q, self.nkv, self.hd)
        k = self.k_norm(k).transpose(1, 2)
        v = v.transpose(1, 2)
        q = M.apply_rope(q, *rope_q)
        k = M.apply_rope(k, *rope_k)
        o = M.attention(q, k, v, causal=False, mask=mask)
        return self.o_proj(o.transpose(1, 2).reshape(B, Q, -1))


class DraftLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        H = cfg["hidden_size"]
        self.input_layernorm = RMSNorm(H, cfg["rms_norm_eps"])
        self.self_attn = DraftAttention(cfg)
        self.post_attention_layernorm = RMSNorm(H, cfg["rms_norm_eps"])
        self.mlp = M.MLP(H, cfg["intermediate_size"])

    def forward(self, x, ctx, rope_q, rope_k, mask):
        x = x + self.self_attn(self.input_layernorm(x), ctx, rope_q, rope_k, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDraft(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        H = cfg["hidden_size"]
        self.taps = list(cfg["dflash_config"]["target_layer_ids"])
        self.mask_token_id = int(cfg["dflash_config"]["mask_token_id"])
        self.block_size = int(cfg.get("block_size", cfg["dflash_config"].get("block_size", 16)))
        self.layers = nn.ModuleList(DraftLayer(cfg) for _ in range(cfg["num_hidden_layers"]))
        self.norm = RMSNorm(H, cfg["rms_norm_eps"])
        self.fc = nn.Linear(len(self.taps) * H, H, bias=False)
        self.hidden_norm = RMSNorm(H, cfg["rms_norm_eps"])
        self.theta = float(cfg.get("rope_theta", cfg.get("rope_parameters", {}).get("rope_theta", 10000.0)))

    @torch.no_grad()
    def init_weights(self, seed, std=0.02):
        g = torch.Generator().manual_seed(seed)
        for name, p in sorted(self.named_parameters()):
            if p.dim() >= 2:
                p.copy_(torch.randn(tuple(p.shape), generator=g) * std)
            else:
                p.fill_(1.0)

    def context(self, taps_cat):
        """taps_cat [B, C, n_taps*H] (the target's layer outputs, concatenated in tap order)."""
        return self.hidden_norm(self.fc(taps_cat))

    def forward(self, noise_emb, ctx, pos_q, pos_ctx, mask):
        """noise_emb [B, Q, H]; ctx [B, C, H] from context(); pos_q [B, Q]; pos_ctx [B, C];
        mask [B, 1, Q, C+Q] bool or None.  Returns normed hidden [B, Q, H]."""
        hd = self.cfg["head_dim"]
        rope_q = M.rope_cos_sin(pos_q, hd, self.theta)
        rope_k = M.rope_cos_sin(torch.cat([pos_ctx, pos_q], dim=1), hd, self.theta)
        h = noise_emb
        for layer in self.layers:
            h = layer(h, ctx, rope_q, rope_k, mask)
        return self.norm(h)

    # -- checkpoints (z-lab layout) ------------------------------------------------------------
    def save(self, out_dir, dtype=torch.bfloat16, extra=None):
        os.makedirs(out_dir, exist_ok=True)
        sd = {k: v.detach().to("cpu", dtype) for k, v in sorted(self.state_dict().items())}
        st_io.save_file(sd, os.path.join(out_dir, "model.safetensors"), {"format": "pt"})
        cfg = dict(self.cfg)
        if extra:
            cfg.update(extra)
        with open(os.path.join(out_dir, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2)
            f.write("\n")

    @classmethod
    def load(cls, d, device="cpu"):
        with open(os.path.join(d, "config.json")) as f:
            cfg = json.load(f)
        m = cls(cfg)
        sd = st_io.load_file(os.path.join(d, "model.safetensors"))
        m.load_state_dict({k: v.float() for k, v in sd.items()}, strict=True)
        return m.to(device)


def make_config(target_spec, mask_token_id, block_size=None, ffn_mult=None, layers=None):
    d = dict(sizes.DRAFT)
    if ffn_mult:
        d["ffn_mult"] = ffn_mult
    if layers:
        d["layers"] = layers
    cfg = sizes.draft_config(target_spec, mask_token_id, d)
    if block_size:
        cfg["block_size"] = block_size
        cfg["dflash_config"]["block_size"] = block_size
    return cfg


# ---------------------------------------------------------------------------------------------
# Training batch (SpecForge layout)
# ---------------------------------------------------------------------------------------------


def build_blocks(ids, lengths, loss_start, n_anchors, block, mask_id, gen):
    """ids [B, L] long (right-padded), lengths [B], loss_start [B] (first answer position).
    Anchors: up to n_anchors per row, drawn without replacement from positions
    a in [max(loss_start-1, 1), length-2] (so at least the label at a+1 exists and lies in the
    answer).  Returns block_ids [B, A*block], labels [B, A*block] (-100 where none), pos_q
    [B, A*block], anchors [B, A] (-1 = unused slot)."""
    B, L = ids.shape
    dev = ids.device
    anchors = torch.full((B, n_anchors), -1, dtype=torch.long)
    for b in range(B):
        lo, hi = max(int(loss_start[b]) - 1, 1), int(lengths[b]) - 2
        if hi < lo:
            continue
        cand = torch.arange(lo, hi + 1)
        pick = cand[torch.randperm(len(cand), generator=gen)[:n_anchors]].sort().values
        anchors[b, :len(pick)] = pick
    anchors = anchors.to(dev)
    valid = anchors >= 0
    a = anchors.clamp_min(0)
    k = torch.arange(block, device=dev)
    pos = a.unsqueeze(-1) + k                                        # [B, A, block]
    block_ids = torch.full((B, n_anchors, block), mask_id, dtype=torch.long, device=dev)
    block_ids[:, :, 0] = torch.gather(ids, 1, a)
    lab_pos = pos.clamp_max(L - 1)
    labels = torch.gather(ids, 1, lab_pos.reshape(B, -1)).reshape(B, n_anchors, block)
    ok = (pos < lengths.to(dev).view(B, 1, 1)) & valid.unsqueeze(-1) & (k > 0)
    labels = labels.masked_fill(~ok, -100)
    return block_ids.reshape(B, -1), labels.reshape(B, -1), pos.reshape(B, -1), anchors


def block_mask(anchors, ctx_len, block):
    """[B, 1, A*block, ctx_len + A*block] bool: block j sees context c < anchor_j and its own
    block (bidirectionally).  Unused anchors (-1) see only their own block (no NaN rows)."""
    B, A = anchors.shape
    dev = anchors.device
    c = torch.arange(ctx_len, device=dev)
    ctx_vis = c.view(1, 1, -1) < anchors.clamp_min(0).unsqueeze(-1)   # [B, A, C]
    ctx_vis = ctx_vis.unsqueeze(2).expand(B, A, block, ctx_len).reshape(B, A * block, ctx_len)
    j = torch.arange(A, device=dev).repeat_interleave(block)
    own = (j.view(-1, 1) == j.view(1, -1)).unsqueeze(0).expand(B, -1, -1)
    return torch.cat([ctx_vis, own], dim=-1).unsqueeze(1)


def loss_weights(labels, block, gamma):
    """exp(-(k-1)/gamma) at block position k >= 1, by column of the flattened [B, A*block]."""
    k = torch.arange(labels.shape[1], device=labels.device) % block
    w = torch.exp(-(k.float() - 1) / gamma)
    return w.unsqueeze(0).expand_as(labels).float()


# ---------------------------------------------------------------------------------------------
# Speculative decoding in PyTorch (for measuring acceptance; the engine does the real thing)
# ---------------------------------------------------------------------------------------------


def _probs(logits, temperature):
    return torch.softmax(logits.float() / temperature, dim=-1)


@torch.no_grad()
def speculative_generate(target, draft, prompt, max_new, temperature=0.0, block=None, stop_ids=(), gen=None):
    """One prompt (list of ids).  Each cycle: the target's layer outputs for the committed
    tokens are the draft's context, the block [anchor, MASK...] gets B-1 proposals, one target
    forward over committed + block verifies them (greedy prefix match at T=0, lossless rejection
    sampling at T>0; z-lab dflash_generate).  Every forward recomputes the whole sequence, which
    is exact (causal) and cheap at these lengths.  Returns (new tokens, tokens per cycle)."""
    dev = target.model.embed_tokens.weight.device
    B = block or draft.block_size
    taps = draft.taps
    seq = list(prompt)
    ids = torch.tensor([seq], device=dev)
    h, tapped = target.hidden(ids, taps=set(taps))
    last = target.logits(h[:, -1]).float()
    # sampling happens on the CPU (gen is a CPU generator): a few rows of V floats per cycle
    first = int(last.argmax(-1)) if temperature <= 0 else int(torch.multinomial(_probs(last, temperature).cpu(), 1, generator=gen))
    feats = torch.cat([tapped[t] for t in taps], dim=-1)                # [1, n, n_taps*H]
    out, per_cycle = [first], []
    anchor = first
    while len(out) < max_new and anchor not in stop_ids:
        n = len(seq)                                                     # anchor sits at position n
        block_ids = torch.full((1, B), draft.mask_token_id, device=dev)
        block_ids[0, 0] = anchor
        emb = target.model.embed_tokens(block_ids)
        ctx = draft.context(feats[:, :n])
        pos_q = torch.arange(n, n + B, device=dev).unsqueeze(0)
        pos_c = torch.arange(n, device=dev).unsqueeze(0)
        dh = draft(emb, ctx, pos_q, pos_c, None)
        dlog = target.logits(dh[:, 1:]).float()[0]                       # [B-1, V]
        if temperature <= 0:
            prop = dlog.argmax(-1)
            q = None
        else:
            q = _probs(dlog, temperature).cpu()
            prop = torch.multinomial(q, 1, generator=gen).squeeze(-1).to(dev)
        full = torch.tensor([seq + [anchor]], device=dev)
        full = torch.cat([full, prop.unsqueeze(0)], dim=1)              # [1, n + B]
        h, tapped = target.hidden(full, taps=set(taps))
        tlog = target.logits(h[0, n:]).float()                           # [B, V]: predictions for n+1 .. n+B
        if temperature <= 0:
            pred = tlog.argmax(-1)
            m = int((prop == pred[:-1]).long().cumprod(0).sum())
            bonus = int(pred[m])
        else:
            p = _probs(tlog, temperature).cpu()
            prop = prop.cpu()
            m = 0
            while m < B - 1:
                t = int(prop[m])
                u = float(torch.rand((), generator=gen))
                if u * float(q[m, t]) < float(p[m, t]):
                    m += 1
                else:
                    break
            if m == B - 1:
                bonus = int(torch.multinomial(p[m], 1, generator=gen))
            else:
                r = (p[m] - q[m]).clamp_min(0)
                r = r / r.sum() if float(r.sum()) > 0 else p[m]
                bonus = int(torch.multinomial(r, 1, generator=gen))
        accepted = [int(x) for x in prop[:m]]
        seq = seq + [anchor] + accepted
        new = accepted + [bonus]
        stop_at = next((i for i, t in enumerate(new) if t in stop_ids), None)
        if stop_at is not None:
            new = new[:stop_at + 1]
        out += new
        per_cycle.append(len(new))
        feats = torch.cat([tapped[t] for t in taps], dim=-1)
        anchor = new[-1]
        if stop_at is not None:
            break
    return out[:max_new], per_cycle
