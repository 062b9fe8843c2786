/* Shared set-up for programs that drive the (fake or real) driver API directly. */
#ifndef PINSHIM_DRVTEST_H
#define PINSHIM_DRVTEST_H

#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "testutil.h"

#define CU(call)                                                                        \
    do {                                                                                \
        CUresult cu_r_ = (call);                                                        \
        if (cu_r_ != CUDA_SUCCESS) {                                                    \
            printf("FAIL %s returned %d at %s:%d\n", #call, (int)cu_r_, __FILE__, __LINE__); \
            exit(1);                                                                    \
        }                                                                               \
    } while (0)

static inline CUcontext drvtest_init(void)
{
    CUdevice dev;
    CUcontext ctx;
    CU(cuInit(0));
    CU(cuDeviceGet(&dev, 0));
    CU(cuDevicePrimaryCtxRetain(&ctx, dev));
    CU(cuCtxSetCurrent(ctx));
    return ctx;
}

static inline void fill_pattern(void *p, size_t n, unsigned seed)
{
    unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        c[i] = (unsigned char)(seed * 131u + i * 7u + (i >> 12));
}

static inline int check_pattern(const void *p, size_t n, unsigned seed)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        if (c[i] != (unsigned char)(seed * 131u + i * 7u + (i >> 12)))
            return 0;
    return 1;
}

/* PINSHIM_MODE as the program sees it: what the shim is expected to do, when preloaded. */
static inline const char *drvtest_mode(void)
{
    const char *preload = getenv("LD_PRELOAD");
    const char *m = getenv("PINSHIM_MODE");
    if (!preload || !strstr(preload, "pinshim"))
        return "none";
    return m && *m ? m : "full";
}

static inline int drvtest_promotes(void)
{
    const char *m = drvtest_mode();
    return strcmp(m, "pin") == 0 || strcmp(m, "full") == 0;
}

#endif
