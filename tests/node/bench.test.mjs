// `splash bench` (src/runtime/cmd_bench.c): a synthetic package made and
// measured on the CPU (the GPU machine runs the same command with --device
// cuda: tools/gpu_synthetic_bench.sh), the --synthetic shorthand making its
// package once and reusing it, and bad arguments as usage errors.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { bin } from "./serve_util.mjs";

const run = (...a) => spawnSync(bin, ["bench", ...a], { encoding: "utf8", timeout: 120000 });
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "splash-bench-test-"));
process.on("exit", () => fs.rmSync(tmp, { recursive: true, force: true }));

test("a synthetic dense package: every tensor over one blob, then measured on the CPU", () => {
    const pkg = path.join(tmp, "dense");
    let r = run("--make-synthetic", pkg, "--hidden", "256", "--intermediate", "512", "--layers", "4", "--vocab", "512");
    assert.equal(r.status, 0, r.stderr);
    const m = JSON.parse(fs.readFileSync(path.join(pkg, "manifest.json"), "utf8"));
    assert.equal(m.model.layers, 4);
    assert.equal(m.model.hidden, 256);
    assert.ok(m.tensors.every((t) => t.file === "blob.bin" && t.offset === 0), "every tensor at the blob's start");
    const biggest = Math.max(...m.tensors.map((t) => t.bytes));
    assert.ok(fs.statSync(path.join(pkg, "blob.bin")).size >= biggest);
    r = run("--model", pkg, "--device", "cpu", "--prompt", "16", "--decode", "4", "--verify-reps", "1", "--act", "int8",
        "--no-bandwidth", "--threads", "1");
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stdout, /device cpu/);
    const prefill = Number(r.stdout.match(/prefill 16 tokens: ([\d.]+) tokens\/s/)?.[1]);
    const decode = Number(r.stdout.match(/decode: median [\d.]+ ms\/token .* = ([\d.]+) tokens\/s/)?.[1]);
    assert.ok(prefill > 0 && decode > 0, r.stdout);
    assert.match(r.stdout, /verify 8 rows: [\d.]+ ms .* = [\d.]+x one row/);
    // a short prompt's prefill: the median of 3 runs from an empty slot by default, the first apart
    assert.match(r.stdout, /prefill 16 tokens: [\d.]+ tokens\/s \([\d.]+ ms CPU per token; median of 3 runs, the first [\d.]+\)/);
    // the prompt in forwards of 8 rows, each after the last, as serve feeds a long prompt
    r = run("--model", pkg, "--device", "cpu", "--prompt", "20", "--prefill-chunk", "8", "--decode", "2",
        "--verify-reps", "1", "--act", "int8", "--no-bandwidth", "--threads", "1");
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stdout, /prefill 20 tokens: [\d.]+ tokens\/s/);
    assert.match(r.stdout, /\(the prompt in forwards of 8 rows, as --prefill-chunk\)/);
    // its draft (DFlash v1 over the same blob): timed alone, lanes 1, 2, 4
    assert.equal(m.draft.architecture, "dflash");
    assert.ok(m.draft.target_layer_ids.every((t) => t >= 0 && t < 4), JSON.stringify(m.draft));
    assert.ok(m.tensors.some((t) => t.name === "draft.fc"));
    r = run("--model", pkg, "--draft", "--device", "cpu", "--prompt", "32", "--verify-reps", "5", "--threads", "1");
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stdout, /draft dflash: 3 tap layers, max block 16, 4 lanes of 32 context positions, device cpu/);
    for (const [block, lanes] of [[16, 1], [16, 4], [8, 2]]) {
        const row = r.stdout.match(new RegExp(`^\\| propose \\| ${block} \\| ${lanes} \\| 0 \\| ([\\d.]+) \\|`, "m"));
        assert.ok(row && Number(row[1]) > 0, r.stdout);
    }
    assert.match(r.stdout, /^\| append 8 rows \+ propose \| 16 \| 4 \| 0 \| [\d.]+ \|/m);
});

test("--synthetic makes the production shape's package once, then measures it as served", () => {
    const dir = path.join(tmp, "moe");
    const args = ["--synthetic", "35b-a3b", "--layers", "1", "--dir", dir, "--device", "cpu", "--prompt", "4",
        "--decode", "2", "--verify-reps", "1", "--no-bandwidth", "--threads", "1"];
    let r = run(...args);
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stdout, /synthetic package .* \(35b-a3b, 1 layers\) written/);
    assert.match(r.stdout, /^int8 +prefill 4 tokens: [\d.]+ tokens\/s/m); // int8 activations by default
    const m = JSON.parse(fs.readFileSync(path.join(dir, "manifest.json"), "utf8"));
    assert.equal(m.model.hidden, 2048);
    assert.equal(m.model.moe.experts, 256);
    r = run(...args, "--prefill-reps", "1");
    assert.equal(r.status, 0, r.stderr);
    assert.doesNotMatch(r.stdout, /written/); // the package is reused
    assert.match(r.stdout, /prefill 4 tokens: [\d.]+ tokens\/s \(.*median of 1 runs, the first/);
    // what the GPU scripts run: --make-synthetic with --shape (the MoE has no dense FFN width)
    r = run("--make-synthetic", path.join(tmp, "moe2"), "--shape", "35b-a3b", "--layers", "1");
    assert.equal(r.status, 0, r.stderr);
    assert.deepEqual(JSON.parse(fs.readFileSync(path.join(tmp, "moe2", "manifest.json"), "utf8")).tensors.length,
        m.tensors.length);
    // the published 35B-A3B draft's depth and taps, over the one-layer target's layer 0
    assert.deepEqual([m.draft.layers, m.draft.hidden, m.draft.target_layer_ids.length], [6, 2048, 8]);
    assert.ok(m.draft.target_layer_ids.every((t) => t === 0));
});

test("bad arguments are usage errors that say what is wrong", () => {
    let r = run("--bogus");
    assert.equal(r.status, 2);
    assert.match(r.stderr, /unknown option or bad value: --bogus/);
    r = run("--model", "x", "--prefill-reps", "0");
    assert.equal(r.status, 2);
    assert.match(r.stderr, /unknown option or bad value: --prefill-reps/);
    r = run("--synthetic", "70b");
    assert.equal(r.status, 2);
    assert.match(r.stderr, /--synthetic takes 27b or 35b-a3b \(not 70b\)/);
    r = run("--make-synthetic", path.join(tmp, "bad"), "--hidden", "100");
    assert.equal(r.status, 2);
    assert.match(r.stderr, /multiples of 64/);
    r = run("--model", path.join(tmp, "dense"), "--device", "tpu");
    assert.equal(r.status, 2);
    assert.match(r.stderr, /--device takes auto, cuda or cpu/);
    r = run("--model", path.join(tmp, "nowhere"), "--device", "cpu", "--no-bandwidth");
    assert.equal(r.status, 1);
    assert.match(r.stderr, /nowhere/);
    r = run("--help");
    assert.equal(r.status, 0);
    assert.match(r.stdout, /^usage: splash bench --synthetic/);
});
