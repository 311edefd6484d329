// The agent launchers (`splash claude|codex|opencode|hermes`, docs/launchers.md)
// against the real server on the test model.
//
// - What each launcher would exec (SPLASH_LAUNCH_DRY_RUN=1: path, argv,
//   environment as JSON) is compared with docs/api.md's list, written out
//   again here; Hermes' generated config.yaml is read back field by field.
// - Failures people meet first: no server, a client not on PATH, a port that
//   is not ours, a wrong API key.
// - The real agents from npm (@anthropic-ai/claude-code, @openai/codex,
//   opencode-ai, installed once into ~/.cache/splash-test-agents; skipped
//   with a message when npm cannot reach its registry, under ASan, or with
//   SPLASH_TEST_AGENTS=0) each run one
//   non-interactive turn through their launcher.  The random test model's
//   output is noise and would run to max_tokens, so a loopback relay between
//   agent and server adds a `test_script` (serve --test-hooks) to each
//   generation request: the model "writes" a short fixed answer, everything
//   else (the agent's own request, our parsing, templating, prefill of its
//   10-20K-token system prompt, streaming, its parsing of our events) is real.
//   The relay also records which endpoints each agent used.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import fs from "node:fs";
import http from "node:http";
import os from "node:os";
import path from "node:path";
import { bin, startServer, testModel } from "./serve_util.mjs";

const KEY = "sk-launch-test-51c7";
const ANSWER = "Hello from the Splash launcher test.";
const SCRIPT = `Answering.\n</think>\n\n${ANSWER}`;

const CONTEXT = 32768; // --max-context 32K
let srv, keyed, tmp;
before(async () => {
    tmp = fs.mkdtempSync(path.join(os.tmpdir(), "splash-launch-"));
    // The default model (no --model): the agents' 10-20K-token system prompts go through its real
    // prefill.  The answers are scripted (test hooks) so the protocol can be checked exactly; the
    // script thinks first, so every request thinks whatever the client sends.
    srv = await startServer(["--test-hooks", "--threads", "2", "--max-context", "32K", "--max-lanes", "2",
        "--served-model-name", "tiny", "--default-reasoning-effort", "medium"]);
    keyed = await startServer(["--model", testModel(), "--threads", "1", "--max-context", "1K", "--api-key", KEY, "--served-model-name", "tiny"]);
});
after(async () => {
    if (srv) assert.equal((await srv.stop("SIGTERM")).code, 0, srv.log());
    if (keyed) await keyed.stop("SIGTERM");
    if (tmp) fs.rmSync(tmp, { recursive: true, force: true });
});

// Runs `splash <args>` with env added to (or, for null values, removed from) this process's.
function launch(args, env = {}, opts = {}) {
    const e = { ...process.env };
    for (const [k, v] of Object.entries(env)) if (v === null) delete e[k]; else e[k] = v;
    return new Promise((resolve) => {
        const p = spawn(bin, args, { env: e, cwd: opts.cwd ?? tmp, stdio: ["ignore", "pipe", "pipe"] });
        let stdout = "", stderr = "";
        p.stdout.on("data", (d) => (stdout += d));
        p.stderr.on("data", (d) => (stderr += d));
        const timer = setTimeout(() => p.kill("SIGKILL"), opts.timeout ?? 20000);
        p.on("exit", (code, signal) => { clearTimeout(timer); resolve({ code, signal, stdout, stderr }); });
    });
}

async function dryRun(client, args, env = {}) {
    const r = await launch([client, ...args], { SPLASH_PORT: String(srv.port), SPLASH_LAUNCH_DRY_RUN: "1", ...env });
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.stderr, `Starting ${client}: tiny · ${CONTEXT} context tokens\n`);
    return JSON.parse(r.stdout);
}

const base = () => `http://127.0.0.1:${srv.port}`;

test("claude: environment and arguments of api.md, arguments passed through", async () => {
    const d = await dryRun("claude", ["-p", "say hi", "--output-format", "json"], { SPLASH_API_KEY: null, ANTHROPIC_API_KEY: "sk-ant-real" });
    assert.equal(d.client, "claude");
    assert.deepEqual(d.argv, ["claude", "--disallowedTools", "WebSearch", "--model", "tiny", "-p", "say hi", "--output-format", "json"]);
    assert.deepEqual(d.env, {
        ANTHROPIC_BASE_URL: base(),
        ANTHROPIC_AUTH_TOKEN: "splash-local",
        ANTHROPIC_API_KEY: null,
        CLAUDE_CODE_MAX_CONTEXT_TOKENS: "32768",
        CLAUDE_CODE_AUTO_COMPACT_WINDOW: "32768",
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: "1",
        DISABLE_AUTOUPDATER: "1",
        ANTHROPIC_MODEL: "tiny",
        ANTHROPIC_DEFAULT_OPUS_MODEL: "tiny",
        ANTHROPIC_DEFAULT_SONNET_MODEL: "tiny",
        ANTHROPIC_DEFAULT_HAIKU_MODEL: "tiny",
        ANTHROPIC_SMALL_FAST_MODEL: "tiny",
    });
});

test("codex: -c overrides of api.md, SPLASH_API_KEY exported, arguments passed through", async () => {
    const d = await dryRun("codex", ["exec", "--skip-git-repo-check", "hi"], { SPLASH_API_KEY: null });
    assert.deepEqual(d.argv, ["codex",
        "-c", 'model_provider="splash"',
        "-c", `model_providers.splash={name="Splash",base_url="${base()}/v1",env_key="SPLASH_API_KEY",wire_api="responses"}`,
        "-c", 'model="tiny"',
        "-c", "model_context_window=32768",
        "-c", `model_auto_compact_token_limit=${Math.floor((32768 * 9) / 10)}`,
        "-c", 'web_search="disabled"',
        "exec", "--skip-git-repo-check", "hi"]);
    assert.deepEqual(d.env, { SPLASH_API_KEY: "splash-local" });
});

test("opencode: OPENCODE_CONFIG_CONTENT with the splash provider, limits, variants, every agent pinned", async () => {
    const d = await dryRun("opencode", ["run", "hi"], { SPLASH_API_KEY: null });
    assert.deepEqual(d.argv, ["opencode", "run", "hi"]);
    const cfg = JSON.parse(d.env.OPENCODE_CONFIG_CONTENT);
    const out = Math.min(32768, Math.floor(32768 / 4));
    assert.deepEqual(cfg.provider, {
        splash: {
            npm: "@ai-sdk/openai-compatible",
            name: "Splash",
            options: { baseURL: `${base()}/v1`, apiKey: "splash-local" },
            models: {
                tiny: {
                    name: "tiny", reasoning: true, tool_call: true,
                    limit: { context: 32768, input: 32768 - out, output: out },
                    variants: { none: { reasoningEffort: "none" }, low: { reasoningEffort: "low" }, medium: { reasoningEffort: "medium" }, high: { reasoningEffort: "high" } },
                },
            },
        },
    });
    assert.equal(cfg.model, "splash/tiny");
    assert.equal(cfg.small_model, "splash/tiny");
    for (const a of ["build", "plan", "general", "explore", "title", "summary", "compaction"]) assert.equal(cfg.agent[a].model, "splash/tiny", a);
    assert.deepEqual(Object.keys(d.env), ["OPENCODE_CONFIG_CONTENT"]);
});

test("hermes: a private HERMES_HOME with config.yaml field by field, OPENAI_* in the environment, no key on disk", async () => {
    const cache = path.join(tmp, "cache");
    const d = await dryRun("hermes", ["chat", "-q", "hi"], { SPLASH_CACHE_DIR: cache, SPLASH_API_KEY: "sk-secret-zz" });
    const home = path.join(cache, "hermes");
    assert.deepEqual(d.argv, ["hermes", "chat", "-q", "hi"]);
    assert.deepEqual(d.env, { HERMES_HOME: home, OPENAI_BASE_URL: `${base()}/v1`, OPENAI_API_KEY: "sk-secret-zz" });
    assert.equal(fs.statSync(home).mode & 0o777, 0o700);
    const file = path.join(home, "config.yaml");
    assert.equal(fs.statSync(file).mode & 0o777, 0o600);
    const text = fs.readFileSync(file, "utf8");
    assert.ok(!text.includes("sk-secret-zz"));
    // A reader for the two-level YAML written here (no YAML package in tests/node).
    const lines = text.split("\n").filter((l) => l && !l.startsWith("#"));
    assert.equal(lines[0], "model:");
    const fields = Object.fromEntries(lines.slice(1).map((l) => {
        const m = /^ {2}([a-z_]+): (.*)$/.exec(l);
        assert.ok(m, `unexpected line ${JSON.stringify(l)}`);
        return [m[1], JSON.parse(m[2])];
    }));
    assert.deepEqual(fields, {
        default: "tiny", provider: "custom", base_url: `${base()}/v1`, api_mode: "chat_completions",
        context_length: 32768, max_tokens: 8192,
    });
});

test("SPLASH_API_KEY reaches the server and the client; a wrong or missing key is said clearly", async () => {
    const port = String(keyed.port);
    let r = await launch(["claude"], { SPLASH_PORT: port, SPLASH_API_KEY: KEY, SPLASH_LAUNCH_DRY_RUN: "1" });
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.stderr, "Starting claude: tiny · 1024 context tokens\n");
    assert.equal(JSON.parse(r.stdout).env.ANTHROPIC_AUTH_TOKEN, KEY);
    r = await launch(["claude"], { SPLASH_PORT: port, SPLASH_API_KEY: null, SPLASH_LAUNCH_DRY_RUN: "1" });
    assert.equal(r.code, 1);
    assert.equal(r.stderr, `splash claude: Splash on http://127.0.0.1:${port} needs an API key: set SPLASH_API_KEY to the key the server was started with\n`);
    r = await launch(["codex"], { SPLASH_PORT: port, SPLASH_API_KEY: "wrong", SPLASH_LAUNCH_DRY_RUN: "1" });
    assert.equal(r.code, 1);
    assert.match(r.stderr, /refused SPLASH_API_KEY/);
});

test("server not running: a clear message, exit 1, nothing started", async () => {
    // A port that was just free: bind, read it, close.
    const s = http.createServer();
    await new Promise((res) => s.listen(0, "127.0.0.1", res));
    const port = s.address().port;
    await new Promise((res) => s.close(res));
    for (const client of ["claude", "codex", "opencode", "hermes"]) {
        const r = await launch([client, "-p", "hi"], { SPLASH_PORT: String(port) });
        assert.equal(r.code, 1, client);
        assert.equal(r.stdout, "");
        assert.equal(r.stderr, `splash ${client}: Splash is not running on http://127.0.0.1:${port}: start it with \`splash serve\`\n`);
    }
    const r = await launch(["claude"], { SPLASH_PORT: "80a" });
    assert.equal(r.code, 1);
    assert.equal(r.stderr, "splash claude: SPLASH_PORT=80a is not a port number (1-65535)\n");
});

test("another server on the port (models not owned_by splash): refused", async () => {
    const s = http.createServer((req, res) => {
        res.writeHead(200, { "content-type": "application/json" });
        res.end(req.url === "/status" ? '{"maximum_context_tokens":8192}' : '{"object":"list","data":[{"id":"gpt-x","object":"model","owned_by":"openai"}]}');
    });
    await new Promise((res) => s.listen(0, "127.0.0.1", res));
    try {
        const r = await launch(["opencode"], { SPLASH_PORT: String(s.address().port), SPLASH_LAUNCH_DRY_RUN: "1" });
        assert.equal(r.code, 1);
        assert.match(r.stderr, /is not Splash \(the first model of GET \/v1\/models is not owned_by "splash"\)/);
    } finally {
        await new Promise((res) => s.close(res));
    }
});

test("client not installed: the install URL, exit 1", async () => {
    const empty = path.join(tmp, "empty-bin");
    fs.mkdirSync(empty, { recursive: true });
    const urls = {
        claude: "https://docs.anthropic.com/en/docs/claude-code/setup (npm install -g @anthropic-ai/claude-code)",
        codex: "https://github.com/openai/codex (npm install -g @openai/codex)",
        opencode: "https://opencode.ai/docs (npm install -g opencode-ai)",
        hermes: "https://github.com/NousResearch/hermes-agent",
    };
    for (const [client, url] of Object.entries(urls)) {
        const r = await launch([client, "hi"], { SPLASH_PORT: String(srv.port), PATH: empty });
        assert.equal(r.code, 1, client);
        assert.equal(r.stderr, `splash ${client}: ${client} is not installed or is not on PATH. Install it first: ${url}\n`);
    }
});

// ---- the real agents ----------------------------------------------------------

const AGENTS_DIR = process.env.SPLASH_TEST_AGENTS_DIR || path.join(os.homedir(), ".cache", "splash-test-agents");
const AGENT_PACKAGES = ["@anthropic-ai/claude-code", "@openai/codex", "opencode-ai"];
const agentBin = path.join(AGENTS_DIR, "node_modules", ".bin");

// Installs the three CLIs once into AGENTS_DIR; returns null, or why the
// real-agent tests are skipped.  They are skipped under ASan builds (a
// 20K-token prefill there takes many minutes) and with SPLASH_TEST_AGENTS=0.
function installAgents() {
    if (process.env.SPLASH_TEST_AGENTS === "0") return "SPLASH_TEST_AGENTS=0";
    if (/libasan/.test(spawnSync("ldd", [bin], { encoding: "utf8" }).stdout ?? "")) return "sanitizer build (too slow for agents' 10-20K-token prompts)";
    if (["claude", "codex", "opencode"].every((b) => fs.existsSync(path.join(agentBin, b)))) return null;
    fs.mkdirSync(AGENTS_DIR, { recursive: true });
    const r = spawnSync("npm", ["install", "--prefix", AGENTS_DIR, "--no-audit", "--no-fund", "--no-save", ...AGENT_PACKAGES],
        { encoding: "utf8", timeout: 300000 });
    if (r.status !== 0) return `npm could not install ${AGENT_PACKAGES.join(" ")} into ${AGENTS_DIR} (no registry?): ${((r.stderr || r.error?.message || "").split("\n").find((l) => /code|ERR|error/.test(l)) ?? "").trim()}`;
    return null;
}

// A loopback relay to the server that gives every generation request the
// scripted answer and records what went through.
async function startRelay(upstream) {
    const seen = [];
    const server = http.createServer((req, res) => {
        const chunks = [];
        req.on("data", (c) => chunks.push(c));
        req.on("end", () => {
            let body = Buffer.concat(chunks);
            let json = null;
            try { json = JSON.parse(body.toString("utf8")); } catch {}
            const entry = { method: req.method, url: req.url, auth: req.headers.authorization ?? req.headers["x-api-key"] ?? null, model: json?.model, status: null, reply: "" };
            seen.push(entry);
            if (json && req.method === "POST" && (json.messages || json.input)) {
                json.test_script = SCRIPT;
                body = Buffer.from(JSON.stringify(json));
            }
            const up = http.request({ host: "127.0.0.1", port: upstream, method: req.method, path: req.url, agent: false,
                headers: { ...req.headers, host: `127.0.0.1:${upstream}`, "content-length": body.length } }, (ur) => {
                entry.status = ur.statusCode;
                res.writeHead(ur.statusCode, ur.headers);
                ur.on("data", (d) => { if (entry.reply.length < 4000) entry.reply += d; });
                ur.pipe(res);
            });
            up.on("error", (e) => { res.writeHead(502); res.end(String(e)); });
            up.end(body);
        });
    });
    await new Promise((res) => server.listen(0, "127.0.0.1", res));
    return { port: server.address().port, seen, close: () => new Promise((res) => server.close(res)) };
}

const why = installAgents();
if (why) console.log(`# real-agent tests skipped: ${why}`);
const agentTest = (name, fn) => test(name, { skip: why ? `real agents skipped: ${why}` : false, timeout: 240000 }, fn);

// One turn of a real agent through its launcher; returns the run and what the relay saw.
async function agentTurn(client, args, endpoint) {
    const relay = await startRelay(srv.port);
    const home = fs.mkdtempSync(path.join(tmp, `${client}-home-`));
    const work = fs.mkdtempSync(path.join(tmp, `${client}-work-`));
    try {
        const r = await launch([client, ...args], {
            SPLASH_PORT: String(relay.port), SPLASH_API_KEY: null, PATH: `${agentBin}:${process.env.PATH}`,
            HOME: home, XDG_CONFIG_HOME: path.join(home, ".config"), XDG_DATA_HOME: path.join(home, ".local/share"),
            XDG_CACHE_HOME: path.join(home, ".cache"), XDG_STATE_HOME: path.join(home, ".local/state"), CODEX_HOME: null,
            NO_COLOR: "1", CI: "1",
        }, { cwd: work, timeout: 230000 });
        const calls = relay.seen.filter((s) => s.url.split("?")[0] === endpoint);
        const detail = `exit ${r.code} ${r.signal ?? ""}\nstdout: ${r.stdout.slice(-2000)}\nstderr: ${r.stderr.slice(-3000)}\n` +
            `requests: ${JSON.stringify(relay.seen.map((s) => ({ ...s, reply: s.status === 200 ? undefined : s.reply })), null, 1).slice(0, 6000)}`;
        if (process.env.SPLASH_LAUNCH_TEST_VERBOSE) console.log(detail);
        return { r, calls, seen: relay.seen, detail };
    } finally {
        await relay.close();
    }
}

agentTest("real Claude Code: `splash claude -p` completes one turn over /v1/messages", async () => {
    const { r, calls, detail } = await agentTurn("claude", ["-p", "Say hi."], "/v1/messages");
    assert.equal(r.code, 0, detail);
    assert.ok(r.stderr.startsWith(`Starting claude: tiny · ${CONTEXT} context tokens\n`), detail);
    assert.ok(calls.length >= 1, detail);
    for (const c of calls) {
        assert.equal(c.status, 200, detail);
        assert.equal(c.model, "tiny", detail);
        assert.equal(c.auth, "Bearer splash-local", detail);
    }
    assert.equal(r.stdout.trim(), ANSWER, detail);
});

agentTest("real Codex: `splash codex exec` completes one turn over /v1/responses", async () => {
    const { r, calls, detail } = await agentTurn("codex", ["exec", "--skip-git-repo-check", "Say hi."], "/v1/responses");
    assert.equal(r.code, 0, detail);
    assert.ok(calls.length >= 1, detail);
    for (const c of calls) {
        assert.equal(c.status, 200, detail);
        assert.equal(c.model, "tiny", detail);
        assert.equal(c.auth, "Bearer splash-local", detail);
    }
    assert.ok(r.stdout.includes(ANSWER), detail);
});

agentTest("real OpenCode: `splash opencode run` completes one turn over /v1/chat/completions", async () => {
    const { r, calls, detail } = await agentTurn("opencode", ["run", "Say hi."], "/v1/chat/completions");
    assert.equal(r.code, 0, detail);
    assert.ok(calls.length >= 1, detail);
    for (const c of calls) {
        assert.equal(c.status, 200, detail);
        assert.equal(c.model, "tiny", detail);
        assert.equal(c.auth, "Bearer splash-local", detail);
    }
    assert.ok(r.stdout.includes(ANSWER), detail);
});
