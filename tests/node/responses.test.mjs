// OpenAI Responses end to end: the real binary with a tiny random model,
// driven by the official `openai` SDK (create, stream helpers, retrieve,
// delete, errors as exceptions) and by raw HTTP for the event framing.
// Expected prompts come from @huggingface/jinja rendering the model's
// template, token counts from @huggingface/tokenizers, outputs from the
// scripted model turns the tests choose (serve --test-hooks).
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import OpenAI from "openai";
import { KEY, chatWeather, countTokens, jinjaPrompt, namedEvents, raw, script, startApiServer, streamThenSigterm, weatherSchema } from "./api_util.mjs";

let srv, client;

before(async () => {
    srv = await startApiServer(["--keepalive-ms", "5"]);
    client = new OpenAI({ apiKey: KEY, baseURL: `${srv.base}/v1`, maxRetries: 0 });
});

after(async () => {
    if (srv) assert.equal((await srv.stop("SIGTERM")).code, 0, srv.log());
});

const tools = [{ type: "function", name: "get_weather", description: "Weather", parameters: weatherSchema, strict: false }];
const ask = [{ type: "message", role: "user", content: [{ type: "input_text", text: "Weather in Paris?" }] }];
const prompt1 = jinjaPrompt({ messages: [{ role: "user", content: "Weather in Paris?" }], tools: [chatWeather] });

test("responses.create: string input, usage, max_output_tokens -> incomplete", async () => {
    const r = await client.responses.create({ model: "tiny", input: "Hi", max_output_tokens: 4, temperature: 0.7 });
    assert.match(r.id, /^resp_[A-Za-z0-9]{24}$/);
    assert.equal(r.object, "response");
    assert.equal(r.status, "incomplete");
    assert.deepEqual(r.incomplete_details, { reason: "max_output_tokens" });
    assert.equal(r.usage.input_tokens, countTokens(jinjaPrompt({ messages: [{ role: "user", content: "Hi" }] })));
    assert.equal(r.usage.output_tokens, 4);
    assert.equal(r.usage.total_tokens, r.usage.input_tokens + 4);
    assert.equal(r.usage.input_tokens_details.cached_tokens, 0);
    assert.equal(r.store, true);
});

test("scripted turn: reasoning item with encrypted_content, message, function_call; the stream helper agrees", async () => {
    const req = { model: "tiny", input: ask, tools, test_script: script, include: ["reasoning.encrypted_content"] };
    const r = await client.responses.create(req);
    assert.equal(r.status, "completed");
    assert.deepEqual(r.output.map((i) => i.type), ["reasoning", "message", "function_call"]);
    assert.match(r.output[0].id, /^rs_/);
    assert.deepEqual(r.output[0].summary, [{ type: "summary_text", text: "I should call the tool." }]);
    assert.equal(typeof r.output[0].encrypted_content, "string");
    assert.match(r.output[1].id, /^msg_/);
    assert.equal(r.output_text, "Checking.");
    const fc = r.output[2];
    assert.match(fc.id, /^fc_/);
    assert.match(fc.call_id, /^call_[A-Za-z0-9]{24}$/);
    assert.equal(fc.name, "get_weather");
    assert.deepEqual(JSON.parse(fc.arguments), { city: "Paris", days: 3 });
    assert.equal(r.usage.input_tokens, countTokens(prompt1));
    assert.ok(r.usage.input_tokens_details.cached_tokens <= r.usage.input_tokens);
    assert.equal(r.usage.output_tokens, countTokens(script) + 1);
    assert.equal(r.usage.output_tokens_details.reasoning_tokens, countTokens("I should call the tool."));

    const s = client.responses.stream(req);
    const events = [];
    let text = "";
    s.on("event", (e) => events.push(structuredClone(e)));
    s.on("response.output_text.delta", (e) => (text += e.delta));
    const fin = await s.finalResponse();
    assert.equal(text, "Checking.");
    assert.deepEqual(fin.output.map((i) => i.type), ["reasoning", "message", "function_call"]);
    assert.ok(fin.usage.input_tokens_details.cached_tokens >= countTokens(prompt1) - 32, JSON.stringify(fin.usage)); // the same prompt again
    assert.equal(fin.output[0].encrypted_content, r.output[0].encrypted_content);
    assert.deepEqual(JSON.parse(fin.output[2].arguments), { city: "Paris", days: 3 });
    // every event has type and consecutive sequence numbers; the order of api.md
    events.forEach((e, i) => assert.equal(e.sequence_number, i));
    const types = events.map((e) => e.type);
    assert.deepEqual(types.slice(0, 2), ["response.created", "response.in_progress"]);
    assert.equal(types[types.length - 1], "response.completed");
    assert.deepEqual(events[events.length - 1].response.output.map((i) => i.type), ["reasoning", "message", "function_call"]);
    const order = types.filter((t) => !t.endsWith(".delta"));
    assert.deepEqual(order.slice(2, -1), [
        "response.output_item.added", "response.reasoning_summary_part.added", "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.done", "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.done", "response.output_item.done"]);
    assert.ok(types.includes("response.reasoning_summary_text.delta") && types.includes("response.function_call_arguments.delta"));
});

test("function call round trip: the whole history re-sent (Codex) and previous_response_id render the first prompt + its output", async () => {
    const r1 = await client.responses.create({ model: "tiny", input: ask, tools, test_script: script, test_echo_prompt: true });
    assert.equal(r1.test_prompt, prompt1);
    const fc = r1.output[2];
    const result = { type: "function_call_output", call_id: fc.call_id, output: "sunny" };
    const turn1 = prompt1 + script + "<|im_end|>\n";
    const expected2 = turn1 + "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n";
    const full = await client.responses.create({ model: "tiny", input: [...ask, ...r1.output, result], tools, max_output_tokens: 2, test_echo_prompt: true, store: false });
    assert.equal(full.test_prompt, expected2);
    const chained = await client.responses.create({ model: "tiny", previous_response_id: r1.id, input: [result], tools, max_output_tokens: 2, test_echo_prompt: true });
    assert.equal(chained.test_prompt, expected2);
    // encrypted_content carries the reasoning: a client that drops the summary still renders the same bytes
    const stripped = r1.output.map((i) => (i.type === "reasoning" ? { type: "reasoning", id: i.id, summary: [], encrypted_content: i.encrypted_content } : i));
    const again = await client.responses.create({ model: "tiny", input: [...ask, ...stripped, result], tools, max_output_tokens: 1, test_echo_prompt: true, store: false });
    assert.equal(again.test_prompt, expected2);
});

test("retrieve and delete; store false is not kept", async () => {
    const r = await client.responses.create({ model: "tiny", input: "Hi", max_output_tokens: 2 });
    const got = await client.responses.retrieve(r.id);
    assert.deepEqual(got, r);
    assert.deepEqual(await client.responses.delete(r.id), { id: r.id, object: "response.deleted", deleted: true });
    await assert.rejects(client.responses.retrieve(r.id), (e) => e instanceof OpenAI.NotFoundError);
    const d = await raw(srv, { method: "DELETE", path: `/v1/responses/${r.id}` });
    assert.equal(d.status, 404);
    const n = await client.responses.create({ model: "tiny", input: "Hi", max_output_tokens: 2, store: false });
    await assert.rejects(client.responses.retrieve(n.id), (e) => e.status === 404);
});

test("Codex-shaped request: instructions + developer message as system, unknown tool types ignored, namespace children, text.format", async () => {
    const body = {
        model: "tiny", instructions: "Be brief.", store: false, stream: false, parallel_tool_calls: false, prompt_cache_key: "k1",
        client_metadata: { x: "y" }, include: ["reasoning.encrypted_content"], reasoning: { effort: "medium", summary: "auto" }, tool_choice: "auto",
        input: [{ type: "message", role: "developer", content: [{ type: "input_text", text: "Dev note." }] }, ...ask],
        tools: [...tools, { type: "web_search" }, { type: "image_generation" }, { type: "custom", name: "apply_patch", format: { type: "grammar" } },
            { type: "tool_search" }, { type: "namespace", name: "mcp", tools: [{ type: "function", name: "read", description: "Read", parameters: { type: "object", properties: {} } }] }],
        max_output_tokens: 1, test_echo_prompt: true,
    };
    const r = await client.responses.create(body);
    const mcpRead = { type: "function", function: { name: "mcp__read", description: "Read", parameters: { type: "object", properties: {} } } };
    assert.equal(r.test_prompt, jinjaPrompt({ messages: [{ role: "system", content: "Be brief.\n\nDev note." }, { role: "user", content: "Weather in Paris?" }], tools: [chatWeather, mcpRead], enable_thinking: true }));
    const off = await client.responses.create({ model: "tiny", input: "Hi", reasoning: { effort: "none" }, max_output_tokens: 1, test_echo_prompt: true, store: false });
    assert.equal(off.test_prompt, jinjaPrompt({ messages: [{ role: "user", content: "Hi" }], enable_thinking: false }));
    const schema = { type: "object", properties: { a: { type: "integer" } } };
    const f = await client.responses.create({ model: "tiny", input: "Hi", text: { format: { type: "json_schema", name: "x", schema } }, max_output_tokens: 1, test_echo_prompt: true, store: false });
    assert.ok(f.test_prompt.startsWith(`<|im_start|>system\nRespond with a single JSON value that matches this JSON schema, and nothing else:\n${JSON.stringify(schema)}<|im_end|>`));
});

test("tool_choice required / named start the turn with the call", async () => {
    const rest = "<parameter=city>\nRome\n</parameter>\n</function>\n</tool_call>";
    const r = await client.responses.create({ model: "tiny", input: ask, tools, tool_choice: { type: "function", name: "get_weather" }, test_script: rest, test_echo_prompt: true, store: false });
    assert.deepEqual(r.output.map((i) => i.type), ["function_call"]);
    assert.deepEqual(JSON.parse(r.output[0].arguments), { city: "Rome" });
    assert.equal(r.test_prompt, jinjaPrompt({ messages: [{ role: "user", content: "Weather in Paris?" }], tools: [chatWeather], enable_thinking: false }) + "<tool_call>\n<function=get_weather>\n");
    const q = await client.responses.create({ model: "tiny", input: ask, tools, tool_choice: "required", test_script: "get_weather>\n" + rest, store: false });
    assert.equal(q.output[0].name, "get_weather");
});

test("errors surface as SDK exceptions", async () => {
    await assert.rejects(client.responses.create({ model: "tiny" }), (e) => e.status === 400 && e.param === "input");
    await assert.rejects(client.responses.create({ model: "tiny", input: "Hi", reasoning: { effort: "huge" } }), (e) => e.status === 400 && e.param === "reasoning.effort");
    await assert.rejects(client.responses.create({ model: "tiny", input: "Hi", previous_response_id: "resp_nope" }), (e) => e.status === 404 && e.param === "previous_response_id");
    await assert.rejects(client.responses.create({ model: "tiny", input: [{ role: "user", content: [{ type: "input_image", image_url: "data:image/png;base64,AAAA" }] }] }),
        (e) => e.status === 400 && /vision/.test(e.message));
    await assert.rejects(client.responses.create({ model: "tiny", input: [{ type: "function_call", call_id: "c", name: "f", arguments: "[1]" }] }), (e) => e.status === 400 && /arguments/.test(e.message));
    await assert.rejects(client.responses.create({ model: "tiny", input: "hello ".repeat(1100) }), (e) => e.status === 400 && e.code === "context_length_exceeded");
    await assert.rejects(client.responses.create({ model: "tiny", input: "Hi", temperature: 9 }), (e) => e.status === 400 && e.param === "temperature");
    const r = await raw(srv, { method: "PUT", path: "/v1/responses" });
    assert.equal(r.status, 405);
});

test("raw stream: event names match data types, no [DONE]; SIGTERM mid-stream ends with response.failed", { timeout: 30000 }, async () => {
    const r = await raw(srv, { path: "/v1/responses", body: { model: "tiny", input: "Hi", max_output_tokens: 3, stream: true } });
    assert.ok(!r.text.includes("[DONE]"));
    const evs = namedEvents(r.text);
    for (const e of evs) assert.equal(e.event, e.data.type);
    const last = evs[evs.length - 1].data;
    assert.equal(last.type, "response.incomplete");
    assert.equal(last.response.status, "incomplete");
    assert.equal(last.response.usage.output_tokens, 3);
    // a long prompt: comments keep the stream alive while it is read (--keepalive-ms 5)
    const long = await raw(srv, { path: "/v1/responses", body: { model: "tiny", input: "hello ".repeat(900), max_output_tokens: 1, stream: true } });
    assert.match(long.text, /^: keep-alive$/m);

    const { text, exit } = await streamThenSigterm("/v1/responses", { model: "x", input: "Hi", stream: true }, ".delta");
    const ev = namedEvents(text);
    const end = ev[ev.length - 1].data;
    assert.equal(end.type, "response.failed");
    assert.equal(end.response.status, "failed");
    assert.match(end.response.error.message, /stopping/);
    assert.equal(exit.code, 0);
});
