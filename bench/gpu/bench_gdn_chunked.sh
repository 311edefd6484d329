#!/usr/bin/env bash
# Build and run bench/gpu/bench_gdn_chunked.cu (sm_90a: H100/H200): one
# chunked-GDN call (prep, state pass, gated norm) of one lane at a production
# shape.  --probe: built with gdn_chunked.cu's per-phase probe (cycles a
# state-pass chunk and a prep block spend in each phase).
# Usage: bench/gpu/bench_gdn_chunked.sh [--probe] [27b|35b] [R ...]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
src="$here/../../src"
nvcc="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
def=() out=/tmp/bench_gdn_chunked
if [ "${1:-}" = "--probe" ]; then def=(-DSPLASH_GDN_PROBE); out=/tmp/bench_gdn_chunked_probe; shift; fi
"$nvcc" -std=c++17 -O3 -arch=sm_90a "${def[@]}" -I"$src" -o "$out" "$here/bench_gdn_chunked.cu" \
    "$src"/backend/cuda/gdn_chunked.cu "$src"/backend/cuda/gdn.cu "$src"/backend/cuda/device.cu
exec "$out" "$@"
