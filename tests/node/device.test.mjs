// --device auto|cuda|cpu on `splash serve` and `splash eval` (docs/cuda.md):
//  - auto (the default) runs where the build and the machine allow, and both
//    commands say which device they use;
//  - cuda on a machine or build without it exits 1 naming the reason, before
//    anything is served;
//  - a name that is not a device is a usage error;
//  - the default model's draft stays unloaded (its manifest's
//    serving.block_size is 1: serve's default, auto, keeps that) until
//    --block-size asks for it.
// The GPU machine runs the positive CUDA path (tools/gpu_model_check.sh).
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { bin, root, startServer, testModel } from "./serve_util.mjs";

const pkg = testModel();
const run = (...a) => spawnSync(bin, a, { encoding: "utf8", timeout: 60000 });
const evalOn = (device) => run("eval", "--model", pkg, "--tokens", "1,2,3,4,5", ...(device ? ["--device", device] : []));
const autoDevice = evalOn(null).stdout.match(/^device (\w+)/m)?.[1];

test("eval says which device it ran on; cpu is always there", () => {
    const r = evalOn("cpu");
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stdout, /^device cpu \(CPU\)$/m);
    assert.match(r.stdout, /^perplexity /m);
    assert.ok(autoDevice === "cpu" || autoDevice === "cuda", `auto chose ${autoDevice}`);
});

test("--device cuda without a GPU or a CUDA build fails with the reason", { skip: autoDevice === "cuda" && "this machine has a GPU" }, async () => {
    const why = /device "cuda": (no CUDA device is visible|this build has no CUDA backend)/;
    const e = evalOn("cuda");
    assert.equal(e.status, 1);
    assert.match(e.stderr, why);
    const s = run("serve", "--model", pkg, "--port", "0", "--device", "cuda");
    assert.equal(s.status, 1);
    assert.match(s.stderr, why);
    assert.doesNotMatch(s.stdout + s.stderr, /Ready ·/);
});

test("a device that is not one is a usage error", () => {
    for (const cmd of [["eval", "--model", pkg, "--tokens", "1,2"], ["serve", "--model", pkg, "--port", "0"]]) {
        const r = run(...cmd, "--device", "tpu");
        assert.equal(r.status, 2, `${cmd[0]}: ${r.stderr}`);
        assert.match(r.stderr, /--device/);
    }
});

const demo = path.join(root, "models", "splash-demo");
const demoHasDraft = fs.existsSync(path.join(demo, "manifest.json")) &&
    JSON.parse(fs.readFileSync(path.join(demo, "manifest.json"), "utf8")).draft !== undefined;

test("serve prints the device; the default model's draft waits for --block-size", { skip: !demoHasDraft }, async () => {
    const m = JSON.parse(fs.readFileSync(path.join(demo, "manifest.json"), "utf8"));
    assert.equal(m.serving.block_size, 1);
    let srv = await startServer(["--device", "cpu", "--threads", "1", "--no-webui"]);
    try {
        assert.match(srv.log(), /Device · cpu · CPU/);
        assert.match(srv.log(), /Draft · in the package, not used: block 1 \(the package's default; --block-size N or auto uses it\)/);
        const st = await (await fetch(srv.base + "/status")).json();
        assert.deepEqual([st.speculation.draft, st.speculation.block_size], ["none", 1]);
    } finally {
        await srv.stop();
    }
    srv = await startServer(["--device", "cpu", "--threads", "1", "--no-webui", "--block-size", "8"]);
    try {
        assert.match(srv.log(), /Draft · dflash · block 8/);
        const st = await (await fetch(srv.base + "/status")).json();
        assert.deepEqual([st.speculation.draft, st.speculation.block_size], ["dflash", 8]);
        // the draft proposes and the target accepts some: a real, trained pair
        const r = await fetch(srv.base + "/v1/chat/completions", {
            method: "POST", headers: { "content-type": "application/json" },
            body: JSON.stringify({ messages: [{ role: "user", content: "Write a Python function that adds two numbers." }], max_tokens: 48, temperature: 0 }),
        });
        const j = await r.json();
        assert.equal(r.status, 200, JSON.stringify(j));
        assert.ok(j.timings.draft_n > 0 && j.timings.draft_n_accepted > 0, JSON.stringify(j.timings));
        assert.ok(j.timings.decode_cycles < j.timings.predicted_n - 1, JSON.stringify(j.timings));
        // the engine's time in each phase of the cycles, in /status and /metrics
        const spec = (await (await fetch(srv.base + "/status")).json()).speculation, sec = spec.seconds;
        assert.ok(sec.draft > 0 && sec.verify > 0 && sec.accept >= 0 && sec.commit >= 0, JSON.stringify(sec));
        // one request: every decode-only step ran its one cycle (the first token comes from prefill)
        assert.ok(spec.steps > 0 && spec.steps <= spec.cycles, JSON.stringify(spec));
        const metrics = await (await fetch(srv.base + "/metrics")).text();
        const drafted = metrics.match(/^splash_spec_seconds_total\{phase="draft"\} ([0-9.e+-]+)$/m);
        assert.ok(drafted && Number(drafted[1]) >= sec.draft, metrics);
    } finally {
        await srv.stop();
    }
});

// serve's default for a package that does not pin block 1 (here the default
// model's files under a manifest without serving.block_size): its draft runs,
// at its block or at 1, chosen step by step; --block-size N fixes the block.
test("serve chooses the block step by step unless the package pins 1", { skip: !demoHasDraft }, async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "splash-auto-"));
    try {
        for (const f of fs.readdirSync(demo)) if (f !== "manifest.json") fs.symlinkSync(path.join(demo, f), path.join(dir, f));
        const m = JSON.parse(fs.readFileSync(path.join(demo, "manifest.json"), "utf8"));
        delete m.serving.block_size;
        fs.writeFileSync(path.join(dir, "manifest.json"), JSON.stringify(m, null, 2));
        for (const [extra, auto] of [[[], true], [["--block-size", "8"], false]]) {
            const srv = await startServer(["--model", dir, "--device", "cpu", "--threads", "1", "--no-webui", ...extra]);
            try {
                assert.match(srv.log(), auto ? /Draft · dflash · block 8 or 1, chosen step by step/ : /Draft · dflash · block 8\n/);
                const st = (await (await fetch(srv.base + "/status")).json()).speculation;
                assert.deepEqual([st.draft, st.block_size, st.auto], ["dflash", 8, auto]);
                const r = await fetch(srv.base + "/v1/chat/completions", {
                    method: "POST", headers: { "content-type": "application/json" },
                    body: JSON.stringify({ messages: [{ role: "user", content: "Say hi." }], max_tokens: 16, temperature: 0 }),
                });
                assert.equal(r.status, 200, await r.text());
                const after = (await (await fetch(srv.base + "/status")).json()).speculation;
                // auto counts its decode-only steps by the way they ran; a fixed block counts none
                const ran = after.auto_steps.block_1 + after.auto_steps.block;
                assert.ok(auto ? ran > 0 : ran === 0, JSON.stringify(after));
            } finally {
                await srv.stop();
            }
        }
    } finally {
        fs.rmSync(dir, { recursive: true, force: true });
    }
});
