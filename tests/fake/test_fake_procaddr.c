/* cuGetProcAddress of the fake driver: base name + version + flags pick the exact variant the
 * real driver exports; the pointers are the library's own definitions. */
#include "fk_test.h"
#include <dlfcn.h>

static void *lib;

static void expect_sym(const char *base, int ver, cuuint64_t flags, const char *want)
{
    void *fn = (void *)1;
    CUdriverProcAddressQueryResult st = (CUdriverProcAddressQueryResult)-1;
    CUresult r = cuGetProcAddress_v2(base, &fn, ver, flags, &st);
    void *w = dlsym(lib, want);
    CHECKF(r == CUDA_SUCCESS && st == CU_GET_PROC_ADDRESS_SUCCESS && fn && fn == w,
           "cuGetProcAddress(\"%s\", %d, %llu) -> %s", base, ver, (unsigned long long)flags, want);
}

int main(void)
{
    lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    CHECK(lib != NULL);
    /* Works before cuInit, as cudart relies on. */
    expect_sym("cuInit", 2000, 0, "cuInit");
    expect_sym("cuGetProcAddress", 11030, 0, "cuGetProcAddress");
    expect_sym("cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2");
    expect_sym("cuGetProcAddress", 13000, 2, "cuGetProcAddress_v2");
    expect_sym("cuMemcpyHtoD", 3020, 0, "cuMemcpyHtoD_v2");
    expect_sym("cuMemcpyHtoD", 7000, 2, "cuMemcpyHtoD_v2_ptds");
    expect_sym("cuMemcpyHtoD", 12000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, "cuMemcpyHtoD_v2");
    expect_sym("cuMemcpyHtoD", 3020, 2, "cuMemcpyHtoD_v2");   /* no per-thread variant yet at 3020 */
    expect_sym("cuMemcpyHtoDAsync", 7000, 2, "cuMemcpyHtoDAsync_v2_ptsz");
    expect_sym("cuMemcpyDtoH", 13000, 2, "cuMemcpyDtoH_v2_ptds");
    expect_sym("cuMemcpy", 4000, 0, "cuMemcpy");
    expect_sym("cuMemcpy", 7000, 2, "cuMemcpy_ptds");
    expect_sym("cuMemcpyAsync", 12000, 2, "cuMemcpyAsync_ptsz");
    expect_sym("cuMemcpy2DUnaligned", 7000, 2, "cuMemcpy2DUnaligned_v2_ptds");
    expect_sym("cuMemcpy3DAsync", 3020, 0, "cuMemcpy3DAsync_v2");
    expect_sym("cuMemcpyBatchAsync", 12080, 0, "cuMemcpyBatchAsync");
    expect_sym("cuMemcpyBatchAsync", 13000, 0, "cuMemcpyBatchAsync_v2");
    expect_sym("cuMemcpyBatchAsync", 13000, 2, "cuMemcpyBatchAsync_v2_ptsz");
    expect_sym("cuMemHostRegister", 4000, 0, "cuMemHostRegister");
    expect_sym("cuMemHostRegister", 6050, 0, "cuMemHostRegister_v2");
    expect_sym("cuMemHostUnregister", 13000, 2, "cuMemHostUnregister");   /* no ptds variant: legacy */
    expect_sym("cuStreamGetCaptureInfo", 12030, 0, "cuStreamGetCaptureInfo_v3");
    expect_sym("cuStreamGetCaptureInfo", 11030, 2, "cuStreamGetCaptureInfo_v2_ptsz");
    expect_sym("cuStreamBeginCapture", 10010, 0, "cuStreamBeginCapture_v2");
    expect_sym("cuEventElapsedTime", 12080, 0, "cuEventElapsedTime_v2");
    expect_sym("cuStreamSynchronize", 7000, 2, "cuStreamSynchronize_ptsz");
    expect_sym("cuMemAlloc", 3020, 0, "cuMemAlloc_v2");
    expect_sym("cuCtxSynchronize", 13000, 0, "cuCtxSynchronize_v2");
    expect_sym("cuCtxSynchronize", 12000, 0, "cuCtxSynchronize");

    void *fn = (void *)1;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
    EXPECT_RC(cuGetProcAddress_v2("cuNoSuchThing", &fn, 13000, 0, &st), CUDA_ERROR_NOT_FOUND);
    CHECK(fn == NULL && st == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    fn = (void *)1;
    EXPECT_RC(cuGetProcAddress_v2("cuMemcpyBatchAsync", &fn, 12000, 0, &st), CUDA_ERROR_NOT_FOUND);
    CHECK(fn == NULL && st == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
    fn = (void *)1;
    EXPECT_RC(cuGetProcAddress_v2("cuMemcpyHtoD", &fn, 3000, 0, &st), CUDA_ERROR_NOT_FOUND);
    CHECK(fn == NULL && st == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
    EXPECT_RC(cuGetProcAddress_v2("cuMemcpyHtoD", NULL, 13000, 0, &st), CUDA_ERROR_INVALID_VALUE);

    /* The legacy 4-argument form, found through itself. */
    CUresult (*gpa1)(const char *, void **, int, cuuint64_t) = NULL;
    MUST(cuGetProcAddress_v2("cuGetProcAddress", (void **)&gpa1, 11030, 0, NULL));
    fn = NULL;
    MUST(gpa1("cuMemcpyDtoH", &fn, 7000, 2));
    CHECK(fn == dlsym(lib, "cuMemcpyDtoH_v2_ptds"));

    /* Calls through a returned pointer reach the entry point (and its counter). */
    CUresult (*init)(unsigned) = NULL;
    MUST(cuGetProcAddress_v2("cuInit", (void **)&init, 2000, 0, NULL));
    unsigned long before = fakecuda_calls("cuInit");
    MUST(init(0));
    CHECK(fakecuda_calls("cuInit") == before + 1);
    CHECK(fakecuda_calls("cuGetProcAddress_v2") >= 30);
    CHECK(fakecuda_calls("no_such_symbol") == 0);

    int v = 0;
    MUST(cuDriverGetVersion(&v));
    CHECK(v == 13000);
    const char *name = NULL, *str = NULL;
    MUST(cuGetErrorName(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, &name));
    MUST(cuGetErrorString(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, &str));
    CHECK(!strcmp(name, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED") && str && *str);
    EXPECT_RC(cuGetErrorName((CUresult)12345, &name), CUDA_ERROR_INVALID_VALUE);
    return TEST_SUMMARY();
}
