/* A program that is not linked against libcuda (tests/check_hostile_env.sh builds it without
 * -lcuda; the Makefile's copy is linked but never calls cu* directly).  Before the driver is
 * anywhere in the process it allocates its buffers and copies data into them (so the shim saw
 * them born while there was no driver); then it dlopens libcuda.so.1, finds cuGetProcAddress_v2
 * with dlsym, obtains every entry point through it and copies, checking the data.
 *   - no libcuda.so.1 loadable: prints one line and exits 3, as a program that handles that;
 *   - cuGetProcAddress on a known name the shim does not hook (cuDeviceGetName) gives the
 *     driver's own function; an unknown name gives the driver's own error;
 *   - the last line claims the copies issued, for the observe-mode count check.
 * Output never depends on the shim or its mode. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <cuda.h>
#include <cudaTypedefs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;
#define EXPECT(cond, what)                                                       \
    do {                                                                         \
        if (cond)                                                                \
            printf("PASS %s\n", what);                                           \
        else {                                                                   \
            printf("FAIL %s [line %d]\n", what, __LINE__);                       \
            failures++;                                                          \
        }                                                                        \
    } while (0)
#define CALL(call)                                                               \
    do {                                                                         \
        CUresult r_ = (call);                                                    \
        if (r_ != CUDA_SUCCESS) {                                                \
            printf("FAIL %s returned %d [line %d]\n", #call, (int)r_, __LINE__); \
            exit(1);                                                             \
        }                                                                        \
    } while (0)

static void fill(unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)(seed * 77u + i * 13u + (i >> 11));
}

static int same(const unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != (unsigned char)(seed * 77u + i * 13u + (i >> 11)))
            return 0;
    return 1;
}

static PFN_cuGetProcAddress_v12000 gpa;

static void *get(const char *name, int version)
{
    void *fn = NULL;
    CUdriverProcAddressQueryResult st;
    CUresult r = gpa(name, &fn, version, CU_GET_PROC_ADDRESS_DEFAULT, &st);
    if (r != CUDA_SUCCESS || !fn || st != CU_GET_PROC_ADDRESS_SUCCESS) {
        printf("FAIL cuGetProcAddress(%s) returned %d\n", name, (int)r);
        exit(1);
    }
    return fn;
}

int main(void)
{
    const size_t n = 8u << 20, small = 64u << 10;
    /* The hot buffers, allocated and filled before anything touches the driver. */
    unsigned char *host = malloc(n), *back = malloc(n), *tiny = malloc(small);
    if (!host || !back || !tiny)
        return 2;
    fill(host, n, 1);
    memcpy(back, host, n);
    fill(tiny, small, 9);

    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        printf("no driver: libcuda.so.1 cannot be loaded; running without a GPU\n");
        free(host);
        free(back);
        free(tiny);
        return 3;
    }
    gpa = (PFN_cuGetProcAddress_v12000)dlsym(lib, "cuGetProcAddress_v2");
    EXPECT(gpa != NULL, "dlsym finds cuGetProcAddress_v2");
    if (!gpa)
        return 1;

    PFN_cuInit_v2000 init = get("cuInit", 2000);
    PFN_cuDeviceGet_v2000 device_get = get("cuDeviceGet", 2000);
    PFN_cuDevicePrimaryCtxRetain_v7000 retain = get("cuDevicePrimaryCtxRetain", 7000);
    PFN_cuCtxSetCurrent_v4000 set_current = get("cuCtxSetCurrent", 4000);
    PFN_cuMemAlloc_v3020 mem_alloc = get("cuMemAlloc", 3020);
    PFN_cuMemFree_v3020 mem_free = get("cuMemFree", 3020);
    PFN_cuMemcpyHtoD_v3020 htod = get("cuMemcpyHtoD", 3020);
    PFN_cuMemcpyDtoH_v3020 dtoh = get("cuMemcpyDtoH", 3020);
    PFN_cuMemcpyDtoD_v3020 dtod = get("cuMemcpyDtoD", 3020);
    PFN_cuMemcpyHtoDAsync_v3020 htod_async = get("cuMemcpyHtoDAsync", 3020);
    PFN_cuMemcpyDtoHAsync_v3020 dtoh_async = get("cuMemcpyDtoHAsync", 3020);
    PFN_cuStreamCreate_v2000 stream_create = get("cuStreamCreate", 2000);
    PFN_cuStreamSynchronize_v2000 stream_sync = get("cuStreamSynchronize", 2000);
    PFN_cuStreamDestroy_v4000 stream_destroy = get("cuStreamDestroy", 4000);

    /* A known name that the shim does not hook: exactly the driver's function. */
    PFN_cuDeviceGetName_v2000 get_name = get("cuDeviceGetName", 2000);
    EXPECT((void *)get_name == dlsym(lib, "cuDeviceGetName"), "cuDeviceGetName is the driver's own");
    /* An unknown name: the driver's own answer. */
    void *fn = (void *)1;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
    CUresult r = gpa("cuNoSuchThing", &fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &st);
    EXPECT(r == CUDA_ERROR_NOT_FOUND && fn == NULL && st == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND,
           "cuNoSuchThing: not found, as the driver says");

    CUdevice dev;
    CUcontext ctx;
    CALL(init(0));
    CALL(device_get(&dev, 0));
    CALL(retain(&ctx, dev));
    CALL(set_current(ctx));
    char name[256] = "";
    CALL(get_name(name, (int)sizeof name, dev));
    EXPECT(name[0] != '\0', "cuDeviceGetName answers");

    CUdeviceptr d1, d2;
    CUstream s;
    CALL(mem_alloc(&d1, n));
    CALL(mem_alloc(&d2, n));
    CALL(stream_create(&s, CU_STREAM_NON_BLOCKING));
    unsigned long h2d = 0, d2h = 0, d2d = 0;
    int ok = 1;
    for (unsigned round = 0; round < 12; round++) {
        /* The buffers born before the driver, copied again and again: hot. */
        fill(host, n, round + 2);
        CALL(htod(d1, host, n)); h2d++;
        CALL(dtod(d2, d1, n)); d2d++;
        memset(back, 0, n);
        CALL(dtoh(back, d2, n)); d2h++;
        ok &= same(back, n, round + 2);

        fill(host, n, round + 100);
        CALL(htod_async(d1, host, n, s)); h2d++;
        memset(host, 0xee, n);   /* pageable semantics: the source may be reused at once */
        memset(back, 0, n);
        CALL(dtoh_async(back, d1, n, s)); d2h++;
        CALL(stream_sync(s));
        ok &= same(back, n, round + 100);

        CALL(htod(d2, tiny, small)); h2d++;
        CALL(dtoh(back, d2, small)); d2h++;
        ok &= same(back, small, 9);
    }
    EXPECT(ok, "data survive every copy");

    CALL(stream_destroy(s));
    CALL(mem_free(d1));
    CALL(mem_free(d2));
    free(host);
    free(back);
    free(tiny);
    printf("EXPECTED_COPIES h2d=%lu d2h=%lu d2d=%lu\n", h2d, d2h, d2d);
    return failures ? 1 : 0;
}
