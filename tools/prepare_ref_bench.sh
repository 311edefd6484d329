#!/bin/bash
# prepare_ref_bench.sh REF NAME - another commit's bench_cpu, for an A/B on the GPU machine.
#
# Checks REF out in a worktree ($TMPDIR/splash-ref-NAME, kept: the next call builds
# incrementally), builds its bench_cpu there (CUDA where nvcc exists, as `make` does) and packs
# it stripped into .carry/NAME.txz (~1 MB), as tools/gpu_model_check.sh --prepare-bench does
# for the working tree.  On the GPU machine, tools/gpu_synthetic_bench.sh
# CARRY_TXZ=".carry/splash-bin.txz .carry/NAME.txz" times both builds interleaved (the bench-only
# tarball borrows the first one's libraries).  E.g. a branch against main:
#   tools/gpu_model_check.sh --prepare && tools/prepare_ref_bench.sh main main
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 2 ] || { sed -n '2,11p' "$0"; exit 2; }
REF=$1 NAME=$2
W=${TMPDIR:-/tmp}/splash-ref-$NAME
if [ -d "$W" ]; then
    git -C "$W" checkout -q --detach "$REF"
else
    git worktree add -q --detach "$W" "$REF"
fi
make -C "$W" -s -j"$(nproc)" build/bench/bench_cpu
P=$(mktemp -d)
mkdir -p "$P/bin" .carry
strip -o "$P/bin/bench_cpu" "$W/build/bench/bench_cpu"
tar -C "$P" -cJf ".carry/$NAME.txz" bin
rm -rf "$P"
echo "$(git -C "$W" log --oneline -1) -> .carry/$NAME.txz ($(du -h ".carry/$NAME.txz" | cut -f1))"
