// fresh_device: what a copy into freshly allocated device memory costs, step by step.  The
// layers of a GPT-2-medium-sized model (24 layers of 12, 4, 16 and 16 MiB tensors), allocated
// with malloc and filled (PINNED=1: cuMemAllocHost), are each copied to the device once as
// tensor.to() does: cuMemcpyHtoDAsync on the legacy stream, then a synchronize.  FRESH=1
// allocates each tensor's device memory right before its copy (as Module.to's caching allocator
// does on a model's first move); otherwise all of it is allocated first.  TOUCH=1 writes each
// fresh allocation once (cuMemsetD8Async and a synchronize) before its copy, so that a cost of
// its first use shows apart from the copy's.  Prints the mean time per tensor of each step:
// the allocation, the touch, the copy's call, the synchronize after it.
// Driver API only, linked with -lcuda: it runs on a GPU's driver or on the checking fake one.
//   cc -O2 -I$CUDA_INC -o build/fresh_device bench/probes/fresh_device.c -lcuda
//   FRESH=1 LD_PRELOAD=build/libpinshim.so build/fresh_device     (and without either)
#include <string.h>
#include "probe_drv.h"

static int flag(const char *name)
{
    const char *v = getenv(name);
    return v && atoi(v);
}

int main(void)
{
    int fresh = flag("FRESH"), touch = flag("TOUCH"), pinned = flag("PINNED");
    probe_context();
    unsigned char *cpu[TENSORS];
    CUdeviceptr gpu[TENSORS];
    size_t total = 0;
    for (int i = 0; i < TENSORS; i++) {
        size_t n = per_layer[i % 4];
        if (pinned)
            check(cuMemAllocHost((void **)&cpu[i], n), "cuMemAllocHost");
        else if (!(cpu[i] = malloc(n))) {
            printf("error: no memory for %zu bytes\n", n);
            return 1;
        }
        memset(cpu[i], i + 1, n);
        if (!fresh)
            check(cuMemAlloc(&gpu[i], n), "cuMemAlloc");
        total += n;
    }
    // A first copy of its own: the shim's staging buffers and threads, the context's first DMA.
    CUdeviceptr warm;
    check(cuMemAlloc(&warm, 1u << 20), "cuMemAlloc");
    check(cuMemcpyHtoDAsync(warm, cpu[0], 1u << 20, 0), "cuMemcpyHtoDAsync");
    check(cuStreamSynchronize(0), "cuStreamSynchronize");
    double t_alloc = 0, t_touch = 0, t_call = 0, t_sync = 0, t0 = now();
    for (int i = 0; i < TENSORS; i++) {
        size_t n = per_layer[i % 4];
        double a = now();
        if (fresh)
            check(cuMemAlloc(&gpu[i], n), "cuMemAlloc");
        double b = now();
        if (fresh && touch) {
            check(cuMemsetD8Async(gpu[i], 0, n, 0), "cuMemsetD8Async");
            check(cuStreamSynchronize(0), "cuStreamSynchronize");
        }
        double c = now();
        check(cuMemcpyHtoDAsync(gpu[i], cpu[i], n, 0), "cuMemcpyHtoDAsync");
        double d = now();
        check(cuStreamSynchronize(0), "cuStreamSynchronize");
        double e = now();
        t_alloc += b - a;
        t_touch += c - b;
        t_call += d - c;
        t_sync += e - d;
    }
    double loop = now() - t0;
    // Every tensor arrived: the device's bytes read back and compared.
    unsigned char *back = malloc(per_layer[2]);
    if (!back) {
        printf("error: no memory for the check\n");
        return 1;
    }
    for (int i = 0; i < TENSORS; i++) {
        size_t n = per_layer[i % 4];
        check(cuMemcpyDtoH(back, gpu[i], n), "cuMemcpyDtoH");
        if (memcmp(back, cpu[i], n)) {
            printf("MISMATCH: tensor %d of %zu bytes\n", i, n);
            return 1;
        }
    }
    printf("fresh=%d touch=%d pinned=%d: %d tensors, %.1f MB in %.2f ms (%.1f GB/s); per tensor: "
           "alloc %.1f us, touch %.1f us, call %.1f us, sync %.1f us\n",
           fresh, touch, pinned, TENSORS, total / 1e6, loop * 1e3, total / loop / 1e9, t_alloc / TENSORS * 1e6,
           t_touch / TENSORS * 1e6, t_call / TENSORS * 1e6, t_sync / TENSORS * 1e6);
    return 0;
}
