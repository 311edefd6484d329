// The prefix cache over the HTTP API (serve test model): a three-turn
// conversation prefills on turn k at most len(prompt_k) - LCP(prompt_k,
// prompt_(k-1) + generated_(k-1)) + 32 tokens (the LCP from the server's own
// template and tokenizer, run as `splash apply-template` / `splash tokenize`),
// reports it as usage.prompt_tokens_details.cached_tokens and in /status;
// divergent branches; a pool smaller than the workload queues and serves
// every request; cancellations leave the pool idle.
import { test, before, after } from "node:test";
import assert from "node:assert";
import { spawnSync } from "node:child_process";
import { bin, testModel, startServer } from "./serve_util.mjs";

let srv, pkg;
before(async () => {
    pkg = testModel();
    // the serve default KV format (int8): snapshots have their own allowance in the memory plan
    srv = await startServer(["--model", pkg, "--test-hooks", "--max-context", "2048", "--checkpoint-interval", "256"]);
});
after(async () => srv && (await srv.stop()));

const post = async (path, body) => {
    const r = await fetch(srv.base + path, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
    return { status: r.status, json: await r.json() };
};
const status = async () => (await fetch(srv.base + "/status")).json();

function tokens(messages, gen) {
    const t = spawnSync(bin, ["apply-template", "--model", pkg], { input: JSON.stringify({ messages, add_generation_prompt: gen, enable_thinking: false }), encoding: "utf8" });
    assert.equal(t.status, 0, t.stderr);
    const k = spawnSync(bin, ["tokenize", "--model", pkg], { input: t.stdout, encoding: "utf8" });
    assert.equal(k.status, 0, k.stderr);
    return JSON.parse(k.stdout);
}
const lcp = (a, b) => {
    let i = 0;
    while (i < a.length && i < b.length && a[i] === b[i]) i++;
    return i;
};
const words = (n, seed) => Array.from({ length: n }, (_, i) => `w${(i * 7 + seed * 13) % 97}`).join(" ");

test("three turns: each prefills only what is new, reported as cached_tokens and in /status", async () => {
    const messages = [{ role: "system", content: words(150, 1) }];
    let prev = null, prevGen = null;
    for (let k = 0; k < 3; k++) {
        messages.push({ role: "user", content: `turn ${k}: ` + words(40, k + 2) });
        const before = await status();
        const script = `Answer ${k}: ` + words(45, k + 9);
        const r = await post("/v1/chat/completions", { model: "t", messages, reasoning_effort: "none", test_script: script, max_tokens: 200 });
        assert.equal(r.status, 200, JSON.stringify(r.json));
        const after = await status();
        const prompt = tokens(messages, true);
        assert.equal(r.json.usage.prompt_tokens, prompt.length);
        const prefilled = after.cache.prefill_tokens - before.cache.prefill_tokens;
        const cached = r.json.usage.prompt_tokens_details.cached_tokens;
        assert.equal(prefilled, prompt.length - cached);
        assert.equal(after.cache.cached_tokens - before.cache.cached_tokens, cached);
        if (prev) {
            const l = lcp(prompt, prev.concat(prevGen));
            assert.ok(l > 200, `turns share ${l} tokens`);
            assert.ok(prefilled <= prompt.length - l + 32, `turn ${k}: prefilled ${prefilled}, prompt ${prompt.length}, LCP ${l}`);
            assert.ok(cached > 0);
        } else assert.equal(cached, 0);
        const reply = r.json.choices[0].message.content;
        messages.push({ role: "assistant", content: reply });
        prev = prompt;
        const sk = spawnSync(bin, ["tokenize", "--model", pkg], { input: script, encoding: "utf8" });
        prevGen = JSON.parse(sk.stdout);
    }
    const s = await status();
    assert.ok(s.cache.hits >= 2 && s.cache.snapshots_held > 0 && s.cache.snapshot_bytes > 0);
});

test("divergent branches: the second restarts at the nearest snapshot, the third at the junction", async () => {
    const base = [{ role: "system", content: words(300, 40) }, { role: "user", content: words(120, 41) }];
    const run = async (tail) => {
        const messages = [...base, { role: "assistant", content: "ok" }, { role: "user", content: tail }];
        const b = await status();
        const r = await post("/v1/chat/completions", { model: "t", messages, reasoning_effort: "none", test_script: "fine", max_tokens: 8 });
        assert.equal(r.status, 200);
        const a = await status();
        return { prompt: tokens(messages, true), prefilled: a.cache.prefill_tokens - b.cache.prefill_tokens };
    };
    const one = await run("branch one " + words(30, 50));
    const two = await run("branch two " + words(30, 51));
    const three = await run("branch three " + words(30, 52));
    const j = lcp(one.prompt, two.prompt);
    const suffix2 = two.prompt.length - j;
    // snapshots branch one left: checkpoints every 256, its replay point and last page
    assert.ok(two.prefilled <= suffix2 + (j % 256), `second: ${two.prefilled} for a suffix of ${suffix2}`);
    const j3 = lcp(three.prompt, two.prompt);
    assert.ok(three.prefilled <= three.prompt.length - j3 + 31, `third: ${three.prefilled} for a suffix of ${three.prompt.length - j3}`);
    assert.ok(one.prefilled === one.prompt.length);
});

test("a pool smaller than the workload queues requests and serves them all; cancellations leave it idle", async () => {
    // 6 pages of KV: each request needs 4 (prompt + max_tokens), so one runs at a time
    const small = await startServer(["--model", pkg, "--test-hooks", "--max-context", "192", "--max-lanes", "4", "--kv-pool-pages", "6"]);
    try {
        const base = small.base;
        const p = (i) => fetch(base + "/v1/chat/completions", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ model: "t", messages: [{ role: "user", content: words(20 + i, i) }], reasoning_effort: "none", test_script: words(10, i), max_tokens: 40 }) });
        const rs = await Promise.all(Array.from({ length: 12 }, (_, i) => p(i)));
        for (const r of rs) assert.equal(r.status, 200, await r.text());
        // random cancellations: aborted streams
        const aborts = [];
        for (let i = 0; i < 10; i++) {
            const ac = new AbortController();
            aborts.push(fetch(base + "/v1/chat/completions", { method: "POST", signal: ac.signal, headers: { "content-type": "application/json" }, body: JSON.stringify({ model: "t", stream: true, messages: [{ role: "user", content: words(20, i + 30) }], reasoning_effort: "none", test_script: words(30, i), max_tokens: 40 }) }).catch(() => null));
            setTimeout(() => ac.abort(), 5 + i * 7);
        }
        await Promise.all(aborts);
        let s;
        for (let i = 0; i < 100; i++) {
            s = await (await fetch(base + "/status")).json();
            if (s.queue.active === 0 && s.queue.queued === 0 && s.cache.pages_pinned === 0 && s.pool.pages_free === s.pool.pages_total) break;
            await new Promise((r) => setTimeout(r, 50));
        }
        assert.equal(s.queue.active, 0);
        assert.equal(s.cache.pages_pinned, 0);
        assert.equal(s.pool.pages_free, s.pool.pages_total);
        assert.ok(s.cache.pages_evicted > 0, JSON.stringify(s.cache));
    } finally {
        await small.stop();
    }
});

test("a memory plan that cannot fit exits with the breakdown", () => {
    const r = spawnSync(bin, ["serve", "--model", pkg, "--port", "0", "--max-memory", "20M"], { encoding: "utf8", timeout: 20000 });
    assert.notEqual(r.status, 0);
    assert.match(r.stderr, /working_set_too_small/);
    for (const w of ["budget", "weights", "scratch", "reserves", "fixed", "kv pages", "deficit"]) assert.match(r.stderr, new RegExp(w));
    // 64M holds 4K tokens of int8 KV but not of f32 KV
    const r2 = spawnSync(bin, ["serve", "--model", pkg, "--port", "0", "--max-context", "4K", "--max-memory", "64M", "--kv-format", "f32"], { encoding: "utf8", timeout: 20000 });
    assert.notEqual(r2.status, 0);
    assert.match(r2.stderr, /kv_pool_does_not_fit/);
});
