#!/usr/bin/env python3
"""Renders the chat-template test cases with Python Jinja, as transformers does.

The expected prompts under tests/node/template_cases/expected/ come from this
script.  Splash's native renderer (src/text/chat_template.c) must reproduce
them byte for byte; tests/node/chat_template.test.mjs checks that.

How it renders: with transformers' own compiled template
(`transformers.utils.chat_template_utils._compile_jinja_template`: an
ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, the
loopcontrols extension, `tojson` = json.dumps(ensure_ascii=False) and
`raise_exception` raising TemplateError).  Where transformers is not
installed it builds the same environment from jinja2 by hand and says so.
Each request file's keys become the template's variables, as
`apply_chat_template(messages, tools=..., add_generation_prompt=..., **kwargs)`
passes them (tools / documents default to None, add_generation_prompt to
False).

Usage:
  python3 tools/render_template_reference.py            # rewrite expected/
  python3 tools/render_template_reference.py --check    # compare, write nothing
  python3 tools/render_template_reference.py --cases DIR --template FILE --out DIR
  python3 tools/render_template_reference.py --fuzz 2000 --splash build/splash [--seed 1]
      random conversations (odd values included) rendered here and by
      `splash apply-template`; prints each mismatch, exits 1 if any

Outputs, per request NAME.json: NAME.prompt (the rendered text, exact bytes,
UTF-8) or NAME.error (the exception's message, one line, no newline) when the
template raises.
"""
import argparse
import json
import os
import random
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = os.path.join(ROOT, "tests", "node", "template_cases")


def compile_template(source):
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template
        import transformers

        return _compile_jinja_template(source), "transformers %s" % transformers.__version__
    except ImportError:
        pass
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env.from_string(source), "jinja2 %s with transformers' settings (transformers not installed)" % jinja2.__version__


def render(template, request):
    kwargs = dict(request)
    kwargs.setdefault("tools", None)
    kwargs.setdefault("documents", None)
    kwargs.setdefault("add_generation_prompt", False)
    try:
        return "prompt", template.render(**kwargs)
    except Exception as e:  # the template's raise_exception and Jinja's own TypeErrors alike
        return "error", str(e)


# ---- differential fuzzing against `splash apply-template` -------------------

PIECES = ["", " ", "\n", "hi", "<think>", "</think>", "<tool_response>", "</tool_response>", "text", "image",
          "video", "\u00e9", "\u3000", "\x85", "\ufeff", " x ", "\n\n", "a'b", '"', "\\", "\t", "\U0001f600",
          "\x00", "\u2028", "\x1c"]


class Fuzzer:
    """Random chat requests; `odd` (0..1) is how often values are of the wrong kind."""

    def __init__(self, seed, odd):
        self.rnd = random.Random(seed)
        self.odd = odd

    def text(self):
        return "".join(self.rnd.choice(PIECES) for _ in range(self.rnd.randint(0, 5)))

    def scalar(self):
        return self.rnd.choice([None, True, False, 0, 1, -0.0, 1.5, 1e-7, 1.0, 10**20, self.text(), self.text()])

    def value(self, depth=0):
        r = self.rnd.random()
        if depth > 2 or r < 0.5:
            return self.scalar()
        if r < 0.75:
            return [self.value(depth + 1) for _ in range(self.rnd.randint(0, 3))]
        keys = ["a", "b", "type", "text", "image", "k \u00e9"]
        return {self.rnd.choice(keys): self.value(depth + 1) for _ in range(self.rnd.randint(0, 3))}

    def weird(self):
        return self.rnd.random() < self.odd

    def part(self):
        r = self.rnd.random()
        if r < 0.4:
            return {"type": "text", "text": self.value() if self.weird() else self.text()}
        if r < 0.55:
            return {"type": "image"}
        if r < 0.65:
            return {"type": "video", "video": "v.mp4"}
        if r < 0.75:
            return {"image_url": {"url": "u"}}
        return self.value() if self.weird() else self.text()

    def content(self):
        r = self.rnd.random()
        if self.weird():
            return self.value()
        return self.text() if r < 0.6 else [self.part() for _ in range(self.rnd.randint(0, 3))]

    def call(self):
        fn = {"name": self.scalar() if self.weird() else self.rnd.choice(["f", "g", "\u00e9"])}
        if self.rnd.random() < 0.8:
            if self.weird():
                fn["arguments"] = self.value()
            else:
                fn["arguments"] = {self.rnd.choice(["x", "y", "z"]): self.value() for _ in range(self.rnd.randint(0, 3))}
        return {"type": "function", "function": fn} if self.rnd.random() < 0.8 else fn

    def message(self):
        roles = ["system", "developer", "user"] if self.weird() else ["user"] * 4 + ["assistant"] * 3 + ["tool"] * 2
        m = {"role": self.rnd.choice(roles)}
        if self.rnd.random() < 0.95:
            m["content"] = self.content()
        if m["role"] == "assistant":
            if self.rnd.random() < 0.4:
                m["reasoning_content"] = self.scalar() if self.weird() else self.text()
            if self.rnd.random() < 0.4:
                m["tool_calls"] = self.value() if self.weird() else [self.call() for _ in range(self.rnd.randint(0, 3))]
        return m

    def request(self):
        msgs = [self.message() for _ in range(self.rnd.randint(0, 6))]
        if not self.weird():
            msgs.insert(self.rnd.randint(0, len(msgs)), {"role": "user", "content": self.text()})
        if msgs and self.rnd.random() < 0.3:
            msgs[0] = {"role": "system", "content": self.content()}
        req = {"messages": msgs}
        for k in ["add_generation_prompt", "enable_thinking", "preserve_thinking", "add_vision_id"]:
            if self.rnd.random() < 0.5:
                req[k] = self.rnd.choice([True, False, None, 0, 1, "", "x"])
        if self.rnd.random() < 0.3:
            req["tools"] = self.value() if self.weird() else [self.value() for _ in range(self.rnd.randint(0, 2))]
        return req


def fuzz(template, splash, tokdir, count, seed):
    counts = {"prompt": 0, "error": 0}
    bad = 0
    for i in range(count):
        fz = Fuzzer(seed * 1000003 + i, [0.0, 0.05, 0.3][i % 3])
        text = json.dumps(fz.request(), ensure_ascii=False)
        kind, want = render(template, json.loads(text))
        counts[kind] += 1
        p = subprocess.run([splash, "apply-template", "--tokenizer-dir", tokdir], input=text.encode(), capture_output=True)
        if kind == "prompt":
            ok = p.returncode == 0 and p.stdout == want.encode()
        else:
            ok = p.returncode == 1 and p.stderr.decode(errors="replace").rstrip("\n").split("\n")[-1] == want
        if not ok:
            bad += 1
            print("MISMATCH request:", text)
            print("  reference %s: %r" % (kind, want[:400]))
            print("  splash exit %d: %r %r" % (p.returncode, p.stdout[:400], p.stderr[:400]))
    print("%d random requests (%d prompts, %d errors): %d mismatches" % (count, counts["prompt"], counts["error"], bad))
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--template", default=os.path.join(CASES, "tokenizer", "chat_template.jinja"))
    ap.add_argument("--cases", default=os.path.join(CASES, "requests"))
    ap.add_argument("--out", default=os.path.join(CASES, "expected"))
    ap.add_argument("--check", action="store_true", help="compare with the files in --out instead of writing")
    ap.add_argument("--fuzz", type=int, metavar="N", help="compare N random requests with --splash instead")
    ap.add_argument("--splash", default=os.path.join(ROOT, "build", "splash"))
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    with open(args.template, encoding="utf-8") as f:
        template, engine = compile_template(f.read())
    print("rendering with", engine)
    if args.fuzz:
        return fuzz(template, args.splash, os.path.dirname(os.path.abspath(args.template)), args.fuzz, args.seed)
    names = sorted(n[:-5] for n in os.listdir(args.cases) if n.endswith(".json"))
    os.makedirs(args.out, exist_ok=True)
    differ = 0
    for name in names:
        with open(os.path.join(args.cases, name + ".json"), encoding="utf-8") as f:
            request = json.load(f)
        kind, text = render(template, request)
        path = os.path.join(args.out, name + "." + kind)
        data = text.encode("utf-8")
        if args.check:
            try:
                with open(path, "rb") as f:
                    same = f.read() == data
            except FileNotFoundError:
                same = False
            if not same:
                differ += 1
                print("DIFFERS", name, kind, repr(text[:200]))
            continue
        other = os.path.join(args.out, name + "." + ("error" if kind == "prompt" else "prompt"))
        if os.path.exists(other):
            os.remove(other)
        with open(path, "wb") as f:
            f.write(data)
    if args.check:
        print("%d cases, %d differ" % (len(names), differ))
        return 1 if differ else 0
    print("%d cases written to %s" % (len(names), args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
