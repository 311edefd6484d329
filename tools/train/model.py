"""The default model's target network in plain PyTorch: Qwen3.5 dense (qwen3_5_text), with a
chunked gated delta rule that trains fast without flash-linear-attention.

Why our own module and not transformers' Qwen3_5ForCausalLM: without flash-linear-attention
transformers runs GDN through torch_chunk_gated_delta_rule, which is correct but written for
inference (per-chunk writes into a preallocated output, four separate matmuls per chunk,
repeat_interleave of q/k), and its model code allocates masks and caches we do not need.
This file keeps the exact math and the exact parameter names of transformers 5.17
(`model.layers.N.linear_attn.in_proj_qkv.weight`, ...; docs/package-format.md, models.md), so
a state dict saved from here loads into Qwen3_5ForCausalLM and `splash pack` reads it.
tools/train/bench.py checks both claims on the GPU machine: chunk_gated_delta_rule against
transformers' fallback (forward and gradients) and the whole network's logits against
Qwen3_5ForCausalLM on the same weights.

What is here besides the network: the chunk system of the GDN solved by a block inverse made
of matmuls (tri_inv_unit_lower); a fused linear cross-entropy over the 151,680-way vocabulary
(LinearCE: no logits kept, elementwise parts compilable; the profile on the H200 put the
cross-entropy's fp32 traffic, not the GDN, at the top of a step); cached decoding for
generate.py (prefill of left-padded prompts, one-token steps with the GDN recurrence, the conv
state and a KV cache, and a fixed-shape variant of the step for CUDA-graph capture).

Shapes: B batch, T time, H hidden, V vocab; GDN Hk key heads of dk, Hv value heads of dv;
attention nh query heads, nkv kv heads of hd.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import sizes

# ---------------------------------------------------------------------------------------------
# Gated delta rule
# ---------------------------------------------------------------------------------------------


def l2norm(x, eps=1e-6):
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def tri_inv_unit_lower(a):
    """(I + strictly_lower(a))^-1 for a [..., C, C] with C a power of two, by block recursion:
    inv([[A, 0], [B, D]]) = [[A^-1, 0], [-D^-1 B A^-1, D^-1]], from 1x1 blocks up, all diagonal
    blocks of one size at once (2 batched matmuls per level, log2(C) levels).  Only matmuls, so
    it is fast on the GPU and cheap to differentiate, where torch.linalg.solve_triangular on
    thousands of 64x64 systems (cuBLAS trsm batched) is not."""
    C = a.shape[-1]
    batch = a.shape[:-2]
    L = a.tril(-1)
    X = torch.ones(*batch, C, 1, 1, dtype=a.dtype, device=a.device)
    s = 1
    while s < C:
        nb2 = C // (2 * s)
        d = torch.diagonal(L.reshape(*batch, nb2, 2, s, nb2, 2, s), dim1=-6, dim2=-3)   # [..., 2, s, 2, s, nb2]
        b21 = d[..., 1, :, 0, :, :].movedim(-1, -3)                                   # [..., nb2, s, s]
        x0, x1 = X[..., 0::2, :, :], X[..., 1::2, :, :]
        X = torch.cat([torch.cat([x0, torch.zeros_like(x0)], dim=-1),
                       torch.cat([-(x1 @ b21 @ x0), x1], dim=-1)], dim=-2)
        s *= 2
    return X.reshape(*batch, C, C)


TRI_SOLVE = "inverse"      # or "trsm": torch.linalg.solve_triangular (bench.py compares the two)


def chunk_gated_delta_rule(q, k, v, g, beta, chunk=64, initial_state=None, output_final_state=False,
                           use_qk_l2norm=True):
    """Chunked (WY/UT) gated delta rule, differentiable by autograd.

    q, k: [B, T, Hk, dk]; v: [B, T, Hv, dv]; g (log decay, <= 0), beta: [B, T, Hv];
    initial_state: [B, Hv, dk, dv] or None.  Returns (o [B, T, Hv, dv] in q's dtype,
    final state [B, Hv, dk, dv] fp32 or None).  Value head j reads key head j // (Hv/Hk).

    Same function as transformers' torch_chunk_gated_delta_rule (fp32 inside, q scaled by
    dk^-0.5 after the optional L2 norm).  Per chunk n of C steps, with c = cumsum(g) inside
    the chunk, Kb = beta*k, A = I + strictly_lower((Kb k^T) * exp(c_i - c_j)):
        U = A^-1 (beta v),  W = A^-1 (Kb exp(c))          (all chunks at once)
        v' = U - W S;  o = (q exp(c)) S + ((q k^T) * exp(c_i - c_j), i >= j) v'
        S  = exp(c_last) S + (k exp(c_last - c))^T v'     (the only sequential part)
    The sequential loop is one bmm and two baddbmm per chunk on [B*Hv] batches: [qd; w] S
    shares one product, and the outputs are gathered once at the end rather than written into
    a preallocated tensor, so autograd keeps no copies of the output.
    """
    out_dtype = q.dtype
    Bsz, T, Hk, dk = k.shape
    Hv, dv = v.shape[-2:]
    if Hk != Hv:
        q = q.repeat_interleave(Hv // Hk, dim=2)
        k = k.repeat_interleave(Hv // Hk, dim=2)
    q, k, v = (x.transpose(1, 2).float() for x in (q, k, v))            # [B, Hv, T, d]
    g, beta = (x.transpose(1, 2).float() for x in (g, beta))            # [B, Hv, T]
    if use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    q = q * dk ** -0.5
    C = chunk
    pad = (-T) % C
    if pad:
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        g, beta = (F.pad(x, (0, pad)) for x in (g, beta))
    N = (T + pad) // C
    BH = Bsz * Hv
    # chunk-major layout [N, BH, C, d] so that chunk n is one contiguous slice
    q, k, v = (x.reshape(BH, N, C, x.shape[-1]).transpose(0, 1) for x in (q, k, v))
    g, beta = (x.reshape(BH, N, C).transpose(0, 1) for x in (g, beta))
    c = g.cumsum(-1)                                                     # [N, BH, C]
    tri_upper = torch.ones(C, C, dtype=torch.bool, device=q.device).triu(1)
    decay = (c.unsqueeze(-1) - c.unsqueeze(-2)).masked_fill(tri_upper, float("-inf")).exp()  # [N,BH,C,C]
    kb = k * beta.unsqueeze(-1)
    vb = v * beta.unsqueeze(-1)
    a = (kb @ k.transpose(-1, -2)) * decay                               # lower incl. diagonal
    # unit lower triangular system: solve_triangular(unitriangular=True) reads only the strict
    # lower part (the upper part is 0 anyway: exp(-inf)), and its backward masks the same way
    rhs = torch.cat([vb, kb * c.exp().unsqueeze(-1)], dim=-1)            # [N, BH, C, dv+dk]
    if TRI_SOLVE == "trsm":
        uw = torch.linalg.solve_triangular(a, rhs, upper=False, unitriangular=True)
    else:
        uw = tri_inv_unit_lower(a) @ rhs
    u, w = uw[..., :dv], uw[..., dv:]
    intra = (q @ k.transpose(-1, -2)) * decay                            # [N, BH, C, C]
    qd = q * c.exp().unsqueeze(-1)
    kd_t = (k * (c[..., -1:] - c).exp().unsqueeze(-1)).transpose(-1, -2)  # [N, BH, dk, C]
    cd = c[..., -1].exp()[..., None, None]                               # [N, BH, 1, 1]
    qw = torch.cat([qd, w], dim=-2)                                      # [N, BH, 2C, dk]
    if initial_state is None:
        S = q.new_zeros(BH, dk, dv)
    else:
        S = initial_state.float().reshape(BH, dk, dv)
    outs = []
    for n in range(N):
        qs_ws = torch.bmm(qw[n], S)                                      # [BH, 2C, dv]
        v_new = u[n] - qs_ws[:, C:]
        outs.append(torch.baddbmm(qs_ws[:, :C], intra[n], v_new))
        S = torch.baddbmm(S * cd[n], kd_t[n], v_new)
    o = torch.stack(outs, 0)                                             # [N, BH, C, dv]
    o = o.transpose(0, 1).reshape(Bsz, Hv, N * C, dv)[:, :, :T]
    o = o.transpose(1, 2).contiguous().to(out_dtype)
    return o, (S.reshape(Bsz, Hv, dk, dv) if output_final_state else None)


def recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=None, use_qk_l2norm=True):
    """Token-by-token reference (models.md step 5), in the inputs' dtype (use float64 for
    checks).  Same argument shapes as chunk_gated_delta_rule; returns (o, final state)."""
    Bsz, T, Hk, dk = k.shape
    Hv, dv = v.shape[-2:]
    if Hk != Hv:
        q = q.repeat_interleave(Hv // Hk, dim=2)
        k = k.repeat_interleave(Hv // Hk, dim=2)
    if use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    q = q * dk ** -0.5
    S = q.new_zeros(Bsz, Hv, dk, dv) if initial_state is None else initial_state.to(q.dtype)
    outs = []
    for t in range(T):
        S = S * g[:, t].exp()[..., None, None]
        kt = k[:, t]                                                     # [B, Hv, dk]
        m = (S * kt.unsqueeze(-1)).sum(-2)                               # S^T k  [B, Hv, dv]
        delta = beta[:, t].unsqueeze(-1) * (v[:, t] - m)
        S = S + kt.unsqueeze(-1) * delta.unsqueeze(-2)
        outs.append((S * q[:, t].unsqueeze(-1)).sum(-2))
    return torch.stack(outs, 1), S


# ---------------------------------------------------------------------------------------------
# Layers (parameter names as transformers 5.17 qwen3_5)
# ---------------------------------------------------------------------------------------------


class ZeroCentredRMSNorm(nn.Module):
    """y = x * rsqrt(mean(x^2) + eps) * (1 + w), fp32 inside; w starts at 0."""

    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * (1.0 + self.weight.float())).type_as(x)


class GatedRMSNorm(nn.Module):
    """GDN output norm over dv: (w * rmsnorm(o)) * silu(z); w NOT offset by 1."""

    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x, z):
        dt = x.dtype
        xf = x.float()
        y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(dt)
        y = self.weight * y
        return (y * F.silu(z.float())).to(dt)


def rope_cos_sin(positions, rotary_dim, theta, dtype=torch.float32):
    """positions [T] or [B, T] -> cos, sin [..., T, rotary_dim] (NEOX halves: i pairs i+rd/2)."""
    inv = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, device=positions.device, dtype=torch.float32) / rotary_dim))
    f = positions.float().unsqueeze(-1) * inv
    e = torch.cat([f, f], dim=-1)
    return e.cos().to(dtype), e.sin().to(dtype)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def apply_rope(x, cos, sin):
    """x [B, heads, T, hd]; cos/sin [T, rd] or [B, T, rd]; rotates the first rd dims."""
    rd = cos.shape[-1]
    if cos.dim() == 3:
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    xr, xp = x[..., :rd], x[..., rd:]
    xr = xr * cos.to(x.dtype) + rotate_half(xr) * sin.to(x.dtype)
    return torch.cat([xr, xp], dim=-1) if xp.shape[-1] else xr


def attention(q, k, v, causal=True, mask=None):
    """q [B, nh, Tq, hd], k/v [B, nkv, Tk, hd]; GQA by repeating kv heads; mask: bool, True =
    visible, broadcast to [B, nh, Tq, Tk].  SDPA where this torch has it."""
    nh, nkv = q.shape[1], k.shape[1]
    if nkv != nh:
        k = k.repeat_interleave(nh // nkv, dim=1)
        v = v.repeat_interleave(nh // nkv, dim=1)
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None)
    s = (q.float() @ k.float().transpose(-1, -2)) * q.shape[-1] ** -0.5
    if mask is None and causal:
        Tq, Tk = q.shape[-2], k.shape[-2]
        mask = torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).tril(Tk - Tq)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return (s.softmax(-1) @ v.float()).to(q.dtype)


class GatedAttention(nn.Module):
    def __init__(self, s):
        super().__init__()
        H, self.nh, self.nkv, self.hd = s["hidden"], s["heads"], s["kv_heads"], s["head_dim"]
        self.q_proj = nn.Linear(H, self.nh * self.hd * 2, bias=False)   # [q_h0 | gate_h0 | q_h1 | ...]
        self.k_proj = nn.Linear(H, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(H, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, H, bias=False)
        self.q_norm = ZeroCentredRMSNorm(self.hd, s["rms_eps"])
        self.k_norm = ZeroCentredRMSNorm(self.hd, s["rms_eps"])

    def _qkv(self, x, cos, sin):
        B, T, _ = x.shape
        q, gate = self.q_proj(x).view(B, T, self.nh, 2 * self.hd).chunk(2, dim=-1)
        gate = gate.reshape(B, T, self.nh * self.hd)
        q = self.q_norm(q).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(B, T, self.nkv, self.hd)).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v, gate

    def forward(self, x, cos, sin, mask=None):
        B, T, _ = x.shape
        q, k, v, gate = self._qkv(x, cos, sin)
        o = attention(q, k, v, causal=True, mask=mask).transpose(1, 2).reshape(B, T, -1)
        return self.o_proj(o * torch.sigmoid(gate))

    def prefill(self, x, cos, sin, mask, cache, max_len):
        """Like forward with an explicit mask; keeps K/V in cache['k'/'v'] [B, nkv, max_len, hd]."""
        B, T, _ = x.shape
        q, k, v, gate = self._qkv(x, cos, sin)
        cache["k"] = k.new_zeros(B, self.nkv, max_len, self.hd)
        cache["v"] = v.new_zeros(B, self.nkv, max_len, self.hd)
        cache["k"][:, :, :T] = k
        cache["v"][:, :, :T] = v
        o = attention(q, k, v, causal=False, mask=mask).transpose(1, 2).reshape(B, T, -1)
        return self.o_proj(o * torch.sigmoid(gate))

    def step_static(self, x, cos, sin, key_mask, cache, n):
        """step() with fixed shapes for CUDA-graph capture: n is a long tensor [1], attention runs
        over the whole max_len cache with key_mask [B, max_len] (False = padding or not yet written)."""
        B = x.shape[0]
        q, k, v, gate = self._qkv(x, cos, sin)
        cache["k"].index_copy_(2, n, k.to(cache["k"].dtype))
        cache["v"].index_copy_(2, n, v.to(cache["v"].dtype))
        o = attention(q, cache["k"].to(q.dtype), cache["v"].to(q.dtype), causal=False, mask=key_mask[:, None, None, :])
        return self.o_proj(o.transpose(1, 2).reshape(B, 1, -1) * torch.sigmoid(gate))

    def step(self, x, cos, sin, key_mask, cache, n):
        """x [B, 1, H] at cache position n; key_mask [B, n+1] bool (False = padding)."""
        B = x.shape[0]
        q, k, v, gate = self._qkv(x, cos, sin)
        cache["k"][:, :, n:n + 1] = k.to(cache["k"].dtype)
        cache["v"][:, :, n:n + 1] = v.to(cache["v"].dtype)
        kk, vv = cache["k"][:, :, :n + 1].to(q.dtype), cache["v"][:, :, :n + 1].to(q.dtype)
        o = attention(q, kk, vv, causal=False, mask=key_mask[:, None, None, :])
        return self.o_proj(o.transpose(1, 2).reshape(B, 1, -1) * torch.sigmoid(gate))


class GatedDeltaNet(nn.Module):
    def __init__(self, s):
        super().__init__()
        H = s["hidden"]
        self.hk, self.hv, self.dk, self.dv = s["gdn_k_heads"], s["gdn_v_heads"], s["gdn_dk"], s["gdn_dv"]
        self.key_dim, self.value_dim = self.hk * self.dk, self.hv * self.dv
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.K = s["conv_kernel"]
        self.in_proj_qkv = nn.Linear(H, self.conv_dim, bias=False)      # [Q all heads | K | V]
        self.in_proj_z = nn.Linear(H, self.value_dim, bias=False)
        self.in_proj_b = nn.Linear(H, self.hv, bias=False)
        self.in_proj_a = nn.Linear(H, self.hv, bias=False)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, self.K, groups=self.conv_dim, bias=False,
                                padding=self.K - 1)
        self.dt_bias = nn.Parameter(torch.ones(self.hv))
        self.A_log = nn.Parameter(torch.zeros(self.hv))
        self.norm = GatedRMSNorm(self.dv, s["rms_eps"])
        self.out_proj = nn.Linear(self.value_dim, H, bias=False)

    def _post_conv(self, x, mixed):
        """mixed: conv output after SiLU [B, T, conv_dim] -> q, k, v, z, beta, g."""
        B, T, _ = mixed.shape
        q, k, v = mixed.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = q.reshape(B, T, self.hk, self.dk)
        k = k.reshape(B, T, self.hk, self.dk)
        v = v.reshape(B, T, self.hv, self.dv)
        z = self.in_proj_z(x).reshape(B, T, self.hv, self.dv)
        beta = torch.sigmoid(self.in_proj_b(x).float())
        g = -self.A_log.float().exp() * F.softplus(self.in_proj_a(x).float() + self.dt_bias.float())
        return q, k, v, z, beta, g

    def _out(self, o, z):
        B, T = o.shape[:2]
        o = self.norm(o.reshape(-1, self.dv), z.reshape(-1, self.dv)).reshape(B, T, self.value_dim)
        return self.out_proj(o)

    def forward(self, x, gdn_fn=None, cache=None):
        """cache: None, or a dict that receives the final recurrent state 'S' [B, Hv, dk, dv] and
        the conv state 'conv' [B, conv_dim, K-1] (the last K-1 pre-conv inputs)."""
        B, T, _ = x.shape
        pre = self.in_proj_qkv(x).transpose(1, 2)                        # [B, conv_dim, T]
        mixed = F.silu(F.conv1d(pre, self.conv1d.weight.to(pre.dtype), None,
                                padding=self.K - 1, groups=self.conv_dim)[..., :T]).transpose(1, 2)
        q, k, v, z, beta, g = self._post_conv(x, mixed)
        o, S = (gdn_fn or chunk_gated_delta_rule)(q, k, v, g=g, beta=beta, use_qk_l2norm=True,
                                                  output_final_state=cache is not None)
        if cache is not None:
            cache["S"] = S
            cache["conv"] = F.pad(pre, (self.K - 1, 0))[..., -(self.K - 1):]
        return self._out(o, z)

    def step(self, x, cache, inplace=False):
        """One token per row: x [B, 1, H]; replaces cache['S'], cache['conv'] (inplace: copies into
        the existing tensors, as a captured CUDA graph needs)."""
        pre = self.in_proj_qkv(x).transpose(1, 2)                        # [B, conv_dim, 1]
        win = torch.cat([cache["conv"].to(pre.dtype), pre], dim=-1)      # [B, conv_dim, K]
        if inplace:
            cache["conv"].copy_(win[..., 1:])
        else:
            cache["conv"] = win[..., 1:]
        mixed = F.silu((win * self.conv1d.weight[:, 0, :].to(pre.dtype)).sum(-1, keepdim=True)).transpose(1, 2)
        q, k, v, z, beta, g = self._post_conv(x, mixed)
        if self.hk != self.hv:
            q = q.repeat_interleave(self.hv // self.hk, dim=2)
            k = k.repeat_interleave(self.hv // self.hk, dim=2)
        q, k, v = l2norm(q[:, 0].float()) * self.dk ** -0.5, l2norm(k[:, 0].float()), v[:, 0].float()  # [B, Hv, d]
        S = cache["S"] * g[:, 0].exp()[..., None, None]
        m = (S * k.unsqueeze(-1)).sum(-2)                                # S^T k
        S = S + k.unsqueeze(-1) * (beta[:, 0].unsqueeze(-1) * (v - m)).unsqueeze(-2)
        if inplace:
            cache["S"].copy_(S)
        else:
            cache["S"] = S
        o = (S * q.unsqueeze(-1)).sum(-2)                                # [B, Hv, dv]
        return self._out(o.unsqueeze(1).to(x.dtype), z)


class MLP(nn.Module):
    def __init__(self, H, inter):
        super().__init__()
        self.gate_proj = nn.Linear(H, inter, bias=False)
        self.up_proj = nn.Linear(H, inter, bias=False)
        self.down_proj = nn.Linear(inter, H, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, s, layer_type):
        super().__init__()
        self.layer_type = layer_type
        if layer_type == "linear_attention":
            self.linear_attn = GatedDeltaNet(s)
        else:
            self.self_attn = GatedAttention(s)
        self.mlp = MLP(s["hidden"], s["ffn"])
        self.input_layernorm = ZeroCentredRMSNorm(s["hidden"], s["rms_eps"])
        self.post_attention_layernorm = ZeroCentredRMSNorm(s["hidden"], s["rms_eps"])

    def forward(self, x, cos, sin, gdn_fn=None):
        h = self.input_layernorm(x)
        if self.layer_type == "linear_attention":
            h = self.linear_attn(h, gdn_fn)
        else:
            h = self.self_attn(h, cos, sin)
        x = x + h
        return x + self.mlp(self.post_attention_layernorm(x))

    def prefill(self, x, cos, sin, valid, mask, cache, max_len):
        h = self.input_layernorm(x)
        if self.layer_type == "linear_attention":
            # padding rows enter the GDN as zeros: the state stays exactly zero through them
            h = self.linear_attn(h * valid.unsqueeze(-1).to(h.dtype), cache=cache)
        else:
            h = self.self_attn.prefill(h, cos, sin, mask, cache, max_len)
        x = x + h
        return x + self.mlp(self.post_attention_layernorm(x))

    def step(self, x, cos, sin, key_mask, cache, n, static=False):
        h = self.input_layernorm(x)
        if self.layer_type == "linear_attention":
            h = self.linear_attn.step(h, cache, inplace=static)
        elif static:
            h = self.self_attn.step_static(h, cos, sin, key_mask, cache, n)
        else:
            h = self.self_attn.step(h, cos, sin, key_mask, cache, n)
        x = x + h
        return x + self.mlp(self.post_attention_layernorm(x))


class TextModel(nn.Module):
    def __init__(self, s):
        super().__init__()
        self.embed_tokens = nn.Embedding(s["vocab"], s["hidden"])
        self.layers = nn.ModuleList(DecoderLayer(s, t) for t in sizes.layer_types(s["layers"]))
        self.norm = ZeroCentredRMSNorm(s["hidden"], s["rms_eps"])


class Qwen35LM(nn.Module):
    """Qwen3_5ForCausalLM with tied embeddings.  state_dict() keys are transformers' (`model.*`);
    there is no lm_head parameter (the logits use model.embed_tokens.weight)."""

    def __init__(self, s):
        super().__init__()
        self.spec = dict(s)
        self.model = TextModel(s)
        self.rotary_dim = int(s["head_dim"] * s["partial_rotary"])
        self.gdn_fn = None          # None: chunk_gated_delta_rule; bench.py swaps in others

    # -- init --------------------------------------------------------------------------------
    @torch.no_grad()
    def init_weights(self, seed, std=0.02):
        """Normal(0, std) matrices and embedding, residual outputs (o_proj, out_proj, down_proj)
        scaled by 1/sqrt(2 * layers); GDN decays as Mamba2/FLA: A ~ U(1, 16), dt ~ logU(1e-3,
        1e-1) with dt_bias = softplus^-1(dt); conv1d U(-1/2, 1/2) (PyTorch's default for k=4);
        zero-centred norms 0, gated norm 1."""
        g = torch.Generator().manual_seed(seed)
        L = self.spec["layers"]
        for name, p in sorted(self.named_parameters()):
            shape = tuple(p.shape)
            if name.endswith(("o_proj.weight", "out_proj.weight", "down_proj.weight")):
                v = torch.randn(shape, generator=g) * (std / math.sqrt(2 * L))
            elif name.endswith("conv1d.weight"):
                v = torch.rand(shape, generator=g) - 0.5
            elif name.endswith("A_log"):
                v = (torch.rand(shape, generator=g) * 15 + 1).log()
            elif name.endswith("dt_bias"):
                dt = torch.exp(torch.rand(shape, generator=g) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
                v = dt + torch.log(-torch.expm1(-dt))
            elif name.endswith("linear_attn.norm.weight"):
                v = torch.ones(shape)
            elif name.endswith("norm.weight"):
                v = torch.zeros(shape)
            elif p.dim() >= 2:
                v = torch.randn(shape, generator=g) * std
            else:
                raise RuntimeError("no init rule for " + name)
            p.copy_(v)

    # -- forward -----------------------------------------------------------------------------
    def hidden(self, ids, taps=(), positions=None):
        """ids [B, T] -> (final-normed hidden [B, T, H], {layer index: output of that layer})."""
        B, T = ids.shape
        x = self.model.embed_tokens(ids)
        if positions is None:
            positions = torch.arange(T, device=ids.device)
        cos, sin = rope_cos_sin(positions, self.rotary_dim, self.spec["rope_theta"])
        tapped = {}
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, self.gdn_fn)
            if i in taps:
                tapped[i] = x
        return self.model.norm(x), tapped

    def logits(self, h):
        return F.linear(h, self.model.embed_tokens.weight)

    # -- cached decoding (generate.py) -------------------------------------------------------
    def prefill(self, ids, valid, max_len):
        """Left-padded prompts: ids [B, T], valid [B, T] bool (False = padding, all at the left).
        Padding is invisible: attention masks it and the GDN layers see zeros there (their state
        stays zero), and each row's positions start at 0 on its first real token.  Returns
        (normed hidden of the last position [B, H], cache)."""
        B, T = ids.shape
        pos = (valid.long().cumsum(-1) - 1).clamp_min(0)                 # [B, T]
        cos, sin = rope_cos_sin(pos, self.rotary_dim, self.spec["rope_theta"])
        causal = torch.ones(T, T, dtype=torch.bool, device=ids.device).tril()
        mask = (causal.unsqueeze(0) & valid.unsqueeze(1)) | torch.eye(T, dtype=torch.bool, device=ids.device)
        mask = mask.unsqueeze(1)                                         # [B, 1, T, T]
        cache = {"layers": [dict() for _ in self.model.layers], "n": T, "key_mask": valid.clone(),
                 "pos": pos[:, -1] + 1, "max_len": max_len}
        x = self.model.embed_tokens(ids)
        for layer, c in zip(self.model.layers, cache["layers"]):
            x = layer.prefill(x, cos, sin, valid, mask, c, max_len)
        return self.model.norm(x[:, -1]), cache

    def static_cache(self, cache):
        """A prefill cache in fixed-shape form for decode_step_static: cache position and row
        positions as tensors, the key mask over the whole max_len (in place from here on)."""
        B, n = cache["key_mask"].shape
        km = torch.zeros(B, cache["max_len"], dtype=torch.bool, device=cache["key_mask"].device)
        km[:, :n] = cache["key_mask"]
        c = dict(cache)
        c.update(key_mask=km, n=torch.tensor([n], device=km.device), pos=cache["pos"].clone())
        for lc in c["layers"]:
            for k in ("S", "conv"):
                if k in lc:
                    lc[k] = lc[k].contiguous()
        return c

    def decode_step_static(self, tok, sc):
        """decode_step with every shape fixed and all state updated in place (CUDA-graph capture):
        tok [B] -> normed hidden [B, H].  The caller guards the cache length."""
        sc["key_mask"].index_fill_(1, sc["n"], True)
        cos, sin = rope_cos_sin(sc["pos"].unsqueeze(1), self.rotary_dim, self.spec["rope_theta"])
        x = self.model.embed_tokens(tok.unsqueeze(1))
        for layer, c in zip(self.model.layers, sc["layers"]):
            x = layer.step(x, cos, sin, sc["key_mask"], c, sc["n"], static=True)
        sc["n"].add_(1)
        sc["pos"].add_(1)
        return self.model.norm(x[:, 0])

    def decode_step(self, tok, cache):
        """tok [B] at each row's next position -> normed hidden [B, H]; advances the cache."""
        n = cache["n"]
        if n >= cache["max_len"]:
            raise ValueError("cache full")
        key_mask = torch.cat([cache["key_mask"], torch.ones_like(cache["key_mask"][:, :1])], dim=1)
        cos, sin = rope_cos_sin(cache["pos"].unsqueeze(1), self.rotary_dim, self.spec["rope_theta"])
        x = self.model.embed_tokens(tok.unsqueeze(1))
        for layer, c in zip(self.model.layers, cache["layers"]):
            x = layer.step(x, cos, sin, key_mask, c, n)
        cache.update(n=n + 1, key_mask=key_mask, pos=cache["pos"] + 1)
        return self.model.norm(x[:, 0])

    def forward(self, ids):
        return self.logits(self.hidden(ids)[0])

    def loss(self, ids, targets, chunk=4096, reduction="mean"):
        """Cross-entropy of next-token targets [B, T] (-100 = ignored), the vocabulary projection
        computed chunk by chunk under activation checkpointing, so [tokens, V] logits never exist
        whole (V = 151680: 4096 rows of fp32 logits are 2.5 GB)."""
        h, _ = self.hidden(ids)
        return chunked_ce(h.reshape(-1, h.shape[-1]), self.model.embed_tokens.weight, targets.reshape(-1),
                          chunk=chunk, reduction=reduction)


def _ce_chunk(h, w, t, weights):
    lg = F.linear(h, w).float()
    ce = F.cross_entropy(lg, t, ignore_index=-100, reduction="none")
    return (ce * weights).sum() if weights is not None else ce.sum()


def _lse_target(z, t):
    """z [n, V] logits, t [n] (-100 allowed) -> (logsumexp [n] fp32, z[t] [n] fp32)."""
    zf = z.float()
    return torch.logsumexp(zf, -1), zf.gather(1, t.clamp_min(0).unsqueeze(1)).squeeze(1)


def _dlogits(z, lse, t, scale):
    """(softmax(z) - onehot(t)) * scale, in z's dtype: the gradient of the CE sum."""
    p = torch.exp(z.float() - lse.unsqueeze(1))
    hit = torch.arange(z.shape[1], device=z.device).unsqueeze(0) == t.unsqueeze(1)
    return ((p - hit.float()) * scale.unsqueeze(1)).to(z.dtype)


CE_IMPL = "checkpoint"     # "checkpoint": chunks under activation checkpointing; "fused": LinearCE
CE_FNS = {"lse": _lse_target, "dlogits": _dlogits}   # bench.py may swap in torch.compile'd versions


class LinearCE(torch.autograd.Function):
    """sum_rows weight * CE(h @ w^T, t) without keeping any logits: the forward keeps only the
    logsumexp per row; the backward recomputes each chunk's logits and turns them straight into
    the logit gradient (softmax - onehot), so one chunk of [rows, V] exists at a time and, with
    CE_FNS compiled, the elementwise work is one pass over it.  Matmuls in mm_dtype (bf16 on
    the GPU, as autocast would), gradients of w accumulated in fp32."""

    @staticmethod
    def forward(ctx, h, w, t, weights, chunk, mm_dtype):
        hb, wb = h.to(mm_dtype), w.to(mm_dtype)
        scale = (t != -100).float() * (weights.float() if weights is not None else 1.0)
        total = h.new_zeros((), dtype=torch.float32)
        lses = []
        for i in range(0, h.shape[0], chunk):
            z = hb[i:i + chunk] @ wb.t()
            lse, zt = CE_FNS["lse"](z, t[i:i + chunk])
            lses.append(lse)
            total = total + ((lse - zt) * scale[i:i + chunk]).sum()
        ctx.save_for_backward(hb, wb, t, scale, torch.cat(lses))
        ctx.chunk, ctx.h_dtype, ctx.w_dtype = chunk, h.dtype, w.dtype
        return total

    @staticmethod
    def backward(ctx, gout):
        hb, wb, t, scale, lse = ctx.saved_tensors
        dh = torch.empty_like(hb)
        dw = torch.zeros(wb.shape, dtype=torch.float32, device=wb.device)
        sc = scale * gout
        for i in range(0, hb.shape[0], ctx.chunk):
            j = slice(i, i + ctx.chunk)
            z = hb[j] @ wb.t()
            g = CE_FNS["dlogits"](z, lse[j], t[j], sc[j])
            dh[j] = g @ wb
            dw += (g.t() @ hb[j]).float()
        return dh.to(ctx.h_dtype), dw.to(ctx.w_dtype), None, None, None, None


def chunked_ce(h, w, targets, chunk=4096, reduction="mean", weights=None):
    """sum or mean over valid targets of CE(h @ w^T, targets), optionally weighted per row."""
    if CE_IMPL == "fused" and torch.is_grad_enabled():
        mm = torch.bfloat16 if h.is_cuda else h.dtype
        with torch.autocast(device_type=h.device.type, enabled=False):
            total = LinearCE.apply(h, w, targets, weights, chunk, mm)
        if reduction == "sum":
            return total
        den = ((weights * (targets != -100)).sum().clamp_min(1e-6) if weights is not None
               else (targets != -100).sum().clamp_min(1))
        return total / den
    total = h.new_zeros((), dtype=torch.float32)
    for i in range(0, h.shape[0], chunk):
        wi = weights[i:i + chunk] if weights is not None else None
        if torch.is_grad_enabled() and h.requires_grad:
            total = total + checkpoint(_ce_chunk, h[i:i + chunk], w, targets[i:i + chunk], wi, use_reentrant=False)
        else:
            total = total + _ce_chunk(h[i:i + chunk], w, targets[i:i + chunk], wi)
    if reduction == "sum":
        return total
    if weights is not None:
        den = (weights * (targets != -100)).sum().clamp_min(1e-6)
    else:
        den = (targets != -100).sum().clamp_min(1)
    return total / den


# ---------------------------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------------------------


def hf_state_dict(model, dtype=torch.bfloat16):
    """{transformers name: CPU tensor}; tied, so no lm_head.weight (save_pretrained omits it too)."""
    return {k: v.detach().to("cpu", dtype).contiguous() for k, v in model.state_dict().items()}


def param_groups(model, weight_decay):
    """AdamW groups: decay on matrices (embedding included), none on norms, A_log, dt_bias, conv."""
    decay, no = [], []
    for n, p in model.named_parameters():
        (decay if p.dim() >= 2 and "conv1d" not in n else no).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no, "weight_decay": 0.0}]
