// `splash pull` against a local HTTP server (node's http module on a free
// loopback port) that serves a real package packed from tests/fixtures/dense-tiny
// under Hugging Face-style paths /OWNER/REPO/resolve/REV/FILE, with Range
// support and knobs that corrupt, cut off, redirect, stall or ignore Range.
// Expected hashes come from node's crypto over the served bytes, not from
// splash.  Nothing but 127.0.0.1 is ever contacted: the base URL points at the
// test server and proxies are switched off in the child's environment.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import crypto from "node:crypto";
import fs from "node:fs";
import http from "node:http";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { testModel, startServer } from "./serve_util.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));
const bin = process.env.SPLASH_BIN || path.join(here, "..", "..", "build", "splash");
const fixture = path.join(here, "..", "fixtures", "dense-tiny");

let work; // temp root
let pkg; // the packed package the server serves
let manifest; // its parsed manifest.json
let server, base;
const sockets = new Set();
let state;

function reset() {
    state = {
        requests: [], // {path, range}
        models: { "acme/tiny": pkg },
        corrupt: new Map(), // file -> times left to serve it with one byte flipped
        cut: new Map(), // file -> {bytes, times}: send that many body bytes, then close
        stall: new Map(), // file -> {bytes, times}: send that many body bytes, then hang
        ignoreRange: false,
        redirect: false, // 302 every request to /cdn/...
        delayMs: 0,
    };
}

function sha256(buf) {
    return crypto.createHash("sha256").update(buf).digest("hex");
}

function corrupted(buf) {
    const b = Buffer.from(buf);
    b[100] ^= 0xff;
    return b;
}

function handle(req, res) {
    const url = new URL(req.url, "http://127.0.0.1");
    let p = url.pathname;
    state.requests.push({ path: p, range: req.headers.range ?? null });
    if (p.startsWith("/cdn/")) p = p.slice(4);
    else if (state.redirect) {
        res.writeHead(302, { Location: `${base}/cdn${p}` });
        res.end();
        return;
    }
    const m = /^\/([^/]+)\/([^/]+)\/resolve\/([^/]+)\/(.+)$/.exec(p);
    const dir = m && m[3] === "main" ? state.models[`${m[1]}/${m[2]}`] : undefined;
    const file = m ? decodeURIComponent(m[4]) : "";
    const full = dir ? path.join(dir, file) : "";
    if (!dir || !full.startsWith(dir + path.sep) || !fs.existsSync(full)) {
        res.writeHead(404, { "Content-Type": "text/plain" });
        res.end("Entry not found");
        return;
    }
    let data = fs.readFileSync(full);
    const c = state.corrupt.get(file);
    if (c > 0) {
        state.corrupt.set(file, c - 1);
        data = corrupted(data);
    }
    const headers = { "Content-Type": "application/octet-stream", "Accept-Ranges": "bytes" };
    let status = 200;
    let start = 0;
    const range = req.headers.range;
    if (range && !state.ignoreRange) {
        const r = /^bytes=(\d+)-$/.exec(range);
        start = r ? Number(r[1]) : 0;
        if (!r || start >= data.length) {
            res.writeHead(416, { "Content-Range": `bytes */${data.length}` });
            res.end();
            return;
        }
        status = 206;
        headers["Content-Range"] = `bytes ${start}-${data.length - 1}/${data.length}`;
    }
    const body = data.subarray(start);
    headers["Content-Length"] = body.length;
    res.writeHead(status, headers);
    const cut = state.cut.get(file);
    if (cut && cut.times > 0) {
        cut.times--;
        res.write(body.subarray(0, cut.bytes), () => res.socket.destroy());
        return;
    }
    const stall = state.stall.get(file);
    if (stall && stall.times > 0) {
        stall.times--;
        res.write(body.subarray(0, stall.bytes)); // and never more
        return;
    }
    res.end(body);
}

function childEnv(cache, extra = {}) {
    const env = { ...process.env, SPLASH_MODEL_BASE_URL: base, SPLASH_CACHE_DIR: cache, NO_PROXY: "*", no_proxy: "*" };
    for (const k of ["http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"]) delete env[k];
    delete env.SPLASH_DOWNLOAD_RETRIES;
    delete env.SPLASH_DOWNLOAD_STALL_S;
    return { ...env, ...extra };
}

// Async: the server runs on this process's event loop, so no spawnSync here.
function splash(args, env) {
    return new Promise((resolve, reject) => {
        const child = spawn(bin, args, { env, stdio: ["ignore", "pipe", "pipe"] });
        let stdout = "";
        let stderr = "";
        child.stdout.on("data", (d) => (stdout += d));
        child.stderr.on("data", (d) => (stderr += d));
        child.on("error", reject);
        child.on("close", (status) => resolve({ status, stdout, stderr }));
    });
}

function newCache() {
    return fs.mkdtempSync(path.join(work, "cache-"));
}

function modelDir(cache, owner = "acme", repo = "tiny", rev = "main") {
    return path.join(cache, "models", `${owner}--${repo}`, rev);
}

function fileRequests(file) {
    return state.requests.filter((r) => r.path.endsWith(`/resolve/main/${file}`));
}

function entry(file) {
    return manifest.files.find((f) => f.path === file);
}

function verify(dir) {
    const r = spawnSync(bin, ["verify", "--quiet", dir], { encoding: "utf8" });
    assert.equal(r.status, 0, r.stderr);
}

function listPartials(dir) {
    return fs.readdirSync(dir, { recursive: true }).filter((f) => String(f).endsWith(".partial"));
}

before(async () => {
    work = fs.mkdtempSync(path.join(os.tmpdir(), "splash-download-test-"));
    pkg = path.join(work, "pkg");
    const r = spawnSync(bin, ["pack", "--from", fixture, "--out", pkg, "--weights", "q8", "--quiet"], { encoding: "utf8" });
    assert.equal(r.status, 0, `pack failed: ${r.stderr}`);
    manifest = JSON.parse(fs.readFileSync(path.join(pkg, "manifest.json"), "utf8"));
    reset();
    server = http.createServer((req, res) => {
        if (state.delayMs) setTimeout(() => handle(req, res), state.delayMs);
        else handle(req, res);
    });
    server.on("connection", (s) => {
        sockets.add(s);
        s.on("close", () => sockets.delete(s));
    });
    await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
    base = `http://127.0.0.1:${server.address().port}`;
});

after(async () => {
    for (const s of sockets) s.destroy();
    if (server) await new Promise((resolve) => server.close(resolve));
    if (work) fs.rmSync(work, { recursive: true, force: true });
});

test("a clean download verifies; the second run and --offline make no request", async () => {
    reset();
    const cache = newCache();
    const env = childEnv(cache);
    const dir = modelDir(cache);
    const r = await splash(["pull", "acme/tiny"], env);
    assert.equal(r.status, 0, r.stderr);
    assert.equal(r.stdout, dir + "\n");
    // the manifest, then each listed file exactly once, whole
    assert.equal(state.requests.length, 1 + manifest.files.length);
    assert.equal(state.requests[0].path, "/acme/tiny/resolve/main/manifest.json");
    for (const f of manifest.files) assert.deepEqual(fileRequests(f.path), [{ path: `/acme/tiny/resolve/main/${f.path}`, range: null }]);
    for (const f of manifest.files) assert.ok(fs.readFileSync(path.join(dir, f.path)).equals(fs.readFileSync(path.join(pkg, f.path))));
    assert.equal(fs.readFileSync(path.join(dir, ".verified"), "utf8").trim(), sha256(fs.readFileSync(path.join(pkg, "manifest.json"))));
    assert.deepEqual(listPartials(dir), []);
    assert.match(r.stderr, /target\/layer-0\.bin {2}262144 bytes {2}sha256 ok/);
    verify(dir);

    const again = await splash(["pull", "acme/tiny"], env);
    assert.equal(again.status, 0, again.stderr);
    assert.equal(again.stdout, dir + "\n");
    assert.equal(state.requests.length, 1 + manifest.files.length, "the verified cache made a request");

    const off = await splash(["pull", "acme/tiny", "--offline"], env);
    assert.equal(off.status, 0, off.stderr);
    assert.equal(off.stdout, dir + "\n");
    // offline even with an unreachable base URL
    const off2 = await splash(["pull", "acme/tiny", "--offline"], { ...env, SPLASH_MODEL_BASE_URL: "http://127.0.0.1:9" });
    assert.equal(off2.status, 0, off2.stderr);
    assert.equal(state.requests.length, 1 + manifest.files.length);

    // a package directory is used as it is
    const p = await splash(["pull", pkg, "--offline"], env);
    assert.equal(p.status, 0, p.stderr);
    assert.equal(p.stdout, pkg + "\n");
});

test("--offline with an empty cache fails clearly and creates nothing", async () => {
    reset();
    const cache = newCache();
    const r = await splash(["pull", "acme/tiny", "--offline"], childEnv(cache));
    assert.equal(r.status, 1);
    assert.equal(r.stdout, "");
    assert.equal(
        r.stderr,
        `splash pull: model acme/tiny is not in the cache (${modelDir(cache)} has no download) and --offline forbids ` +
            "downloading it; run `splash pull acme/tiny` while online, or give a package directory\n",
    );
    assert.equal(state.requests.length, 0);
    assert.deepEqual(fs.readdirSync(cache), []);
});

test("a file served corrupt once is fetched again and the download succeeds", async () => {
    reset();
    const file = "target/layer-3.bin";
    state.corrupt.set(file, 1);
    const cache = newCache();
    const r = await splash(["pull", "acme/tiny"], childEnv(cache));
    assert.equal(r.status, 0, r.stderr);
    assert.equal(fileRequests(file).length, 2);
    const bad = sha256(corrupted(fs.readFileSync(path.join(pkg, file))));
    assert.ok(r.stderr.includes(`${file}: sha256 mismatch: expected ${entry(file).sha256}, actual ${bad}; fetching it again`), r.stderr);
    verify(modelDir(cache));
    assert.ok(fs.existsSync(path.join(modelDir(cache), ".verified")));
});

test("a file served corrupt every time fails naming the file and both hashes", async () => {
    reset();
    const file = "target/layer-3.bin";
    state.corrupt.set(file, Infinity);
    const cache = newCache();
    const dir = modelDir(cache);
    const r = await splash(["pull", "acme/tiny"], childEnv(cache));
    assert.equal(r.status, 1);
    assert.equal(r.stdout, "");
    assert.equal(fileRequests(file).length, 2);
    const bad = sha256(corrupted(fs.readFileSync(path.join(pkg, file))));
    const last = r.stderr.trim().split("\n").at(-1);
    assert.equal(
        last,
        `splash pull: ${file} of model acme/tiny is corrupt after fetching it twice: sha256 mismatch: expected ` +
            `${entry(file).sha256}, actual ${bad} (from ${base}/acme/tiny/resolve/main/${file})`,
    );
    assert.ok(!fs.existsSync(path.join(dir, ".verified")));
    assert.ok(!fs.existsSync(path.join(dir, file)));
    assert.deepEqual(listPartials(dir), []);
    // nor does --offline accept the incomplete cache
    const off = await splash(["pull", "acme/tiny", "--offline"], childEnv(cache));
    assert.equal(off.status, 1);
    assert.match(off.stderr, /holds an incomplete download/);
});

test("an interrupted download resumes on the next run with a Range request", async () => {
    reset();
    const file = "target/layer-5.bin";
    const cut = 100000;
    state.cut.set(file, { bytes: cut, times: 1 });
    const cache = newCache();
    const dir = modelDir(cache);
    const r = await splash(["pull", "acme/tiny"], childEnv(cache, { SPLASH_DOWNLOAD_RETRIES: "0" }));
    assert.equal(r.status, 1);
    assert.match(r.stderr, new RegExp(`downloading ${file} of model acme/tiny .*\\(${cut} of 262144 bytes kept in .*layer-5\\.bin\\.partial; run again to resume\\)`));
    assert.equal(fs.statSync(path.join(dir, file + ".partial")).size, cut);
    assert.ok(!fs.existsSync(path.join(dir, ".verified")));
    assert.ok(fs.existsSync(path.join(dir, "target/layer-4.bin")));

    state.requests = [];
    const again = await splash(["pull", "acme/tiny"], childEnv(cache, { SPLASH_DOWNLOAD_RETRIES: "0" }));
    assert.equal(again.status, 0, again.stderr);
    // manifest, the resumed file, then the files not started yet; the finished ones are kept
    assert.deepEqual(
        state.requests.map((q) => [q.path.split("/resolve/main/")[1], q.range]),
        [["manifest.json", null], [file, `bytes=${cut}-`], ["target/layer-6.bin", null], ["target/layer-7.bin", null]],
    );
    verify(dir);
    assert.deepEqual(listPartials(dir), []);
});

test("a connection cut mid-file is resumed within the same run", async () => {
    reset();
    const file = "target/layer-1.bin";
    state.cut.set(file, { bytes: 50000, times: 1 });
    const cache = newCache();
    const r = await splash(["pull", "acme/tiny"], childEnv(cache));
    assert.equal(r.status, 0, r.stderr);
    assert.deepEqual(fileRequests(file).map((q) => q.range), [null, "bytes=50000-"]);
    assert.match(r.stderr, /layer-1\.bin: .*; resuming from byte 50000 \(retry 1 of 3\)/);
    verify(modelDir(cache));
});

test("a server that ignores Range sends the whole file and the download starts over", async () => {
    reset();
    const file = "target/layer-2.bin";
    state.cut.set(file, { bytes: 70000, times: 1 });
    const cache = newCache();
    const dir = modelDir(cache);
    const env = childEnv(cache, { SPLASH_DOWNLOAD_RETRIES: "0" });
    assert.equal((await splash(["pull", "acme/tiny"], env)).status, 1);
    assert.equal(fs.statSync(path.join(dir, file + ".partial")).size, 70000);
    state.ignoreRange = true;
    const r = await splash(["pull", "acme/tiny"], env);
    assert.equal(r.status, 0, r.stderr);
    assert.deepEqual(fileRequests(file).map((q) => q.range), [null, "bytes=70000-"]);
    verify(dir);
});

test("redirects are followed, Range included", async () => {
    reset();
    state.redirect = true;
    const file = "target/head.bin";
    state.cut.set(file, { bytes: 30000, times: 1 });
    const cache = newCache();
    const r = await splash(["pull", "acme/tiny", "--progress", "bar"], childEnv(cache));
    assert.equal(r.status, 0, r.stderr);
    const cdn = state.requests.filter((q) => q.path.startsWith("/cdn/"));
    assert.equal(cdn.length, 1 + manifest.files.length + 1);
    assert.deepEqual(fileRequests(file).map((q) => [q.path.startsWith("/cdn/"), q.range]), [
        [false, null],
        [true, null],
        [false, "bytes=30000-"],
        [true, "bytes=30000-"],
    ]);
    // the bar: percent, bytes, speed, ETA, redrawn in place, ending at 100%
    assert.match(r.stderr, /\racme\/tiny \[#{24}\] 100% {2}2\.2 MB \/ 2\.2 MB {2}[0-9.]+ MB\/s {2}ETA [0-9:]+\x1b\[K\n/);
    verify(modelDir(cache));
});

test("a model the server does not have is reported as not found", async () => {
    reset();
    const cache = newCache();
    const r = await splash(["pull", "acme/missing"], childEnv(cache));
    assert.equal(r.status, 1);
    assert.equal(r.stderr, `splash pull: model acme/missing not found at ${base}/acme/missing/resolve/main/manifest.json (HTTP 404)\n`);
    const rev = await splash(["pull", "acme/tiny@v9"], childEnv(cache));
    assert.equal(rev.status, 1);
    assert.equal(rev.stderr, `splash pull: model acme/tiny (revision v9) not found at ${base}/acme/tiny/resolve/v9/manifest.json (HTTP 404)\n`);
    // a listed file the server lacks
    const partial = path.join(work, "pkg-missing-file");
    fs.cpSync(pkg, partial, { recursive: true });
    fs.rmSync(path.join(partial, "target/layer-6.bin"));
    state.models["acme/broken"] = partial;
    const broken = await splash(["pull", "acme/broken"], childEnv(cache));
    assert.equal(broken.status, 1);
    assert.equal(broken.stderr.trim().split("\n").at(-1),
        `splash pull: target/layer-6.bin of model acme/broken: not found (HTTP 404) at ${base}/acme/broken/resolve/main/target/layer-6.bin`);
    // bad names and non-http base URLs never reach the network
    const bad = await splash(["pull", "acme/../etc"], childEnv(cache));
    assert.equal(bad.status, 1);
    const ftp = await splash(["pull", "acme/other"], childEnv(cache, { SPLASH_MODEL_BASE_URL: "ftp://127.0.0.1/" }));
    assert.equal(ftp.status, 1);
    assert.match(ftp.stderr, /only http:\/\/ and https:\/\//);
});

test("a stalled transfer is abandoned and the partial kept", async () => {
    reset();
    const file = "target/layer-0.bin";
    state.stall.set(file, { bytes: 1000, times: 1 });
    const cache = newCache();
    const t0 = Date.now();
    const r = await splash(["pull", "acme/tiny"], childEnv(cache, { SPLASH_DOWNLOAD_RETRIES: "0", SPLASH_DOWNLOAD_STALL_S: "1" }));
    assert.equal(r.status, 1);
    assert.ok(Date.now() - t0 < 8000);
    assert.match(r.stderr, /transfer stalled/);
    assert.equal(fs.statSync(path.join(modelDir(cache), file + ".partial")).size, 1000);
});

test("two processes pulling the same model download each file once", async () => {
    reset();
    state.delayMs = 30;
    const cache = newCache();
    const env = childEnv(cache);
    const [a, b] = await Promise.all([splash(["pull", "acme/tiny"], env), splash(["pull", "acme/tiny"], env)]);
    assert.equal(a.status, 0, a.stderr);
    assert.equal(b.status, 0, b.stderr);
    assert.equal(a.stdout, b.stdout);
    for (const f of manifest.files) assert.equal(fileRequests(f.path).length, 1, f.path);
    assert.equal(fileRequests("manifest.json").length, 1);
    verify(modelDir(cache));
});

test("splash serve --model OWNER/REPO downloads into the cache, then serves it --offline", async () => {
    reset();
    state.models["acme/chat"] = testModel(); // a package with a real tokenizer
    const cache = newCache();
    const env = childEnv(cache);
    const first = await startServer(["--model", "acme/chat"], env);
    try {
        const models = await (await fetch(`${first.base}/v1/models`)).json();
        assert.equal(models.data[0].id, "chat");
        assert.ok(state.requests.some((r) => r.path === "/acme/chat/resolve/main/manifest.json"));
    } finally {
        await first.stop();
    }
    const n = state.requests.length;
    const second = await startServer(["--model", "acme/chat", "--offline"], { ...env, SPLASH_MODEL_BASE_URL: "http://127.0.0.1:9" });
    try {
        const r = await fetch(`${second.base}/health`);
        assert.equal(r.status, 200);
        assert.equal(state.requests.length, n, "the offline start made a request");
    } finally {
        await second.stop();
    }
    assert.ok(fs.existsSync(path.join(modelDir(cache, "acme", "chat"), ".verified")));
});
