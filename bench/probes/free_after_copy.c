// free_after_copy: what freeing a model's CPU tensors during its move to the GPU costs.  The
// layers of a GPT-2-medium-sized model (24 layers of 12, 4, 16 and 16 MiB tensors) are
// allocated with malloc and filled, then each is copied to the device once (cuMemcpyHtoDAsync
// on the legacy stream, then a synchronize, as tensor.to() does) and, with FREE_EACH=1, freed
// right after its copy, as Module.to frees each parameter's CPU memory; otherwise all are freed
// after the loop.  Prints the loop's time, the copies' and the frees' (each timed alone).
// Driver API only, linked with -lcuda: it runs on a GPU's driver or on the checking fake one.
//   cc -O2 -I$CUDA_INC -o build/free_after_copy bench/probes/free_after_copy.c -lcuda
//   FREE_EACH=1 LD_PRELOAD=build/libpinshim.so build/free_after_copy     (and without either)
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LAYERS 24
#define TENSORS (LAYERS * 4)

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void check(CUresult r, const char *what)
{
    if (r != CUDA_SUCCESS) {
        printf("error: %s returned %d\n", what, (int)r);
        exit(1);
    }
}

int main(void)
{
    static const size_t per_layer[4] = { 12u << 20, 4u << 20, 16u << 20, 16u << 20 };
    int free_each = getenv("FREE_EACH") && atoi(getenv("FREE_EACH"));
    CUdevice dev;
    CUcontext ctx;
    check(cuInit(0), "cuInit");
    check(cuDeviceGet(&dev, 0), "cuDeviceGet");
    check(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
    unsigned char *cpu[TENSORS];
    CUdeviceptr gpu[TENSORS];
    for (int i = 0; i < TENSORS; i++) {
        size_t n = per_layer[i % 4];
        if (!(cpu[i] = malloc(n))) {
            printf("error: no memory for %zu bytes\n", n);
            return 1;
        }
        memset(cpu[i], i + 1, n);
        check(cuMemAlloc(&gpu[i], n), "cuMemAlloc");
    }
    double copies = 0, frees = 0, t0 = now();
    for (int i = 0; i < TENSORS; i++) {
        double a = now();
        check(cuMemcpyHtoDAsync(gpu[i], cpu[i], per_layer[i % 4], 0), "cuMemcpyHtoDAsync");
        check(cuStreamSynchronize(0), "cuStreamSynchronize");
        double b = now();
        copies += b - a;
        if (free_each) {
            free(cpu[i]);
            frees += now() - b;
        }
    }
    double loop = now() - t0, after = now();
    if (!free_each)
        for (int i = 0; i < TENSORS; i++)
            free(cpu[i]);
    after = now() - after;
    printf("free_each=%d: %d tensors, loop %.1f ms: copies %.1f ms, frees in the loop %.2f ms (%.1f us each), "
           "frees after it %.2f ms\n", free_each, TENSORS, loop * 1e3, copies * 1e3, frees * 1e3,
           free_each ? frees * 1e6 / TENSORS : 0.0, after * 1e3);
    for (int i = 0; i < TENSORS; i++)
        cuMemFree(gpu[i]);
    return 0;
}
