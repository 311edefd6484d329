#!/bin/bash
# gpu_synthetic_bench.sh - the production shapes' speed on the GPU without their weights.
#
#   tools/gpu_model_check.sh --prepare      (here: the CUDA build of splash and bench_cpu, packed
#                                            into .carry/splash-bin.txz)
#   tools/gpu_synthetic_bench.sh [--shape 27b|35b-a3b] [--depths 4,8] [--prompt 256[,32768]] [--decode 32]
#                                [--graphs 0,1] [--gemm 0,1] [--synthetic] [--prefill] [--rounds N]
#                                [--random-route]
#                                (CARRY_TXZ="a.txz b.txz": several builds)
#       (the GPU machine, carrying .carry)
# Another commit's bench_cpu for CARRY_TXZ: tools/prepare_ref_bench.sh REF NAME (.carry/NAME.txz).
# --synthetic: `bench_cpu --make-synthetic` instead: every tensor of the package over one random
# 0.7 GB blob (no checkpoint, no quantising), so the full depth (--depths 64 / 40) takes seconds to
# make and its time is measured, not fitted; a single depth prints no fit.
# --random-route (35b-a3b): bench_cpu's --random-route, the router's logits replaced by a hash of
# (layer, row) so a verify's rows take distinct experts; a synthetic package's own router sends
# every row to the same ones (its hidden states share one direction), the optimistic extreme.
# --prefill: the prefill is what is timed (2 decode steps, one verify repetition: their columns
# are then rough).
# BENCH_ARGS="--prefill-reps 3": more of bench_cpu's arguments for every run (a prompt over 8,192
# tokens is prefilled once unless told: that first run includes cuBLASLt's first calls;
# "--prefill-chunk 2048": the prompt in forwards of 2,048 rows, as serve feeds it on a GPU).
# --rounds N: with several builds, each runs N times, interleaved (round 1 in CARRY_TXZ's order,
# round 2 reversed, ...), and the table gives each build's median over its rounds: one pass in a
# fixed order misled by ~1.5% (session 21: the same two builds 8.810 vs 8.657 ms, then 8.810 vs
# 8.818); the per-round times are printed too.
# VARIANTS="base: pdl_conv:SPLASH_CUDA_PDL_OFF=gdn_conv ...": the first build run once per entry
# (tag:VAR=VALUE, VAR=VALUE optional, several joined by +), with those set: an A/B of runtime switches, timed
# like several builds (interleaved, medians); an entry that names another carried build (its
# tarball's name, no colon: "main") runs that build as it is, in the same rounds.
# For each depth L: `bench_cpu --make-random --shape S --layers L` writes a random bf16 checkpoint
# of the exact dimensions, first L layers of the 3:1 pattern (the full 27B is 54 GB of bf16, more
# than the machine's disk holds beside its package), packs it q4, then `bench_cpu --device cuda`
# times a 256-row prefill, one-token decode steps (PREFILL 1: the engine's step when nothing is
# proposed) and VERIFY blocks of 8 and 16 rows.  --graphs 0,1 runs each bench with
# SPLASH_CUDA_GRAPHS=0 (eager launches) and =1 (CUDA graphs), --gemm 0,1 with SPLASH_CUDA_GEMM=0
# (prefill products 16 rows a launch) and =1 (the tensor-core GEMM); per-kernel times:
# tools/gpu_kernel_profile.sh (ncu; the GPU machine has no nsys).  Every time and
# the bytes read per token are a + b L (the layers are the same work each period of 4), so two
# depths give the full depth's (64 for the 27B, 40 for the 35B-A3B): printed with the roofline
# fraction at 4.3 TB/s.  Several --prompt lengths (a list) time decode at those contexts on the same
# packages (KV pages int8, as served).  Logs and the fitted table in $OUT.
set -u -o pipefail
cd "$(dirname "$0")/.." || exit 1
SHAPE=27b DEPTHS=4,8 PROMPT=256 DECODE=32 VREPS=9 GRAPHS="1" GEMMS="1" MAKE=--make-random ROUNDS=1 ROUTE=()
DEVICE=${DEVICE:-cuda}       # DEVICE=cpu with MAKE_ARGS="--vocab 2048": a check of this script without a GPU
MAKE_ARGS=${MAKE_ARGS:-}
while [ $# -gt 0 ]; do
    case "$1" in
    --shape) SHAPE=$2; shift 2 ;;
    --depths) DEPTHS=$2; shift 2 ;;
    --prompt) PROMPT=$2; shift 2 ;;
    --decode) DECODE=$2; shift 2 ;;
    --graphs) GRAPHS=$2; shift 2 ;;
    --gemm) GEMMS=$2; shift 2 ;;
    --synthetic) MAKE=--make-synthetic; shift ;;
    --prefill) DECODE=2 VREPS=1; shift ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --random-route) ROUTE=(--random-route); shift ;;
    *) sed -n '2,39p' "$0"; exit 2 ;;
    esac
done
case "$SHAPE" in 27b) FULL=64 ;; 35b-a3b) FULL=40 ;; *) echo "--shape 27b or 35b-a3b"; exit 2 ;; esac
OUT=${OUT:-build-synthetic}
W=${SYN_DIR:-/tmp/splash-synthetic}
mkdir -p "$OUT" "$W"
# The builds to time: the carried tarballs (CARRY_TXZ: a list, e.g. a build of the last commit
# beside this one, for an A/B in one call; each timed on the same packages), else build/.  A
# tarball may hold bench_cpu alone (tools/gpu_model_check.sh --prepare-bench): it then runs with
# the libraries of the first tarball that has them.
TAGS=""
for TXZ in ${CARRY_TXZ:-.carry/splash-bin.txz}; do
    [ -f "$TXZ" ] || continue
    T=$(basename "$TXZ" .txz) # tag: the tarball's name, extracted into $W/<tag>
    mkdir -p "$W/$T" && tar -C "$W/$T" -xJf "$TXZ" || exit 1
    TAGS="$TAGS $T"
done
[ -n "$TAGS" ] || TAGS=build
declare -A VAR_ENV=() VAR_BUILD=() # a variant's tag -> its VAR=VALUE, its build
if [ -n "${VARIANTS:-}" ]; then
    BUILDS=$TAGS
    set -- $TAGS
    BUILD=$1 TAGS=""
    for V in $VARIANTS; do
        T=${V%%:*}
        case " $BUILDS " in
        *" $V "*) VAR_BUILD[$T]=$V ;; # another carried build's name: that build as it is
        *) VAR_ENV[$T]=${V#*:} VAR_BUILD[$T]=$BUILD ;;
        esac
        TAGS="$TAGS $T"
    done
fi
bench_of() { # $TAG -> its bench_cpu
    local t=$TAG
    [ -n "${VARIANTS:-}" ] && t=${VAR_BUILD[$TAG]}
    if [ "$t" = build ]; then echo "$PWD/build/bench/bench_cpu"; else echo "$W/$t/bin/bench_cpu"; fi
}
run_bench() { # the tag's bench_cpu with its own libraries (a bench-only tarball: the first one's with lib/)
    local b d l t
    b=$(bench_of) d=$(dirname "$b") l=$d/lib
    if [ ! -d "$l" ]; then
        for t in ${BUILD:-} $TAGS; do [ -d "$W/$t/bin/lib" ] && l=$W/$t/bin/lib && break; done
    fi
    local -a e=()
    [ -n "${VAR_ENV[$TAG]:-}" ] && IFS='+' read -ra e <<<"${VAR_ENV[$TAG]}" # A=1+B=2: both set
    env ${e[@]+"${e[@]}"} LD_LIBRARY_PATH="$l${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$b" "$@"
}
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader 2>/dev/null
for L in ${DEPTHS//,/ }; do
    P=$W/$SHAPE-$L
    t0=$(date +%s)
    set -- $TAGS
    TAG=$1 # the first build makes the package
    run_bench $MAKE "$P" --shape "$SHAPE" --layers "$L" $MAKE_ARGS > "$OUT/make-$SHAPE-$L.log" 2>&1 ||
        { tail -5 "$OUT/make-$SHAPE-$L.log"; exit 1; }
    t1=$(date +%s)
    for N in ${PROMPT//,/ }; do
    for G in ${GRAPHS//,/ }; do
    for E in ${GEMMS//,/ }; do
    for R in $(seq 1 "$ROUNDS"); do
    ORDER=$TAGS
    [ $((R % 2)) = 0 ] && ORDER=$(printf '%s\n' $TAGS | tac | tr '\n' ' ')
    for TAG in $ORDER; do
        LOG=$OUT/bench-$SHAPE-$L-p$N-g$G-e$E-$TAG-r$R.log
        SPLASH_CUDA_GRAPHS=$G SPLASH_CUDA_GEMM=$E run_bench --model "$P" --device "$DEVICE" --act int8 --kv-format int8 --no-bandwidth \
            --prompt "$N" --decode "$DECODE" --decode-prefill --verify-reps "$VREPS" ${ROUTE[@]+"${ROUTE[@]}"} \
            ${BENCH_ARGS:-} > "$LOG" 2>&1 ||
            { tail -5 "$LOG"; exit 1; }
        echo "$TAG (round $R): depth $L, prompt $N, graphs $G, gemm $E: made and packed in $((t1 - t0)) s, benchmarked in $(( $(date +%s) - t1 )) s"
        grep -E "^(cuda|int8|read per|decode|prefill)" "$LOG"
    done
    done
    done
    done
    done
    rm -rf "$P"
done
for N in ${PROMPT//,/ }; do
for G in ${GRAPHS//,/ }; do
for E in ${GEMMS//,/ }; do
for TAG in $TAGS; do
python3 - "$OUT" "$SHAPE" "$FULL" "${DEPTHS//,/ }" "$G" "$E" "$N" "$TAG" "$ROUNDS" "${#ROUTE[@]}" <<'PY'
import re, statistics, sys
out, shape, full, depths, g, e, n, tag = sys.argv[1], sys.argv[2], int(sys.argv[3]), [int(x) for x in sys.argv[4].split()], sys.argv[5], sys.argv[6], sys.argv[7], sys.argv[8]
rounds = int(sys.argv[9])
route = ", random route" if int(sys.argv[10]) else ""
rows = {}
for L in depths:
    per = []  # each round's figures; the table takes their medians
    for r in range(1, rounds + 1):
        t = open(f"{out}/bench-{shape}-{L}-p{n}-g{g}-e{e}-{tag}-r{r}.log").read()
        g_ = lambda pat: float(re.search(pat, t).group(1))
        per.append(dict(prefill=1.0 / g_(r"prefill \d+ tokens: ([0-9.]+) tokens/s"), step=g_(r"decode: median ([0-9.]+) ms"),
                        v8=g_(r"verify 8 rows: ([0-9.]+) ms"), v16=g_(r"16 rows: ([0-9.]+) ms"),
                        v4x8=g_(r"4 lanes x 8 rows: ([0-9.]+) ms"), mb=g_(r"= ([0-9.]+) MB; peak")))
    rows[L] = {k: statistics.median(p[k] for p in per) for k in per[0]}
    if rounds > 1:
        print(f"{tag}, {L} layers, rounds: decode " + " / ".join(f"{p['step']:.3f}" for p in per) +
              " ms; verify 8 " + " / ".join(f"{p['v8']:.3f}" for p in per) +
              "; 16 " + " / ".join(f"{p['v16']:.3f}" for p in per) + "; 4 x 8 " + " / ".join(f"{p['v4x8']:.2f}" for p in per))
a, b = depths[0], depths[-1]
fit = [] if a == b else [(f"{full} (fit)", {k: rows[a][k] + (rows[b][k] - rows[a][k]) * (full - a) / (b - a) for k in rows[a]})]
print(f"| {tag}: {shape}{route}, prompt {n}, graphs {g}, gemm {e}{f', median of {rounds} rounds' if rounds > 1 else ''} | layers | decode ms/token | tokens/s | MB read/token | % of 4.3 TB/s | verify 8 / 1 | verify 16 / 1 | 4 lanes x 8 / 1 | prefill tokens/s |")
print("|---|---|---|---|---|---|---|---|---|---|")
for L, r in sorted(rows.items()) + fit:
    frac = r["mb"] * 1e6 / (r["step"] * 1e-3) / 4.3e12
    print(f"| | {L} | {r['step']:.3f} | {1e3 / r['step']:.1f} | {r['mb']:.0f} | {100 * frac:.1f}% | "
          f"{r['v8'] / r['step']:.2f} | {r['v16'] / r['step']:.2f} | {r['v4x8'] / r['step']:.2f} | {1 / r['prefill']:.0f} |")
PY
done
done
done
done
