// The built-in chat page at / in a real browser: Debian's chromium, headless,
// driven by playwright-core, against the real binary with the tiny random
// model behind an API key.  The page's requests go to the server as the page
// sends them, except that the test adds "test_script" (serve --test-hooks) so
// the answer is a text the test chose: what the page must render is known in
// advance, never read back from the server.  Token counts come from the
// reference tokenizer and template (@huggingface/tokenizers, @huggingface/jinja).
//
// Screenshots go to $SPLASH_ARTIFACTS, else BUILD/test-artifacts (beside the
// binary).  Without /usr/bin/chromium the browser tests are skipped with a
// message; CI installs it (tools/deps.sh).
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import crypto from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { countTokens, jinjaPrompt } from "./api_util.mjs";
import { bin, rawRequest, root, startServer, testModel } from "./serve_util.mjs";

const CHROMIUM = "/usr/bin/chromium";
const noBrowser = fs.existsSync(CHROMIUM) ? false
    : `${CHROMIUM} not found: install Debian's chromium (sudo apt-get install chromium) to run the chat page tests`;
const KEY = "sk-page-test-51c7";
const artifacts = process.env.SPLASH_ARTIFACTS || path.join(path.dirname(path.resolve(bin)), "test-artifacts");
const pageFile = fs.readFileSync(path.join(root, "src/server/chat_page.html"), "utf8");

let srv, browser, page;
const requests = [];      // every URL the page asked for
const chatBodies = [];    // the JSON bodies the page sent to /v1/chat/completions
const problems = [];      // console errors (CSP violations among them) and uncaught page errors
let nextScript = null;    // the scripted answer for the page's next chat request
let canned = null;        // instead: { status, contentType, body } answered without the server

before(async () => {
    srv = await startServer(["--model", testModel(), "--test-hooks", "--threads", "1", "--max-context", "4K",
        "--api-key", KEY, "--served-model-name", "tiny"]);
    if (noBrowser) return;
    fs.mkdirSync(artifacts, { recursive: true });
    const { chromium } = await import("playwright-core");
    browser = await chromium.launch({ executablePath: CHROMIUM, args: ["--no-sandbox"] });
    const context = await browser.newContext({ viewport: { width: 1200, height: 820 } });
    page = await context.newPage();
    page.on("request", (r) => requests.push(r.url()));
    page.on("console", (m) => { if (m.type() === "error") problems.push(`console: ${m.text()}`); });
    page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
    await page.route("**/v1/chat/completions", async (route) => {
        const body = JSON.parse(route.request().postData());
        chatBodies.push(body);
        if (canned) return route.fulfill({ status: canned.status, contentType: canned.contentType, body: canned.body });
        if (nextScript !== null) body.test_script = nextScript;
        await route.continue({ postData: JSON.stringify(body) });
    });
});

after(async () => {
    if (browser) await browser.close();
    if (srv) assert.equal((await srv.stop("SIGTERM")).code, 0, srv.log());
});

const status = async () => (await rawRequest(srv.port, { method: "GET", path: "/status", key: KEY })).json;
const shot = (name) => page.screenshot({ path: path.join(artifacts, `chat_page-${name}.png`) });
const assistant = () => page.locator(".msg.assistant").last();

// The CSP hash-source of the text between a tag that starts a line and its end tag.
function cspHash(open, close) {
    const a = pageFile.indexOf(`\n${open}`) + 1 + open.length;
    return `'sha256-${crypto.createHash("sha256").update(pageFile.slice(a, pageFile.indexOf(close, a))).digest("base64")}'`;
}

test("GET / and /index.html: the page, its CSP hashes, caching and security headers; public under an API key", async () => {
    const r = await rawRequest(srv.port, { method: "GET", path: "/" });
    assert.equal(r.status, 200);
    assert.equal(r.headers["content-type"], "text/html; charset=utf-8");
    assert.equal(r.text, pageFile);
    const csp = Object.fromEntries(r.headers["content-security-policy"].split(";").map((d) => {
        const [k, ...v] = d.trim().split(/\s+/);
        return [k, v.join(" ")];
    }));
    assert.deepEqual(csp, {
        "default-src": "'none'", "script-src": cspHash("<script>", "</script>"), "style-src": cspHash("<style>", "</style>"),
        "connect-src": "'self'", "img-src": "data:", "base-uri": "'none'", "form-action": "'none'",
        "frame-ancestors": "'none'",
    });
    assert.equal(r.headers["x-content-type-options"], "nosniff");
    assert.equal(r.headers["x-frame-options"], "DENY");
    assert.equal(r.headers["referrer-policy"], "no-referrer");
    assert.equal(r.headers["cache-control"], "no-cache");
    assert.match(r.headers.etag, /^"[0-9a-f]{32}"$/);
    const again = await rawRequest(srv.port, { method: "GET", path: "/index.html", headers: { "if-none-match": r.headers.etag } });
    assert.equal(again.status, 304);
    assert.equal(again.text, "");
    assert.equal((await rawRequest(srv.port, { method: "GET", path: "/index.html?x=1" })).text, pageFile);
    assert.equal((await rawRequest(srv.port, { method: "POST", path: "/", body: {} })).status, 405);
    // the API itself still wants the key
    assert.equal((await rawRequest(srv.port, { method: "GET", path: "/v1/models" })).status, 401);
    // --no-webui: no page
    const bare = await startServer(["--model", testModel(), "--threads", "1", "--max-context", "1K", "--no-webui"]);
    try {
        assert.equal((await rawRequest(bare.port, { method: "GET", path: "/" })).status, 404);
    } finally {
        assert.equal((await bare.stop("SIGTERM")).code, 0, bare.log());
    }
});

const markdownScript = "Let me think.\n</think>\n\n# Title\n\nSome **bold**, *slanted* and `code`.\n\n" +
    "```python\ndef f(x):\n    return 42  # answer\n```\n\n| a | b |\n|:--|--:|\n| 1 | 2 |\n\n- one\n- two\n\n" +
    "<img src=x onerror=alert(1)> [bad](javascript:alert(1)) [good](https://example.com/)";

test("the API key flow, then a streamed answer rendered as markdown with its reasoning and statistics", { skip: noBrowser, timeout: 60000 }, async () => {
    await page.goto(`${srv.base}/`);
    await page.locator("#model-name", { hasText: "API key needed" }).waitFor();
    nextScript = markdownScript;
    await page.fill("#input", "Show me some markdown");
    await page.keyboard.press("Enter");
    await assistant().locator(".error", { hasText: "needs an API key" }).waitFor();
    await page.fill("#api-key", KEY);
    await page.locator("#api-key").dispatchEvent("change");
    await page.locator("#model-name", { hasText: "tiny" }).waitFor();
    assert.equal(await page.textContent("#model-ctx"), "context 4K");
    await assistant().locator(".retry").click();
    const meta = assistant().locator(".meta");
    await meta.waitFor();
    const body = chatBodies[chatBodies.length - 1];
    assert.deepEqual(body.messages, [{ role: "user", content: "Show me some markdown" }]);
    assert.equal(body.stream, true);
    assert.deepEqual(body.stream_options, { include_usage: true });
    assert.equal(body.return_progress, true);
    assert.equal(body.reasoning_effort, "medium");
    assert.equal(body.model, "tiny");
    const a = assistant();
    assert.equal(await a.locator(".reasoning summary").textContent(), "Thoughts");
    assert.equal((await a.locator(".reasoning .md").textContent()).trim(), "Let me think.");
    const c = a.locator(".content");
    assert.equal(await c.locator("h1").textContent(), "Title");
    assert.equal(await c.locator("strong").first().textContent(), "bold");
    assert.equal(await c.locator("em").first().textContent(), "slanted");
    assert.equal(await c.locator("p > code").textContent(), "code");
    assert.equal(await c.locator("pre").textContent(), "def f(x):\n    return 42  # answer");
    assert.deepEqual(await c.locator("pre .tk-kw").allTextContents(), ["def", "return"]);
    assert.deepEqual(await c.locator("pre .tk-num").allTextContents(), ["42"]);
    assert.deepEqual(await c.locator("pre .tk-com").allTextContents(), ["# answer"]);
    assert.deepEqual(await c.locator("th").allTextContents(), ["a", "b"]);
    assert.deepEqual(await c.locator("td").allTextContents(), ["1", "2"]);
    assert.equal(await c.locator("td").last().getAttribute("class"), "al-r");
    assert.deepEqual(await c.locator("li").allTextContents(), ["one", "two"]);
    // raw HTML stays text, the javascript: link is no link, the https one is
    assert.equal(await c.locator("img").count(), 0);
    assert.match(await c.textContent(), /<img src=x onerror=alert\(1\)> bad good$/);
    assert.deepEqual(await c.locator("a").evaluateAll((as) => as.map((x) => [x.textContent, x.getAttribute("href"), x.rel])),
        [["good", "https://example.com/", "noopener noreferrer"]]);
    // completion tokens: the script's tokens and the stop token
    const n = countTokens(markdownScript) + 1;
    assert.match(await meta.textContent(), new RegExp(`^${n} tokens · \\d+\\.\\d tok/s · prompt \\d+ at \\d+ tok/s$`));
    assert.equal(await page.locator(".chat-item.current .open").textContent(), "Show me some markdown");
    await shot("answer");
});

test("the renderer escapes what it shows and links only http(s), mailto and relative targets", { skip: noBrowser }, async () => {
    const attacks = [
        "<script>alert(1)</script>", "<img src=x onerror=alert(1)>", "[x](javascript:alert(1))", "[x](JaVaScRiPt:alert(1))",
        "[x](java\nscript:alert(1))", "[x](java&#09;script:alert(1))", "[x](data:text/html,<script>alert(1)</script>)",
        "[x](vbscript:msgbox(1))", "![x](javascript:alert(1))", "[x](//evil.example/)", "<javascript:alert(1)>",
        "[a\"onmouseover=\"alert(1)](https://ok.example/\"onmouseover=\"alert(1))", "`<b>`", "```html\n<b onclick=x>\n```",
        "| <i>t</i> |\n|---|\n| <svg onload=alert(1)> |", "**<u>x</u>**", "> <iframe src=x>", "- <object data=x>",
        "# <style>*{}</style>", "http://ok.example/?q=<b>", "[x](https://ok.example/ 'title')",
    ];
    const found = await page.evaluate((inputs) => inputs.map((src) => {
        const d = document.createElement("div");
        d.innerHTML = window.splash.markdown(src);
        const els = [...d.querySelectorAll("*")];
        return {
            tags: [...new Set(els.map((e) => e.tagName.toLowerCase()))],
            attrs: [...new Set(els.flatMap((e) => [...e.attributes].map((a) => a.name)))],
            hrefs: [...d.querySelectorAll("a")].map((a) => a.href), // resolved against the page's URL
        };
    }), attacks);
    const allowedTags = new Set(["p", "br", "strong", "em", "del", "code", "pre", "a", "h1", "h2", "h3", "h4", "h5", "h6",
        "ul", "ol", "li", "blockquote", "hr", "table", "thead", "tbody", "tr", "th", "td", "div", "span", "button"]);
    const allowedAttrs = new Set(["href", "target", "rel", "class", "type", "start"]);
    found.forEach((f, i) => {
        for (const t of f.tags) assert.ok(allowedTags.has(t), `${JSON.stringify(attacks[i])} made <${t}>`);
        for (const a of f.attrs) assert.ok(allowedAttrs.has(a), `${JSON.stringify(attacks[i])} made the attribute ${a}`);
        for (const h of f.hrefs) {
            const u = new URL(h);
            assert.ok(["http:", "https:", "mailto:"].includes(u.protocol), `${JSON.stringify(attacks[i])} linked ${h}`);
            assert.ok(u.protocol === "mailto:" || [new URL(srv.base).host, "ok.example"].includes(u.host), `${JSON.stringify(attacks[i])} linked ${h}`);
        }
    });
    assert.deepEqual(found[found.length - 1].hrefs, ["https://ok.example/"]);
    // the highlighter marks up, never executes: the same text comes back
    const code = "fn main() { let s = \"<b>\"; } // <i>\nconst x = `a${b}`; /* c */ 0x1F\nif [ -z \"$1\" ]; then echo '#'; fi # c";
    for (const lang of ["rust", "js", "c", "go", "bash", "python", "json", "ts", "unknown"]) {
        const text = await page.evaluate(([c, l]) => {
            const d = document.createElement("div");
            d.innerHTML = window.splash.highlight(c, l);
            return [d.textContent, d.querySelectorAll(":not(span)").length];
        }, [code, lang]);
        assert.deepEqual(text, [code, 0], lang);
    }
});

test("thinking off, prompt progress, then Stop: the server's request ends and the partial answer stays", { skip: noBrowser, timeout: 60000 }, async () => {
    await page.click("#new-chat");
    await page.selectOption("#thinking", "off");
    const before = await status();
    const long = "Please read this. " + "word ".repeat(600);
    const promptTokens = countTokens(jinjaPrompt({ messages: [{ role: "user", content: long }], enable_thinking: false }));
    nextScript = "word ".repeat(3000); // far longer than the test waits
    // record every status line the page shows while the answer is pending
    await page.evaluate(() => {
        window.__statusLog = [];
        new MutationObserver(() => {
            for (const s of document.querySelectorAll(".msg.assistant .status")) window.__statusLog.push(s.textContent);
        }).observe(document.getElementById("thread"), { childList: true, subtree: true, characterData: true });
    });
    await page.fill("#input", long);
    await page.click("#send");
    await assistant().locator(".content").waitFor();
    assert.equal(chatBodies[chatBodies.length - 1].reasoning_effort, "none");
    const during = await status();
    assert.equal(during.queue.active, 1);
    await page.click("#stop");
    const t0 = Date.now();
    let s;
    do {
        s = await status();
        if (s.queue.active === 0 && s.streams_open === 0) break;
        await new Promise((r) => setTimeout(r, 20));
    } while (Date.now() - t0 < 5000);
    assert.equal(s.queue.active, 0, "the request still runs after Stop");
    assert.equal(s.streams_open, 0);
    assert.equal(s.totals.requests, before.totals.requests + 1);
    assert.ok(s.totals.completion_tokens - before.totals.completion_tokens < 3000, "the request ran to its end");
    await assistant().locator(".meta", { hasText: "stopped" }).waitFor();
    assert.match(await assistant().locator(".content").textContent(), /^(word ?)+$/);
    assert.equal(await page.isVisible("#send"), true);
    assert.equal(await page.isVisible("#stop"), false);
    assert.equal(await page.locator(".reasoning").count(), 0);
    // the prompt was read in several prefill chunks: the page showed how far it was
    const log = await page.evaluate(() => window.__statusLog);
    const progress = log.map((t) => t.match(/^Reading the prompt: (\d+)% \((\d+) of (\d+) tokens\)$/)).filter(Boolean);
    assert.ok(progress.length >= 1, JSON.stringify(log.slice(0, 20)));
    for (const m of progress) {
        assert.equal(Number(m[3]), promptTokens);
        assert.equal(Number(m[1]), Math.floor((100 * Number(m[2])) / promptTokens));
    }
    await shot("stopped");
});

test("chats persist: reload, list, switch, delete; a narrow window gets a drawer", { skip: noBrowser, timeout: 60000 }, async () => {
    await page.reload();
    await page.locator("#model-name", { hasText: "tiny" }).waitFor(); // the key was kept
    const titles = await page.locator(".chat-item .open").allTextContents();
    assert.deepEqual(titles, [("Please read this. " + "word ".repeat(600)).trim().replace(/\s+/g, " ").slice(0, 60), "Show me some markdown"]);
    assert.equal(await page.inputValue("#thinking"), "off");
    await page.locator(".chat-item .open", { hasText: "Show me some markdown" }).click();
    assert.equal(await page.locator(".msg.user .bubble").textContent(), "Show me some markdown");
    assert.equal(await assistant().locator(".content h1").textContent(), "Title");
    // the stopped chat: its partial answer was kept
    await page.locator(".chat-item .open").first().click();
    assert.match(await assistant().locator(".meta").textContent(), /stopped/);
    await page.locator(".chat-item").first().locator(".del").click();
    assert.deepEqual(await page.locator(".chat-item .open").allTextContents(), ["Show me some markdown"]);
    await page.reload();
    assert.deepEqual(await page.locator(".chat-item .open").allTextContents(), ["Show me some markdown"]);
    assert.equal(await page.locator(".welcome").count(), 1);
    // narrow: the chat list hides behind the menu button
    await page.setViewportSize({ width: 390, height: 760 });
    await page.waitForFunction(() => document.getElementById("sidebar").getBoundingClientRect().right <= 1);
    assert.equal(await page.isVisible("#menu"), true);
    await shot("narrow");
    await page.click("#menu");
    await page.waitForFunction(() => document.getElementById("sidebar").getBoundingClientRect().x >= 0);
    await shot("narrow-drawer");
    await page.click("#backdrop", { position: { x: 370, y: 400 } });
    await page.waitForFunction(() => document.getElementById("sidebar").getBoundingClientRect().right <= 1);
});

test("canned replies: the acceptance length and statistics from timings, errors mid-stream and as a status", { skip: noBrowser, timeout: 30000 }, async () => {
    await page.setViewportSize({ width: 1200, height: 820 });
    await page.click("#new-chat");
    const chunk = (o) => `data: ${JSON.stringify({ id: "chatcmpl-x", object: "chat.completion.chunk", created: 1, model: "tiny", ...o })}\n\n`;
    const ask = async (text) => {
        await page.fill("#input", text);
        await page.click("#send");
        await page.locator("#send").waitFor({ state: "visible" });
    };
    canned = { status: 200, contentType: "text/event-stream", body:
        chunk({ choices: [{ index: 0, delta: { role: "assistant", content: "" }, finish_reason: null }] }) +
        ": keep-alive\n\n" +
        chunk({ choices: [{ index: 0, delta: { role: "assistant", content: null }, finish_reason: null }],
            prompt_progress: { total: 5, cache: 4, processed: 5, time_ms: 3 } }) +
        chunk({ choices: [{ index: 0, delta: { content: "Hi" }, finish_reason: null }] }) +
        chunk({ choices: [{ index: 0, delta: {}, finish_reason: "stop" }], timings: { prompt_n: 5, prompt_per_second: 99.6,
            predicted_n: 20, predicted_per_second: 12.34, draft_n: 30, draft_n_accepted: 24, decode_cycles: 10 } }) +
        chunk({ choices: [], usage: { prompt_tokens: 5, completion_tokens: 20, total_tokens: 25, prompt_tokens_details: { cached_tokens: 4 } } }) +
        "data: [DONE]\n\n" };
    await ask("canned one");
    assert.equal(await assistant().locator(".content").textContent(), "Hi");
    // (24 + 10) / 10 tokens per cycle
    assert.equal(await assistant().locator(".meta").textContent(),
        "20 tokens · 12.3 tok/s · acceptance length 3.40 · prompt 5 (4 cached) at 100 tok/s");
    canned = { status: 200, contentType: "text/event-stream", body:
        chunk({ choices: [{ index: 0, delta: { content: "Part" }, finish_reason: null }] }) +
        `data: ${JSON.stringify({ error: { message: "the server is stopping", type: "server_error", param: null, code: null } })}\n\n` +
        "data: [DONE]\n\n" };
    await ask("canned two");
    assert.equal(await assistant().locator(".content").textContent(), "Part");
    assert.equal(await assistant().locator(".error").textContent(), "the server is stoppingRetry");
    canned = { status: 429, contentType: "application/json",
        body: JSON.stringify({ error: { message: "the queue is full", type: "invalid_request_error", param: null, code: "rate_limit_exceeded" } }) };
    await ask("canned three");
    assert.equal(await assistant().locator(".error").textContent(), "429: the queue is fullRetry");
    // Retry sends the same history again (without the failed answer)
    canned = { status: 200, contentType: "text/event-stream", body: chunk({ choices: [{ index: 0, delta: { content: "Fine" }, finish_reason: "stop" }] }) + "data: [DONE]\n\n" };
    await assistant().locator(".retry").click();
    await assistant().locator(".content", { hasText: "Fine" }).waitFor();
    assert.deepEqual(chatBodies[chatBodies.length - 1].messages.map((m) => m.content),
        ["canned one", "Hi", "canned two", "Part", "canned three"]);
    assert.equal(await page.locator(".msg.assistant .error").count(), 1); // the mid-stream one stays
    canned = null;
    await shot("canned");
    await page.locator(".chat-item .open", { hasText: "Show me some markdown" }).click();
    await page.emulateMedia({ colorScheme: "dark" });
    await shot("dark");
    await page.emulateMedia({ colorScheme: "light" });
});

test("the page asked its own origin only and broke no Content-Security-Policy rule", { skip: noBrowser }, async () => {
    const origin = new URL(srv.base).origin;
    const foreign = requests.filter((u) => !u.startsWith("data:") && new URL(u).origin !== origin);
    assert.deepEqual(foreign, []);
    assert.ok(requests.some((u) => u.endsWith("/v1/chat/completions")));
    // (the 401 and the canned 429 were on purpose: the browser logs failed loads)
    assert.deepEqual(problems.filter((p) => !/status of (401|429) /.test(p)), []);
});
