#!/usr/bin/env python3
"""ncu_summary.py - one line per profiled launch from Nsight Compute's CSV.

    ncu --csv --page details --section ... --metrics ... PROGRAM > ncu.csv
    tools/ncu_summary.py ncu.csv [--min-us 20] [--stalls 6]

Prints, per launch at least --min-us long: the kernel (short name), grid, duration, SM and
DRAM throughput (% of peak), achieved occupancy, the cycles a scheduler issued (%: the
SchedulerStats section's "One or More Eligible"), warp cycles per issued instruction,
instructions executed (millions), the tensor pipe's active cycles (%: the busiest of the
sm__pipe_tensor* metrics collected, e.g. hmma's and imma's), shared-memory bank
conflicts (millions), and the largest stall reasons (cycles per issued instruction, from the
smsp__average_warps_issue_stalled_*_per_issue_active.ratio metrics when collected).
Why: the details page has one row per (launch, metric); reading a kernel's limiter means
putting a launch's few telling numbers on one line, beside the same kernel's other shapes.
"""
import csv
import re
import sys


def short(name):
    name = name.replace("void ", "").replace("(anonymous namespace)::", "").replace("<unnamed>::", "")
    head = name.split("(")[0]
    return head[:48]


def num(v):
    try:
        return float(v.replace(",", ""))
    except ValueError:
        return None


def main(argv):
    path = argv[1]
    min_us = 20.0
    n_stalls = 6
    i = 2
    while i < len(argv):
        if argv[i] == "--min-us":
            min_us = float(argv[i + 1])
            i += 2
        elif argv[i] == "--stalls":
            n_stalls = int(argv[i + 1])
            i += 2
        else:
            print(__doc__)
            return 2
    lines = open(path, errors="replace").read().splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        print("no ncu CSV rows in", path)
        return 1
    launches = {}
    order = []
    for r in csv.DictReader(lines[start:]):
        key = r["ID"]
        if key not in launches:
            launches[key] = {"name": short(r["Kernel Name"]), "grid": r.get("Grid Size", ""),
                             "block": r.get("Block Size", ""), "m": {}}
            order.append(key)
        launches[key]["m"][r["Metric Name"]] = (r["Metric Unit"], r["Metric Value"])

    def get(m, name, to_us=False):
        if name not in m:
            return None
        unit, v = m[name]
        x = num(v)
        if x is None:
            return None
        if to_us:
            x *= {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}.get(unit, 1.0)
        return x

    stall_re = re.compile(r"smsp__average_warps_issue_stalled_(.*)_per_issue_active\.ratio")
    hdr = f"{'kernel':48s} {'grid':>14s} {'us':>8s} {'SM%':>5s} {'DRAM%':>5s} {'occ':>5s} {'issue%':>6s} {'cyc/ins':>7s} {'Minst':>7s} {'tc%':>5s} {'bankc':>7s}  stalls (cycles per issue)"
    print(hdr)
    for key in order:
        L = launches[key]
        m = L["m"]
        us = get(m, "Duration", True)
        if us is None or us < min_us:
            continue
        sm = get(m, "Compute (SM) Throughput")
        dram = get(m, "DRAM Throughput")
        occ = get(m, "Achieved Occupancy")
        issue = get(m, "One or More Eligible")  # SchedulerStats: cycles a scheduler issued (one a cycle)
        cpi = get(m, "Warp Cycles Per Issued Instruction")
        inst = get(m, "smsp__inst_executed.sum")
        # the busiest tensor pipe collected: fp16 (hmma) or int8 (imma) products
        tcs = [get(m, n) for n in m if n.startswith("sm__pipe_tensor") and n.endswith("pct_of_peak_sustained_active")]
        tc = max((x for x in tcs if x is not None), default=None)
        bank = get(m, "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum")
        stalls = []
        for name, (unit, v) in m.items():
            s = stall_re.fullmatch(name)
            x = num(v)
            if s and x is not None and s.group(1) not in ("not_selected", "selected"):
                stalls.append((x, s.group(1)))
        stalls.sort(reverse=True)
        st = " ".join(f"{n}={x:.1f}" for x, n in stalls[:n_stalls])

        def f(x, w, p=1):
            return f"{x:{w}.{p}f}" if x is not None else " " * (w - 1) + "-"

        print(f"{L['name']:48s} {L['grid']:>14s} {f(us, 8)} {f(sm, 5)} {f(dram, 5)} {f(occ, 5)} {f(issue, 6)} "
              f"{f(cpi, 7)} {f(inst / 1e6 if inst else None, 7, 2)} {f(tc, 5)} {f(bank / 1e6 if bank else None, 7, 2)}  {st}")
    extra = ["Registers Per Thread", "Dynamic Shared Memory Per Block", "Theoretical Occupancy"]
    seen = set()
    for key in order:
        L = launches[key]
        if L["name"] in seen:
            continue
        seen.add(L["name"])
        vals = [f"{e}={L['m'][e][1]}" for e in extra if e in L["m"]]
        print(f"{L['name']}: " + ", ".join(vals))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
