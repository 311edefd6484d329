#!/usr/bin/env python3
"""Turns requests logged by record_proxy.mjs into the committed fixtures.

python3 scrub.py LOG_DIR CLIENT FIRST_LOG SECOND_LOG
  e.g. scrub.py /tmp/log claude-code 003-POST_v1_messages_beta_true.json 004-POST_v1_messages_beta_true.json

Machine-specific text is replaced (the recording's home and work directories,
kernel version, device id), every UUID (session, thread, installation, item
ids) is mapped consistently to 00000000-0000-4000-8000-N, and every JSON
string longer than 80 characters is cut to 80 + " [...]" (the same cut in
both turns, so the second still extends the first): the CLIs' system prompts
and tool descriptions are ~20K tokens, which a 4-layer random model on one
CPU thread needs a minute to prefill.  Keys, blocks, items, tools and their
schemas stay as the CLI sent them.
"""
import json, re, sys

HOME, WORK = "/tmp/agents/home", "/tmp/agents/work"
LIMIT = 80


def scrub(s):
    s = s.replace(HOME, "/home/user").replace(WORK, "/home/user/project")
    s = s.replace(WORK.replace("/", "-"), "-home-user-project")
    s = re.sub(r"Linux \d+\.\d+\.\d+[-\w.]*", "Linux 6.8.0", s)
    s = re.sub(r'(device_id\\":\\")[0-9a-f]{64}', lambda m: m.group(1) + "0" * 64, s)
    return s


def compact(v):
    if isinstance(v, str):
        return v if len(v) <= LIMIT else v[:LIMIT] + " [...]"
    if isinstance(v, list):
        return [compact(x) for x in v]
    if isinstance(v, dict):
        return {k: compact(x) for k, x in v.items()}
    return v


def main():
    log, client, files = sys.argv[1], sys.argv[2], sys.argv[3:]
    uuids = {}

    def uuid(m):
        return uuids.setdefault(m.group(0), "00000000-0000-4000-8000-%012d" % len(uuids))

    for i, f in enumerate(files):
        body = json.load(open(f"{log}/{f}"))["body"]
        s = scrub(json.dumps(body, ensure_ascii=False))
        s = re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", uuid, s)
        with open(f"{client}-turn{i + 1}.json", "w") as out:
            out.write(json.dumps(compact(json.loads(s)), ensure_ascii=False, indent=1) + "\n")


main()
