#!/bin/bash
# gpu_q4_matmul.sh - the one script the GPU machine runs for the CUDA q4
# product: builds the library object, the test and the benchmark for sm_90a,
# runs the test (full log in $OUT/test.log; FAIL lines and "N passed, N failed"
# printed), then the benchmark, whose table comes last.
#   tools/gpu_q4_matmul.sh [--sweep | --gemm]
#     --sweep  also time every config
#     --gemm   only the prefill GEMM (q4_gemm.h): its tests and its table
set -u -o pipefail
cd "$(dirname "$0")/.." || exit 1
B=${BUILD:-build-cuda}
OUT=${OUT:-$B}
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
FLAGS="-std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Isrc -Xcompiler -Wall,-Wextra"
mkdir -p "$B" "$OUT"

echo "== build"
$NVCC $FLAGS -Xptxas -v -c src/backend/cuda/q4_matmul.cu -o "$B/q4_matmul.o" 2>"$B/ptxas.log" || { cat "$B/ptxas.log"; exit 1; }
$NVCC $FLAGS -Xptxas -v -c src/backend/cuda/q4_gemm.cu -o "$B/q4_gemm.o" 2>>"$B/ptxas.log" || { cat "$B/ptxas.log"; exit 1; }
$NVCC $FLAGS -c src/backend/cuda/blas.cu -o "$B/blas.o" || exit 1
grep -v 'ptxas info' "$B/ptxas.log" | grep -iE 'warning|error' && exit 1
grep -E 'spill' "$B/ptxas.log" | grep -v ' 0 bytes spill stores, 0 bytes spill loads' && echo "SPILLS (see ptxas.log)"
$NVCC $FLAGS tests/gpu/test_q4_matmul.cu "$B/q4_matmul.o" "$B/q4_gemm.o" "$B/blas.o" -ldl -o "$B/test_q4_matmul" &
p1=$!
$NVCC $FLAGS bench/gpu/bench_q4_matmul.cu "$B/q4_matmul.o" "$B/q4_gemm.o" "$B/blas.o" -ldl -o "$B/bench_q4_matmul" &
p2=$!
wait $p1 || exit 1
wait $p2 || exit 1
gzip -c "$B/ptxas.log" > "$OUT/ptxas.log.gz"
if command -v cuobjdump >/dev/null 2>&1; then
    cuobjdump --dump-sass "$B/q4_matmul.o" > "$B/sass.txt" 2>/dev/null && gzip -c "$B/sass.txt" > "$OUT/sass.txt.gz"
    # instruction mix per kernel (MODE, NT, R, U, stages in the mangled name) -> $OUT/sass_mix.txt
    awk '/Function :/ {name = $3} /^ +\/\*[0-9a-f]+\*\/ +[A-Z@]/ {op = $2; if (op ~ /^@/) op = $3; sub(/\..*/, "", op);
         sub(/;$/, "", op); n[name] ++; k[name, op]++}
         END {for (f in n) {printf "%s total %d:", f, n[f]; for (key in k) {split(key, a, SUBSEP);
              if (a[1] == f && k[key] >= 8) printf " %s %d", a[2], k[key]} printf "\n"}}' "$B/sass.txt" > "$OUT/sass_mix.txt"
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader 2>/dev/null

echo "== test"
GEMM=""
[ "${1:-}" = "--gemm" ] && GEMM=--gemm
"$B/test_q4_matmul" $GEMM > "$OUT/test.log" 2>&1
trc=$?
grep -E '^(FAIL|device)' "$OUT/test.log" | head -n 30
awk '/rel_l2=/ {for (i = 1; i <= NF; i++) if ($i ~ /^rel_l2=/) {v = substr($i, 8) + 0; if (v > w) {w = v; l = $0}}}
     END {print "worst rel_l2 " w ": " l}' "$OUT/test.log"
tail -n 1 "$OUT/test.log"
echo "== bench"
if [ -n "$GEMM" ]; then
    "$B/bench_q4_matmul" --gemm > "$OUT/bench.log" 2>&1
    brc=$?
    grep -E '^(\||prefill|device)' "$OUT/bench.log"
    exit $((trc + brc))
elif [ "${1:-}" = "--sweep" ]; then
    "$B/bench_q4_matmul" --sweep --csv "$OUT/sweep.csv" > "$OUT/bench.log" 2>&1
else
    "$B/bench_q4_matmul" --csv "$OUT/bench.csv" > "$OUT/bench.log" 2>&1
fi
brc=$?
# ceilings and prep times, the presets the sweep selected, then the table
sed -n '/^| shape/,$!p' "$OUT/bench.log" | grep -v '^    {' | grep -v '^$' | tail -n 8
grep '^    {' "$OUT/bench.log"
sed -n '/^| shape/,$p' "$OUT/bench.log"
exit $((trc + brc))
