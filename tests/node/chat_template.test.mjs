// The native chat template (`splash apply-template`) against two references:
//  - template_cases/expected/: renderings by Python Jinja with transformers'
//    settings (tools/render_template_reference.py), byte for byte, every case;
//  - @huggingface/jinja rendering the same chat_template.jinja live, for the
//    cases where it agrees with Python (index.json says why the others don't).
// Then the CLI's edges, and the prefix stability that agent prefix reuse needs.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { Template } from "@huggingface/jinja";

const here = path.dirname(fileURLToPath(import.meta.url));
const casesDir = path.join(here, "template_cases");
const tokDir = path.join(casesDir, "tokenizer");
const bin = process.env.SPLASH_BIN || path.join(here, "..", "..", "build", "splash");
const templateSource = fs.readFileSync(path.join(tokDir, "chat_template.jinja"), "utf8");
const index = JSON.parse(fs.readFileSync(path.join(casesDir, "index.json"), "utf8"));

function splash(input, args = ["--tokenizer-dir", tokDir]) {
    const r = spawnSync(bin, ["apply-template", ...args], { input });
    assert.equal(r.error, undefined, `could not run ${bin}`);
    return { status: r.status, stdout: r.stdout, stderr: r.stderr.toString("utf8") };
}

function lastLine(s) {
    const lines = s.replace(/\n$/, "").split("\n");
    return lines[lines.length - 1];
}

// Renders a request object; returns the prompt (string) or throws with the stderr.
function render(request) {
    const r = splash(JSON.stringify(request));
    if (r.status !== 0) throw new Error(`exit ${r.status}: ${r.stderr}`);
    return r.stdout.toString("utf8");
}

function hfRender(request) {
    try {
        return { kind: "prompt", text: new Template(templateSource).render(request) };
    } catch (e) {
        return { kind: "error", text: e.message };
    }
}

const names = Object.keys(index);

test("the case set is large enough", () => {
    assert.ok(names.length >= 30);
    assert.ok(names.filter((n) => index[n].hf_jinja).length >= 30, "at least 30 cases checked against @huggingface/jinja");
    for (const n of names) assert.ok(fs.existsSync(path.join(casesDir, "requests", n + ".json")), n);
});

for (const name of names) {
    const meta = index[name];
    test(`${name}: ${meta.description}`, () => {
        const requestText = fs.readFileSync(path.join(casesDir, "requests", name + ".json"));
        const r = splash(requestText);
        const promptFile = path.join(casesDir, "expected", name + ".prompt");
        const errorFile = path.join(casesDir, "expected", name + ".error");
        if (fs.existsSync(promptFile)) {
            assert.equal(r.status, 0, r.stderr);
            assert.equal(r.stderr, "");
            const want = fs.readFileSync(promptFile);
            assert.ok(r.stdout.equals(want), `differs from Python Jinja:\n got ${JSON.stringify(r.stdout.toString())}\nwant ${JSON.stringify(want.toString())}`);
        } else {
            const want = fs.readFileSync(errorFile, "utf8");
            assert.equal(r.status, 1, `expected the template error '${want}'`);
            assert.equal(r.stdout.length, 0);
            assert.equal(lastLine(r.stderr), want);
        }
        if (meta.hf_jinja) {
            const hf = hfRender(JSON.parse(requestText.toString("utf8")));
            if (hf.kind === "prompt") {
                assert.equal(r.status, 0, `@huggingface/jinja renders, splash fails: ${r.stderr}`);
                assert.equal(r.stdout.toString("utf8"), hf.text, "differs from @huggingface/jinja");
            } else {
                assert.equal(r.status, 1, `@huggingface/jinja raises '${hf.text}'`);
                assert.equal(lastLine(r.stderr), hf.text);
            }
        } else {
            assert.ok(meta.why_not_hf_jinja, `${name} must say why @huggingface/jinja is not its reference`);
        }
    });
}

// ---- the CLI --------------------------------------------------------------

test("bad JSON exits 2, a non-object request exits 2", () => {
    let r = splash('{"messages": [');
    assert.equal(r.status, 2);
    assert.match(r.stderr, /not JSON/);
    r = splash("[1, 2]");
    assert.equal(r.status, 2);
    r = splash("");
    assert.equal(r.status, 2);
});

test("usage errors exit 2", () => {
    // no input: these exit before reading stdin
    assert.equal(splash("", []).status, 2);
    assert.equal(splash("", ["--model", "a", "--tokenizer-dir", "b"]).status, 2);
    assert.equal(splash("", ["--bogus"]).status, 2);
    const help = splash("", ["--help"]);
    assert.equal(help.status, 0);
    assert.match(help.stdout.toString(), /apply-template/);
});

test("--model reads PKG/tokenizer/chat_template.jinja; an unknown template warns but renders natively", () => {
    const pkg = fs.mkdtempSync(path.join(os.tmpdir(), "splash-tpl-"));
    try {
        fs.mkdirSync(path.join(pkg, "tokenizer"));
        fs.writeFileSync(path.join(pkg, "tokenizer", "chat_template.jinja"), templateSource + "\n\n  \n");
        const req = JSON.stringify({ messages: [{ role: "user", content: "Hi" }], add_generation_prompt: true });
        const want = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n";
        let r = splash(req, ["--model", pkg]);
        assert.equal(r.status, 0);
        assert.equal(r.stderr, "", "trailing whitespace does not make a template unknown");
        assert.equal(r.stdout.toString(), want);

        const changed = templateSource.replace("<|im_start|>system\\n' + content", "<|im_start|>SYSTEM\\n' + content");
        assert.notEqual(changed, templateSource);
        fs.writeFileSync(path.join(pkg, "tokenizer", "chat_template.jinja"), changed);
        r = splash(req, ["--model", pkg]);
        assert.equal(r.status, 0);
        assert.match(r.stderr, /warning: .*not the known Qwen3\.6 template: line 64, column \d+/);
        assert.equal(r.stdout.toString(), want);

        fs.rmSync(path.join(pkg, "tokenizer", "chat_template.jinja"));
        fs.writeFileSync(path.join(pkg, "tokenizer", "tokenizer_config.json"), JSON.stringify({ chat_template: templateSource }));
        r = splash(req, ["--model", pkg]);
        assert.equal(r.stderr, "", "the template inside tokenizer_config.json is recognised");
        assert.equal(r.stdout.toString(), want);

        assert.equal(splash("", ["--model", path.join(pkg, "missing")]).status, 1);
    } finally {
        fs.rmSync(pkg, { recursive: true, force: true });
    }
});

// ---- determinism and prefix stability ------------------------------------
// A server reuses the KV cache of the longest rendered prefix it has seen, so
// it matters exactly where the template keeps an old rendering as a prefix.

const SYS = { role: "system", content: "You are an agent." };
const TOOLS = [{ type: "function", function: { name: "run", parameters: { type: "object", properties: { cmd: { type: "string" } } } } }];
const callRun = (cmd) => [{ type: "function", function: { name: "run", arguments: { cmd } } }];

test("the same conversation always renders to the same bytes", () => {
    const req = { messages: [SYS, { role: "user", content: "ls" }, { role: "assistant", content: "", reasoning_content: "r", tool_calls: callRun("ls") }, { role: "tool", content: "a\nb" }], tools: TOOLS, add_generation_prompt: true };
    const first = render(req);
    for (let i = 0; i < 3; i++) assert.equal(render(structuredClone(req)), first);
});

test("agent turns: the prompt with its generation prompt is a prefix of the next request", () => {
    for (const thinking of [true, false]) {
        const history = [SYS, { role: "user", content: "build it" }];
        let prev = render({ messages: history, tools: TOOLS, add_generation_prompt: true, enable_thinking: thinking });
        for (let step = 0; step < 3; step++) {
            // the model answered with reasoning (none when thinking is off) and a call; the client adds the result
            history.push({ role: "assistant", content: "", reasoning_content: thinking ? `step ${step}` : "", tool_calls: callRun(`make ${step}`) });
            history.push({ role: "tool", content: `ok ${step}` });
            const next = render({ messages: history, tools: TOOLS, add_generation_prompt: true, enable_thinking: thinking });
            assert.ok(next.startsWith(prev), `step ${step} (thinking ${thinking}) rewrote the prefix`);
            prev = next;
        }
    }
});

test("a new user query drops the previous turn's reasoning: the prefix ends at that assistant turn", () => {
    const turn1 = [{ role: "user", content: "q1" }];
    const prompt1 = render({ messages: turn1, add_generation_prompt: true });
    const turn2 = [...turn1, { role: "assistant", content: "a1", reasoning_content: "why" }, { role: "user", content: "q2" }];
    const prompt2 = render({ messages: turn2, add_generation_prompt: true });
    const stable = render({ messages: turn1 }) + "<|im_start|>assistant\n";
    assert.ok(prompt2.startsWith(stable));
    assert.equal(prompt1, stable + "<think>\n");
    assert.ok(!prompt2.startsWith(prompt1), "the template drops history reasoning, as documented");
    // with preserve_thinking the whole previous prompt stays a prefix
    const keep1 = render({ messages: turn1, add_generation_prompt: true, preserve_thinking: true });
    const keep2 = render({ messages: turn2, add_generation_prompt: true, preserve_thinking: true });
    assert.ok(keep2.startsWith(keep1));
});

test("appending to a run of tool messages rewrites only the run's closing <|im_end|>", () => {
    const base = [{ role: "user", content: "go" }, { role: "assistant", content: "", tool_calls: [...callRun("a"), ...callRun("b")] }, { role: "tool", content: "A" }];
    const one = render({ messages: base });
    const two = render({ messages: [...base, { role: "tool", content: "B" }] });
    assert.ok(one.endsWith("</tool_response><|im_end|>\n"));
    const open = one.slice(0, -"<|im_end|>\n".length);
    assert.ok(two.startsWith(open));
    assert.ok(!two.startsWith(one));
});
