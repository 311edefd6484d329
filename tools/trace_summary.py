#!/usr/bin/env python3
"""trace_summary.py - where a CUDA graph's time goes, from tools/cupti_trace.cpp's CSV.

    python3 tools/trace_summary.py trace.csv [--min-replays 5] [--top 40]

For every CUDA graph replayed at least --min-replays times (a decode step's graph is replayed once
per step): nodes, replays, the median replay's span (first kernel start to last kernel end), the
sum of its kernels' times and the gaps between them (span - sum: launch and drain between
dependent kernels), then per kernel (name, grid, block, merged by name and grid): launches per
replay, median us per launch, and its cost: the us it adds to the span per replay and their share.
A kernel's cost is its end minus the latest end of the kernels started before it (0 if earlier):
under programmatic dependent launch a kernel starts while its predecessor runs and waits inside,
so its own duration counts that wait, and the durations sum to more than the span (session 15);
the costs sum to the span.  Rows are sorted by cost.  Kernels outside graphs are summed by name
at the end.
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
        cost = collections.defaultdict(list)  # per kernel key: its cost summed over the replay's launches
        for i in range(replays):
            rep = recs[i * nodes:(i + 1) * nodes]
            spans.append(max(r[1] for r in rep) - rep[0][0])
            sums.append(sum(r[1] - r[0] for r in rep))
            last, rc = rep[0][0], collections.defaultdict(int)
            for r in rep:
                key = (r[5], r[3], r[4])
                per.setdefault(key, []).append(r[1] - r[0])
                rc[key] += max(0, r[1] - last)
                last = max(last, r[1])
            for key in per:
                cost[key].append(rc.get(key, 0))
        span, ksum = statistics.median(spans), statistics.median(sums)
        print(f"\n## graph {gid}: {nodes} kernels, {replays} replays; median span {span / 1e3:.1f} us, "
              f"kernels {ksum / 1e3:.1f} us, gaps {(span - ksum) / 1e3:.1f} us "
              f"({(span - ksum) / nodes:.0f} ns per kernel)\n")
        print("| kernel | grid | block | per replay | us (median) | cost us per replay | % of span |")
        print("|---|---|---|---|---|---|---|")
        rows = []
        for key, ts in per.items():
            name, grid, block = key
            n = len(ts) / replays
            med = statistics.median(ts) / 1e3
            rows.append((statistics.median(cost[key]) / 1e3, name, grid, block, n, med))
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
