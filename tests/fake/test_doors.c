/* Every door to the driver: direct linking, dlsym on a libcuda handle, and cuGetProcAddress
 * by base name with the legacy and per-thread flags, as the CUDA runtime does.  Each door must
 * hand back exactly the variant asked for (checked with the fake's per-symbol call counters),
 * and the data must survive.  The lookups' copies use memory the program pinned, which the shim
 * passes to the entry point it was called through (pageable memory it may stage through copies
 * of its own, and the counters would count those).  The last line tells the runner how many copies of each direction
 * were issued (in observe mode the shim's JSON must count exactly those), and how often each copy
 * entry point was called (in every mode the JSON's entry_points must match). */
#include <dlfcn.h>
#include <cudaTypedefs.h>
#include "drvtest.h"
#include "fakecuda.h"

static unsigned long h2d, d2h, d2d;
/* Calls the program made, by the exported name the door it called stands for. */
static unsigned long e_htod, e_dtoh, e_dtod, e_memcpy, e_dtoh_ptds, e_htod_async_ptsz, e_2d;

int main(void)
{
    drvtest_init();
    const size_t n = 1 << 20;
    unsigned char *host = malloc(n), *back = malloc(n), *pin_host, *pin_back;
    CU(cuMemHostAlloc((void **)&pin_host, n, 0));
    CU(cuMemHostAlloc((void **)&pin_back, n, 0));
    CUdeviceptr dev, dev2;
    CU(cuMemAlloc(&dev, n));
    CU(cuMemAlloc(&dev2, n));

    /* (a) linked directly */
    fill_pattern(host, n, 1);
    CU(cuMemcpyHtoD(dev, host, n)); h2d++; e_htod++;
    CU(cuMemcpyDtoD(dev2, dev, n)); d2d++; e_dtod++;
    memset(back, 0, n);
    CU(cuMemcpyDtoH(back, dev2, n)); d2h++; e_dtoh++;
    CHECK(check_pattern(back, n, 1));
    CU(cuMemcpy(dev, (CUdeviceptr)host, 4096)); h2d++; e_memcpy++;
    CU(cuMemcpy((CUdeviceptr)back, dev, 4096)); d2h++; e_memcpy++;

    /* (b) dlsym on a libcuda handle */
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    CHECK(lib != NULL);
    PFN_cuMemcpyHtoD_v3020 htod = (PFN_cuMemcpyHtoD_v3020)dlsym(lib, "cuMemcpyHtoD_v2");
    PFN_cuMemcpyDtoH_v3020 dtoh = (PFN_cuMemcpyDtoH_v3020)dlsym(lib, "cuMemcpyDtoH_v2");
    CHECK(htod && dtoh);
    fill_pattern(host, n, 2);
    CU(htod(dev, host, n)); h2d++; e_htod++;
    memset(back, 0, n);
    CU(dtoh(back, dev, n)); d2h++; e_dtoh++;
    CHECK(check_pattern(back, n, 2));

    /* (c) cuGetProcAddress, found the way cudart finds it */
    PFN_cuGetProcAddress_v12000 gpa = (PFN_cuGetProcAddress_v12000)dlsym(lib, "cuGetProcAddress_v2");
    CHECK(gpa != NULL);
    CUdriverProcAddressQueryResult status;
    void *fn = NULL;
    CU(gpa("cuGetProcAddress", &fn, 12000, 0, &status));
    CHECK(fn != NULL && status == CU_GET_PROC_ADDRESS_SUCCESS);
    gpa = (PFN_cuGetProcAddress_v12000)fn;

    /* legacy variants */
    CU(gpa("cuMemcpyHtoD", &fn, 3020, CU_GET_PROC_ADDRESS_DEFAULT, &status));
    htod = (PFN_cuMemcpyHtoD_v3020)fn;
    /* In full mode the shim may issue a legacy copy as an async copy on its own stream: either
     * way it must be a legacy-variant call, never the per-thread one. */
    unsigned long legacy_before = fakecuda_calls("cuMemcpyHtoD_v2") + fakecuda_calls("cuMemcpyHtoDAsync_v2");
    unsigned long ptds_htod_before = fakecuda_calls("cuMemcpyHtoD_v2_ptds");
    fill_pattern(pin_host, n, 3);
    CU(htod(dev, pin_host, n)); h2d++; e_htod++;
    CHECKF(fakecuda_calls("cuMemcpyHtoD_v2") + fakecuda_calls("cuMemcpyHtoDAsync_v2") == legacy_before + 1 &&
           fakecuda_calls("cuMemcpyHtoD_v2_ptds") == ptds_htod_before, "flags 0 reach the legacy cuMemcpyHtoD_v2");

    /* per-thread variants, version 7000 and flag 2 */
    CU(gpa("cuMemcpyDtoH", &fn, 7000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &status));
    dtoh = (PFN_cuMemcpyDtoH_v3020)fn;
    unsigned long ptds_before = fakecuda_calls("cuMemcpyDtoH_v2_ptds");
    memset(pin_back, 0, n);
    CU(dtoh(pin_back, dev, n)); d2h++; e_dtoh_ptds++;
    CHECKF(fakecuda_calls("cuMemcpyDtoH_v2_ptds") == ptds_before + 1, "flag 2 reaches cuMemcpyDtoH_v2_ptds");
    CHECK(check_pattern(pin_back, n, 3));

    CU(gpa("cuMemcpyHtoDAsync", &fn, 7000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &status));
    PFN_cuMemcpyHtoDAsync_v3020 htod_async = (PFN_cuMemcpyHtoDAsync_v3020)fn;
    unsigned long ptsz_before = fakecuda_calls("cuMemcpyHtoDAsync_v2_ptsz");
    fill_pattern(pin_host, n, 4);
    CU(htod_async(dev, pin_host, n, 0)); h2d++; e_htod_async_ptsz++;
    CHECKF(fakecuda_calls("cuMemcpyHtoDAsync_v2_ptsz") == ptsz_before + 1, "flag 2 reaches cuMemcpyHtoDAsync_v2_ptsz");
    CU(cuStreamSynchronize(CU_STREAM_PER_THREAD));
    memset(back, 0, n);
    CU(cuMemcpyDtoH(back, dev, n)); d2h++; e_dtoh++;
    CHECK(check_pattern(back, n, 4));

    /* 2D through the lookup, and a name nobody hooks, which must come back as the driver's */
    CU(gpa("cuMemcpy2D", &fn, 3020, 0, &status));
    PFN_cuMemcpy2D_v3020 copy2d = (PFN_cuMemcpy2D_v3020)fn;
    CUDA_MEMCPY2D p = {0};
    p.srcMemoryType = CU_MEMORYTYPE_HOST;
    p.srcHost = host;
    p.srcPitch = 1024;
    p.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    p.dstDevice = dev;
    p.dstPitch = 1024;
    p.WidthInBytes = 1000;
    p.Height = 64;
    CU(copy2d(&p)); h2d++; e_2d++;
    void *ctx_get = NULL;
    CU(gpa("cuCtxGetCurrent", &ctx_get, 4000, 0, &status));
    CHECKF(ctx_get == dlsym(lib, "cuCtxGetCurrent"), "an unhooked name passes through untouched");

    /* an unknown name: the driver's own answer */
    fn = (void *)1;
    CUresult r = gpa("cuNoSuchFunction", &fn, 12000, 0, &status);
    CHECK(r == CUDA_ERROR_NOT_FOUND && fn == NULL && status == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);

    CHECK(fakecuda_violations() == 0);
    cuMemFree(dev);
    cuMemFree(dev2);
    free(host);
    free(back);
    cuMemFreeHost(pin_host);
    cuMemFreeHost(pin_back);
    printf("EXPECTED_COPIES h2d=%lu d2h=%lu d2d=%lu\n", h2d, d2h, d2d);
    printf("EXPECTED_ENTRIES cuMemcpyHtoD_v2=%lu cuMemcpyDtoH_v2=%lu cuMemcpyDtoD_v2=%lu cuMemcpy=%lu "
           "cuMemcpyDtoH_v2_ptds=%lu cuMemcpyHtoDAsync_v2_ptsz=%lu cuMemcpy2D_v2=%lu "
           "cuMemcpyHtoD_v2_ptds=0 cuMemcpyHtoDAsync_v2=0\n",
           e_htod, e_dtoh, e_dtod, e_memcpy, e_dtoh_ptds, e_htod_async_ptsz, e_2d);
    return TEST_SUMMARY();
}
