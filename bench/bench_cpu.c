/* bench_cpu.c - the model benchmark as a program of its own, for the GPU
 * machine's scripts (tools/gpu_synthetic_bench.sh, gpu_kernel_profile.sh):
 * the same code as `splash bench` (src/runtime/cmd_bench.c), with the same
 * options; its device defaults to cpu instead of auto. */
#include "commands.h"

int main(int argc, char **argv) { return splash_cmd_bench(argc, argv); }
