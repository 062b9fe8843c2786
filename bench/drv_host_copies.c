/* drv_host_copies: the fresh-buffer, two-thread fresh-buffer and bounce-copy benchmarks on the
 * driver API only (cuMemcpyHtoD/DtoH, cuMemHostAlloc), so that they also run on the checking fake
 * driver.  Everything is in host_copies.h, which bench/gpu_host_copies.cu builds on the CUDA
 * runtime. */
#include "host_copies.h"

int main(int argc, char **argv) { return hc_main(argc, argv); }
