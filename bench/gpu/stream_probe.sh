#!/usr/bin/env bash
# Build and run bench/gpu/stream_probe.cu (sm_90a: H100/H200).
# Usage: bench/gpu/stream_probe.sh [tiles,tiles,...]   (default 384,640,1088,2176,15520)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
nvcc="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
"$nvcc" -std=c++17 -O3 -arch=sm_90a -I"$here/../../src" -o /tmp/stream_probe "$here/stream_probe.cu"
exec /tmp/stream_probe "$@"
