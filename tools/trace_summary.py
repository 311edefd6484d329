#!/usr/bin/env python3
"""trace_summary.py - where a CUDA graph's time goes, from tools/cupti_trace.cpp's CSV.

    python3 tools/trace_summary.py trace.csv [--min-replays 5] [--top 40]

For every CUDA graph replayed at least --min-replays times (a decode step's graph is replayed once
per step): nodes, replays, the median replay's span (first kernel start to last kernel end), the
sum of its kernels' times and the gaps between them (span - sum: launch and drain between
dependent kernels), then per kernel (name, grid, block, in graph order merged by name and grid):
launches per replay, median us per launch, us per replay and share of the span. Kernels outside
graphs are summed by name at the end.
"""
import csv
import collections
import statistics
import sys


def short(name):
    name = name.replace("(anonymous namespace)::", "").replace("splash_cuda::", "")
    head = name.split("(")[0]
    if head.startswith("void "):
        head = head[5:]
    return head if len(head) <= 70 else head[:67] + "..."


def main():
    args = sys.argv[1:]
    if not args:
        print(__doc__)
        return 2
    path, min_replays, top = args[0], 5, 40
    if "--min-replays" in args:
        min_replays = int(args[args.index("--min-replays") + 1])
    if "--top" in args:
        top = int(args[args.index("--top") + 1])
    graphs = collections.defaultdict(list)
    eager = collections.defaultdict(list)
    with open(path) as f:
        for r in csv.DictReader(f):
            rec = (int(r["start_ns"]), int(r["end_ns"]), int(r["graph_node"]), r["grid"], r["block"], short(r["name"]))
            (graphs[int(r["graph_id"])] if r["graph_id"] != "0" else eager[(rec[5], rec[3], rec[4])]).append(rec)
    for gid, recs in sorted(graphs.items()):
        recs.sort()
        nodes = len({r[2] for r in recs})
        replays = len(recs) // nodes
        if replays < min_replays:
            continue
        spans, sums = [], []
        per = collections.OrderedDict()
        for i in range(replays):
            rep = recs[i * nodes:(i + 1) * nodes]
            spans.append(rep[-1][1] - rep[0][0])
            sums.append(sum(r[1] - r[0] for r in rep))
            for r in rep:
                per.setdefault((r[5], r[3], r[4]), []).append(r[1] - r[0])
        span, ksum = statistics.median(spans), statistics.median(sums)
        print(f"\n## graph {gid}: {nodes} kernels, {replays} replays; median span {span / 1e3:.1f} us, "
              f"kernels {ksum / 1e3:.1f} us, gaps {(span - ksum) / 1e3:.1f} us "
              f"({(span - ksum) / nodes:.0f} ns per kernel)\n")
        print("| kernel | grid | block | per replay | us (median) | us per replay | % of span |")
        print("|---|---|---|---|---|---|---|")
        rows = []
        for (name, grid, block), ts in per.items():
            n = len(ts) / replays
            med = statistics.median(ts) / 1e3
            rows.append((med * n, name, grid, block, n, med))
        for tot, name, grid, block, n, med in sorted(rows, reverse=True)[:top]:
            print(f"| {name} | {grid} | {block} | {n:g} | {med:.2f} | {tot:.1f} | {100 * tot * 1e3 / span:.1f} |")
    if eager:
        total = sum(r[1] - r[0] for recs in eager.values() for r in recs)
        print(f"\n## outside graphs: {sum(len(v) for v in eager.values())} kernels, {total / 1e6:.2f} ms\n")
        print("| kernel | grid | block | launches | us (median) | ms total |")
        print("|---|---|---|---|---|---|")
        rows = sorted(((sum(r[1] - r[0] for r in v), k, v) for k, v in eager.items()), reverse=True)[:top]
        for tot, (name, grid, block), v in rows:
            med = statistics.median(r[1] - r[0] for r in v) / 1e3
            print(f"| {name} | {grid} | {block} | {len(v)} | {med:.2f} | {tot / 1e6:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
