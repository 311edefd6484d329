#!/usr/bin/env bash
# Build and run bench/gpu/bench_chain.cu (sm_90a: H100/H200): a chain of
# dependent weight-streaming phases, per boundary, as launches, programmatic
# launches and one persistent kernel with grid barriers.
# Usage: bench/gpu/bench_chain.sh [MB,MB,...]   (default 1,4.7,17.7,50)
#        bench/gpu/bench_chain.sh -l MB,MB,...  (one layer of these phases, repeated)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
nvcc="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
"$nvcc" -std=c++17 -O3 -arch=sm_90a -I"$here/../../src" -o /tmp/bench_chain "$here/bench_chain.cu"
exec /tmp/bench_chain "$@"
