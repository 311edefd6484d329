#!/usr/bin/env python3
"""One device call's worth of measurements for the default model (run by run_device.sh bench).

  1. chunk_gated_delta_rule (model.py) against transformers' torch_chunk_gated_delta_rule and
     against a float64 token-by-token recurrence, on fresh random inputs: forward, final state
     and the gradients of q, k, v, g, beta (relative L2 errors), fp32 with TF32 off;
  2. the GDN core's speed, forward + backward, ours vs transformers' fallback;
  3. the whole network against Qwen3_5ForCausalLM loaded from our export (logits and the tapped
     layer outputs, fp32, TF32 off, unit-scale random weights);
  4. training throughput (tokens/s) of the candidate sizes (sizes.CANDIDATES): eager and with
     the whole step in one CUDA graph; transformers' own model (fallback GDN) for comparison;
  5. (--compile-trial, a separate process) torch.compile of the GDN core: compile time and the
     step time it gives.

--variants (the second call): the GDN core with solve_triangular vs the block inverse, a
torch.profiler table of one eager step, the step time of the speed variants (block inverse,
fused linear-CE, its elementwise parts compiled, 64 x 1024), and cached decoding speed.

Prints a table at the end and writes OUT/bench.json (OUT/variants.json).  Every part checks the time left against
--deadline and is skipped, with a note, if it would not fit.
"""

import argparse
import json
import math
import os
import sys
import time
import traceback

import torch

sys.dont_write_bytecode = True      # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common as C  # noqa: E402
import model as M  # noqa: E402
import sizes  # noqa: E402

T0 = time.time()
RES = {"notes": []}


def left(a):
    return a.deadline - (time.time() - T0)


def note(msg):
    print("[bench] " + msg, flush=True)
    RES["notes"].append(msg)


def rel(x, ref):
    x, ref = x.detach(), ref.detach()
    return float((x.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30))


def hf_gdn_fn():
    from transformers.models.qwen3_5 import modeling_qwen3_5 as hfm
    fn = getattr(hfm, "torch_chunk_gated_delta_rule")
    return getattr(fn, "__wrapped__", fn)


def gdn_inputs(B, T, Hk, Hv, dk, dv, dev, dtype, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn(B, T, Hk, dk, generator=g)
    k = torch.randn(B, T, Hk, dk, generator=g)
    v = torch.randn(B, T, Hv, dv, generator=g)
    gg = -torch.rand(B, T, Hv, generator=g) * 3 * torch.rand(1, 1, Hv, generator=g)   # mixed decays
    beta = torch.rand(B, T, Hv, generator=g)
    s0 = torch.randn(B, Hv, dk, dv, generator=g) * 0.1
    return [x.to(dev, dtype).requires_grad_() for x in (q, k, v, gg, beta)] + [s0.to(dev)]


def check_gdn(dev):
    """ours vs transformers (fp32) and vs float64 recurrence."""
    C.fast_math(False)
    out = {}
    hf = hf_gdn_fn()
    for (B, T, Hk, Hv, dk, dv, seed) in ((2, 300, 2, 4, 64, 64, 1), (1, 200, 2, 6, 32, 48, 2)):
        q, k, v, g, beta, s0 = gdn_inputs(B, T, Hk, Hv, dk, dv, dev, torch.float32, seed)
        w = torch.randn(B, T, Hv, dv, device=dev)
        o1, s1 = M.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=s0, output_final_state=True)
        gr1 = torch.autograd.grad((o1 * w).sum(), [q, k, v, g, beta])
        rep = Hv // Hk
        o2, s2 = hf(q.repeat_interleave(rep, 2), k.repeat_interleave(rep, 2), v, g=g, beta=beta, chunk_size=64,
                    initial_state=s0, output_final_state=True, use_qk_l2norm_in_kernel=True)
        gr2 = torch.autograd.grad((o2 * w).sum(), [q, k, v, g, beta])
        qd, kd, vd, gd, bd = (x.detach().double().requires_grad_() for x in (q, k, v, g, beta))
        o3, s3 = M.recurrent_gated_delta_rule(qd, kd, vd, gd, bd, initial_state=s0.double())
        gr3 = torch.autograd.grad((o3 * w.double()).sum(), [qd, kd, vd, gd, bd])
        key = "B%d_T%d_Hk%d_Hv%d_dk%d_dv%d" % (B, T, Hk, Hv, dk, dv)
        out[key] = {
            "ours_vs_hf": {"o": rel(o1, o2), "state": rel(s1, s2),
                           **{"d" + n: rel(a, b) for n, a, b in zip("q k v g beta".split(), gr1, gr2)}},
            "ours_vs_f64": {"o": rel(o1, o3), "state": rel(s1, s3),
                            **{"d" + n: rel(a, b) for n, a, b in zip("q k v g beta".split(), gr1, gr3)}},
            "hf_vs_f64": {"o": rel(o2, o3), "state": rel(s2, s3),
                          **{"d" + n: rel(a, b) for n, a, b in zip("q k v g beta".split(), gr2, gr3)}},
        }
        for who, d in out[key].items():
            print("[bench] gdn %s %s: %s" % (key, who, " ".join("%s=%.2e" % kv for kv in d.items())), flush=True)
    C.fast_math(True)
    return out


def time_cuda(fn, reps=5, warm=2):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        ts.append(s.elapsed_time(e))
    ts.sort()
    return ts[len(ts) // 2]


def gdn_speed(dev, fn_ours=None):
    B, T, Hk, Hv, d = 8, 2048, 2, 4, 64
    q, k, v, g, beta, _ = gdn_inputs(B, T, Hk, Hv, d, d, dev, torch.bfloat16, 7)
    g = g.detach().float().requires_grad_()
    beta = beta.detach().float().requires_grad_()
    hf = hf_gdn_fn()
    ours = fn_ours or M.chunk_gated_delta_rule

    def run_ours():
        o, _ = ours(q, k, v, g, beta)
        o.float().sum().backward()

    def run_hf():
        o, _ = hf(q.repeat_interleave(2, 2), k.repeat_interleave(2, 2), v, g=g, beta=beta, chunk_size=64,
                  use_qk_l2norm_in_kernel=True)
        o.float().sum().backward()
    r = {"shape": "B%d T%d Hv%d d%d bf16 in, fwd+bwd" % (B, T, Hv, d), "ours_ms": time_cuda(run_ours),
         "hf_ms": time_cuda(run_hf, reps=3, warm=1)}
    print("[bench] gdn speed %s" % r, flush=True)
    return r


def randomize_(m, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in sorted(m.named_parameters()):
            if n.endswith("embed_tokens.weight"):
                p.copy_(torch.randn(p.shape, generator=g))
            elif p.dim() >= 2 and "conv1d" not in n:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))
            elif "linear_attn.norm" in n:
                p.copy_(1 + torch.randn(p.shape, generator=g) * 0.1)
            elif n.endswith("norm.weight"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)


def check_model(dev, name, tmp):
    """our network vs Qwen3_5ForCausalLM.from_pretrained(our export)."""
    import transformers
    C.fast_math(False)
    s = sizes.spec(name)
    m = M.Qwen35LM(s)
    m.init_weights(11)
    randomize_(m, 12)
    m = m.to(torch.bfloat16).to(torch.float32)      # the exported (bf16) values exactly
    C.export_hf(m, tmp)
    hf = transformers.Qwen3_5ForCausalLM.from_pretrained(tmp, dtype=torch.float32, attn_implementation="eager")
    hf = hf.to(dev).eval()
    m = m.to(dev).eval()
    taps = sizes.taps_for(s["layers"], sizes.DRAFT["n_taps"])
    ids = torch.randint(0, 151669, (2, 200), generator=torch.Generator().manual_seed(13)).to(dev)
    with torch.no_grad():
        out = hf(ids, output_hidden_states=True)
        h, tapped = m.hidden(ids, taps=set(taps))
        lg = m.logits(h)
    r = {"size": name, "logits_rel": rel(lg, out.logits), "n_hidden_states": len(out.hidden_states)}
    for t in taps:   # z-lab reads hidden_states[layer_id + 1]: the output of layer layer_id
        r["tap%d_rel_hs[t+1]" % t] = rel(tapped[t], out.hidden_states[t + 1])
        r["tap%d_rel_hs[t]" % t] = rel(tapped[t], out.hidden_states[t])
    # cached decoding (generate.py) against the full forward: left-padded prefill + 16 steps
    with torch.no_grad():
        L0, n = 150, 16
        valid = torch.ones(2, 184, dtype=torch.bool, device=dev)
        valid[1, :184 - L0] = False
        full_ids = torch.randint(0, 151669, (2, 184 + n), generator=torch.Generator().manual_seed(14)).to(dev)
        hp, cache = m.prefill(full_ids[:, :184], valid, 184 + n)
        got = [m.logits(hp)]
        for t in range(n - 1):
            got.append(m.logits(m.decode_step(full_ids[:, 184 + t], cache)))
        got = torch.stack(got, 1)
        ref0 = m(full_ids)[0, 183:183 + n]
        ref1 = m(full_ids[1:, 184 - L0:])[0, L0 - 1:L0 - 1 + n]
        r["decode_vs_full_rel"] = max(rel(got[0], ref0), rel(got[1], ref1))
    miss = [k for k in hf.state_dict() if k not in m.state_dict() and k != "lm_head.weight"]
    r["hf_keys_missing_here"] = miss
    r["tied"] = bool(hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr())
    print("[bench] model vs transformers: %s" % r, flush=True)
    C.fast_math(True)
    del hf
    torch.cuda.empty_cache()
    return r


def train_throughput(dev, name, batch, seq, mode, seconds, hf_model=False):
    """tokens/s of full training steps (bf16 autocast, fused AdamW, clip) on random tokens."""
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    s = sizes.spec(name)
    if hf_model:
        import transformers
        cfg = transformers.Qwen3_5TextConfig(**{k: v for k, v in sizes.hf_config(s).items()
                                                 if k not in ("architectures", "model_type", "transformers_version",
                                                              "dtype")})
        net = transformers.Qwen3_5ForCausalLM(cfg).to(dev).train()

        def loss_fn(x):
            h = net.model(input_ids=x[:, :-1]).last_hidden_state
            return M.chunked_ce(h.reshape(-1, h.shape[-1]), net.lm_head.weight, x[:, 1:].reshape(-1))
    else:
        net = M.Qwen35LM(s)
        net.init_weights(1)
        net = net.to(dev).train()
        net.gdn_fn = GDN_FN[0]

        def loss_fn(x):
            return net.loss(x[:, :-1], x[:, 1:])
    graph = mode == "graph"
    lr_t = torch.tensor(1e-3, device=dev)
    opt = torch.optim.AdamW(M.param_groups(net, 0.1), lr=lr_t if graph else 1e-3, betas=(0.9, 0.95), fused=True,
                            capturable=graph)
    params = list(net.parameters())
    x = torch.randint(0, 151669, (batch, seq + 1), device=dev)

    def step():
        with C.autocast(dev):
            loss = loss_fn(x)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        opt.step()
        return loss.detach()
    t_setup = time.time()
    if graph:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                opt.zero_grad(set_to_none=True)
                step()
        torch.cuda.current_stream().wait_stream(side)
        opt.zero_grad(set_to_none=True)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            sl = step()
        run = g.replay
    else:
        def run():
            opt.zero_grad(set_to_none=True)
            return step()
        run()
        run()
    torch.cuda.synchronize()
    t_setup = time.time() - t_setup
    n, t = 0, time.time()
    while True:
        run()
        n += 1
        if n >= 2 and (n % 2 == 0):
            torch.cuda.synchronize()
            if time.time() - t >= seconds:
                break
    torch.cuda.synchronize()
    dt = time.time() - t
    loss = float(sl) if graph else float(run())
    r = {"size": name + ("(hf)" if hf_model else ""), "mode": mode, "batch": batch, "seq": seq,
         "tokens_per_step": batch * seq, "steps": n, "ms_per_step": round(1000 * dt / n, 1),
         "tok_per_s": round(batch * seq * n / dt), "setup_s": round(t_setup, 1),
         "peak_gib": round(torch.cuda.max_memory_allocated() / 2 ** 30, 1), "loss_after": round(loss, 3),
         "params": sum(p.numel() for p in net.parameters())}
    print("[bench] throughput %s" % r, flush=True)
    del net, opt, x
    if graph:
        del g
    torch.cuda.empty_cache()
    return r


def set_variant(tri="inverse", ce="checkpoint", ce_compiled=False, gdn_compiled=False):
    M.TRI_SOLVE = tri
    M.CE_IMPL = ce
    M.CE_FNS = {"lse": M._lse_target, "dlogits": M._dlogits}
    if ce_compiled:
        M.CE_FNS = {"lse": torch.compile(M._lse_target, dynamic=False),
                    "dlogits": torch.compile(M._dlogits, dynamic=False)}
    GDN_FN[0] = torch.compile(M.chunk_gated_delta_rule, dynamic=False) if gdn_compiled else None


GDN_FN = [None]


def profile_step(dev, name="B", batch=32, seq=2048):
    """CUDA time by kernel of one eager training step (after one warm-up step)."""
    from torch.profiler import ProfilerActivity, profile
    net = M.Qwen35LM(sizes.spec(name))
    net.init_weights(1)
    net = net.to(dev).train()
    net.gdn_fn = GDN_FN[0]
    opt = torch.optim.AdamW(M.param_groups(net, 0.1), lr=1e-3, fused=True)
    x = torch.randint(0, 151669, (batch, seq + 1), device=dev)

    def step():
        opt.zero_grad(set_to_none=True)
        with C.autocast(dev):
            loss = net.loss(x[:, :-1], x[:, 1:])
        loss.backward()
        opt.step()
    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=22, max_name_column_width=70)
    print(table, flush=True)
    del net, opt
    torch.cuda.empty_cache()
    return table


@torch.no_grad()
def generate_speed(dev, name="B", batch=256, plen=200, new=64):
    import generate as G
    net = M.Qwen35LM(sizes.spec(name))
    net.init_weights(1)
    net = net.to(dev).eval()
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 151669, (plen - (i % 50),), generator=g).tolist() for i in range(batch)]
    gen = torch.Generator(device=dev)
    gen.manual_seed(1)
    t = time.time()
    G.generate_batch(net, prompts[:8], 4, [0.0] * 8, {151645}, gen, dev, 151643)
    torch.cuda.synchronize()
    t = time.time()
    out = G.generate_batch(net, prompts, new, [0.0, 1.0] * (batch // 2), {-1}, gen, dev, 151643)
    torch.cuda.synchronize()
    dt = time.time() - t
    r = {"batch": batch, "prompt": plen, "new": new, "seconds": round(dt, 2),
         "new_tok_per_s": round(batch * new / dt), "ms_per_step": round(1000 * dt / new, 1)}
    print("[bench] generate %s" % r, flush=True)
    return r


def compile_trial(a, dev):
    C.fast_math(True)
    t = time.time()
    comp = torch.compile(M.chunk_gated_delta_rule, dynamic=False)
    r = {}
    try:
        r["gdn_compiled"] = gdn_speed(dev, comp)
        r["compile_plus_first_s"] = round(time.time() - t, 1)
        note("compile trial: GDN fwd+bwd %.2f ms compiled vs (see gdn_speed) eager; compile+first %.1f s" % (
            r["gdn_compiled"]["ours_ms"], r["compile_plus_first_s"]))
    except Exception as e:  # noqa: BLE001
        r["error"] = repr(e)[:500]
        note("compile trial failed: %r" % e)
    print("[bench] compile trial result %s" % json.dumps(r), flush=True)


def variants(a, dev):
    """Where the step time goes, and what the candidate fixes buy (B, 32 x 2048, CUDA graph)."""
    C.fast_math(True)
    out = {}

    def part(name, fn, need):
        if left(a) < need:
            note("skipped %s: %.0f s left" % (name, left(a)))
            return None
        try:
            return fn()
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            note("%s failed: %r" % (name, e))
            return {"error": repr(e)[:800]}
    set_variant(tri="trsm")
    out["gdn_speed_trsm"] = part("gdn speed trsm", lambda: gdn_speed(dev), 8)
    set_variant(tri="inverse")
    out["gdn_speed_inverse"] = part("gdn speed inverse", lambda: gdn_speed(dev), 8)
    out["gdn_check_inverse"] = part("gdn check inverse", lambda: check_gdn(dev), 8)
    set_variant(tri="trsm")
    out["profile_trsm"] = part("profile trsm", lambda: profile_step(dev), 15)
    S = a.seconds
    rows = []
    for label, kw in (("trsm+ckptCE", dict(tri="trsm")), ("inverse+ckptCE", dict(tri="inverse")),
                      ("inverse+fusedCE", dict(tri="inverse", ce="fused")),
                      ("inverse+fusedCE(compiled)", dict(tri="inverse", ce="fused", ce_compiled=True))):
        set_variant(**kw)
        t = time.time()
        r = part("variant " + label, lambda: train_throughput(dev, "B", 32, 2048, "graph", S), S + 10)
        if r:
            r["variant"] = label
            r["wall_incl_compile_s"] = round(time.time() - t, 1)
            rows.append(r)
    set_variant(tri="inverse", ce="fused")
    r = part("variant seq1024", lambda: train_throughput(dev, "B", 64, 1024, "graph", S), S + 10)
    if r:
        r["variant"] = "inverse+fusedCE, 64x1024"
        r["wall_incl_compile_s"] = 0
        rows.append(r)
    best = dict(tri="inverse", ce="fused", ce_compiled=False)
    set_variant(**best)
    out["profile_best"] = part("profile inverse+fusedCE", lambda: profile_step(dev), 15)
    out["generate"] = part("generate speed", lambda: generate_speed(dev), 15)
    set_variant(tri="inverse", ce="fused", ce_compiled=True, gdn_compiled=True)
    t = time.time()
    r = part("variant all-compiled", lambda: train_throughput(dev, "B", 32, 2048, "graph", S), S + 70)
    if r:
        r["variant"] = "inverse+fusedCE+GDN compiled"
        r["wall_incl_compile_s"] = round(time.time() - t, 1)
        rows.append(r)
    out["variants"] = rows
    with open(os.path.join(a.out, "variants.json"), "w") as f:
        json.dump(out, f, indent=1, default=str)
    print("\n| variant | ms/step | tokens/s | setup s | wall incl. compile s | peak GiB |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        if "error" not in r:
            print("| %s | %s | %s | %s | %s | %s |" % (r["variant"], r["ms_per_step"], r["tok_per_s"], r["setup_s"],
                                                  r["wall_incl_compile_s"], r["peak_gib"]))
    print("[bench] variants done in %.1f s" % (time.time() - T0), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--deadline", type=float, default=120)
    ap.add_argument("--seconds", type=float, default=8)
    ap.add_argument("--compile-trial", action="store_true")
    ap.add_argument("--variants", action="store_true", help="second call: profile + speed variants")
    a = ap.parse_args()
    dev = C.device()
    os.makedirs(a.out, exist_ok=True)
    if a.compile_trial:
        compile_trial(a, dev)
        return
    if a.variants:
        variants(a, dev)
        return
    import transformers
    RES["env"] = {"torch": torch.__version__, "transformers": transformers.__version__,
                  "gpu": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu",
                  "cuda": torch.version.cuda}
    try:
        import fla  # noqa: F401
        RES["env"]["fla"] = True
    except Exception:  # noqa: BLE001
        RES["env"]["fla"] = False
    print("[bench] env %s" % RES["env"], flush=True)

    def part(name, fn, need):
        if left(a) < need:
            note("skipped %s: %.0f s left, needs ~%.0f" % (name, left(a), need))
            return None
        try:
            return fn()
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            note("%s failed: %r" % (name, e))
            return {"error": repr(e)[:800]}

    RES["gdn_check"] = part("gdn_check", lambda: check_gdn(dev), 10)
    RES["gdn_speed"] = part("gdn_speed", lambda: gdn_speed(dev), 10)
    RES["model_check"] = part("model_check", lambda: check_model(dev, sizes.CHOSEN, "/tmp/splash-bench-export"), 15)
    tp = []
    S = a.seconds
    plan = [("B", 32, 2048, "eager"), ("B", 32, 2048, "graph"), ("A", 32, 2048, "graph"), ("C", 32, 2048, "graph"),
            ("B", 64, 2048, "graph"), ("B", 8, 2048, "eager")]
    for name, b, sq, mode in plan:
        r = part("throughput %s b%d %s" % (name, b, mode), lambda: train_throughput(dev, name, b, sq, mode, S), S + 12)
        if r:
            tp.append(r)
    r = part("throughput hf B", lambda: train_throughput(dev, "B", 8, 2048, "eager", S, hf_model=True), S + 20)
    if r:
        tp.append(r)
    RES["throughput"] = tp
    RES["seconds"] = round(time.time() - T0, 1)
    with open(os.path.join(a.out, "bench.json"), "w") as f:
        json.dump(RES, f, indent=1)
    print("\n| size | mode | batch x seq | ms/step | tokens/s | setup s | peak GiB |")
    print("|---|---|---|---|---|---|---|")
    for r in tp:
        if "error" in r:
            continue
        print("| %s | %s | %dx%d | %s | %s | %s | %s |" % (r["size"], r["mode"], r["batch"], r["seq"], r["ms_per_step"],
                                                       r["tok_per_s"], r["setup_s"], r["peak_gib"]))
    print("[bench] done in %.1f s" % (time.time() - T0), flush=True)


if __name__ == "__main__":
    main()
