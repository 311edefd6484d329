#!/usr/bin/env python3
"""bench_accept.py - mean acceptance length and decode speed of a package's draft, through the engine.

Starts `splash serve` on a free loopback port once per block size, sends every prompt of a
chat-prompt file (one {"messages": [...]} per line) to /v1/chat/completions one at a time (--lanes N:
N at a time, the server with N lanes, so the engine's steps run N lanes' cycles together), and sums
the `timings` the server returns (llama.cpp's names): predicted_n, predicted_ms, draft_n,
draft_n_accepted, decode_cycles.  Prints one table row per (block size, temperature):

  mean acceptance length = tokens emitted by decode cycles / cycles
                         = (accepted proposals + cycles) / cycles   (the anchor's token counts, as in DFlash)
  decode tok/s           = decoded tokens / decode time, summed over the prompts (a request's speed)
  wall tok/s             = decoded tokens / the row's wall-clock time (the server's throughput, which
                           --lanes N raises; it includes the prompts' prefill)
  speed-up               = decode tok/s / the block-1 row's at the same temperature
  ms a cycle per phase   = the engine's seconds in draft / verify / accept / commit (/status
                           speculation.seconds, the difference over the row's requests) / cycles
  ms a step per phase    = the same / decode-only engine steps (/status speculation.steps): with
                           --lanes N a step holds up to N lanes' cycles
and, for T=0, how many greedy replies equal the smallest block's (lossless decoding: all of them).

Greedy rows are deterministic; T=1 rows use a fixed seed per prompt, so reruns draw the same numbers
from the same distributions (the outputs differ between block sizes only in the draft's proposals,
which lossless verification makes invisible in distribution, not draw by draw).

  python3 bench/bench_accept.py [--splash build/splash] [--model PKG] [--blocks 1,8,auto]
                                [--temperatures 0,1] [--max-tokens 256] [--prompts FILE] [--threads N]
                                [--device auto|cuda|cpu] [--lanes N]
"""
import argparse
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))


def start_server(args, block):
    cmd = [args.splash, "serve", "--port", "0", "--no-webui", "--block-size", str(block), "--max-lanes", str(args.lanes)]
    if args.model:
        cmd += ["--model", args.model]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    if args.device:
        cmd += ["--device", args.device]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    for line in proc.stdout:
        m = re.search(r"Ready .*http://[^:]+:(\d+)", line)
        if m:
            return proc, int(m.group(1))
        if time.time() > deadline:
            break
    proc.kill()
    raise SystemExit("splash serve did not become ready: " + " ".join(cmd))


def chat(port, messages, temperature, seed, max_tokens):
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": temperature, "seed": seed}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def status_seconds(port):
    """The engine's cumulative seconds per decode-cycle phase (/status speculation.seconds) and its
    decode-only steps."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=30) as r:
        spec = json.loads(r.read())["speculation"]
        return dict(spec["seconds"], steps=spec.get("steps", 0))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--splash", default=os.path.join(HERE, "..", "build", "splash"))
    ap.add_argument("--model", default="", help="package directory (default: the default model)")
    ap.add_argument("--blocks", default="1,8")
    ap.add_argument("--temperatures", default="0,1")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--prompts", default=os.path.join(HERE, "data", "heldout_chat_prompts.jsonl"))
    ap.add_argument("--limit", type=int, default=0, help="first N prompts only")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--device", default="", help="auto|cuda|cpu (default: serve's)")
    ap.add_argument("--seed", type=int, default=20261130)
    ap.add_argument("--lanes", type=int, default=1, help="requests in flight at once (the server's lanes)")
    args = ap.parse_args()
    prompts = [json.loads(line)["messages"] for line in open(args.prompts) if line.strip()]
    if args.limit:
        prompts = prompts[:args.limit]
    temps = [float(t) for t in args.temperatures.split(",")]
    rows = []
    greedy = {}  # block -> the greedy replies: lossless decoding makes them the same text at every block size
    # a block size, or "auto" (serve --block-size auto: the draft's block or 1, chosen step by step)
    for block in [b if b == "auto" else int(b) for b in args.blocks.split(",")]:
        proc, port = start_server(args, block)
        try:
            chat(port, [{"role": "user", "content": "warm up"}], 0, 0, 8)
            for t in temps:
                s = dict(tokens=0, ms=0.0, drafted=0, accepted=0, cycles=0)
                before = status_seconds(port)
                texts = []
                t0 = time.time()
                with concurrent.futures.ThreadPoolExecutor(max_workers=max(args.lanes, 1)) as pool:
                    replies = list(pool.map(lambda im: chat(port, im[1], t, args.seed + im[0], args.max_tokens),
                                            enumerate(prompts)))
                s["wall"] = time.time() - t0
                for reply in replies:
                    tm = reply["timings"]
                    texts.append(reply["choices"][0]["message"].get("content") or "")
                    s["tokens"] += max(tm["predicted_n"] - 1, 0)  # the first token comes from prefill
                    s["ms"] += tm["predicted_ms"]
                    s["drafted"] += tm["draft_n"]
                    s["accepted"] += tm["draft_n_accepted"]
                    s["cycles"] += tm["decode_cycles"]
                after = status_seconds(port)
                s.update({k: after[k] - before[k] for k in after})  # engine seconds in each cycle phase
                if t == 0:
                    greedy[block] = texts
                rows.append((block, t, s))
                print(f"[bench_accept] block {block} T={t:g}: {json.dumps(s)}", file=sys.stderr, flush=True)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    base = {t: s for b, t, s in rows if b == 1}
    print(f"prompts: {len(prompts)} from {os.path.relpath(args.prompts)}, max_tokens {args.max_tokens}, "
          f"lanes {args.lanes}" + (f", device {args.device}" if args.device else ""))
    print("| block | T | decoded tokens | cycles | drafted | accepted | mean acceptance length | decode tok/s | speed-up vs block 1 "
          "| wall tok/s | ms a cycle: draft / verify / accept / commit | ms a step: draft / verify / accept / commit |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for b, t, s in rows:
        tps = 1e3 * s["tokens"] / s["ms"] if s["ms"] > 0 else 0.0
        acc = (s["accepted"] + s["cycles"]) / s["cycles"] if s["cycles"] else 0.0
        sp = ""
        if t in base and base[t]["ms"] > 0 and base[t]["tokens"]:
            sp = f"{tps / (1e3 * base[t]['tokens'] / base[t]['ms']):.2f}x"
        ph = " / ".join(f"{1e3 * s[k] / s['cycles']:.3f}" if s["cycles"] else "-"
                        for k in ("draft", "verify", "accept", "commit"))
        pst = " / ".join(f"{1e3 * s[k] / s['steps']:.3f}" if s["steps"] else "-"
                         for k in ("draft", "verify", "accept", "commit"))
        wall = s["tokens"] / s["wall"] if s["wall"] > 0 else 0.0
        print(f"| {b} | {t:g} | {s['tokens']} | {s['cycles']} | {s['drafted']} | {s['accepted']} | {acc:.3f} | {tps:.1f} | {sp} "
              f"| {wall:.1f} | {ph} | {pst} |")
    if len(greedy) > 1:
        ref_block = 1 if 1 in greedy else next(iter(greedy))
        for b in greedy:
            if b != ref_block:
                same = sum(x == y for x, y in zip(greedy[b], greedy[ref_block]))
                print(f"greedy replies at block {b} equal to block {ref_block}'s: {same} of {len(greedy[b])}")


if __name__ == "__main__":
    main()
