"""A Splash package (docs/package-format.md) read back into the PyTorch target of model.py.

    import package_io
    model = package_io.load_target("models/splash-demo", device)     # Qwen35LM, dequantised, fp32
    tok_path = package_io.tokenizer_path("models/splash-demo")       # the package's tokenizer.json

Why: the GPU machine gets only the repository's working tree (64 MiB in all), which holds the
committed q4 package but not the 103 MB bf16 export it was made from, so everything after the
target's training (evaluation, the draft's data, the draft) starts from the package.  The
dequantised q4 target is also the better teacher for the draft: it is the network the engine
runs.

What is read: manifest.json (each tensor's file, offset, dtype and shape) and the target's .bin
files.  Encodings (src/package/tensor.c, splash_matrix_layout and splash_tensor_row_f32):
f32/f16/bf16 dense row-major; q4/q8 per [rows, cols] matrix one blob of codes [rows][cols/2]
(q4: element 2j in the low nibble of byte j) or [rows][cols] (q8), then bf16 scales and bf16
biases [rows][cols/64], each part starting at a multiple of 64 bytes; w = scale * q + bias,
computed in float32 as the C code does.  Canonical names back to transformers' names: the
zero-centred norms are stored as the factor 1 + w, so w = stored - 1 (the GDN output norm is
stored as w); the conv weight [C, K] becomes conv1d.weight [C, 1, K]; tied embeddings store no
lm_head.  numpy only (no torch) up to state_dict(), so the reader is testable anywhere.
"""

import json
import os

import numpy as np

QGROUP = 64

# canonical suffix (after "layers.N.") -> (transformers suffix, offset subtracted)
_LAYER_NAMES = {
    "input_norm": ("input_layernorm.weight", 1.0),
    "post_norm": ("post_attention_layernorm.weight", 1.0),
    "attn.q_proj": ("self_attn.q_proj.weight", 0.0),
    "attn.k_proj": ("self_attn.k_proj.weight", 0.0),
    "attn.v_proj": ("self_attn.v_proj.weight", 0.0),
    "attn.o_proj": ("self_attn.o_proj.weight", 0.0),
    "attn.q_norm": ("self_attn.q_norm.weight", 1.0),
    "attn.k_norm": ("self_attn.k_norm.weight", 1.0),
    "gdn.in_proj_qkv": ("linear_attn.in_proj_qkv.weight", 0.0),
    "gdn.in_proj_z": ("linear_attn.in_proj_z.weight", 0.0),
    "gdn.in_proj_b": ("linear_attn.in_proj_b.weight", 0.0),
    "gdn.in_proj_a": ("linear_attn.in_proj_a.weight", 0.0),
    "gdn.conv": ("linear_attn.conv1d.weight", 0.0),
    "gdn.A_log": ("linear_attn.A_log", 0.0),
    "gdn.dt_bias": ("linear_attn.dt_bias", 0.0),
    "gdn.norm": ("linear_attn.norm.weight", 0.0),
    "gdn.out_proj": ("linear_attn.out_proj.weight", 0.0),
    "ffn.gate": ("mlp.gate_proj.weight", 0.0),
    "ffn.up": ("mlp.up_proj.weight", 0.0),
    "ffn.down": ("mlp.down_proj.weight", 0.0),
}


def is_package(path):
    return os.path.isfile(os.path.join(path, "manifest.json"))


def read_manifest(pkg):
    with open(os.path.join(pkg, "manifest.json")) as f:
        m = json.load(f)
    if m.get("format") != "splash-package" or m.get("version") != 1:
        raise ValueError("%s: not a version 1 splash package" % pkg)
    if m.get("architecture") != "qwen3_5":
        raise ValueError("%s: architecture %r (only the dense qwen3_5 target is read)" % (pkg, m.get("architecture")))
    return m


def tokenizer_path(pkg):
    """A path to the package's tokenizer.json.  Packages store it gzipped
    (tokenizer/tokenizer.json.gz); that one is decompressed once into a file in the temp
    directory named by its SHA-256, which is what is returned."""
    p = os.path.join(pkg, "tokenizer", "tokenizer.json")
    if os.path.isfile(p):
        return p
    gz = p + ".gz"
    if not os.path.isfile(gz):
        raise FileNotFoundError("%s: the package has no tokenizer/tokenizer.json(.gz)" % pkg)
    import gzip
    import hashlib
    import tempfile
    with open(gz, "rb") as f:
        raw = f.read()
    out = os.path.join(tempfile.gettempdir(), "splash-tokenizer-%s.json" % hashlib.sha256(raw).hexdigest()[:16])
    if not os.path.isfile(out):
        tmp = out + ".%d" % os.getpid()
        with open(tmp, "wb") as f:
            f.write(gzip.decompress(raw))
        os.replace(tmp, out)
    return out


def _a64(n):
    return (n + 63) & ~63


def bf16_to_f32(u16):
    """uint16 array of bf16 bits -> float32 (exact)."""
    return (u16.astype(np.uint32) << 16).view(np.float32)


def matrix_bytes(dtype, rows, cols):
    """splash_matrix_layout().bytes for one [rows, cols] matrix."""
    if dtype in ("q4", "q8"):
        codes = rows * (cols // 2 if dtype == "q4" else cols)
        sb = rows * (cols // QGROUP) * 2
        return _a64(codes) + 2 * _a64(sb)
    return rows * cols * {"f32": 4, "f16": 2, "bf16": 2}[dtype]


def dequantize(buf, dtype, shape):
    """bytes of one tensor (as stored) -> float32 numpy array of `shape`."""
    shape = [int(x) for x in shape]
    cols = shape[-1] if shape else 1
    rows = shape[-2] if len(shape) >= 2 else 1
    count = int(np.prod(shape[:-2])) if len(shape) > 2 else 1
    if dtype == "f32":
        return np.frombuffer(buf, np.float32, rows * cols * count).reshape(shape).copy()
    if dtype == "bf16":
        return bf16_to_f32(np.frombuffer(buf, np.uint16, rows * cols * count)).reshape(shape)
    if dtype == "f16":
        return np.frombuffer(buf, np.float16, rows * cols * count).astype(np.float32).reshape(shape)
    if dtype not in ("q4", "q8"):
        raise ValueError("unknown dtype " + dtype)
    if cols % QGROUP:
        raise ValueError("quantised tensor with %d columns (not a multiple of %d)" % (cols, QGROUP))
    groups = cols // QGROUP
    row_codes = cols // 2 if dtype == "q4" else cols
    sb = rows * groups * 2
    one = matrix_bytes(dtype, rows, cols)
    out = np.empty((count, rows, cols), np.float32)
    for e in range(count):
        base = e * one
        codes = np.frombuffer(buf, np.uint8, rows * row_codes, base).reshape(rows, row_codes)
        so = base + _a64(rows * row_codes)
        scales = bf16_to_f32(np.frombuffer(buf, np.uint16, rows * groups, so)).reshape(rows, groups, 1)
        biases = bf16_to_f32(np.frombuffer(buf, np.uint16, rows * groups, so + _a64(sb))).reshape(rows, groups, 1)
        if dtype == "q4":
            q = np.empty((rows, cols), np.uint8)
            q[:, 0::2] = codes & 15
            q[:, 1::2] = codes >> 4
        else:
            q = codes
        w = scales * q.reshape(rows, groups, QGROUP).astype(np.float32)
        w += biases
        out[e] = w.reshape(rows, cols)
    return out.reshape(shape)


def read_tensors(pkg, manifest=None, prefix=""):
    """{canonical name: float32 numpy array} of the tensors whose name starts with prefix."""
    m = manifest or read_manifest(pkg)
    files, out = {}, {}
    try:
        for t in m["tensors"]:
            name = t["name"]
            if not name.startswith(prefix) or (not prefix and name.startswith("draft.")):
                continue
            f = t["file"]
            if f not in files:
                with open(os.path.join(pkg, f), "rb") as fh:
                    files[f] = fh.read()
            buf = files[f]
            off, n = int(t["offset"]), int(t["bytes"])
            if off % 64 or off + n > len(buf):
                raise ValueError("%s: tensor %s outside %s or misaligned" % (pkg, t["name"], f))
            shape = t["shape"]
            cnt = int(np.prod(shape[:-2])) if len(shape) > 2 else 1
            expect = cnt * matrix_bytes(t["dtype"], shape[-2] if len(shape) >= 2 else 1, shape[-1])
            if expect != n:
                raise ValueError("%s: tensor %s has %d bytes, its layout %d" % (pkg, t["name"], n, expect))
            out[t["name"]] = dequantize(memoryview(buf)[off:off + n], t["dtype"], shape)
    finally:
        files.clear()
    return out


def spec_from_manifest(m):
    """model.py's spec dict from manifest['model'] (the packer resolved every value there)."""
    md, at, gd = m["model"], m["model"]["attention"], m["model"]["gdn"]
    if "ffn" not in md:
        raise ValueError("MoE packages are not read here")
    return dict(vocab=md["vocab"], hidden=md["hidden"], layers=md["layers"], ffn=md["ffn"]["intermediate"],
                heads=at["heads"], kv_heads=at["kv_heads"], head_dim=at["head_dim"],
                gdn_k_heads=gd["key_heads"], gdn_v_heads=gd["value_heads"], gdn_dk=gd["key_dim"],
                gdn_dv=gd["value_dim"], rms_eps=md["rms_eps"], rope_theta=at["rope_theta"],
                partial_rotary=at["rotary_dim"] / at["head_dim"], conv_kernel=gd["conv_kernel"],
                max_positions=md["max_positions"], tie=md["tie_embeddings"], name="package")


def hf_name(canon):
    """canonical tensor name -> (transformers name, offset the package added to the value)."""
    if canon == "embed":
        return "model.embed_tokens.weight", 0.0
    if canon == "final_norm":
        return "model.norm.weight", 1.0
    parts = canon.split(".", 2)
    if len(parts) == 3 and parts[0] == "layers" and parts[2] in _LAYER_NAMES:
        hf, off = _LAYER_NAMES[parts[2]]
        return "model.layers.%s.%s" % (parts[1], hf), off
    raise ValueError("unexpected tensor %s" % canon)


def hf_state(pkg, manifest=None):
    """(spec, {transformers name: float32 numpy array}) of the package's target."""
    m = manifest or read_manifest(pkg)
    spec = spec_from_manifest(m)
    if not spec["tie"]:
        raise ValueError("%s: untied lm_head (model.py ties the embedding)" % pkg)
    types = m["model"]["layer_types"]
    import sizes
    if list(types) != list(sizes.layer_types(spec["layers"])):
        raise ValueError("%s: layer_types differ from model.py's pattern" % pkg)
    canon = read_tensors(pkg, m)
    sd = {}
    for name, a in canon.items():
        if name.startswith("mtp."):
            continue
        hf, off = hf_name(name)
        if name.endswith("gdn.conv"):
            a = a.reshape(a.shape[0], 1, a.shape[1])
        sd[hf] = a - np.float32(off) if off else a
    return spec, sd


def load_target(pkg, dev="cpu", dtype=None):
    """The package's target as a model.Qwen35LM on dev (float32 unless dtype is given), eval mode,
    parameters frozen."""
    import torch
    import model as M
    spec, sd = hf_state(pkg)
    m = M.Qwen35LM(spec)
    m.load_state_dict({k: torch.from_numpy(v) for k, v in sd.items()}, strict=True)
    for p in m.parameters():
        p.requires_grad_(False)
    return m.to(dev, dtype or torch.float32).eval()
