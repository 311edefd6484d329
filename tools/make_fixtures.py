#!/usr/bin/env python3
"""Make Splash's test fixtures: tiny random Qwen3.5 checkpoints with reference logits.

Usage:  python3 tools/make_fixtures.py --out DIR [--device cuda]

Needs PyTorch, transformers 5.17 (qwen3_5 / qwen3_5_moe) and numpy.  It downloads
nothing.  Everything is deterministic: every random number comes from a CPU
torch.Generator seeded from SEED below, so the weights and token ids do not depend
on the device; the reference logits are computed on the device (GPU by default) in
fp32 with TF32 off and eager attention / eager experts.

Fixtures written under DIR (one folder each):

  dense-tiny       Qwen3_5ForCausalLM (text config qwen3_5_text), saved by save_pretrained
                   in bf16.
  moe-tiny         Qwen3_5MoeForCausalLM (qwen3_5_moe_text), saved by save_pretrained in
                   bf16 (whatever expert form transformers writes; recorded in ref.json).
  moe-tiny-fused   the same weights as moe-tiny, safetensors written by this script with
                   the experts in the other on-disk form, text tensors under
                   model.language_model., a nested multimodal config
                   (Qwen3_5MoeForConditionalGeneration) and two fake mtp.* tensors.
                   Same reference logits as moe-tiny.
  dense-tiny-mlx   dense-tiny converted the way mlx-lm converts a qwen3_5 model to
                   affine 4-bit group 64 (see MLX notes below); reference logits from the
                   dequantised weights.

Token ids: dense fixtures use T random ids from SEED; the MoE fixtures use the one of
1024 random candidate sequences whose smallest router top-k logit gap is largest (so no
expert choice of the reference is a near-tie).

Each folder: config.json, model.safetensors, ref.json, ref_logits.f32 (float32
little-endian, row-major [T, vocab]: logits at every position of one full-prefill
forward over ref.json's token_ids) and tensors.txt (name, dtype, shape of every tensor).
"""

import argparse
import copy
import datetime
import json
import math
import os
import platform
import re
import struct
import sys
import traceback

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np
import torch

SEED = 20251130          # master seed; each fixture derives its own from it
T = 200                  # tokens in the reference sequence (> 3 GDN chunks of 64)
PREFIX = 130             # prefill length for the cache-consistency checks
CHUNK = 7                # multi-token step size for the verify-shaped check
VOCAB = 512
HIDDEN = 128
N_LAYERS = 8
GROUP = 64               # MLX quantisation group size
BITS = 4

ROPE = {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25}

# A small vision tower config, only so that the nested multimodal configs are complete
# (the fixtures carry no vision tensors).
VISION_TINY = {
    "depth": 1,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_heads": 2,
    "in_channels": 3,
    "patch_size": 16,
    "temporal_patch_size": 2,
    "spatial_merge_size": 2,
    "out_hidden_size": HIDDEN,
    "num_position_embeddings": 16,
}


def layer_types(n):
    return ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(n)]


DENSE_KW = dict(
    vocab_size=VOCAB,
    hidden_size=HIDDEN,
    intermediate_size=192,
    num_hidden_layers=N_LAYERS,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    hidden_act="silu",
    max_position_embeddings=4096,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    attention_bias=False,
    linear_conv_kernel_dim=4,
    linear_num_key_heads=2,
    linear_num_value_heads=6,
    linear_key_head_dim=32,
    linear_value_head_dim=48,
)

MOE_KW = dict(
    vocab_size=VOCAB,
    hidden_size=HIDDEN,
    num_hidden_layers=N_LAYERS,
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=64,
    hidden_act="silu",
    max_position_embeddings=4096,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    attention_bias=False,
    linear_conv_kernel_dim=4,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=32,
    linear_value_head_dim=48,
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=64,
    shared_expert_intermediate_size=64,
)

DTYPE_NOTE = (
    "Weights on disk are bf16. Reference = transformers {tv} in float32 on the bf16-rounded "
    "weights (the exact values on disk, upcast), on {dev}, eager attention, eager experts, "
    "torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False, "
    "float32 matmul precision 'highest', batch 1, no attention mask, positions 0..T-1. "
    "ref_logits.f32 is float32 little-endian, row-major [T, vocab]."
)


# ----------------------------------------------------------------------------------
# safetensors, written and read by hand (full control over names and dtypes)
# ----------------------------------------------------------------------------------

def tensor_entry(t):
    """(dtype string, shape, raw little-endian bytes) for a torch tensor or numpy array."""
    if isinstance(t, np.ndarray):
        if t.dtype == np.uint32:
            return "U32", list(t.shape), np.ascontiguousarray(t.astype("<u4")).tobytes()
        if t.dtype == np.float32:
            return "F32", list(t.shape), np.ascontiguousarray(t.astype("<f4")).tobytes()
        raise TypeError(f"unsupported numpy dtype {t.dtype}")
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return "BF16", list(t.shape), t.view(torch.int16).numpy().astype("<i2").tobytes()
    if t.dtype == torch.float16:
        return "F16", list(t.shape), t.numpy().astype("<f2").tobytes()
    if t.dtype == torch.float32:
        return "F32", list(t.shape), t.numpy().astype("<f4").tobytes()
    raise TypeError(f"unsupported torch dtype {t.dtype}")


def write_safetensors(path, tensors, metadata=None):
    """tensors: name -> torch tensor / numpy array. Names sorted, data packed in that order."""
    names = sorted(tensors)
    entries = {n: tensor_entry(tensors[n]) for n in names}
    header = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    off = 0
    for n in names:
        dt, shape, raw = entries[n]
        header[n] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    hb = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hb += b" " * ((8 - len(hb) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for n in names:
            f.write(entries[n][2])


def read_safetensors_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n).decode("utf-8"))


def write_tensor_list(fixture_dir):
    """tensors.txt: one line per tensor, 'name<TAB>dtype<TAB>[shape]', sorted by name."""
    lines = []
    for fn in sorted(os.listdir(fixture_dir)):
        if not fn.endswith(".safetensors"):
            continue
        hdr = read_safetensors_header(os.path.join(fixture_dir, fn))
        lines.append(f"# file: {fn}")
        meta = hdr.pop("__metadata__", None)
        if meta:
            lines.append(f"# metadata: {json.dumps(meta, sort_keys=True)}")
        lines.append(f"# tensors: {len(hdr)}")
        for name in sorted(hdr):
            e = hdr[name]
            lines.append(f"{name}\t{e['dtype']}\t[{', '.join(str(d) for d in e['shape'])}]")
    with open(os.path.join(fixture_dir, "tensors.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


# ----------------------------------------------------------------------------------
# weights
# ----------------------------------------------------------------------------------

ZERO_CENTRED_SUFFIXES = (
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
    "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
)


def is_zero_centred_norm(name):
    if name.endswith(ZERO_CENTRED_SUFFIXES):
        return True
    # the final norm: model.norm.weight / model.language_model.norm.weight
    return re.fullmatch(r"(model\.)?(language_model\.)?norm\.weight", name) is not None


def randomize_(model, seed):
    """Give every parameter a random value (CPU generator, sorted names), rounded to bf16.

    Matrices: normal * 1/sqrt(fan_in) (so each projection keeps unit scale; embeddings
    normal * 1). Zero-centred norm offsets: normal * 0.1. GDN gated norm: 1 + normal * 0.1.
    A_log = log(U(0.05, 1.0)) (decays exp(g) spread over (0, 1), long memories
    included), dt_bias normal * 0.5, conv1d normal * 0.5.
    """
    g = torch.Generator().manual_seed(seed)
    rules = {}
    for name, p in sorted(model.named_parameters()):
        shape = tuple(p.shape)

        def normal(std, mean=0.0):
            return torch.randn(shape, generator=g, dtype=torch.float32) * std + mean

        if name.endswith("embed_tokens.weight"):
            v, rule = normal(1.0), "normal*1"
        elif name.endswith("linear_attn.norm.weight"):
            v, rule = normal(0.1, 1.0), "1+normal*0.1"
        elif p.ndim == 1 and is_zero_centred_norm(name):
            v, rule = normal(0.1), "normal*0.1 (zero-centred offset)"
        elif name.endswith("A_log"):
            v = torch.empty(shape, dtype=torch.float32).uniform_(0.05, 1.0, generator=g).log()
            rule = "log(U(0.05,1))"
        elif name.endswith("dt_bias"):
            v, rule = normal(0.5), "normal*0.5"
        elif name.endswith("conv1d.weight"):
            v, rule = normal(0.5), "normal*0.5"
        elif p.ndim in (2, 3):
            fan_in = shape[-1]
            v, rule = normal(1.0 / math.sqrt(fan_in)), f"normal/sqrt({fan_in})"
        else:
            raise RuntimeError(f"no randomisation rule for parameter {name} {shape}")
        with torch.no_grad():
            p.copy_(v.to(torch.bfloat16).to(p.dtype))
        key = re.sub(r"\.\d+\.", ".N.", name)
        rules[key] = rule
    return rules


def state_dict_fp32(model):
    return {k: v.detach().to("cpu", torch.float32).clone() for k, v in model.state_dict().items()}


# ----------------------------------------------------------------------------------
# transformers helpers
# ----------------------------------------------------------------------------------

def set_eager(model, moe):
    for meth, arg in (("set_attn_implementation", "eager"), ("set_experts_implementation", "eager")):
        if meth == "set_experts_implementation" and not moe:
            continue
        fn = getattr(model, meth, None)
        if fn is not None:
            try:
                fn(arg)
            except Exception as e:  # noqa: BLE001
                print(f"  note: {meth}({arg!r}) failed: {e!r}")


def load_ref_model(cls, path, moe, device):
    kw = dict(dtype=torch.float32, attn_implementation="eager")
    if moe:
        kw["experts_implementation"] = "eager"
    try:
        m = cls.from_pretrained(path, **kw)
    except TypeError as e:
        print(f"  note: from_pretrained({sorted(kw)}) failed ({e!r}); retrying with dtype only")
        m = cls.from_pretrained(path, dtype=torch.float32)
    set_eager(m, moe)
    m = m.to(device).eval()
    impl = {}
    for a in ("_attn_implementation", "_experts_implementation"):
        impl[a] = getattr(m.config, a, None)
    print(f"  loaded {cls.__name__} from {path}: {impl}")
    return m


def rel_l2(ref, x):
    ref = ref.double()
    x = x.double()
    return float((ref - x).norm() / ref.norm())


@torch.no_grad()
def full_prefill(model, ids):
    return model(input_ids=ids, use_cache=False).logits[0].float()


@torch.no_grad()
def cached_run(model, ids, prefix, step):
    out = model(input_ids=ids[:, :prefix], use_cache=True)
    cache = out.past_key_values
    pieces = [out.logits[0].float()]
    t = prefix
    n_total = ids.shape[1]
    while t < n_total:
        n = min(step, n_total - t)
        o = model(input_ids=ids[:, t:t + n], past_key_values=cache, use_cache=True)
        cache = o.past_key_values
        pieces.append(o.logits[0].float())
        t += n
    return torch.cat(pieces, 0)


def consistency(model, ids, full):
    res = {}
    a = cached_run(model, ids, PREFIX, 1)
    b = cached_run(model, ids, PREFIX, CHUNK)
    res[f"prefill{PREFIX}_then_1tok_steps_rel_l2"] = rel_l2(full, a)
    res[f"prefill{PREFIX}_then_{CHUNK}tok_chunks_rel_l2"] = rel_l2(full, b)
    res[f"prefill{PREFIX}_then_1tok_steps_max_abs"] = float((full - a).abs().max())
    res[f"prefill{PREFIX}_then_{CHUNK}tok_chunks_max_abs"] = float((full - b).abs().max())
    # the first PREFIX rows are a shorter full prefill: compare them on their own too
    res[f"prefill{PREFIX}_rows_vs_full_rel_l2"] = rel_l2(full[:PREFIX], a[:PREFIX])
    return res


def logit_stats(lg):
    return {
        "finite": bool(torch.isfinite(lg).all()),
        "std": float(lg.std()),
        "mean": float(lg.mean()),
        "max_abs": float(lg.abs().max()),
        "argmax_first8": [int(i) for i in lg.argmax(-1)[:8]],
    }


def check_stats(name, st):
    ok = st["finite"] and st["std"] > 0.1
    print(f"  [{name}] logits std {st['std']:.4f} mean {st['mean']:.4f} max|x| {st['max_abs']:.3f} "
          f"finite {st['finite']} -> {'OK' if ok else 'CHECK FAILED'}")
    return ok


def write_logits(path, lg):
    arr = lg.detach().to("cpu", torch.float32).contiguous().numpy().astype("<f4")
    arr.tofile(path)


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=False)
        f.write("\n")


class RouterMargin:
    """Forward hooks on the MoE routers: for each sequence of the batch, the smallest gap
    between the k-th and (k+1)-th routing logit (and probability) over all its tokens and
    layers. A tiny gap makes the expert choice fragile under fp32 rounding."""

    def __init__(self, model, k, batch=1):
        self.k = k
        self.batch = batch
        self.logit_gap = {}   # layer -> tensor [batch]
        self.prob_gap = {}
        self.handles = []
        for name, mod in model.named_modules():
            if type(mod).__name__.endswith("TopKRouter"):
                self.handles.append(mod.register_forward_hook(self._hook(name)))

    def _hook(self, name):
        def fn(mod, inp, out):
            logits = (out[0] if isinstance(out, tuple) else out).float()
            logits = logits.reshape(self.batch, -1, logits.shape[-1])
            sl = logits.sort(-1, descending=True).values
            sp = torch.softmax(logits, -1).sort(-1, descending=True).values
            lg = (sl[..., self.k - 1] - sl[..., self.k]).amin(-1).cpu()
            pg = (sp[..., self.k - 1] - sp[..., self.k]).amin(-1).cpu()
            self.logit_gap[name] = torch.minimum(lg, self.logit_gap.get(name, lg))
            self.prob_gap[name] = torch.minimum(pg, self.prob_gap.get(name, pg))
        return fn

    def per_sequence_logit_gap(self):
        return torch.stack(list(self.logit_gap.values())).amin(0)

    def remove(self):
        for h in self.handles:
            h.remove()


@torch.no_grad()
def pick_moe_ids(model, device, n_cand=1024, seed=None):
    """Among n_cand random token sequences pick the one whose smallest router top-k logit
    gap (over all tokens and layers) is largest, so that the expert choice of the
    reference is not a near-tie."""
    g = torch.Generator().manual_seed(SEED + 10 if seed is None else seed)
    cands = torch.randint(0, VOCAB, (n_cand, T), generator=g, dtype=torch.long)
    rm = RouterMargin(model, MOE_KW["num_experts_per_tok"], batch=n_cand)
    model(input_ids=cands.to(device), use_cache=False)
    rm.remove()
    gaps = rm.per_sequence_logit_gap()
    best = int(gaps.argmax())
    stats = {"candidates": n_cand, "candidate_seed": SEED + 10 if seed is None else seed, "picked_index": best,
             "picked_min_logit_gap": float(gaps[best]), "median_min_logit_gap": float(gaps.median()),
             "worst_min_logit_gap": float(gaps.min())}
    print(f"  token search: {stats}")
    return cands[best:best + 1].clone(), stats


# ----------------------------------------------------------------------------------
# MLX-style affine 4-bit quantisation
# ----------------------------------------------------------------------------------

def quantize_affine(w, group=GROUP, bits=BITS):
    """w: float32 [out, in], in % group == 0.

    Per group of `group` consecutive inputs: scale = (max - min) / (2^bits - 1),
    bias = min, both rounded to bf16 (they are stored bf16); q = round((w - bias) / scale)
    clamped to [0, 2^bits - 1] using the stored (bf16) scale and bias.
    Returns packed uint32 [out, in*bits/32] (value j of a word in bits [bits*j, bits*j+bits),
    low bits first), scales bf16 [out, in/group], biases bf16 [out, in/group], and the
    dequantised float32 weight scale*q + bias (computed in fp32 from the bf16 scale/bias).
    """
    out_dim, in_dim = w.shape
    assert in_dim % group == 0
    levels = (1 << bits) - 1
    wg = w.reshape(out_dim, in_dim // group, group)
    mn = wg.amin(-1)
    mx = wg.amax(-1)
    scale = ((mx - mn) / levels).to(torch.bfloat16)
    bias = mn.to(torch.bfloat16)
    s = scale.float().unsqueeze(-1)
    b = bias.float().unsqueeze(-1)
    s_safe = torch.where(s == 0, torch.ones_like(s), s)
    q = torch.clamp(torch.round((wg - b) / s_safe), 0, levels).to(torch.int64)
    deq = (s * q.to(torch.float32) + b).reshape(out_dim, in_dim)
    per_word = 32 // bits
    qw = q.reshape(out_dim, in_dim // per_word, per_word)
    shifts = torch.arange(per_word, dtype=torch.int64) * bits
    packed = (qw << shifts).sum(-1)
    packed_np = packed.numpy().astype(np.uint64).astype(np.uint32)
    return packed_np, scale, bias, deq


def dequantize_packed(packed, scales, biases, group=GROUP, bits=BITS):
    """Inverse of the packing, from the stored tensors (used as a self-check)."""
    per_word = 32 // bits
    p = torch.from_numpy(packed.astype(np.int64))
    shifts = torch.arange(per_word, dtype=torch.int64) * bits
    q = (p.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)
    q = q.reshape(p.shape[0], -1).to(torch.float32)
    s = scales.float().repeat_interleave(group, dim=1)
    b = biases.float().repeat_interleave(group, dim=1)
    return s * q + b


# ----------------------------------------------------------------------------------
# fixture builders
# ----------------------------------------------------------------------------------

def env_info(device):
    import transformers
    info = {
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "numpy_version": np.__version__,
        "python_version": platform.python_version(),
        "device": torch.cuda.get_device_name(0) if device.startswith("cuda") else device,
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "seed": SEED,
    }
    try:
        from transformers.utils import is_flash_linear_attention_available
        info["flash_linear_attention_available"] = bool(is_flash_linear_attention_available())
    except Exception:  # noqa: BLE001
        info["flash_linear_attention_available"] = None
    try:
        import kernels  # noqa: F401
        info["kernels_package"] = True
    except Exception:  # noqa: BLE001
        info["kernels_package"] = False
    return info


def introspect():
    import transformers
    print("== introspection")
    print("  transformers", transformers.__version__, "torch", torch.__version__)
    for n in ("Qwen3_5TextConfig", "Qwen3_5Config", "Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration",
              "Qwen3_5MoeTextConfig", "Qwen3_5MoeConfig", "Qwen3_5MoeForCausalLM",
              "Qwen3_5MoeForConditionalGeneration"):
        c = getattr(transformers, n, None)
        extra = ""
        if c is not None and hasattr(c, "model_type"):
            extra = f" model_type={getattr(c, 'model_type', None)!r}"
        if c is not None and hasattr(c, "config_class"):
            cc = getattr(c, "config_class", None)
            extra += f" config_class={getattr(cc, '__name__', cc)}"
        print(f"  {n}: {'present' if c is not None else 'MISSING'}{extra}")


def build_model(kind, seed):
    """kind: 'dense' or 'moe'. Returns (model fp32 on CPU, config kwargs used)."""
    import transformers
    if kind == "dense":
        cfg_cls, model_cls, kw = transformers.Qwen3_5TextConfig, transformers.Qwen3_5ForCausalLM, DENSE_KW
    else:
        cfg_cls, model_cls, kw = transformers.Qwen3_5MoeTextConfig, transformers.Qwen3_5MoeForCausalLM, MOE_KW
    kwargs = dict(kw)
    kwargs["rope_parameters"] = dict(ROPE)
    kwargs["layer_types"] = layer_types(kw["num_hidden_layers"])
    cfg = cfg_cls(**kwargs)
    try:
        cfg._attn_implementation = "eager"
    except Exception:  # noqa: BLE001
        pass
    print(f"  {cfg_cls.__name__} rope_parameters={cfg.rope_parameters} layer_types={cfg.layer_types}")
    torch.manual_seed(seed)
    model = model_cls(cfg).float().eval()
    set_eager(model, kind == "moe")
    inv = model.model.rotary_emb.inv_freq
    assert inv.numel() == int(kw["head_dim"] * ROPE["partial_rotary_factor"]) // 2, inv.shape
    rules = randomize_(model, seed)
    return model, kwargs, rules


def save_hf(model, path):
    os.makedirs(path, exist_ok=True)
    m16 = copy.deepcopy(model).to(torch.bfloat16)
    m16.save_pretrained(path)
    del m16
    hdr = read_safetensors_header(os.path.join(path, "model.safetensors"))
    hdr.pop("__metadata__", None)
    dts = sorted({e["dtype"] for e in hdr.values()})
    print(f"  saved {path}: {len(hdr)} tensors, dtypes {dts}, files {sorted(os.listdir(path))}")
    return hdr


def expert_form(hdr):
    if any(re.search(r"mlp\.experts\.\d+\.gate_proj\.weight$", k) for k in hdr):
        return "per-expert"
    if any(k.endswith("mlp.experts.gate_up_proj") for k in hdr):
        return "fused"
    return "unknown"


def compare_sd(master, model, prefix_map=lambda k: k):
    sd = model.state_dict()
    worst = 0.0
    missing = []
    for k, v in master.items():
        k2 = prefix_map(k)
        if k2 not in sd:
            missing.append(k2)
            continue
        worst = max(worst, float((sd[k2].detach().to("cpu", torch.float32) - v).abs().max()))
    return worst, missing


def make_hf_fixture(name, kind, out, ids, device, env):
    import transformers
    print(f"== {name}")
    seed = SEED + (1 if kind == "dense" else 2)
    model, kwargs, rules = build_model(kind, seed)
    master = state_dict_fp32(model)
    print(f"  parameters: {sum(v.numel() for v in master.values())}")
    for k in sorted(master):
        if ".layers." not in k or ".layers.0." in k or ".layers.3." in k:
            print(f"    {k} {tuple(master[k].shape)}")
    d = os.path.join(out, name)
    hdr = save_hf(model, d)
    form = expert_form(hdr) if kind == "moe" else None
    if form:
        print(f"  expert form written by save_pretrained: {form}")
    cls = transformers.Qwen3_5ForCausalLM if kind == "dense" else transformers.Qwen3_5MoeForCausalLM
    ref = load_ref_model(cls, d, kind == "moe", device)
    worst, missing = compare_sd(master, ref)
    print(f"  reloaded vs in-memory weights: max abs diff {worst} missing {missing[:4]}")
    assert worst == 0.0 and not missing, "reloaded weights differ from the weights that were saved"
    search = None
    if kind == "moe":
        ids, search = pick_moe_ids(ref, device)
    ids_dev = ids.to(device)
    margin = RouterMargin(ref, MOE_KW["num_experts_per_tok"]) if kind == "moe" else None
    full = full_prefill(ref, ids_dev)
    if margin:
        margin.remove()
    st = logit_stats(full)
    ok = check_stats(name, st)
    cons = consistency(ref, ids_dev, full)
    for k, v in cons.items():
        print(f"  {k}: {v:.3e}")
    write_logits(os.path.join(d, "ref_logits.f32"), full)
    cfg_json = json.load(open(os.path.join(d, "config.json")))
    info = {
        "fixture": name,
        "description": ("Qwen3_5ForCausalLM (text-only qwen3_5_text), random weights, saved by save_pretrained"
                        if kind == "dense" else
                        "Qwen3_5MoeForCausalLM (text-only qwen3_5_moe_text), random weights, saved by save_pretrained"),
        "model_class": cls.__name__,
        "config_class": type(ref.config).__name__,
        "model_type": cfg_json.get("model_type"),
        "architectures": cfg_json.get("architectures"),
        "config_kwargs": kwargs,
        "layer_types": layer_types(N_LAYERS),
        "tensor_prefix": ("model.language_model." if any(k.startswith("model.language_model.") for k in hdr)
                          else "model."),
        "expert_form": form,
        "weights_dtype": "bf16",
        "init_rules": rules,
        "seed": seed,
        **env,
        "dtype_note": DTYPE_NOTE.format(tv=env["transformers_version"], dev=env["device"]),
        "T": int(ids.shape[1]),
        "vocab": VOCAB,
        "logits_file": "ref_logits.f32",
        "logits_shape": [int(ids.shape[1]), VOCAB],
        "logits_dtype": "float32 little-endian, row-major",
        "logits_stats": st,
        "checks_ok": ok,
        "consistency": cons,
        "consistency_note": (f"relative L2 over the whole [T, vocab] logits: full prefill vs prefill of the first "
                             f"{PREFIX} tokens then 1-token steps on the cache, and vs {PREFIX} then chunks of "
                             f"{CHUNK} tokens (last chunk shorter if needed)"),
        "token_ids": [int(i) for i in ids[0]],
    }
    if margin:
        info["token_ids_note"] = ("picked among random candidate sequences to maximise the smallest gap between "
                                  "the k-th and (k+1)-th router logit (see router_token_search)")
        info["router_token_search"] = search
        info["router_min_topk_logit_gap"] = float(margin.per_sequence_logit_gap()[0])
        info["router_min_topk_logit_gap_per_layer"] = {k: float(v[0]) for k, v in margin.logit_gap.items()}
        info["router_min_topk_prob_gap_per_layer"] = {k: float(v[0]) for k, v in margin.prob_gap.items()}
        print(f"  router min top-k logit gap: {info['router_min_topk_logit_gap']:.3e}")
    write_json(os.path.join(d, "ref.json"), info)
    write_tensor_list(d)
    return {"model": model, "master": master, "ref": ref, "full": full, "dir": d, "form": form,
            "kwargs": kwargs, "info": info, "ids": ids}


def make_moe_fused(moe, out, ids, device, env):
    import transformers
    ids = moe["ids"]
    name = "moe-tiny-fused"
    print(f"== {name}")
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    master = moe["master"]
    n_exp, inter = MOE_KW["num_experts"], MOE_KW["moe_intermediate_size"]
    src_form = moe["form"]
    dst_form = "fused" if src_form == "per-expert" else "per-expert"
    tensors = {}
    for k, v in master.items():
        k2 = "model.language_model." + k[len("model."):] if k.startswith("model.") else k
        m = re.match(r"(.*mlp\.experts)\.(gate_up_proj|down_proj)$", k2)
        if m and dst_form == "per-expert":
            base, which = m.groups()
            for e in range(n_exp):
                if which == "gate_up_proj":
                    tensors[f"{base}.{e}.gate_proj.weight"] = v[e, :inter].to(torch.bfloat16)
                    tensors[f"{base}.{e}.up_proj.weight"] = v[e, inter:].to(torch.bfloat16)
                else:
                    tensors[f"{base}.{e}.down_proj.weight"] = v[e].to(torch.bfloat16)
            continue
        tensors[k2] = v.to(torch.bfloat16)
    g = torch.Generator().manual_seed(SEED + 3)
    tensors["mtp.fc.weight"] = (torch.randn(HIDDEN, 2 * HIDDEN, generator=g) / math.sqrt(2 * HIDDEN)).to(torch.bfloat16)
    tensors["mtp.norm.weight"] = (torch.randn(HIDDEN, generator=g) * 0.1).to(torch.bfloat16)
    write_safetensors(os.path.join(d, "model.safetensors"), tensors, {"format": "pt"})

    text_kw = dict(moe["kwargs"])
    text_kw["rope_parameters"] = dict(ROPE, mrope_interleaved=True, mrope_section=[3, 3, 2])
    tcfg = transformers.Qwen3_5MoeTextConfig(**text_kw)
    cfg = transformers.Qwen3_5MoeConfig(text_config=tcfg, vision_config=dict(VISION_TINY))
    cfg.architectures = ["Qwen3_5MoeForConditionalGeneration"]
    for c in (cfg, cfg.text_config):
        try:
            c.dtype = torch.bfloat16
        except Exception:  # noqa: BLE001
            pass
    cfg.save_pretrained(d)
    print(f"  wrote {d}: {sorted(os.listdir(d))}, experts {dst_form}")

    # logits: identical weights, so the reference is moe-tiny's; also check that
    # transformers reads this checkpoint to the same weights and logits.
    full = moe["full"]
    write_logits(os.path.join(d, "ref_logits.f32"), full)
    verify = {}
    try:
        mm = load_ref_model(transformers.Qwen3_5MoeForConditionalGeneration, d, True, device)
        worst, missing = compare_sd(master, mm, lambda k: "model.language_model." + k[len("model."):]
                                    if k.startswith("model.") else k)
        lg = full_prefill(mm, ids.to(device))
        verify = {
            "loaded_with": "Qwen3_5MoeForConditionalGeneration.from_pretrained",
            "text_weights_max_abs_diff": worst,
            "text_weights_missing": missing[:8],
            "logits_rel_l2_vs_moe_tiny": rel_l2(full, lg),
            "logits_max_abs_vs_moe_tiny": float((full - lg).abs().max()),
        }
        del mm
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        verify = {"error": repr(e)[:500]}
    print(f"  verify: {verify}")
    hdr = read_safetensors_header(os.path.join(d, "model.safetensors"))
    info = {
        "fixture": name,
        "description": ("moe-tiny's weights in the other expert form, text tensors under model.language_model., "
                        "nested multimodal config, plus fake mtp.* tensors; same reference logits as moe-tiny"),
        "same_weights_as": "moe-tiny",
        "model_class_for_reference": moe["info"]["model_class"],
        "architectures": cfg.architectures,
        "model_type": "qwen3_5_moe",
        "text_config_model_type": "qwen3_5_moe_text",
        "tensor_prefix": "model.language_model.",
        "lm_head": "lm_head.weight",
        "expert_form": dst_form,
        "expert_layout": ("mlp.experts.gate_up_proj [E, 2*I, H] (rows 0..I-1 = gate, I..2I-1 = up), "
                          "mlp.experts.down_proj [E, H, I]" if dst_form == "fused" else
                          "mlp.experts.{e}.{gate,up,down}_proj.weight"),
        "mtp_tensors": {"mtp.fc.weight": [HIDDEN, 2 * HIDDEN], "mtp.norm.weight": [HIDDEN],
                        "note": "random, not a working MTP head; transformers ignores mtp.*"},
        "vision": "config has a tiny vision_config; the checkpoint holds no model.visual.* tensors",
        "rope_note": "text_config.rope_parameters carries mrope_interleaved/mrope_section like the real "
                     "checkpoints; for text-only positions they change nothing",
        "n_tensors": len([k for k in hdr if k != "__metadata__"]),
        "transformers_load_check": verify,
        **env,
        "dtype_note": DTYPE_NOTE.format(tv=env["transformers_version"], dev=env["device"]),
        "T": int(ids.shape[1]),
        "vocab": VOCAB,
        "logits_file": "ref_logits.f32",
        "logits_shape": [int(ids.shape[1]), VOCAB],
        "logits_dtype": "float32 little-endian, row-major",
        "logits_stats": moe["info"]["logits_stats"],
        "consistency": moe["info"]["consistency"],
        "router_min_topk_logit_gap": moe["info"].get("router_min_topk_logit_gap"),
        "token_ids": [int(i) for i in ids[0]],
    }
    write_json(os.path.join(d, "ref.json"), info)
    write_tensor_list(d)


def make_dense_mlx(dense, out, ids, device, env):
    import transformers
    name = "dense-tiny-mlx"
    print(f"== {name}")
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    master = dense["master"]
    tensors = {}
    ref_sd = {}
    quantised, kept_bf16, plus_one = [], [], []
    worst_pack = 0.0
    for k, v in sorted(master.items()):
        mk = "language_model." + k          # model.X -> language_model.model.X, lm_head -> language_model.lm_head
        if v.ndim == 2 and k.endswith(".weight") and v.shape[1] % GROUP == 0:
            packed, scales, biases, deq = quantize_affine(v)
            back = dequantize_packed(packed, scales, biases)
            worst_pack = max(worst_pack, float((back - deq).abs().max()))
            tensors[mk] = packed
            tensors[mk[:-len("weight")] + "scales"] = scales
            tensors[mk[:-len("weight")] + "biases"] = biases
            ref_sd[k] = deq
            quantised.append(mk)
        elif v.ndim == 1 and is_zero_centred_norm(k):
            stored = (1.0 + v).to(torch.bfloat16)
            tensors[mk] = stored
            ref_sd[k] = stored.float() - 1.0
            plus_one.append(mk)
        elif k.endswith("conv1d.weight"):
            tensors[mk] = v.transpose(1, 2).contiguous().to(torch.bfloat16)   # [C,1,K] -> [C,K,1]
            ref_sd[k] = v
        else:
            tensors[mk] = v.to(torch.bfloat16)
            ref_sd[k] = v
            if v.ndim == 2:
                kept_bf16.append(mk)
    assert worst_pack == 0.0, f"pack/unpack mismatch {worst_pack}"
    write_safetensors(os.path.join(d, "model.safetensors"), tensors, {"format": "mlx"})
    try:  # the safetensors library must read what was written by hand
        from safetensors import safe_open
        with safe_open(os.path.join(d, "model.safetensors"), framework="pt") as f:
            keys = list(f.keys())
            t0 = f.get_tensor(quantised[0])
        print(f"  safetensors reads {len(keys)} tensors; {quantised[0]} {t0.dtype} {tuple(t0.shape)}")
    except Exception as e:  # noqa: BLE001
        print(f"  note: safetensors could not read the MLX file back: {e!r}")

    tcfg = transformers.Qwen3_5TextConfig(**dense["kwargs"])
    cfg = transformers.Qwen3_5Config(text_config=tcfg, vision_config=dict(VISION_TINY))
    cfg.architectures = ["Qwen3_5ForConditionalGeneration"]
    for c in (cfg, cfg.text_config):
        try:
            c.dtype = torch.bfloat16
        except Exception:  # noqa: BLE001
            pass
    cfg.save_pretrained(d)
    cj = json.load(open(os.path.join(d, "config.json")))
    cj["quantization"] = {"group_size": GROUP, "bits": BITS}
    cj["quantization_config"] = {"group_size": GROUP, "bits": BITS}
    write_json(os.path.join(d, "config.json"), cj)

    ref = load_ref_model(transformers.Qwen3_5ForCausalLM, dense["dir"], False, device)
    missing, unexpected = ref.load_state_dict({k: v.to(device) for k, v in ref_sd.items()}, strict=False)
    # non-persistent buffers are not in state_dict; anything else missing would be a bug
    assert not unexpected and not [m for m in missing if "inv_freq" not in m], (missing, unexpected)
    ids_dev = ids.to(device)
    full = full_prefill(ref, ids_dev)
    st = logit_stats(full)
    ok = check_stats(name, st)
    cons = consistency(ref, ids_dev, full)
    for k, v in cons.items():
        print(f"  {k}: {v:.3e}")
    vs_dense = rel_l2(dense["full"], full)
    print(f"  quantisation effect: rel L2 vs dense-tiny logits {vs_dense:.3e}")
    write_logits(os.path.join(d, "ref_logits.f32"), full)
    info = {
        "fixture": name,
        "description": "dense-tiny converted the mlx-lm way to affine 4-bit group 64; reference logits from the "
                       "dequantised weights",
        "source_fixture": "dense-tiny",
        "model_class_for_reference": "Qwen3_5ForCausalLM",
        "architectures": cfg.architectures,
        "model_type": "qwen3_5",
        "text_config_model_type": "qwen3_5_text",
        "tensor_prefix": "language_model.model.",
        "lm_head": "language_model.lm_head.{weight,scales,biases}",
        "naming_note": ("mlx-lm's qwen3_5 Model.sanitize renames model.language_model.X to language_model.model.X "
                        "and prefixes everything else with 'language_model.', drops model.visual.* and mtp.*; "
                        "the saved names are those of the MLX module tree: language_model.model.embed_tokens, "
                        "language_model.model.layers.N..., language_model.model.norm, language_model.lm_head"),
        "quantization": {"group_size": GROUP, "bits": BITS, "mode": "affine"},
        "quant_format": ("weight: uint32 [out, in/8], 8 4-bit values per word, value j of the word in bits "
                         "4j..4j+3 (low nibble = lowest input index); scales and biases: bf16 [out, in/64]; "
                         "w[o,i] = scales[o,i/64] * q[o,i] + biases[o,i/64]"),
        "quant_rule": ("per group: scale = bf16((max-min)/15), bias = bf16(min), q = clamp(round((w-bias)/scale), "
                       "0, 15) with the bf16 scale/bias (round half to even)"),
        "quantised_rule": "every 2-D weight (Linear and Embedding) whose input dim is a multiple of 64, "
                          "embed_tokens and lm_head included",
        "quantised_tensors": quantised,
        "kept_bf16_matrices": kept_bf16,
        "kept_bf16_note": "input dim not a multiple of 64 (GDN out_proj: 6*48 = 288)",
        "norms_plus_one": plus_one,
        "norms_note": ("zero-centred RMSNorm weights stored as bf16(1 + w): do not add 1 again. "
                       "linear_attn.norm.weight (GDN gated norm) is stored unchanged"),
        "conv1d_layout": "linear_attn.conv1d.weight stored [C, K, 1] (HF: [C, 1, K])",
        "unchanged": "A_log, dt_bias, linear_attn.norm.weight, out_proj (bf16)",
        "reference_note": ("reference = Qwen3_5ForCausalLM in fp32 with every quantised matrix replaced by its "
                           "dequantisation scale*q + bias computed in fp32 from the stored bf16 scale/bias, and "
                           "every zero-centred norm weight set to (stored - 1); all other weights are dense-tiny's"),
        "logits_rel_l2_vs_dense_tiny": vs_dense,
        **env,
        "dtype_note": DTYPE_NOTE.format(tv=env["transformers_version"], dev=env["device"]),
        "T": int(ids.shape[1]),
        "vocab": VOCAB,
        "logits_file": "ref_logits.f32",
        "logits_shape": [int(ids.shape[1]), VOCAB],
        "logits_dtype": "float32 little-endian, row-major",
        "logits_stats": st,
        "checks_ok": ok,
        "consistency": cons,
        "token_ids": [int(i) for i in ids[0]],
    }
    write_json(os.path.join(d, "ref.json"), info)
    write_tensor_list(d)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output folder (one sub-folder per fixture)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--only", default="", help="comma list of fixtures to make (default: all)")
    args = ap.parse_args()

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    os.makedirs(args.out, exist_ok=True)

    introspect()
    env = env_info(args.device)
    print("  env:", env)

    g = torch.Generator().manual_seed(SEED)
    ids = torch.randint(0, VOCAB, (1, T), generator=g, dtype=torch.long)
    only = set(filter(None, args.only.split(",")))
    want = lambda n: not only or n in only  # noqa: E731
    failures = []

    dense = moe = None
    try:
        if want("dense-tiny") or want("dense-tiny-mlx"):
            dense = make_hf_fixture("dense-tiny", "dense", args.out, ids, args.device, env)
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        failures.append("dense-tiny")
    try:
        if dense is not None and want("dense-tiny-mlx"):
            make_dense_mlx(dense, args.out, ids, args.device, env)
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        failures.append("dense-tiny-mlx")
    try:
        if want("moe-tiny") or want("moe-tiny-fused"):
            moe = make_hf_fixture("moe-tiny", "moe", args.out, ids, args.device, env)
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        failures.append("moe-tiny")
    try:
        if moe is not None and want("moe-tiny-fused"):
            make_moe_fused(moe, args.out, ids, args.device, env)
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        failures.append("moe-tiny-fused")

    print("== summary")
    for fn in sorted(os.listdir(args.out)):
        p = os.path.join(args.out, fn)
        if os.path.isdir(p):
            for f in sorted(os.listdir(p)):
                print(f"  {fn}/{f} {os.path.getsize(os.path.join(p, f))}")
    if failures:
        print("FAILED:", failures)
        sys.exit(1)
    print("all fixtures made")


if __name__ == "__main__":
    main()
