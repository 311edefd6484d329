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

    python3 tools/trace_summary.py trace.csv --compare A,B [--min-replays 5] [--top 40]

Instead: where graph B's span differs from graph A's (e.g. a verify's from the decode step's:
their ids are the "## graph N" lines above).  Each graph's kernels in launch order, each with its
median cost over the replays, are matched by kernel family (the name before its template
arguments) in order (difflib: the longest common subsequence), so a product meets the same
product at another M; the table sums, per A kernel (name, grid), B's matched costs against A's,
then B's kernels that A lacks.  Session 40 did this by hand for the 27B's verify.
"""
import difflib
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
    if "--compare" in args:
        a, b = (int(g) for g in args[args.index("--compare") + 1].split(","))
        return compare(graphs, a, b, top)
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
            rc = collections.defaultdict(int)
            for r, c in replay_costs(rep):
                key = (r[5], r[3], r[4])
                per.setdefault(key, []).append(r[1] - r[0])
                rc[key] += c
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


def replay_costs(rep):
    """A replay's launches (by start) with their costs: a launch's end minus the latest end before it (0 if earlier)."""
    last = rep[0][0]
    for r in rep:
        yield r, max(0, r[1] - last)
        last = max(last, r[1])


def launch_costs(recs):
    """A graph's kernels in launch order (by median start in its replays): (name, grid, median
    cost) per node, a kernel's cost as in main (replay_costs); and the replays."""
    recs = sorted(recs)
    nodes = len({r[2] for r in recs})
    replays = len(recs) // nodes
    start, cost, ident = collections.defaultdict(list), collections.defaultdict(list), {}
    for i in range(replays):
        rep = recs[i * nodes:(i + 1) * nodes]
        for r, c in replay_costs(rep):
            start[r[2]].append(r[0] - rep[0][0])
            cost[r[2]].append(c)
            ident[r[2]] = (r[5], r[3])
    out = [(statistics.median(start[n]), ident[n][0], ident[n][1], statistics.median(cost[n])) for n in ident]
    return [(name, grid, c) for _, name, grid, c in sorted(out)], replays


def in_a(name):  # a row of A's (not a kernel only B launched)
    return not name.startswith("(only in B) ")


def family(name):
    return name.split("<")[0].split("(")[0]


def compare(graphs, a, b, top):
    if a not in graphs or b not in graphs:
        print(f"no graph {a if a not in graphs else b} in the trace")
        return 2
    ka, ra = launch_costs(graphs[a])
    kb, rb = launch_costs(graphs[b])
    sa, sb = sum(k[2] for k in ka), sum(k[2] for k in kb)
    print(f"\n## graph {b} against graph {a}: {len(kb)} / {len(ka)} kernels, {rb} / {ra} replays; "
          f"span {sb / 1e3:.1f} / {sa / 1e3:.1f} us, {sb / sa:.2f}x, +{(sb - sa) / 1e3:.1f} us\n")
    rows = collections.OrderedDict()  # A's (name, grid) -> [launches, A cost, B cost, B's (name, grid)s]
    sm = difflib.SequenceMatcher(None, [family(k[0]) for k in ka], [family(k[0]) for k in kb], autojunk=False)
    for op, i0, i1, j0, j1 in sm.get_opcodes():
        pairs = list(zip(range(i0, i1), range(j0, j1))) if op in ("equal", "replace") else []
        if op == "replace":  # unequal lengths: the rest unmatched
            pairs += [(i, None) for i in range(i0 + len(pairs), i1)] + [(None, j) for j in range(j0 + len(pairs), j1)]
        elif op == "delete":
            pairs = [(i, None) for i in range(i0, i1)]
        elif op == "insert":
            pairs = [(None, j) for j in range(j0, j1)]
        for i, j in pairs:
            key = (ka[i][0], ka[i][1]) if i is not None else ("(only in B) " + kb[j][0], kb[j][1])
            row = rows.setdefault(key, [0, 0.0, 0.0, set()])
            row[0] += 1
            row[1] += ka[i][2] if i is not None else 0
            row[2] += kb[j][2] if j is not None else 0
            if j is not None:
                row[3].add(f"{kb[j][0]} {kb[j][1]}")
    print("| kernel in A | grid | launches | A us | B us | B - A us | B's kernels |")
    print("|---|---|---|---|---|---|---|")
    for (name, grid), (n, ca, cb, bs) in sorted(rows.items(), key=lambda kv: -abs(kv[1][2] - kv[1][1]))[:top]:
        other = "; ".join(sorted(bs)) if bs and bs != {f"{name} {grid}"} and in_a(name) else ""
        print(f"| {name} | {grid} | {n} | {ca / 1e3:.1f} | {cb / 1e3:.1f} | {(cb - ca) / 1e3:+.1f} | {other} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
