/* What a GPU does not forgive, and the fake must not either:
 *   - device addresses are not host memory: a CPU read or write there faults (also after
 *     cuMemFree), and a copy whose "host" side is a device address, or runs into one, fails with
 *     CUDA_ERROR_INVALID_VALUE through every entry point, changing nothing;
 *   - a DMA write into a range registered CU_MEMHOSTREGISTER_READ_ONLY is a violation even when
 *     the host made the pages writable since (the device mapping stays read-only), while reads
 *     from such a range are fine;
 *   - a host function queued before a pageable async HtoD on the same stream leaves the device
 *     with the source as it was at the call or as the function left it, never a mix. */
#include "fk_test.h"
#include <signal.h>
#include <sys/mman.h>

#define BIG ((size_t)4 << 20)

static int all(const unsigned char *p, size_t n, unsigned char v)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != v) return 0;
    return 1;
}

/* ---- child scenarios ---- */
static int scenario(const char *name)
{
    fkt_init();
    CUdeviceptr d;
    MUST(cuMemAlloc_v2(&d, BIG));
    if (!strcmp(name, "write_dev")) {                  /* must fault */
        *(volatile char *)(uintptr_t)(d + BIG / 2) = 1;
        return 0;
    }
    if (!strcmp(name, "read_freed")) {                 /* must fault */
        MUST(cuMemFree_v2(d));
        volatile char c = *(volatile char *)(uintptr_t)d;
        (void)c;
        return 0;
    }
    CUstream s;
    MUST(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    /* A private read-only mapping, registered read-only, then made writable. */
    unsigned char *p = mmap(NULL, BIG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    memset(p, 0x11, BIG);
    mprotect(p, BIG, PROT_READ);
    MUST(cuMemHostRegister_v2(p, BIG, CU_MEMHOSTREGISTER_READ_ONLY));
    MUST(cuMemcpyHtoD_v2(d, p, BIG));                  /* reading it: fine */
    MUST(cuMemsetD8_v2(d, 0x22, BIG));
    MUST(cuCtxSynchronize());   /* the memset is on the legacy stream, which s does not wait for */
    if (!strcmp(name, "ro_read")) {
        MUST(cuMemcpyHtoDAsync_v2(d, p, BIG, s));
        MUST(cuStreamSynchronize(s));
    } else if (!strcmp(name, "ro_dtoh")) {
        mprotect(p, BIG, PROT_READ | PROT_WRITE);
        MUST(cuMemcpyDtoH_v2(p, d, BIG));
    } else if (!strcmp(name, "ro_dtoh_async_sub")) {
        mprotect(p, BIG, PROT_READ | PROT_WRITE);
        MUST(cuMemcpyDtoHAsync_v2(p + 4096, d, 8192, s));
        MUST(cuStreamSynchronize(s));
    } else if (!strcmp(name, "ro_unified")) {         /* the host side named as a device pointer */
        mprotect(p, BIG, PROT_READ | PROT_WRITE);
        MUST(cuMemcpy((CUdeviceptr)(uintptr_t)p, d, BIG));
    } else if (!strcmp(name, "ro_still_readonly")) {
        MUST(cuMemcpyDtoHAsync_v2(p, d, BIG, s));
        MUST(cuStreamSynchronize(s));
    } else {
        return 99;
    }
    printf("landed=%d untouched=%d violations=%lu\n", p[4096] == 0x22, p[4096] == 0x11, fakecuda_violations());
    return 0;
}

static void run(const char *name, int want_viol, const char *want_out)
{
    char out[8192];
    const char *env[] = { "FAKECUDA_EXIT_STATUS=0", NULL };
    int rc = fkt_run_self(name, env, out, sizeof out);
    int v = fkt_count(out, "fakecuda: VIOLATION:");
    int ok = rc == 0 && v == want_viol && strstr(out, want_out) &&
             (!want_viol || strstr(out, "registered CU_MEMHOSTREGISTER_READ_ONLY"));
    CHECKF(ok, "%s: exit %d, %d violation line(s), expected %d", name, rc, v, want_viol);
    if (!ok) printf("---- output of %s ----\n%s\n----\n", name, out);
}

static void faults(const char *name, const char *what)
{
    char out[4096];
    int st = fkt_run_self(name, NULL, out, sizeof out);
    CHECKF(st == 128 + SIGSEGV || (st != 0 && strstr(out, "SEGV")), "%s faults (status %d)", what, st);
}

/* ---- device addresses as the host side ---- */
static void devptr_as_host(void)
{
    const size_t n = (size_t)64 << 20;
    CUdeviceptr a, b;
    MUST(cuMemAlloc_v2(&a, n));
    MUST(cuMemAlloc_v2(&b, n));
    MUST(cuMemsetD8_v2(a, 0x5a, n));
    MUST(cuMemsetD8_v2(b, 0xa5, n));
    CUstream s;
    MUST(cuStreamCreate(&s, 0));
    void *ha = (void *)(uintptr_t)a, *hb = (void *)(uintptr_t)b;
    const size_t sizes[] = { BIG, n };
    for (int k = 0; k < 2; k++) {
        size_t m = sizes[k];
        printf("-- %zu MiB\n", m >> 20);
        EXPECT_RC(cuMemcpyHtoD_v2(b, ha, m), CUDA_ERROR_INVALID_VALUE);
        EXPECT_RC(cuMemcpyHtoD_v2_ptds(b, ha, m), CUDA_ERROR_INVALID_VALUE);
        EXPECT_RC(cuMemcpyHtoDAsync_v2(b, ha, m, s), CUDA_ERROR_INVALID_VALUE);
        EXPECT_RC(cuMemcpyHtoDAsync_v2_ptsz(b, ha, m, NULL), CUDA_ERROR_INVALID_VALUE);
        EXPECT_RC(cuMemcpyDtoH_v2(hb, a, m), CUDA_ERROR_INVALID_VALUE);
        EXPECT_RC(cuMemcpyDtoH_v2_ptds(hb, a, m), CUDA_ERROR_INVALID_VALUE);
        EXPECT_RC(cuMemcpyDtoHAsync_v2(hb, a, m, s), CUDA_ERROR_INVALID_VALUE);
        EXPECT_RC(cuMemcpyDtoHAsync_v2_ptsz(hb, a, m, CU_STREAM_PER_THREAD), CUDA_ERROR_INVALID_VALUE);
        CUDA_MEMCPY2D p2 = { 0 };
        p2.srcMemoryType = CU_MEMORYTYPE_HOST; p2.srcHost = ha; p2.srcPitch = 1 << 20;
        p2.dstMemoryType = CU_MEMORYTYPE_DEVICE; p2.dstDevice = b; p2.dstPitch = 1 << 20;
        p2.WidthInBytes = 1 << 20; p2.Height = m >> 20;
        EXPECT_RC(cuMemcpy2D_v2(&p2), CUDA_ERROR_INVALID_VALUE);
        EXPECT_RC(cuMemcpy2DAsync_v2(&p2, s), CUDA_ERROR_INVALID_VALUE);
        CUDA_MEMCPY3D p3 = { 0 };
        p3.srcMemoryType = CU_MEMORYTYPE_DEVICE; p3.srcDevice = a; p3.srcPitch = 1 << 20; p3.srcHeight = 4;
        p3.dstMemoryType = CU_MEMORYTYPE_HOST; p3.dstHost = hb; p3.dstPitch = 1 << 20; p3.dstHeight = 4;
        p3.WidthInBytes = 1 << 20; p3.Height = 4; p3.Depth = m >> 22;
        EXPECT_RC(cuMemcpy3D_v2(&p3), CUDA_ERROR_INVALID_VALUE);
        EXPECT_RC(cuMemcpy3DAsync_v2(&p3, s), CUDA_ERROR_INVALID_VALUE);
    }
    EXPECT_RC(cuMemHostRegister_v2(ha, BIG, 0), CUDA_ERROR_INVALID_VALUE);
    MUST(cuStreamSynchronize(s));
    CHECKF(fkt_dev_all(a, n, 0x5a) && fkt_dev_all(b, n, 0xa5), "the failed copies changed nothing on the device");

    /* A host range that starts below the device addresses and runs into them.  The first
     * allocation of device 0 starts one gap (64 KiB) into the reservation; the page below the
     * reservation may be the program's (mapped here when free) or anyone's: the copies that run
     * into device addresses are refused before either side is touched. */
    unsigned char *edge = (unsigned char *)(uintptr_t)a - (64 << 10);
    unsigned char *m = mmap(edge - (1 << 20), 1 << 20, PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    EXPECT_RC(cuMemcpyHtoD_v2(b, edge - 4096, 8192), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuMemcpyHtoDAsync_v2(b, edge - 4096, 8192, s), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuMemcpyDtoH_v2(edge - 4096, a, 8192), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuMemcpyDtoHAsync_v2(edge - 1, a, 2, s), CUDA_ERROR_INVALID_VALUE);
    if (m == edge - (1 << 20)) {
        memset(m, 1, 1 << 20);
        MUST(cuMemcpyHtoD_v2(b, edge - 8192, 8192));   /* ends right below: host memory */
        CHECKF(fkt_dev_all(b, 8192, 1), "a host range ending right below the device addresses copies");
        MUST(cuMemsetD8_v2(b, 0xa5, n));
    }
    if (m != MAP_FAILED) munmap(m, 1 << 20);
    MUST(cuStreamSynchronize(s));
    CHECKF(fkt_dev_all(a, n, 0x5a) && fkt_dev_all(b, n, 0xa5), "nor did the ones running into device addresses");
    MUST(cuStreamDestroy_v2(s));
    MUST(cuMemFree_v2(a));
    MUST(cuMemFree_v2(b));
}

/* ---- host function before a pageable async HtoD ---- */
static unsigned char *hf_buf;
static size_t hf_n;
static void CUDA_CB rewrite(void *ud) { memset(hf_buf, (int)(uintptr_t)ud, hf_n); }

static void hostfn_then_pageable(void)
{
    hf_n = (size_t)32 << 20;
    hf_buf = malloc(hf_n);
    unsigned char *out = malloc(hf_n);
    CUdeviceptr d;
    MUST(cuMemAlloc_v2(&d, hf_n));
    CUstream st[3];
    MUST(cuStreamCreate(&st[0], 0));
    MUST(cuStreamCreate(&st[1], CU_STREAM_NON_BLOCKING));
    st[2] = NULL;
    int mixed = 0, olds = 0, news = 0, tries = 0;
    for (int k = 0; k < 24; k++) {
        CUstream s = st[k % 3];
        memset(hf_buf, 1, hf_n);
        MUST(cuLaunchHostFunc(s, rewrite, (void *)(uintptr_t)2));
        /* Let the function start (or not) before the copy: both orders must come out whole. */
        usleep((useconds_t)(k * 250));
        MUST(cuMemcpyHtoDAsync_v2(d, hf_buf, hf_n, s));
        MUST(cuStreamSynchronize(s));
        MUST(cuMemcpyDtoH_v2(out, d, hf_n));
        tries++;
        if (all(out, hf_n, 1)) olds++;
        else if (all(out, hf_n, 2)) news++;
        else mixed++;
    }
    CHECKF(mixed == 0, "host function before a pageable async HtoD: %d of %d copies mixed old and new "
           "(%d old, %d new)", mixed, tries, olds, news);
    /* The sync form syncs the stream first: the function's bytes. */
    memset(hf_buf, 1, hf_n);
    MUST(cuLaunchHostFunc(NULL, rewrite, (void *)(uintptr_t)3));
    MUST(cuMemcpyHtoD_v2(d, hf_buf, hf_n));
    CHECKF(fkt_dev_all(d, hf_n, 3), "host function before a pageable sync HtoD: the function's bytes");
    MUST(cuStreamDestroy_v2(st[0]));
    MUST(cuStreamDestroy_v2(st[1]));
    MUST(cuMemFree_v2(d));
    free(out);
    free(hf_buf);
}

int main(int argc, char **argv)
{
    if (argc > 1) return scenario(argv[1]);
    faults("write_dev", "a host write to a device address");
    faults("read_freed", "a host read of a freed device address");
    fkt_init();
    devptr_as_host();
    run("ro_read", 0, "violations=0");
    run("ro_dtoh", 1, "landed=0 untouched=1 violations=1");
    run("ro_dtoh_async_sub", 1, "landed=0 untouched=1 violations=1");
    run("ro_unified", 1, "landed=0 untouched=1 violations=1");
    run("ro_still_readonly", 1, "landed=0 untouched=1 violations=1");
    hostfn_then_pageable();
    CHECK(fakecuda_violations() == 0);
    return TEST_SUMMARY();
}
