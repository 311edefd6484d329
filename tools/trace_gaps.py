#!/usr/bin/env python3
"""trace_gaps.py - when the GPU waits for the host, from tools/cupti_trace.cpp's CSV.

    python3 tools/trace_gaps.py trace.csv [--from-ms A] [--to-ms B] [--cycles N] [--top 12]

Merges every kernel's [start, end) into the GPU's busy intervals and reports, over the window
(default: the whole trace; --from-ms / --to-ms in ms after the first kernel), the span, the busy
time, the idle time and the idle gaps by length; then the gaps of 5 us or more grouped by the
kernel that ends them (the first kernel after the gap: what the host launched once it came back)
and by the one before them, with their count and total.  --cycles N (the engine's decode cycles
in the window, e.g. from the server's /status) divides the totals into per-cycle figures.  A
serving process idles between requests, so pick a window of decode or read the gaps by length:
the long ones (ms) are the client's pauses, the short ones the host's work inside a cycle.
"""
import csv
import collections
import sys

import trace_summary  # tools/: the kernel names as trace_summary.py shortens them


def short(name):
    """A kernel's name without its template arguments (the gaps are grouped by kernel)."""
    return trace_summary.short(name).split("<")[0]


def arg(args, name, conv, default):
    return conv(args[args.index(name) + 1]) if name in args else default


def main():
    args = sys.argv[1:]
    if not args:
        print(__doc__)
        return 2
    rows = []
    with open(args[0], newline="") as f:
        for r in csv.reader(f):
            if not r or not r[0].isdigit():
                continue
            rows.append((int(r[0]), int(r[1]), r[-1]))
    if not rows:
        print("no kernels in the trace")
        return 1
    rows.sort()
    t0 = rows[0][0]
    lo = t0 + int(arg(args, "--from-ms", float, 0.0) * 1e6)
    hi = t0 + int(arg(args, "--to-ms", float, 1e12) * 1e6)
    cycles = arg(args, "--cycles", int, 0)
    top = arg(args, "--top", int, 12)
    rows = [r for r in rows if r[0] >= lo and r[0] < hi]
    busy, gaps = 0, []  # gaps: (length ns, kernel before, kernel after)
    cur_s, cur_e, cur_last = rows[0][0], rows[0][1], rows[0][2]
    for s, e, name in rows[1:]:
        if s > cur_e:
            busy += cur_e - cur_s
            gaps.append((s - cur_e, cur_last, name))
            cur_s, cur_e = s, e
        elif e > cur_e:
            cur_e = e
        if e >= cur_e:
            cur_last = name
    busy += cur_e - cur_s
    span = cur_e - rows[0][0]
    idle = span - busy
    per = f" ({idle / 1e3 / cycles:.1f} us a cycle over {cycles} cycles)" if cycles else ""
    print(f"kernels {len(rows)}; span {span / 1e6:.3f} ms, busy {busy / 1e6:.3f} ms "
          f"({100.0 * busy / span:.1f}%), idle {idle / 1e6:.3f} ms{per}")
    edges = [(0, 2e3), (2e3, 5e3), (5e3, 20e3), (20e3, 100e3), (100e3, 1e6), (1e6, 1e18)]
    labels = ["< 2 us", "2-5 us", "5-20 us", "20-100 us", "0.1-1 ms", ">= 1 ms"]
    print("| idle gaps | count | total ms | per cycle us |")
    print("|---|---|---|---|")
    for (a, b), lab in zip(edges, labels):
        sel = [g for g in gaps if a <= g[0] < b]
        tot = sum(g[0] for g in sel)
        pc = f"{tot / 1e3 / cycles:.1f}" if cycles else "-"
        print(f"| {lab} | {len(sel)} | {tot / 1e6:.3f} | {pc} |")
    for key, title in ((2, "the kernel after"), (1, "the kernel before")):
        agg = collections.defaultdict(lambda: [0, 0])
        for g in gaps:
            if 5e3 <= g[0] < 1e6:
                a = agg[short(g[key])]
                a[0] += 1
                a[1] += g[0]
        print(f"\n| gaps of 5 us - 1 ms by {title} | count | total ms | mean us |")
        print("|---|---|---|---|")
        for name, (n, tot) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:top]:
            print(f"| {name} | {n} | {tot / 1e6:.3f} | {tot / 1e3 / n:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
