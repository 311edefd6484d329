#!/usr/bin/env bash
# Build and run bench/gpu/bench_attention.cu (sm_90a: H100/H200): one attention
# call over int8 pages at a prefill chunk's shape, the long split's kernel
# (flash, or the wide one with SPLASH_CUDA_ATTN_FLASH=0) and the default split.
# Usage: bench/gpu/bench_attention.sh [27b|35b|hd128] [P:R ...]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
src="$here/../../src"
nvcc="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
"$nvcc" -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I"$src" -o /tmp/bench_attention "$here/bench_attention.cu" \
    "$src"/backend/cuda/attention.cu "$src"/backend/cuda/attention_int8*.cu "$src"/backend/cuda/device.cu
exec /tmp/bench_attention "$@"
