// Replays real Claude Code and Codex traffic (tests/node/recorded/: request
// bodies captured from @anthropic-ai/claude-code 2.1.197 and @openai/codex
// 0.171.0 talking to `splash serve`, two consecutive turns each: a tool call,
// then the answer after the tool's result; see recorded/README.md).  For each
// client: every streamed event is well formed; the rendered prompt equals the
// committed golden rendering, which is itself checked against an independent
// rendering (the API -> Chat mapping of docs/api.md written again here, and
// @huggingface/jinja on the model's template); the second turn's prompt
// starts with the first turn's prompt + the model's output byte for byte, so
// the prefix cache reuses it (cached tokens >= the first prompt - 32).  SPLASH_UPDATE_GOLDEN=1 rewrites the
// golden files from the independent rendering.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { countTokens, jinjaPrompt, namedEvents, raw, ref } from "./api_util.mjs";
import { here, startServer, testModel } from "./serve_util.mjs";

const dir = path.join(here, "recorded");
const load = (name) => JSON.parse(fs.readFileSync(path.join(dir, name), "utf8"));
const scripts = load("scripts.json");

// The test model with a manifest that allows 64K positions: Claude Code's first prompt is ~18K tokens.
function widePackage() {
    const pkg = testModel(), wide = `${pkg}-64k`;
    if (fs.existsSync(path.join(wide, "manifest.json"))) return wide;
    const tmp = fs.mkdtempSync(`${pkg}-64k-tmp`);
    for (const f of fs.readdirSync(pkg)) if (f !== "manifest.json") fs.symlinkSync(path.join(pkg, f), path.join(tmp, f));
    const m = JSON.parse(fs.readFileSync(path.join(pkg, "manifest.json"), "utf8"));
    m.model.max_positions = 65536;
    fs.writeFileSync(path.join(tmp, "manifest.json"), JSON.stringify(m));
    try { fs.renameSync(tmp, wide); } catch { fs.rmSync(tmp, { recursive: true, force: true }); }
    return wide;
}

let srv;
before(async () => {
    srv = await startServer(["--model", widePackage(), "--test-hooks", "--threads", "1", "--max-context", "32K", "--max-lanes", "1", "--served-model-name", "tiny"]);
});
after(async () => {
    if (srv) assert.equal((await srv.stop("SIGTERM")).code, 0, srv.log());
});

// ---- the independent rendering: API requests -> Chat messages (docs/api.md) ----

const unseal = (s) => {
    const m = /^sr1_[0-9a-f]{32}_([A-Za-z0-9+/=]*)$/.exec(s ?? "");
    return m ? Buffer.from(m[1], "base64").toString("utf8") : null;
};
const chatTool = (name, description, parameters) => ({ type: "function", function: { name, ...(description !== undefined && { description }), ...(parameters !== undefined && { parameters }) } });

function fold() { // the srv_convo rules: leading system texts merge, later ones are user turns
    const system = [], msgs = [];
    let open = null;
    const openMsg = (role) => {
        if (!open || open.role !== role) msgs.push((open = { role, content: "" }));
        return open;
    };
    return {
        system(t) { if (msgs.length) { open = null; openMsg("user").content += t; open = null; } else system.push(t); },
        user(t) { openMsg("user").content += t; },
        reasoning(t) {
            if (open?.role === "assistant" && (open.content || open.tool_calls || "reasoning_content" in open)) open = null;
            const m = openMsg("assistant");
            m.reasoning_content = (m.reasoning_content ?? "") + t;
        },
        assistant(t) { if (open?.tool_calls) open = null; openMsg("assistant").content += t; },
        call(id, name, args) { const m = openMsg("assistant"); (m.tool_calls ??= []).push({ id, type: "function", function: { name, arguments: args } }); },
        result(id, t) { msgs.push({ role: "tool", tool_call_id: id, content: t }); open = null; },
        brk() { open = null; },
        messages: () => (system.length ? [{ role: "system", content: system.join("\n\n") }, ...msgs] : msgs),
    };
}

function anthropicReference(req) {
    const f = fold();
    const texts = (c) => (typeof c === "string" ? [c] : c.filter((b) => b.type === "text").map((b) => b.text));
    const sys = texts(req.system ?? []).filter((t) => !t.startsWith("x-anthropic-billing-header")).join("\n\n");
    if (sys) f.system(sys);
    for (const m of req.messages) {
        f.brk();
        if (m.role === "system") { f.system(texts(m.content).join("\n\n")); continue; }
        for (const b of typeof m.content === "string" ? [{ type: "text", text: m.content }] : m.content) {
            if (b.type === "text") (m.role === "user" ? f.user : f.assistant)(b.text);
            else if (b.type === "tool_result") f.result(b.tool_use_id, (b.is_error ? "Error: " : "") + texts(b.content ?? "").join("\n"));
            else if (b.type === "thinking") f.reasoning(unseal(b.signature) ?? b.thinking);
            else if (b.type === "tool_use") f.call(b.id, b.name, b.input);
            else throw new Error(`block ${b.type}`);
        }
    }
    const thinking = req.thinking ? req.thinking.type !== "disabled" : undefined;
    return jinjaPrompt({ messages: f.messages(), tools: req.tools.map((t) => chatTool(t.name, t.description, t.input_schema)),
        ...(thinking !== undefined && { enable_thinking: thinking }) });
}

function responsesReference(req) {
    const f = fold();
    const text = (c) => (typeof c === "string" ? c : c.map((p) => p.text).join(""));
    if (req.instructions) f.system(req.instructions);
    for (const it of req.input) {
        if (it.type === "message" && it.role === "user") { f.user(text(it.content)); f.brk(); }
        else if (it.type === "message" && it.role === "assistant") f.assistant(text(it.content));
        else if (it.type === "message") f.system(text(it.content));
        else if (it.type === "reasoning") f.reasoning(unseal(it.encrypted_content) ?? it.summary.map((s) => s.text).join("\n\n"));
        else if (it.type === "function_call") f.call(it.call_id, (it.namespace ? `${it.namespace}__` : "") + it.name, JSON.parse(it.arguments));
        else if (it.type === "function_call_output") f.result(it.call_id, text(it.output));
        else throw new Error(`item ${it.type}`);
    }
    const tools = req.tools.flatMap((t) => (t.type === "function" ? [chatTool(t.name, t.description, t.parameters)]
        : t.type === "namespace" ? t.tools.map((c) => chatTool(`${t.name}__${c.name}`, c.description, c.parameters)) : []));
    const effort = req.reasoning?.effort;
    return jinjaPrompt({ messages: f.messages(), tools, ...(effort && { enable_thinking: effort !== "none" }) });
}

// ---- event checks ----

function checkAnthropicStream(text) {
    const evs = namedEvents(text);
    for (const e of evs) assert.equal(e.event, e.data.type);
    assert.equal(evs[0].event, "message_start");
    assert.deepEqual(evs[0].data.message.content, []);
    assert.equal(evs[evs.length - 1].event, "message_stop");
    const delta = evs[evs.length - 2];
    assert.equal(delta.event, "message_delta");
    const blocks = [];
    let open = -1;
    const kinds = { thinking: ["thinking_delta", "signature_delta"], text: ["text_delta"], tool_use: ["input_json_delta"] };
    for (const { event, data } of evs.slice(1, -2)) {
        if (event === "ping") continue;
        if (event === "content_block_start") {
            assert.equal(open, -1);
            assert.equal(data.index, blocks.length);
            open = data.index;
            blocks.push({ ...data.content_block, json: "" });
        } else if (event === "content_block_delta") {
            assert.equal(data.index, open);
            const b = blocks[open];
            assert.ok(kinds[b.type].includes(data.delta.type), `${data.delta.type} in a ${b.type} block`);
            if (data.delta.type === "thinking_delta") b.thinking += data.delta.thinking;
            if (data.delta.type === "signature_delta") b.signature = data.delta.signature;
            if (data.delta.type === "text_delta") b.text += data.delta.text;
            if (data.delta.type === "input_json_delta") b.json += data.delta.partial_json;
        } else {
            assert.equal(event, "content_block_stop");
            assert.equal(data.index, open);
            open = -1;
        }
    }
    assert.equal(open, -1);
    for (const b of blocks) if (b.type === "tool_use") b.input = JSON.parse(b.json);
    return { blocks, stop: delta.data.delta.stop_reason, usage: delta.data.usage };
}

function checkResponsesStream(text) {
    assert.ok(!text.includes("[DONE]"));
    const evs = namedEvents(text).map((e) => (assert.equal(e.event, e.data.type), e.data));
    evs.forEach((e, i) => assert.equal(e.sequence_number, i));
    assert.deepEqual(evs.slice(0, 2).map((e) => e.type), ["response.created", "response.in_progress"]);
    const last = evs[evs.length - 1];
    assert.equal(last.type, "response.completed");
    const done = [];
    let open = null;
    for (const e of evs.slice(2, -1)) {
        if (e.type === "response.output_item.added") {
            assert.equal(open, null);
            assert.equal(e.output_index, done.length);
            open = e.item;
        } else if (e.type === "response.output_item.done") {
            assert.equal(e.item.id, open.id);
            done.push(e.item);
            open = null;
        } else {
            assert.equal(e.item_id, open.id, e.type);
            assert.equal(e.output_index, done.length);
        }
    }
    assert.equal(open, null);
    assert.deepEqual(last.response.output, done);
    return last.response;
}

// The second turn's prompt must start with the first's + the model's output (token ids too).
function assertExtends(p1, output, p2) {
    const turn1 = p1 + output + "<|im_end|>\n";
    assert.ok(p2.startsWith(turn1), "the second prompt does not start with the first turn");
    const a = ref.encode(turn1).ids, b = ref.encode(p2).ids;
    let k = 0;
    while (k < a.length && a[k] === b[k]) k++;
    assert.ok(k >= countTokens(p1) - 32, `${k} common tokens of ${countTokens(p1)}`);
}

function golden(name, text) {
    const file = path.join(dir, name);
    if (process.env.SPLASH_UPDATE_GOLDEN) fs.writeFileSync(file, text);
    return fs.readFileSync(file, "utf8");
}

test("Claude Code: two recorded turns replay; events well formed; prompts equal the golden rendering; turn 2 extends turn 1", { timeout: 60000 }, async () => {
    const [t1, t2] = [load("claude-code-turn1.json"), load("claude-code-turn2.json")];
    const [s1, s2] = scripts["claude-code"];
    const g1 = golden("claude-code-turn1.prompt.txt", anthropicReference(t1));
    assert.equal(anthropicReference(t1), g1);
    const tail = golden("claude-code-turn2.tail.txt", anthropicReference(t2).slice(g1.length + s1.length + "<|im_end|>\n".length));
    const g2 = g1 + s1 + "<|im_end|>\n" + tail;
    assert.equal(anthropicReference(t2), g2);

    const c1 = await raw(srv, { path: "/v1/messages/count_tokens?beta=true", body: { ...t1, test_echo_prompt: true }, key: null });
    assert.equal(c1.status, 200, c1.text);
    assert.equal(c1.json.test_prompt, g1);
    assert.equal(c1.json.input_tokens, countTokens(g1));
    const r1 = await raw(srv, { path: "/v1/messages?beta=true", body: { ...t1, test_script: s1 }, key: null });
    assert.equal(r1.status, 200, r1.text);
    const o1 = checkAnthropicStream(r1.text);
    assert.equal(o1.stop, "tool_use");
    assert.deepEqual(o1.blocks.map((b) => b.type), ["thinking", "tool_use"]);
    assert.deepEqual(o1.blocks[1].input, t2.messages.at(-2).content[1].input); // what Claude Code sent back
    assert.equal(o1.usage.input_tokens + o1.usage.cache_read_input_tokens, countTokens(g1));

    const c2 = await raw(srv, { path: "/v1/messages/count_tokens", body: { ...t2, test_echo_prompt: true }, key: null });
    assert.equal(c2.json.test_prompt, g2);
    assertExtends(c1.json.test_prompt, s1, c2.json.test_prompt);
    const r2 = await raw(srv, { path: "/v1/messages?beta=true", body: { ...t2, test_script: s2 }, key: null });
    const o2 = checkAnthropicStream(r2.text);
    assert.equal(o2.stop, "end_turn");
    assert.equal(o2.usage.input_tokens + o2.usage.cache_read_input_tokens, countTokens(g2));
    assert.ok(o2.usage.cache_read_input_tokens >= countTokens(g1) - 32, JSON.stringify(o2.usage)); // the prefix cache reused turn 1
    assert.deepEqual(o2.blocks.map((b) => [b.type, b.text ?? b.thinking]), [["thinking", "The listing is done."], ["text", "The directory has one file: notes.txt."]]);
});

test("Codex: two recorded turns replay; events well formed; prompts equal the golden rendering; turn 2 extends turn 1", { timeout: 60000 }, async () => {
    const [t1, t2] = [load("codex-turn1.json"), load("codex-turn2.json")];
    const [s1, s2] = scripts.codex;
    const g1 = golden("codex-turn1.prompt.txt", responsesReference(t1));
    assert.equal(responsesReference(t1), g1);
    const tail = golden("codex-turn2.tail.txt", responsesReference(t2).slice(g1.length + s1.length + "<|im_end|>\n".length));
    const g2 = g1 + s1 + "<|im_end|>\n" + tail;
    assert.equal(responsesReference(t2), g2);

    const r1 = await raw(srv, { path: "/v1/responses", body: { ...t1, test_script: s1 }, key: null });
    assert.equal(r1.status, 200, r1.text);
    const o1 = checkResponsesStream(r1.text);
    assert.deepEqual(o1.output.map((i) => i.type), ["reasoning", "function_call"]);
    assert.equal(o1.output[1].arguments, t2.input.find((i) => i.type === "function_call").arguments); // what Codex sent back
    assert.equal(o1.usage.input_tokens, countTokens(g1));
    const w1 = await raw(srv, { path: "/v1/responses", body: { ...t1, stream: false, test_script: s1, test_echo_prompt: true }, key: null });
    assert.equal(w1.json.test_prompt, g1);

    const r2 = await raw(srv, { path: "/v1/responses", body: { ...t2, test_script: s2 }, key: null });
    const o2 = checkResponsesStream(r2.text);
    assert.deepEqual(o2.output.map((i) => i.type), ["reasoning", "message"]);
    assert.equal(o2.output[1].content[0].text, "The directory has one file: notes.txt.");
    assert.equal(o2.usage.input_tokens, countTokens(g2));
    assert.ok(o2.usage.input_tokens_details.cached_tokens >= countTokens(g1) - 32, JSON.stringify(o2.usage)); // the prefix cache reused turn 1
    const w2 = await raw(srv, { path: "/v1/responses", body: { ...t2, stream: false, test_script: s2, test_echo_prompt: true }, key: null });
    assert.equal(w2.json.test_prompt, g2);
    assertExtends(g1, s1, w2.json.test_prompt);
});
