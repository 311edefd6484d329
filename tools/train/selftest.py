#!/usr/bin/env python3
"""CPU self-checks of the training code (any PyTorch >= 1.13; no GPU, no transformers needed).

    python3 tools/train/selftest.py

  1. chunk_gated_delta_rule (fp32) against the token-by-token recurrence in float64: outputs,
     final state, gradients of q, k, v, g, beta; T not a multiple of the chunk, grouped heads,
     an initial state;
  2. cached decoding (prefill of left-padded prompts + one-token steps) against the full forward,
     and the fixed-shape step generate.py captures in a CUDA graph against the cached decoding;
     generate.generate_batch through StaticDecoder (the captured path's code, eagerly) gives the
     same tokens as eager decoding, greedy and sampled rows, and runs without autograd;
  3. speculative decoding with an untrained draft gives exactly the target's greedy output;
  4. the draft's training mask: block j sees context < anchor_j and its own block only;
  5. safetensors write/read round trip, and the exact q4 byte count of sizes.py against the
     packer's rules for one small shape (also checked against a real package, see NOTES.md).
Each check prints its figure and raises on failure.
"""

import math
import os
import sys
import tempfile

import torch

sys.dont_write_bytecode = True      # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dflash_draft as D  # noqa: E402
import generate as G  # noqa: E402
import model as M  # noqa: E402
import sizes  # noqa: E402
import st_io  # noqa: E402


def rel(a, b):
    return float((a.detach().double() - b.detach().double()).norm() / b.detach().double().norm())


def check(name, value, limit):
    ok = value <= limit
    print("%-44s %.2e (limit %.0e) %s" % (name, value, limit, "ok" if ok else "FAIL"), flush=True)
    if not ok:
        raise SystemExit("selftest failed: " + name)


def random_target(seed=3):
    s = sizes.spec("T")
    m = M.Qwen35LM(s)
    m.init_weights(seed)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():     # unit-scale weights so every path matters
        for n, p in sorted(m.named_parameters()):
            if n.endswith("embed_tokens.weight"):
                p.copy_(torch.randn(p.shape, generator=g))
            elif p.dim() >= 2 and "conv1d" not in n:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))
    return m.eval()


def main():
    torch.manual_seed(0)
    # 1
    B, T, Hk, Hv, dk, dv = 2, 150, 2, 4, 16, 24
    f64 = dict(dtype=torch.float64)
    q, k = torch.randn(B, T, Hk, dk, **f64), torch.randn(B, T, Hk, dk, **f64)
    v = torch.randn(B, T, Hv, dv, **f64)
    g, beta = -torch.rand(B, T, Hv, **f64) * 2, torch.rand(B, T, Hv, **f64)
    s0 = torch.randn(B, Hv, dk, dv, **f64)
    xs = [x.requires_grad_() for x in (q, k, v, g, beta)]
    o1, s1 = M.recurrent_gated_delta_rule(*xs, initial_state=s0)
    o2, s2 = M.chunk_gated_delta_rule(*xs, initial_state=s0, output_final_state=True)
    check("gdn chunked vs recurrent f64: output", rel(o2, o1), 1e-5)
    check("gdn chunked vs recurrent f64: state", rel(s2, s1), 1e-5)
    w = torch.randn_like(o1)
    g1 = torch.autograd.grad((o1 * w).sum(), xs)
    g2 = torch.autograd.grad((o2.double() * w).sum(), xs)
    for n, a, b in zip("q k v g beta".split(), g2, g1):
        check("gdn chunked vs recurrent f64: d" + n, rel(a, b), 1e-5)
    # 2
    m = random_target()
    gen = torch.Generator().manual_seed(1)
    lens, cont = [5, 17, 70], 12
    seqs = [torch.randint(0, 151669, (L + cont,), generator=gen) for L in lens]
    Tm = max(lens)
    ids = torch.zeros(len(lens), Tm, dtype=torch.long)
    valid = torch.zeros(len(lens), Tm, dtype=torch.bool)
    for i, (s, L) in enumerate(zip(seqs, lens)):
        ids[i, Tm - L:], valid[i, Tm - L:] = s[:L], True
    with torch.no_grad():
        h, cache = m.prefill(ids, valid, Tm + cont)
        outs = [m.logits(h)]
        for t in range(cont - 1):
            outs.append(m.logits(m.decode_step(torch.stack([s[L + t] for s, L in zip(seqs, lens)]), cache)))
        worst = 0.0
        for i, (s, L) in enumerate(zip(seqs, lens)):
            ref = m(s[None])[0, L - 1:L - 1 + cont]
            worst = max(worst, rel(torch.stack([o[i] for o in outs]), ref))
    check("cached decode (left-padded) vs full forward", worst, 1e-5)
    with torch.no_grad():        # the fixed-shape step that generate.py captures in a CUDA graph
        h, cache = m.prefill(ids, valid, Tm + cont)
        sc = m.static_cache(cache)
        got = [m.logits(h)]
        for t in range(cont - 1):
            got.append(m.logits(m.decode_step_static(torch.stack([s[L + t] for s, L in zip(seqs, lens)]), sc)))
        worst = max(rel(a, b) for a, b in zip(got, outs))
    check("static (graph-shaped) decode vs cached decode", worst, 1e-5)
    prompts = [s[:L].tolist() for s, L in zip(seqs, lens)]
    outs = {}
    for dec in ("static", "eager"):
        gen_s = torch.Generator().manual_seed(5)
        outs[dec] = G.generate_batch(m, prompts, 10, [0.0, 1.0, 1.0], {7}, gen_s, torch.device("cpu"), 0, decoder=dec)
    check("generate_batch static vs eager (rows differing)",
          float(sum(a != b for a, b in zip(outs["static"], outs["eager"]))), 0)
    with torch.no_grad():
        h, cache = m.prefill(ids, valid, Tm + cont)
    sd = G.StaticDecoder(m, cache, torch.device("cpu"))
    hs = sd(torch.zeros(len(lens), dtype=torch.long))
    check("StaticDecoder output outside autograd (0 = yes)", float(hs.requires_grad), 0)
    # 3
    d = D.DFlashDraft(D.make_config(m.spec, 151669, 4))
    d.init_weights(1)
    d.eval()
    prompt = torch.randint(0, 151669, (20,), generator=gen).tolist()
    with torch.no_grad():
        seq, plain = list(prompt), []
        for _ in range(16):
            nx = int(m(torch.tensor([seq]))[0, -1].argmax())
            plain.append(nx)
            seq.append(nx)
        out, _ = D.speculative_generate(m, d, prompt, 16, temperature=0.0, block=4)
    check("speculative greedy == plain greedy (mismatches)", float(sum(a != b for a, b in zip(out, plain))), 0)
    # 4
    anchors = torch.tensor([[3, 7, -1]])
    mk = D.block_mask(anchors, 10, 2)[0, 0]
    exp = torch.zeros(6, 16, dtype=torch.bool)
    exp[0:2, :3] = True
    exp[2:4, :7] = True
    for j in range(3):
        exp[2 * j:2 * j + 2, 10 + 2 * j:12 + 2 * j] = True
    check("draft block mask (wrong entries)", float((mk != exp).sum()), 0)
    # 5
    t = {"a": torch.randn(3, 5).bfloat16(), "b": torch.randn(7), "c": torch.arange(4, dtype=torch.int64)}
    with tempfile.TemporaryDirectory() as tmp:
        st_io.save_file(t, os.path.join(tmp, "x.safetensors"), {"format": "pt"})
        u = st_io.load_file(os.path.join(tmp, "x.safetensors"))
    check("safetensors round trip (tensors differing)", float(sum(not torch.equal(t[n], u[n]) for n in t)), 0)
    total, _ = sizes.package_bytes(sizes.target_tensors(sizes.spec("T")))
    check("q4 bytes of shape T vs splash pack (5619712)", float(abs(total - 5619712)), 0)
    print("selftest: all passed")


if __name__ == "__main__":
    main()
