// Anthropic Messages end to end: the real binary with a tiny random model,
// driven by the official @anthropic-ai/sdk (create, stream helpers, count
// tokens, errors as exceptions) and by raw HTTP for shapes SDKs hide.
// Expected prompts come from @huggingface/jinja rendering the model's
// template, token counts from @huggingface/tokenizers, outputs from the
// scripted model turns the tests choose (serve --test-hooks).
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import Anthropic from "@anthropic-ai/sdk";
import { KEY, chatWeather, countTokens, jinjaPrompt, namedEvents, raw, script, startApiServer, streamThenSigterm, weatherSchema } from "./api_util.mjs";

let srv, client;

before(async () => {
    srv = await startApiServer(["--keepalive-ms", "5"]);
    client = new Anthropic({ apiKey: KEY, baseURL: srv.base, maxRetries: 0 });
});

after(async () => {
    if (srv) assert.equal((await srv.stop("SIGTERM")).code, 0, srv.log());
});

const tools = [{ name: "get_weather", description: "Weather", input_schema: weatherSchema, cache_control: { type: "ephemeral" } }];
const ask = [{ role: "user", content: "Weather in Paris?" }];
const prompt1 = jinjaPrompt({ messages: [{ role: "user", content: "Weather in Paris?" }], tools: [chatWeather] });

test("messages.create: a plain reply, usage from the reference tokenizer, max_tokens", async () => {
    const m = await client.messages.create({ model: "tiny", max_tokens: 4, messages: [{ role: "user", content: "Hi" }], temperature: 0.7, top_k: 10, top_p: 0.9, metadata: { user_id: "u1" } });
    assert.match(m.id, /^msg_[A-Za-z0-9]{24}$/);
    assert.equal(m.type, "message");
    assert.equal(m.role, "assistant");
    assert.equal(m.model, "tiny");
    assert.equal(m.stop_reason, "max_tokens");
    assert.equal(m.stop_sequence, null);
    assert.equal(m.usage.input_tokens, countTokens(jinjaPrompt({ messages: [{ role: "user", content: "Hi" }] })));
    assert.equal(m.usage.cache_read_input_tokens, 0);
    assert.equal(m.usage.output_tokens, 4);
});

test("scripted turn: thinking with a signature, text, tool_use; streamed through the SDK helpers the same", async () => {
    const req = { model: "tiny", max_tokens: 200, messages: ask, tools, test_script: script };
    const m = await client.messages.create(req);
    assert.equal(m.stop_reason, "tool_use");
    assert.deepEqual(m.content.map((b) => b.type), ["thinking", "text", "tool_use"]);
    assert.equal(m.content[0].thinking, "I should call the tool.");
    assert.equal(typeof m.content[0].signature, "string");
    assert.equal(m.content[1].text, "Checking.");
    assert.match(m.content[2].id, /^toolu_[A-Za-z0-9]{24}$/);
    assert.equal(m.content[2].name, "get_weather");
    assert.deepEqual(m.content[2].input, { city: "Paris", days: 3 });
    assert.equal(m.usage.input_tokens + m.usage.cache_read_input_tokens, countTokens(prompt1));
    assert.equal(m.usage.output_tokens, countTokens(script) + 1); // + the stop token

    const stream = client.messages.stream(req);
    const events = [];
    let text = "", thinking = "", json = "";
    stream.on("streamEvent", (e) => events.push(structuredClone(e))); // the SDK grows message_start's message in place
    stream.on("text", (d) => (text += d));
    stream.on("thinking", (d) => (thinking += d));
    stream.on("inputJson", (d) => (json += d));
    const fin = await stream.finalMessage();
    assert.equal(text, "Checking.");
    assert.equal(thinking, "I should call the tool.");
    assert.deepEqual(JSON.parse(json), { city: "Paris", days: 3 });
    assert.deepEqual(fin.content.map((b) => b.type), ["thinking", "text", "tool_use"]);
    assert.equal(fin.content[0].signature, m.content[0].signature);
    assert.deepEqual(fin.content[2].input, { city: "Paris", days: 3 });
    assert.equal(fin.stop_reason, "tool_use");
    assert.equal(fin.usage.output_tokens, m.usage.output_tokens);
    // the same prompt again: the prefix cache holds it (input_tokens counts only what was not cached)
    assert.equal(fin.usage.input_tokens + fin.usage.cache_read_input_tokens, countTokens(prompt1));
    assert.ok(fin.usage.cache_read_input_tokens >= countTokens(prompt1) - 32, JSON.stringify(fin.usage));
    // the event sequence of api.md
    const types = events.map((e) => e.type);
    assert.equal(types[0], "message_start");
    assert.deepEqual(events[0].message.content, []);
    assert.equal(types[types.length - 1], "message_stop");
    assert.equal(types[types.length - 2], "message_delta");
    const starts = events.filter((e) => e.type === "content_block_start");
    assert.deepEqual(starts.map((e) => [e.index, e.content_block.type]), [[0, "thinking"], [1, "text"], [2, "tool_use"]]);
    const deltas = new Set(events.filter((e) => e.type === "content_block_delta").map((e) => e.delta.type));
    assert.deepEqual([...deltas].sort(), ["input_json_delta", "signature_delta", "text_delta", "thinking_delta"]);
    assert.equal(events.filter((e) => e.type === "content_block_stop").length, 3);
    for (const e of events.filter((e) => e.type.startsWith("content_block_")))
        assert.ok(types.indexOf("message_start") < types.indexOf(e.type) && e.index <= 2);
});

test("tool round trip: the re-sent turn (thinking with signature, text, tool_use) renders the first prompt + its output byte for byte", async () => {
    const t1 = await client.messages.create({ model: "tiny", max_tokens: 200, messages: ask, tools, test_script: script, test_echo_prompt: true });
    assert.equal(t1.test_prompt, prompt1);
    const history = [...ask, { role: "assistant", content: t1.content },
        { role: "user", content: [{ type: "tool_result", tool_use_id: t1.content[2].id, content: [{ type: "text", text: "sunny" }] }] }];
    const t2 = await client.messages.create({ model: "tiny", max_tokens: 3, messages: history, tools, test_echo_prompt: true });
    const turn1 = prompt1 + script + "<|im_end|>\n";
    assert.ok(t2.test_prompt.startsWith(turn1), `second prompt does not extend the first:\n${t2.test_prompt}`);
    assert.equal(t2.test_prompt, turn1 + "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n");
    // the signature carries the reasoning: a client that changed or dropped the text still renders the same bytes
    const edited = structuredClone(history);
    edited[1].content[0].thinking = "";
    const t3 = await client.messages.create({ model: "tiny", max_tokens: 1, messages: edited, tools, test_echo_prompt: true });
    assert.equal(t3.test_prompt, t2.test_prompt);
    // redacted_thinking whose data is our seal, likewise
    edited[1].content[0] = { type: "redacted_thinking", data: t1.content[0].signature };
    const t4 = await client.messages.create({ model: "tiny", max_tokens: 1, messages: edited, tools, test_echo_prompt: true });
    assert.equal(t4.test_prompt, t2.test_prompt);
    // a signature that is not ours: the plain text is used
    edited[1].content[0] = { type: "thinking", thinking: "Other reasoning.", signature: "EqQBCkYIBxgCKkB" };
    const t5 = await client.messages.create({ model: "tiny", max_tokens: 1, messages: edited, tools, test_echo_prompt: true });
    assert.equal(t5.test_prompt, t2.test_prompt.replace("I should call the tool.", "Other reasoning."));
    // is_error tool results are marked
    const err = structuredClone(history);
    err[2].content[0].is_error = true;
    const t6 = await client.messages.create({ model: "tiny", max_tokens: 1, messages: err, tools, test_echo_prompt: true });
    assert.ok(t6.test_prompt.includes("<tool_response>\nError: sunny\n</tool_response>"));
});

test("count_tokens, system blocks (billing header dropped, cache_control tolerated), role system inside messages", async () => {
    const system = [{ type: "text", text: "x-anthropic-billing-header: cc_version=1.0.0; cc_entrypoint=cli" },
        { type: "text", text: "You are terse.", cache_control: { type: "ephemeral" } }, { type: "text", text: "Use tools." }];
    const messages = [{ role: "system", content: "Be kind." }, { role: "user", content: [{ type: "text", text: "Hi", cache_control: { type: "ephemeral" } }] }];
    const expected = jinjaPrompt({ messages: [{ role: "system", content: "You are terse.\n\nUse tools.\n\nBe kind." }, { role: "user", content: "Hi" }], tools: [chatWeather] });
    const c = await client.messages.countTokens({ model: "tiny", system, messages, tools });
    assert.equal(c.input_tokens, countTokens(expected));
    const r = await raw(srv, { path: "/v1/messages/count_tokens?beta=true", body: { model: "tiny", system, messages, tools, test_echo_prompt: true } });
    assert.equal(r.json.test_prompt, expected);
    // thinking disabled; a system entry after the first turn becomes a user turn (the template allows system only first)
    const later = await raw(srv, { path: "/v1/messages/count_tokens", body: { model: "tiny", thinking: { type: "disabled" }, test_echo_prompt: true,
        messages: [{ role: "user", content: "Hi" }, { role: "assistant", content: "Hello." }, { role: "system", content: "Note." }, { role: "user", content: "Bye" }] } });
    assert.equal(later.json.test_prompt, jinjaPrompt({ enable_thinking: false,
        messages: [{ role: "user", content: "Hi" }, { role: "assistant", content: "Hello." }, { role: "user", content: "Note." }, { role: "user", content: "Bye" }] }));
});

test("stop_sequences end the turn with stop_reason stop_sequence, never emitted", async () => {
    const req = { model: "tiny", max_tokens: 50, thinking: { type: "disabled" }, messages: [{ role: "user", content: "Hi" }],
        test_script: "Hello world, stop here please", stop_sequences: ["zzz", "stop h"] };
    const m = await client.messages.create(req);
    assert.deepEqual(m.content, [{ type: "text", text: "Hello world, " }]);
    assert.equal(m.stop_reason, "stop_sequence");
    assert.equal(m.stop_sequence, "stop h");
    const fin = await client.messages.stream(req).finalMessage();
    assert.equal(fin.content[0].text, "Hello world, ");
    assert.equal(fin.stop_reason, "stop_sequence");
    assert.equal(fin.stop_sequence, "stop h");
    const plain = await client.messages.create({ ...req, stop_sequences: undefined, test_script: "Hello" });
    assert.equal(plain.stop_reason, "end_turn");
});

test("max_tokens beyond the context is clamped: stop_reason model_context_window_exceeded", async () => {
    const long = "hello ".repeat(990);
    const n = countTokens(jinjaPrompt({ messages: [{ role: "user", content: long }], enable_thinking: false }));
    assert.ok(n < 1024 && n > 980, String(n));
    // (the SDK refuses a non-streaming request this large; its stream helper does not)
    const m = await client.messages.stream({ model: "tiny", max_tokens: 100000, thinking: { type: "disabled" },
        messages: [{ role: "user", content: long }], test_script: "word ".repeat(60) }).finalMessage();
    assert.equal(m.stop_reason, "model_context_window_exceeded");
    assert.equal(m.usage.output_tokens, 1024 - n);
});

test("tool_choice tool / any start the turn with the call; assistant prefill is continued", async () => {
    const rest = "<parameter=city>\nRome\n</parameter>\n</function>\n</tool_call>";
    const m = await client.messages.create({ model: "tiny", max_tokens: 50, messages: ask, tools, test_echo_prompt: true,
        tool_choice: { type: "tool", name: "get_weather" }, test_script: rest });
    assert.equal(m.stop_reason, "tool_use");
    assert.deepEqual(m.content.map((b) => b.type), ["tool_use"]);
    assert.deepEqual(m.content[0].input, { city: "Rome" });
    const base = jinjaPrompt({ messages: ask, tools: [chatWeather], enable_thinking: false });
    assert.equal(m.test_prompt, base + "<tool_call>\n<function=get_weather>\n");
    const any = await client.messages.create({ model: "tiny", max_tokens: 50, messages: ask, tools, tool_choice: { type: "any" }, test_script: "get_weather>\n" + rest });
    assert.deepEqual(any.content[0].input, { city: "Rome" });
    await assert.rejects(client.messages.create({ model: "tiny", max_tokens: 5, messages: ask, tools, tool_choice: { type: "tool", name: "get_weather" }, thinking: { type: "enabled", budget_tokens: 1024 } }),
        (e) => e.status === 400 && /Thinking/.test(e.message));
    const p = await client.messages.create({ model: "tiny", max_tokens: 5, messages: [...ask, { role: "assistant", content: "It is" }], test_script: " sunny.", test_echo_prompt: true });
    assert.equal(p.test_prompt, jinjaPrompt({ messages: ask, enable_thinking: false }) + "It is");
    assert.deepEqual(p.content, [{ type: "text", text: " sunny." }]);
});

test("errors are Anthropic-shaped and surface as SDK exceptions", async () => {
    await assert.rejects(client.messages.create({ model: "tiny", messages: ask }), (e) => e instanceof Anthropic.BadRequestError && e.error.error.type === "invalid_request_error" && /max_tokens/.test(e.message));
    await assert.rejects(client.messages.create({ model: "tiny", max_tokens: 5, messages: [{ role: "user", content: [{ type: "image", source: { type: "base64", media_type: "image/png", data: "iVBORw0KGgo=" } }] }] }),
        (e) => e.status === 400 && /vision/.test(e.message));
    await assert.rejects(client.messages.create({ model: "tiny", max_tokens: 5, messages: [{ role: "user", content: [{ type: "document", source: { type: "base64", media_type: "application/pdf", data: "JVBERi0=" } }] }] }),
        (e) => e.status === 400 && /document/.test(e.message));
    await assert.rejects(client.messages.create({ model: "tiny", max_tokens: 5, temperature: 5, messages: ask }), (e) => e.status === 400 && /temperature/.test(e.message));
    await assert.rejects(client.messages.create({ model: "tiny", max_tokens: 5, messages: [{ role: "user", content: "hello ".repeat(1100) }] }), (e) => e.status === 400 && /1024/.test(e.message));
    const wrong = new Anthropic({ apiKey: "sk-wrong", baseURL: srv.base, maxRetries: 0 });
    await assert.rejects(wrong.messages.create({ model: "tiny", max_tokens: 5, messages: ask }), (e) => e instanceof Anthropic.AuthenticationError && e.error.error.type === "authentication_error");
    const r = await raw(srv, { method: "GET", path: "/v1/messages" });
    assert.equal(r.status, 405);
    assert.equal(r.json.type, "error");
    assert.equal(r.json.error.type, "invalid_request_error");
    const bad = await raw(srv, { path: "/v1/messages", body: "{\"messages\": [" });
    assert.deepEqual(Object.keys(bad.json), ["type", "error"]);
    assert.deepEqual(Object.keys(bad.json.error), ["type", "message"]);
});

test("raw stream: event names match data types, ping first; SIGTERM mid-stream ends with event: error", { timeout: 30000 }, async () => {
    const r = await raw(srv, { path: "/v1/messages", body: { model: "tiny", max_tokens: 3, stream: true, messages: ask } });
    const evs = namedEvents(r.text);
    for (const e of evs) assert.equal(e.event, e.data.type);
    assert.deepEqual(evs.slice(0, 2).map((e) => e.event), ["message_start", "ping"]);
    assert.equal(evs[evs.length - 2].data.delta.stop_reason, "max_tokens");
    assert.equal(evs[evs.length - 2].data.usage.output_tokens, 3);
    // a long prompt: pings keep the stream alive while it is read (--keepalive-ms 5)
    const long = await raw(srv, { path: "/v1/messages", body: { model: "tiny", max_tokens: 1, stream: true, messages: [{ role: "user", content: "hello ".repeat(900) }] } });
    const lev = namedEvents(long.text);
    assert.ok(lev.slice(2).some((e) => e.event === "ping"), "no keep-alive ping");
    assert.equal(lev[lev.length - 1].event, "message_stop");

    const { text, exit } = await streamThenSigterm("/v1/messages?beta=true", { model: "x", max_tokens: 3000, stream: true, messages: ask }, "content_block_delta");
    const ev = namedEvents(text);
    const last = ev[ev.length - 1];
    assert.equal(last.event, "error");
    assert.equal(last.data.type, "error");
    assert.equal(last.data.error.type, "overloaded_error");
    assert.equal(exit.code, 0);
});
