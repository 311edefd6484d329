#!/bin/bash
# gpu_kernel_profile.sh - where a production-shape decode step's time goes, kernel by kernel.
#
#   tools/gpu_model_check.sh --prepare       (here: .carry/splash-bin.txz)
#   tools/gpu_kernel_profile.sh [--shape 27b|35b-a3b] [--layers 4] [--decode 3] [--prompt 1] [--trace]
#                               [--details REGEX [--count 12] [--skip 0]]
#       (the GPU machine, carrying .carry)
#   CARRY_TXZ=.carry/main.txz SYN_DIR=/tmp/syn-main tools/gpu_kernel_profile.sh ...: another build's
#       (tools/prepare_ref_bench.sh main main), with the libraries of .carry/splash-bin.txz; give
#       each build its own SYN_DIR (the tarball is extracted into it)
# Makes the synthetic package of tools/gpu_synthetic_bench.sh --synthetic (first L layers: every
# tensor over one random blob, made in a second), then runs bench_cpu
# under Nsight Compute (ncu: every kernel replayed alone with the caches flushed, so weights come
# from HBM as in a real decode step) for a --prompt-token prompt (1: decode only; 512: where a
# prefill's time goes), --decode one-token steps (PREFILL 1),
# VERIFY blocks of 8 and 16 rows and 4 lanes x 8 rows, each with its commit; graphs off (ncu times kernels, not graphs).  Prints per kernel
# (name, grid, block): launches, mean duration, DRAM bytes read + written per launch and that
# as GB/s; then the total.  Raw CSV in $OUT/ncu.csv.
# --details REGEX: instead, Nsight Compute's details (speed of light, occupancy, scheduler and
# warp-state sections, the stall reasons per issued instruction, instructions, tensor pipe, shared
# bank conflicts) for --count launches of the kernels whose names match REGEX after --skip of
# them, one line each through tools/ncu_summary.py (raw CSV in $OUT/ncu_details.csv): what bounds
# a kernel (e.g. --prompt 4096 --details 'gdn_chunk' for the chunked GDN's prep and state pass);
# NCU_ARGS="--kernel-name-base demangled" matches REGEX against template arguments too (e.g.
# 'q4_matmul_kernel<\(int\)1': the q4 products of 5-16 rows, verify's);
# NCU_METRICS=a,b adds metrics.
# --trace: instead of ncu, the kernel timeline as the program runs, CUDA graphs on (CUPTI through
# tools/cupti_trace.cpp, built here): per graph (the decode step's, the verify blocks') the span of
# a replay, its kernels' times, what each adds to the span and the gaps (tools/trace_summary.py; raw CSV in
# $OUT/trace.csv).  Use --decode 32 or more so the decode graph replays often.
set -u -o pipefail
cd "$(dirname "$0")/.." || exit 1
SHAPE=27b LAYERS=4 DECODE=3 PROMPT=1 TRACE=0 DETAILS="" COUNT=12 SKIP=0
while [ $# -gt 0 ]; do
    case "$1" in
    --shape) SHAPE=$2; shift 2 ;;
    --layers) LAYERS=$2; shift 2 ;;
    --decode) DECODE=$2; shift 2 ;;
    --prompt) PROMPT=$2; shift 2 ;;
    --trace) TRACE=1; shift ;;
    --details) DETAILS=$2; shift 2 ;;
    --count) COUNT=$2; shift 2 ;;
    --skip) SKIP=$2; shift 2 ;;
    *) sed -n '2,27p' "$0"; exit 2 ;;
    esac
done
OUT=${OUT:-build-profile}
W=${SYN_DIR:-/tmp/splash-synthetic}
mkdir -p "$OUT" "$W"
tar -C "$W" -xJf "${CARRY_TXZ:-.carry/splash-bin.txz}" || exit 1 # CARRY_TXZ: another tarball of the build
# a bench-only tarball (tools/prepare_ref_bench.sh: another commit's bench_cpu) runs with the
# shared libraries of .carry/splash-bin.txz, as in gpu_synthetic_bench.sh
if [ ! -d "$W/bin/lib" ] && [ -f .carry/splash-bin.txz ]; then
    tar -C "$W" -xJf .carry/splash-bin.txz bin/lib || exit 1
fi
export LD_LIBRARY_PATH="$W/bin/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
P=$W/prof-$SHAPE-$LAYERS
[ -d "$P" ] || "$W/bin/bench_cpu" --make-synthetic "$P" --shape "$SHAPE" --layers "$LAYERS" > "$OUT/make.log" 2>&1 ||
    { tail -5 "$OUT/make.log"; exit 1; }
# the benchmark both modes run (KV pages int8, as served)
RUN=("$W/bin/bench_cpu" --model "$P" --device cuda --act int8 --kv-format int8 --no-bandwidth --prompt "$PROMPT"
     --decode "$DECODE" --decode-prefill)
if [ -n "$DETAILS" ]; then
    STALLS=""
    for r in barrier long_scoreboard short_scoreboard wait math_pipe_throttle mio_throttle lg_throttle \
        no_instruction dispatch_stall membar drain imc_miss branch_resolving sleeping tex_throttle; do
        STALLS="$STALLS,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio"
    done
    # the tensor pipe as fp16 (hmma) and as int8 (imma: the q4 products and the int8 attention)
    M="smsp__inst_executed.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
    M="$M,sm__pipe_tensor_op_imma_cycles_active.avg.pct_of_peak_sustained_active"
    M="$M,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum$STALLS${NCU_METRICS:+,$NCU_METRICS}"
    SPLASH_CUDA_GRAPHS=0 "$NCU" --csv --page details --section SpeedOfLight --section Occupancy \
        --section SchedulerStats --section WarpStateStats --section LaunchStats --metrics "$M" \
        ${NCU_ARGS:-} -k "regex:$DETAILS" --launch-skip "$SKIP" -c "$COUNT" "${RUN[@]}" --verify-reps 1 \
        > "$OUT/ncu_details.csv" 2> "$OUT/ncu_details.err" || { tail -20 "$OUT/ncu_details.err"; exit 1; }
    python3 tools/ncu_summary.py "$OUT/ncu_details.csv" --min-us 1 --stalls 7
    exit $?
fi
if [ "$TRACE" = 1 ]; then
    CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")")
    CUPTI=$(dirname "$(find "$CUDA_HOME"/ /usr/local/cuda/ -name 'libcupti.so' 2>/dev/null | head -1)")
    g++ -shared -fPIC -O2 -I"$CUDA_HOME/include" tools/cupti_trace.cpp -o "$W/libtrace.so" -L"$CUPTI" -lcupti \
        -Wl,-rpath,"$CUPTI" || exit 1
    CUDA_INJECTION64_PATH=$W/libtrace.so SPLASH_TRACE_OUT=$OUT/trace.csv "${RUN[@]}" --verify-reps 9 \
        > "$OUT/trace.log" 2>&1 || { tail -20 "$OUT/trace.log"; exit 1; }
    grep -E "^(cuda|int8|decode|prefill)" "$OUT/trace.log"
    python3 tools/trace_summary.py "$OUT/trace.csv"
    exit $?
fi
SPLASH_CUDA_GRAPHS=0 "$NCU" --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
    "${RUN[@]}" --verify-reps 1 > "$OUT/ncu.csv" 2> "$OUT/ncu.err" || { tail -20 "$OUT/ncu.err"; exit 1; }
python3 - "$OUT/ncu.csv" <<'PY'
import csv, sys, collections
lines = open(sys.argv[1]).read().splitlines()
start = next(i for i, l in enumerate(lines) if l.startswith('"ID"'))
agg = collections.OrderedDict()
for r in csv.DictReader(lines[start:]):
    name = r["Kernel Name"].replace("void ", "").replace("(anonymous namespace)::", "").replace("<unnamed>::", "")
    name = name[: name.index(">") + 1] if "<" in name.split("(")[0] else name.split("(")[0]
    key = (name[:60], r["Grid Size"], r["Block Size"])
    a = agg.setdefault(key, {"n": 0, "t": 0.0, "rd": 0.0, "wr": 0.0})
    v = float(r["Metric Value"].replace(",", ""))
    unit = r["Metric Unit"]
    m = r["Metric Name"]
    scale = {"ns": 1e-9, "nsecond": 1e-9, "us": 1e-6, "usecond": 1e-6, "ms": 1e-3, "msecond": 1e-3, "B": 1, "byte": 1,
             "KB": 1e3, "Kbyte": 1e3, "MB": 1e6, "Mbyte": 1e6, "GB": 1e9, "Gbyte": 1e9}[unit]
    if m == "gpu__time_duration.sum":
        a["n"] += 1
        a["t"] += v * scale
    elif m == "dram__bytes_read.sum":
        a["rd"] += v * scale
    elif m == "dram__bytes_write.sum":
        a["wr"] += v * scale
tot = sum(a["t"] for a in agg.values())
print(f"{'kernel':60s} {'grid':>16s} {'block':>12s} {'n':>4s} {'us/launch':>9s} {'MB/launch':>9s} {'GB/s':>6s} {'% time':>6s}")
for k, a in sorted(agg.items(), key=lambda kv: -kv[1]["t"]):
    n = max(a["n"], 1)
    mb = (a["rd"] + a["wr"]) / n / 1e6
    us = a["t"] / n * 1e6
    print(f"{k[0]:60s} {k[1]:>16s} {k[2]:>12s} {a['n']:4d} {us:9.2f} {mb:9.2f} {mb * 1e3 / us if us else 0:6.0f} {100 * a['t'] / tot:6.1f}")
print(f"total kernel time {tot * 1e3:.2f} ms over {sum(a['n'] for a in agg.values())} launches")
PY
