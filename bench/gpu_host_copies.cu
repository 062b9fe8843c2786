// gpu_host_copies: the fresh-buffer, two-thread fresh-buffer and bounce-copy benchmarks on the
// CUDA runtime (cudaMemcpy, cudaMallocHost).  Everything is in host_copies.h, which
// bench/drv_host_copies.c builds on the driver API.
#include "host_copies.h"

int main(int argc, char **argv) { return hc_main(argc, argv); }
