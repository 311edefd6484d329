#!/usr/bin/env python3
"""Model shapes of the embedded default model, and their exact q4 package size.

Torch-free on purpose: it runs on the 2-core dev machine (no PyTorch there) as
well as on the GPU machine, and every other script takes its shapes from here,
so the size in docs/default-model.md and the shapes that get trained are one
statement.

    python3 tools/train/sizes.py            # table of the candidates
    python3 tools/train/sizes.py --json B   # one candidate's HF config.json

Size rules copied from docs/package-format.md (`splash_matrix_layout` in
src/package/tensor.c): a q4 matrix [rows, cols] (cols a multiple of 64) is
codes rows*cols/2 bytes, then scales and biases rows*cols/64 bf16 each, each
part rounded up to 64 bytes; a matrix whose last dimension is not a multiple of
64 is bf16; norms, A_log, dt_bias and conv weights are f32.  Tensors start at
multiples of 64 bytes, and each .bin file is padded to a multiple of 16 KiB.
With tied embeddings the package stores the embedding once (packer.c).
"""

import argparse
import json
import math
import sys

QGROUP = 64
FILE_ALIGN = 16384
TOKENIZER_VOCAB = 151669        # ids 0..151668 in the Qwen3 tokenizer.json (151643 BPE + 26 added)
VOCAB = 151680                  # padded to a multiple of 64 (the model's embedding rows)
TOKENIZER_FILES_BYTES = 2061687 + 9675    # tokenizer.json.gz (gzip -9 of 11,422,654 bytes) + tokenizer_config.json


def layer_types(n, interval=4):
    return ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)]


def taps_for(n_layers, n_taps):
    """DFlash taps: n_taps layer indices spread evenly from 1 to n_layers-3 (z-lab: [1,9,17,25,33] of 36)."""
    lo, hi = 1, n_layers - 3
    if n_taps == 1:
        return [hi]
    return sorted({round(lo + (hi - lo) * i / (n_taps - 1)) for i in range(n_taps)})


# The candidates measured in one device call (docs/default-model.md).  Shapes kept so every
# q4 matrix has a last dimension that is a multiple of 64 (else the packer stores bf16).
CANDIDATES = {
    "A": dict(hidden=256, layers=8, ffn=768, heads=4, kv_heads=2, head_dim=64,
              gdn_k_heads=2, gdn_v_heads=4, gdn_dk=64, gdn_dv=64),
    "B": dict(hidden=256, layers=12, ffn=1024, heads=4, kv_heads=2, head_dim=64,
              gdn_k_heads=2, gdn_v_heads=4, gdn_dk=64, gdn_dv=64),
    "C": dict(hidden=320, layers=12, ffn=1280, heads=4, kv_heads=2, head_dim=64,
              gdn_k_heads=2, gdn_v_heads=4, gdn_dk=64, gdn_dv=64),
}
CHOSEN = "B"
# A tiny shape for smoke tests of the scripts (same vocabulary, so the real token ids fit).
TEST = {"T": dict(hidden=64, layers=4, ffn=128, heads=2, kv_heads=1, head_dim=32,
                  gdn_k_heads=1, gdn_v_heads=2, gdn_dk=32, gdn_dv=32)}

COMMON = dict(vocab=VOCAB, rms_eps=1e-6, rope_theta=10000.0, partial_rotary=0.5,
              conv_kernel=4, max_positions=4096, tie=True)

# The DFlash v1 draft: Qwen3-style layers at the target's hidden size.
DRAFT = dict(layers=2, heads=4, kv_heads=2, head_dim=64, ffn_mult=8, block_size=8, n_taps=3,
             rms_eps=1e-6, rope_theta=10000.0)


def spec(name):
    s = dict(COMMON)
    s.update(CANDIDATES[name] if name in CANDIDATES else TEST[name])
    s["name"] = name
    return s


# ---- tensor lists ---------------------------------------------------------------------------

def target_tensors(s):
    """(package file, name, shape, kind) for every tensor the packer stores; kind in
    'matrix' (q4 if the last dim is a multiple of 64), 'f32'."""
    H, V = s["hidden"], s["vocab"]
    out = [("target/embedding.bin", "embed", (V, H), "matrix")]
    hd, nh, nkv = s["head_dim"], s["heads"], s["kv_heads"]
    kd = s["gdn_k_heads"] * s["gdn_dk"]
    vd = s["gdn_v_heads"] * s["gdn_dv"]
    conv = 2 * kd + vd
    for i, t in enumerate(layer_types(s["layers"])):
        f = "target/layer-%d.bin" % i
        out.append((f, "input_norm", (H,), "f32"))
        if t == "full_attention":
            out += [(f, "attn.q_proj", (nh * hd * 2, H), "matrix"),
                    (f, "attn.k_proj", (nkv * hd, H), "matrix"),
                    (f, "attn.v_proj", (nkv * hd, H), "matrix"),
                    (f, "attn.o_proj", (H, nh * hd), "matrix"),
                    (f, "attn.q_norm", (hd,), "f32"), (f, "attn.k_norm", (hd,), "f32")]
        else:
            out += [(f, "gdn.in_proj_qkv", (conv, H), "matrix"),
                    (f, "gdn.in_proj_z", (vd, H), "matrix"),
                    (f, "gdn.in_proj_b", (s["gdn_v_heads"], H), "matrix"),
                    (f, "gdn.in_proj_a", (s["gdn_v_heads"], H), "matrix"),
                    (f, "gdn.conv", (conv, 1, s["conv_kernel"]), "f32"),
                    (f, "gdn.A_log", (s["gdn_v_heads"],), "f32"),
                    (f, "gdn.dt_bias", (s["gdn_v_heads"],), "f32"),
                    (f, "gdn.norm", (s["gdn_dv"],), "f32"),
                    (f, "gdn.out_proj", (H, vd), "matrix")]
        out += [(f, "post_norm", (H,), "f32"),
                (f, "ffn.gate", (s["ffn"], H), "matrix"),
                (f, "ffn.up", (s["ffn"], H), "matrix"),
                (f, "ffn.down", (H, s["ffn"]), "matrix")]
    out.append(("target/head.bin", "final_norm", (H,), "f32"))
    if not s["tie"]:
        out.append(("target/head.bin", "lm_head", (V, H), "matrix"))
    return out


def draft_tensors(s, d=DRAFT):
    H = s["hidden"]
    n_taps = len(taps_for(s["layers"], d["n_taps"]))
    f = "draft/draft.bin"
    out = [(f, "fc", (H, n_taps * H), "matrix"), (f, "hidden_norm", (H,), "f32")]
    I = d["ffn_mult"] * H
    for i in range(d["layers"]):
        p = "layers.%d." % i
        out += [(f, p + "input_layernorm", (H,), "f32"),
                (f, p + "self_attn.q_proj", (d["heads"] * d["head_dim"], H), "matrix"),
                (f, p + "self_attn.k_proj", (d["kv_heads"] * d["head_dim"], H), "matrix"),
                (f, p + "self_attn.v_proj", (d["kv_heads"] * d["head_dim"], H), "matrix"),
                (f, p + "self_attn.o_proj", (H, d["heads"] * d["head_dim"]), "matrix"),
                (f, p + "self_attn.q_norm", (d["head_dim"],), "f32"),
                (f, p + "self_attn.k_norm", (d["head_dim"],), "f32"),
                (f, p + "post_attention_layernorm", (H,), "f32"),
                (f, p + "mlp.gate_proj", (I, H), "matrix"),
                (f, p + "mlp.up_proj", (I, H), "matrix"),
                (f, p + "mlp.down_proj", (H, I), "matrix")]
    out.append((f, "norm", (H,), "f32"))
    return out


# ---- byte accounting ------------------------------------------------------------------------

def a64(n):
    return (n + 63) // 64 * 64


def tensor_bytes(shape, kind, weights="q4"):
    n = math.prod(shape)
    if kind == "f32":
        return 4 * n
    rows, cols = math.prod(shape[:-1]), shape[-1]
    if weights == "bf16" or cols % QGROUP:
        return 2 * n
    codes = rows * (cols // 2 if weights == "q4" else cols)
    sb = rows * (cols // QGROUP) * 2
    return a64(codes) + 2 * a64(sb)


def package_bytes(tensors, weights="q4"):
    files = {}
    for f, _, shape, kind in tensors:
        files[f] = a64(files.get(f, 0)) + tensor_bytes(shape, kind, weights)
    return sum((b + FILE_ALIGN - 1) // FILE_ALIGN * FILE_ALIGN for b in files.values()), files


def params(tensors):
    return sum(math.prod(shape) for _, _, shape, _ in tensors)


def summary(name):
    s = spec(name)
    tt, dt = target_tensors(s), draft_tensors(s)
    emb = s["vocab"] * s["hidden"]
    tq, _ = package_bytes(tt)
    dq, _ = package_bytes(dt)
    return dict(name=name, spec=s, params=params(tt), params_body=params(tt) - emb,
                params_draft=params(dt), target_q4=tq, draft_q4=dq,
                embed_q4=tensor_bytes((s["vocab"], s["hidden"]), "matrix"),
                bf16_bytes=2 * params(tt), fp32_bytes=4 * params(tt),
                package=tq + dq + TOKENIZER_FILES_BYTES,
                taps=taps_for(s["layers"], DRAFT["n_taps"]))


# ---- configs --------------------------------------------------------------------------------

def hf_config(s, seq_len=None):
    """config.json of a Qwen3_5ForCausalLM checkpoint (model_type qwen3_5_text), as
    transformers 5.17 save_pretrained writes it for the fixtures (tests/fixtures/dense-tiny)."""
    rope = {"rope_type": "default", "rope_theta": s["rope_theta"], "partial_rotary_factor": s["partial_rotary"]}
    return {
        "architectures": ["Qwen3_5ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": None,
        "dtype": "bfloat16",
        "eos_token_id": [151645, 151643],
        "head_dim": s["head_dim"],
        "hidden_act": "silu",
        "hidden_size": s["hidden"],
        "initializer_range": 0.02,
        "intermediate_size": s["ffn"],
        "layer_types": layer_types(s["layers"]),
        "linear_conv_kernel_dim": s["conv_kernel"],
        "linear_key_head_dim": s["gdn_dk"],
        "linear_num_key_heads": s["gdn_k_heads"],
        "linear_num_value_heads": s["gdn_v_heads"],
        "linear_value_head_dim": s["gdn_dv"],
        "max_position_embeddings": s["max_positions"],
        "model_type": "qwen3_5_text",
        "num_attention_heads": s["heads"],
        "num_hidden_layers": s["layers"],
        "num_key_value_heads": s["kv_heads"],
        "pad_token_id": 151643,
        "partial_rotary_factor": s["partial_rotary"],
        "rms_norm_eps": s["rms_eps"],
        "rope_parameters": rope,
        "tie_word_embeddings": bool(s["tie"]),
        "transformers_version": "5.17.0",
        "use_cache": True,
        "vocab_size": s["vocab"],
    }


def draft_config(s, mask_token_id, d=DRAFT, train_seq=None):
    """config.json of the DFlash v1 draft in the z-lab layout (dflash/model.py reads
    dflash_config.{mask_token_id,target_layer_ids} and block_size)."""
    taps = taps_for(s["layers"], d["n_taps"])
    return {
        "architectures": ["DFlashDraftModel"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "block_size": d["block_size"],
        "dflash_config": {"mask_token_id": mask_token_id, "target_layer_ids": taps,
                          "block_size": d["block_size"]},
        "dtype": "bfloat16",
        "head_dim": d["head_dim"],
        "hidden_act": "silu",
        "hidden_size": s["hidden"],
        "intermediate_size": d["ffn_mult"] * s["hidden"],
        "layer_types": ["full_attention"] * d["layers"],
        "max_position_embeddings": s["max_positions"],
        "model_type": "qwen3",
        "num_attention_heads": d["heads"],
        "num_hidden_layers": d["layers"],
        "num_key_value_heads": d["kv_heads"],
        "num_target_layers": s["layers"],
        "rms_norm_eps": d["rms_eps"],
        "rope_theta": d["rope_theta"],
        "rope_parameters": {"rope_type": "default", "rope_theta": d["rope_theta"]},
        "sliding_window": None,
        "use_sliding_window": False,
        "tie_word_embeddings": False,
        "vocab_size": s["vocab"],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", metavar="NAME", help="print this candidate's HF config.json")
    a = ap.parse_args()
    if a.json:
        json.dump(hf_config(spec(a.json)), sys.stdout, indent=2)
        print()
        return
    MB = 1e6
    print("| cand | hidden | layers (GDN+attn) | ffn | params total / body | bf16 ckpt | q4 target "
          "(embedding) | q4 draft | package with tokenizer |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n in CANDIDATES:
        r = summary(n)
        s = r["spec"]
        na = s["layers"] // 4
        print("| %s%s | %d | %d (%d+%d) | %d | %.2fM / %.2fM | %.1f MB | %.2f MB (%.2f) | %.2f MB | %.2f MB |" % (
            n, " (chosen)" if n == CHOSEN else "", s["hidden"], s["layers"], s["layers"] - na, na, s["ffn"],
            r["params"] / 1e6, r["params_body"] / 1e6, r["bf16_bytes"] / MB, r["target_q4"] / MB,
            r["embed_q4"] / MB, r["draft_q4"] / MB, r["package"] / MB))


if __name__ == "__main__":
    main()
