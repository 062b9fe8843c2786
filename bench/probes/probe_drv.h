// What the driver-API probes (free_after_copy.c, fresh_device.c) share: a clock, a check of
// each call, the context, and the model whose tensors they move (the layers of a
// GPT-2-medium-sized model: 24 layers of 12, 4, 16 and 16 MiB tensors).
#ifndef PINSHIM_PROBE_DRV_H
#define PINSHIM_PROBE_DRV_H
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define LAYERS 24
#define TENSORS (LAYERS * 4)
static const size_t per_layer[4] = { 12u << 20, 4u << 20, 16u << 20, 16u << 20 };

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

// Device 0's primary context, current on this thread.
static void probe_context(void)
{
    CUdevice dev;
    CUcontext ctx;
    check(cuInit(0), "cuInit");
    check(cuDeviceGet(&dev, 0), "cuDeviceGet");
    check(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
}
#endif
