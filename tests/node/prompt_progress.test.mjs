// Prompt progress while a long prompt is read: Chat Completions streaming
// with "return_progress": true sends llama.cpp-shaped chunks
// ({"delta":{"role":"assistant","content":null}, "prompt_progress":
// {total, cache, processed, time_ms}}) after each prefill chunk, and
// keep-alive comments while the request waits for a lane.  One lane (so a
// request can be made to queue) and 100 ms keep-alives.  The prompt's length
// comes from the reference template (@huggingface/jinja) and tokenizer
// (@huggingface/tokenizers), never from the server.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";
import { countTokens, jinjaPrompt } from "./api_util.mjs";
import { rawRequest, sseEvents, startServer, testModel } from "./serve_util.mjs";

let srv;

before(async () => {
    srv = await startServer(["--model", testModel(), "--test-hooks", "--threads", "1", "--max-context", "2K",
        "--max-lanes", "1", "--keepalive-ms", "100"]);
});

after(async () => {
    if (srv) assert.equal((await srv.stop("SIGTERM")).code, 0, srv.log());
});

const raw = (body) => rawRequest(srv.port, { path: "/v1/chat/completions", body });

// A stream; resolves with its chunks as { t (ms since the request), d (text) }.
function streamChunks(body) {
    const chunks = [];
    const t0 = Date.now();
    return new Promise((resolve, reject) => {
        const req = http.request({ host: "127.0.0.1", port: srv.port, method: "POST", path: "/v1/chat/completions", agent: false,
            headers: { "content-type": "application/json" } }, (res) => {
            res.on("data", (d) => chunks.push({ t: Date.now() - t0, d: d.toString() }));
            res.on("end", () => resolve(chunks));
        });
        req.on("error", reject);
        req.end(JSON.stringify(body));
    });
}

function checkProgress(events, n) {
    const pp = events.filter((e) => e !== "[DONE]" && e.prompt_progress);
    assert.ok(pp.length >= 1, "no prompt_progress chunk");
    for (const e of pp) {
        assert.equal(e.object, "chat.completion.chunk");
        assert.deepEqual(e.choices, [{ index: 0, delta: { role: "assistant", content: null }, logprobs: null, finish_reason: null }]);
        assert.deepEqual(Object.keys(e.prompt_progress), ["total", "cache", "processed", "time_ms"]);
        assert.equal(e.prompt_progress.total, n);
    }
    const p = pp.map((e) => e.prompt_progress);
    for (let i = 1; i < p.length; i++) {
        assert.ok(p[i].processed > p[i - 1].processed, `not increasing: ${JSON.stringify(p)}`);
        assert.ok(p[i].time_ms >= p[i - 1].time_ms, `time went back: ${JSON.stringify(p)}`);
    }
    assert.equal(p[p.length - 1].processed, n, JSON.stringify(p));
    // every progress chunk comes before the first text
    const firstText = events.findIndex((e) => e !== "[DONE]" && e.choices?.[0]?.delta?.content);
    const lastProgress = events.lastIndexOf(pp[pp.length - 1]);
    if (firstText >= 0) assert.ok(lastProgress < firstText);
    return p;
}

test("return_progress: monotonic prompt_progress chunks ending at the prompt length; the cached part on a repeat", { timeout: 30000 }, async () => {
    const content = "hello ".repeat(600);
    const n = countTokens(jinjaPrompt({ messages: [{ role: "user", content }] }));
    const body = { messages: [{ role: "user", content }], max_tokens: 2, stream: true, return_progress: true,
        stream_options: { include_usage: true } };
    const ev = sseEvents((await streamChunks(body)).map((c) => c.d).join(""));
    const p = checkProgress(ev, n);
    // a 600-token prompt is read in prefill chunks of at most 256 rows: several steps
    assert.ok(p.length >= 3, JSON.stringify(p));
    assert.equal(p[0].cache, 0);
    assert.ok(p[0].processed < n);
    assert.equal(ev[ev.length - 2].usage.prompt_tokens, n);
    assert.equal(ev[ev.length - 1], "[DONE]");
    // the same prompt again: the prefix cache holds most of it
    const ev2 = sseEvents((await streamChunks(body)).map((c) => c.d).join(""));
    const p2 = checkProgress(ev2, n);
    const cached = ev2[ev2.length - 2].usage.prompt_tokens_details.cached_tokens;
    assert.ok(cached > 0);
    for (const x of p2) assert.equal(x.cache, cached);
    assert.ok(p2[0].processed >= cached);
});

test("return_progress: queued requests get keep-alives, then progress; no progress without it or without stream", { timeout: 30000 }, async () => {
    // A holds the only lane for a while (a scripted 200-token answer, >= 0.6 s)
    const a = raw({ messages: [{ role: "user", content: "Hi" }], test_script: "word ".repeat(200), max_tokens: 300 });
    for (let i = 0; i < 200; i++) {
        const s = (await rawRequest(srv.port, { method: "GET", path: "/status" })).json;
        if (s.queue.active === 1) break;
        await new Promise((r) => setTimeout(r, 10));
    }
    const content = "queued ".repeat(300);
    const n = countTokens(jinjaPrompt({ messages: [{ role: "user", content }] }));
    const chunks = await streamChunks({ messages: [{ role: "user", content }], max_tokens: 1, stream: true, return_progress: true });
    assert.equal((await a).status, 200);
    const all = chunks.map((c) => c.d).join("");
    const firstProgress = all.indexOf("prompt_progress");
    assert.ok(firstProgress > 0, all.slice(0, 1000));
    assert.ok(all.slice(0, firstProgress).includes(": keep-alive"), "no keep-alive while queued");
    const ev = sseEvents(all);
    const p = checkProgress(ev, n);
    // time_ms counts from admission, not from the request (B waited for most of A)
    const tFirst = chunks.find((c) => c.d.includes("prompt_progress")).t;
    assert.ok(p[0].time_ms + 250 < tFirst, `time_ms ${p[0].time_ms}, first progress after ${tFirst} ms`);
    // without return_progress, or without stream, nothing of it
    const plain = await raw({ messages: [{ role: "user", content }], max_tokens: 1, stream: true });
    assert.ok(!plain.text.includes("prompt_progress"));
    const whole = await raw({ messages: [{ role: "user", content }], max_tokens: 1, return_progress: true });
    assert.equal(whole.status, 200);
    assert.ok(!("prompt_progress" in whole.json));
    const bad = await raw({ messages: [{ role: "user", content: "x" }], stream: true, return_progress: "yes" });
    assert.equal(bad.status, 400);
    assert.equal(bad.json.error.param, "return_progress");
});
