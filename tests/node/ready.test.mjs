// Memory and queue pressure over HTTP (serve test model):
//  - /ready turns 503 with a JSON reason when the queue is full
//    ("queue_full") or when a queued request waits with a lane free because
//    the KV pool cannot hold it ("pool_exhausted"), and is 200 again once the
//    pressure is gone;
//  - a pool for 2 requests serves 12 concurrent ones: never more than 2
//    run, the rest queue, every reply is the scripted text;
//  - a memory plan that cannot fit exits non-zero and prints every line of
//    the breakdown and the named reason.
// Requests are held in the engine by long scripted streams (test_script)
// that are aborted once the check is done; an aborted stream cancels its
// request.
import { test } from "node:test";
import assert from "node:assert";
import { spawnSync } from "node:child_process";
import { bin, testModel, startServer } from "./serve_util.mjs";

const pkg = testModel();
const words = (n, seed) => Array.from({ length: n }, (_, i) => `w${(i * 7 + seed * 13) % 97}`).join(" ");
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const chat = (base, body, signal) =>
    fetch(base + "/v1/chat/completions", { method: "POST", signal, headers: { "content-type": "application/json" }, body: JSON.stringify({ model: "t", reasoning_effort: "none", ...body }) });

// A streamed request that stays in the engine (a long script) until release().
function hold(base, seed, maxTokens) {
    const ac = new AbortController();
    const done = chat(base, { stream: true, messages: [{ role: "user", content: `hold ${seed}` }], test_script: words(800, seed), max_tokens: maxTokens }, ac.signal)
        .then(async (r) => {
            const reader = r.body.getReader();
            for (;;) if ((await reader.read()).done) break;
        })
        .catch(() => null);
    return { release: () => ac.abort(), done };
}

const getJson = async (base, path) => {
    const r = await fetch(base + path);
    return { status: r.status, headers: r.headers, json: await r.json() };
};

async function until(base, pred, what) {
    let s;
    for (let i = 0; i < 400; i++) {
        s = (await getJson(base, "/status")).json;
        if (pred(s)) return s;
        await sleep(10);
    }
    assert.fail(`timed out waiting for ${what}: ${JSON.stringify(s.queue)} ${JSON.stringify(s.pool)}`);
}

test("/ready is 503 queue_full while the queue is full, 200 before and after", async () => {
    const srv = await startServer(["--model", pkg, "--test-hooks", "--max-context", "4096", "--max-lanes", "1", "--max-queue", "2"]);
    const held = [];
    try {
        assert.deepEqual((await getJson(srv.base, "/ready")).json, { status: "ready" });
        held.push(hold(srv.base, 1, 2000));
        await until(srv.base, (s) => s.queue.active === 1, "one running request");
        const one = await getJson(srv.base, "/ready");
        assert.equal(one.status, 200); // the lane is busy, nothing waits
        held.push(hold(srv.base, 2, 2000));
        assert.equal((await getJson(srv.base, "/ready")).status, 200); // one waits for the lane: not critical
        held.push(hold(srv.base, 3, 2000));
        await until(srv.base, (s) => s.queue.queued === 2, "two queued requests");
        const r = await getJson(srv.base, "/ready");
        assert.equal(r.status, 503);
        assert.equal(r.headers.get("retry-after"), "1");
        assert.equal(r.json.status, "unavailable");
        assert.equal(r.json.reason, "queue_full");
        assert.equal(r.json.queued, 2);
        assert.equal(r.json.max_queued, 2);
        // what /ready announced: the next request is refused
        const extra = await chat(srv.base, { messages: [{ role: "user", content: "one more" }], test_script: "x", max_tokens: 4 });
        assert.equal(extra.status, 429);
        await extra.text();
        for (const h of held) h.release();
        await Promise.all(held.map((h) => h.done));
        await until(srv.base, (s) => s.queue.active === 0 && s.queue.queued === 0, "an idle engine");
        assert.deepEqual((await getJson(srv.base, "/ready")).json, { status: "ready" });
    } finally {
        for (const h of held) h.release();
        await srv.stop();
    }
});

test("/ready is 503 pool_exhausted while a request waits for KV pages with a lane free", async () => {
    // 80 pages of 32 tokens; a request of ~2015 tokens (prompt + max_tokens) takes 63 of them
    const srv = await startServer(["--model", pkg, "--test-hooks", "--max-context", "2048", "--max-lanes", "2", "--kv-pool-pages", "80"]);
    const held = [];
    try {
        held.push(hold(srv.base, 4, 2000));
        const a = await until(srv.base, (s) => s.queue.active === 1, "the first request running");
        assert.ok(a.pool.pages_free <= 80 - 63, JSON.stringify(a.pool));
        assert.equal((await getJson(srv.base, "/ready")).status, 200); // a lane and pages are free
        held.push(hold(srv.base, 5, 2000));
        await until(srv.base, (s) => s.queue.queued === 1, "the second request waiting");
        const r = await getJson(srv.base, "/ready");
        assert.equal(r.status, 503, JSON.stringify(r.json));
        assert.equal(r.headers.get("retry-after"), "1");
        assert.equal(r.json.reason, "pool_exhausted");
        assert.equal(r.json.queued, 1);
        assert.equal(r.json.slots_free, 1);
        assert.equal(r.json.pages_total, 80);
        assert.ok(r.json.pages_free < 63);
        held[0].release(); // its pages come back: the waiting request is admitted
        await until(srv.base, (s) => s.queue.queued === 0 && s.queue.active === 1, "the second request admitted");
        assert.equal((await getJson(srv.base, "/ready")).status, 200);
        held[1].release();
        await Promise.all(held.map((h) => h.done));
        const s = await until(srv.base, (s) => s.queue.active === 0 && s.cache.pages_pinned === 0, "an idle engine");
        assert.equal(s.pool.pages_free, s.pool.pages_total);
    } finally {
        for (const h of held) h.release();
        await srv.stop();
    }
});

test("a pool for 2 requests serves 12 concurrent ones: 2 run at a time, the rest queue", async () => {
    // 8 pages of 32 tokens; each request takes 4: max_tokens = 120 - its prompt
    const srv = await startServer(["--model", pkg, "--test-hooks", "--max-context", "256", "--max-lanes", "4", "--kv-pool-pages", "8"]);
    try {
        // prompts of one length (two-digit numbers are two digit tokens), measured by a one-token probe
        const messages = Array.from({ length: 12 }, (_, i) => [{ role: "user", content: `question ${10 + i} ` + words(8, 1) }]);
        const scripts = Array.from({ length: 12 }, (_, i) => `Reply ${i}: ` + words(2, i + 60));
        const probe = await chat(srv.base, { messages: messages[0], test_script: "x", max_tokens: 1 });
        const n = (await probe.json()).usage.prompt_tokens;
        assert.ok(n > 0 && n < 90, String(n));
        const maxTokens = messages.map(() => 120 - n);
        let running = true, maxActive = 0, maxQueued = 0, sawPool503 = false;
        const watch = (async () => {
            while (running) {
                const s = (await getJson(srv.base, "/status")).json;
                maxActive = Math.max(maxActive, s.queue.active);
                maxQueued = Math.max(maxQueued, s.queue.queued);
                const r = await getJson(srv.base, "/ready");
                if (r.status === 503 && r.json.reason === "pool_exhausted") sawPool503 = true;
                await sleep(5);
            }
        })();
        const rs = await Promise.all(messages.map((m, i) => chat(srv.base, { messages: m, test_script: scripts[i], max_tokens: maxTokens[i] }).then(async (r) => ({ status: r.status, json: await r.json() }))));
        running = false;
        await watch;
        rs.forEach((r, i) => {
            assert.equal(r.status, 200, JSON.stringify(r.json));
            assert.equal(r.json.choices[0].message.content, scripts[i]);
            assert.equal(r.json.choices[0].finish_reason, "stop");
        });
        assert.equal(maxActive, 2, "2 requests fit the pool at once (of 4 lanes)");
        assert.ok(maxQueued >= 1, "requests queued");
        assert.ok(sawPool503, "/ready said pool_exhausted while requests waited with lanes free");
        const s = await until(srv.base, (s) => s.queue.active === 0 && s.queue.queued === 0, "an idle engine");
        assert.equal(s.totals.requests, 13);
        assert.equal(s.pool.pages_free, s.pool.pages_total);
        assert.equal((await getJson(srv.base, "/ready")).status, 200);
    } finally {
        await srv.stop();
    }
});

// Every line of the memory plan's breakdown: "  NAME  FIGURE MiB|tokens".
const planLines = ["available", "margin", "budget", "weights", "scratch", "reserves", "fixed", "pool", "state slots", "snapshots", "kv pages", "max context", "deficit"];
function planFigures(text) {
    const fig = {};
    for (const name of planLines) {
        const m = text.match(new RegExp(`^  ${name} +(\\d+(?:\\.\\d)?) (MiB|tokens)`, "m"));
        assert.ok(m, `no "${name}" line in:\n${text}`);
        fig[name] = Number(m[1]);
    }
    return fig;
}

test("a memory plan that cannot fit exits non-zero with every line of the breakdown and the reason", () => {
    const r = spawnSync(bin, ["serve", "--model", pkg, "--port", "0", "--max-memory", "20M"], { encoding: "utf8", timeout: 30000 });
    assert.equal(r.status, 1, r.stderr);
    assert.doesNotMatch(r.stdout + r.stderr, /Ready ·/);
    assert.match(r.stderr, /the model does not fit \(working_set_too_small\)/);
    assert.match(r.stderr, /^  does not fit: working_set_too_small$/m);
    const f = planFigures(r.stderr);
    assert.equal(f.budget, 20.0); // --max-memory caps the budget
    assert.ok(Math.abs(f.fixed - (f.weights + f.scratch + f.reserves)) <= 0.2, JSON.stringify(f));
    assert.ok(f.fixed > f.budget && f.deficit > 0, JSON.stringify(f));

    // room for the weights, not for 4K tokens of f32 KV
    const r2 = spawnSync(bin, ["serve", "--model", pkg, "--port", "0", "--max-context", "4K", "--max-memory", "64M", "--kv-format", "f32"], { encoding: "utf8", timeout: 30000 });
    assert.equal(r2.status, 1, r2.stderr);
    assert.match(r2.stderr, /the model does not fit \(kv_pool_does_not_fit\)/);
    assert.match(r2.stderr, /^  does not fit: kv_pool_does_not_fit$/m);
    const g = planFigures(r2.stderr);
    assert.equal(g.budget, 64.0);
    assert.ok(g.fixed < g.budget && g.deficit > 0, JSON.stringify(g));
    assert.ok(Math.abs(g.pool - (g.budget - g.fixed)) <= 0.2, JSON.stringify(g));
    assert.ok(g["kv pages"] + g.snapshots + g["state slots"] <= g.pool + 0.2, JSON.stringify(g));
});
