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


/* ---- settings as the program sees them (helpers for mode-aware expectations) ---- */
#include <stdint.h>
#include <time.h>

/* A size setting from the environment: base 10 with an optional K/M/G/T suffix (x1024).
 * Returns dflt when unset or empty, SIZE_MAX when it is a percentage or unreadable. */
static inline size_t drvtest_env_size(const char *name, size_t dflt)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return dflt;
    char *end;
    unsigned long long x = strtoull(v, &end, 10);
    if (end == v)
        return SIZE_MAX;
    switch (*end) {
    case 'K': case 'k': x <<= 10; end++; break;
    case 'M': case 'm': x <<= 20; end++; break;
    case 'G': case 'g': x <<= 30; end++; break;
    case 'T': case 't': x <<= 40; end++; break;
    default: break;
    }
    if (*end == 'B' || *end == 'b')
        end++;
    return *end ? SIZE_MAX : (size_t)x;
}

/* Whether the shim is preloaded at all (any mode). */
static inline int drvtest_shim_loaded(void)
{
    return strcmp(drvtest_mode(), "none") != 0;
}

/* PINSHIM_MIN_SIZE (default 64K). */
static inline size_t drvtest_min_size(void)
{
    return drvtest_env_size("PINSHIM_MIN_SIZE", 64u << 10);
}

/* PINSHIM_BUDGET in bytes; 0 when unset (the default, a share of RAM) or a percentage. */
static inline size_t drvtest_budget(void)
{
    size_t b = drvtest_env_size("PINSHIM_BUDGET", 0);
    return b == SIZE_MAX ? 0 : b;
}

/* PINSHIM_TRUST_ASYNC switched on for a preloaded shim. */
static inline int drvtest_trust_async(void)
{
    const char *v = getenv("PINSHIM_TRUST_ASYNC");
    if (!drvtest_shim_loaded() || !v)
        return 0;
    return strcmp(v, "1") == 0 || strcmp(v, "yes") == 0 || strcmp(v, "on") == 0 || strcmp(v, "true") == 0;
}

/* The shim is expected to promote a hot, touched block of n bytes: pin/full, the default
 * budget (unset), and n at least PINSHIM_MIN_SIZE. */
static inline int drvtest_expect_promotion(size_t n)
{
    return drvtest_promotes() && !getenv("PINSHIM_BUDGET") && n >= drvtest_min_size();
}

/* Sleeps ms milliseconds, all of them (a signal does not cut it short). */
static inline void drvtest_sleep_ms(long ms)
{
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
    while (nanosleep(&ts, &ts) != 0)
        ;
}

/* A block that proved reused is registered off the copy's path (its copies are staged until
 * then): where the shim is expected to promote [p, p+n), wait until the driver sees it
 * registered, for up to two seconds.  Returns whether it is. */
int fakecuda_registered(const void *p, size_t n);
static inline int drvtest_wait_registered(const void *p, size_t n)
{
    if (!drvtest_expect_promotion(n))
        return fakecuda_registered(p, n);
    for (int i = 0; i < 2000 && !fakecuda_registered(p, n); i++)
        drvtest_sleep_ms(1);
    return fakecuda_registered(p, n);
}

/* The registrar works behind the program's frees: wait until the driver's registered bytes have
 * not changed for 200 ms (at most ten seconds: a sanitizer's build is slow). */
size_t fakecuda_registered_bytes(void);
static inline void drvtest_wait_registrations_settled(void)
{
    size_t last = fakecuda_registered_bytes();
    int still = 0;
    for (int i = 0; i < 10000 && still < 200; i++) {
        drvtest_sleep_ms(1);
        size_t now = fakecuda_registered_bytes();
        still = now == last ? still + 1 : 0;
        last = now;
    }
}

/* The process's threads (-1 when they cannot be counted). */
static inline int drvtest_count_threads(void)
{
    return (int)test_status_value("Threads");
}

/* The shim starts work of its own behind the program's first calls (full mode: the staging
 * buffers, registered by a builder thread that then starts the copy threads, on the first
 * device allocation).  A test that counts the process's mappings around calls of its own
 * waits for that first: until the driver's registered bytes, the thread count and the mapping
 * count have not changed for 200 ms (at most ten seconds). */
static inline void drvtest_wait_shim_settled(void)
{
    size_t bytes = fakecuda_registered_bytes();
    int threads = drvtest_count_threads(), maps = test_count_mappings();
    for (int i = 0, still = 0; i < 2000 && still < 40; i++) {
        drvtest_sleep_ms(5);
        size_t b = fakecuda_registered_bytes();
        int t = drvtest_count_threads(), m = test_count_mappings();
        still = b == bytes && t == threads && m == maps ? still + 1 : 0;
        bytes = b;
        threads = t;
        maps = m;
    }
}

#endif
