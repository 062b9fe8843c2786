/* Contract rule 2: a copy the shim moves to its own stream still waits for what the original
 * call waited for, and later work still sees it.
 *   - device work on a blocking created stream, then a legacy sync D2H into a hot buffer (and a
 *     2D and a cuMemcpy one): sees the work; a legacy sync H2D lands after it;
 *   - the same from 4 threads at once, each with its own stream and buffers;
 *   - sync H2D, then legacy-stream device work that reads it (DtoD), then D2H: sees the H2D data;
 *   - per-thread default stream: work, then a _ptds copy sees it; work on it, then a legacy copy
 *     sees it (the per-thread stream is a blocking stream);
 *   - async copies on a stream after device work on that stream see the work.
 * The device work takes 20 ms: a copy that did not wait reads the old contents. */
#define _GNU_SOURCE
#include <pthread.h>
#include "drvtest.h"
#include "fakecuda.h"

CUresult cuMemcpyDtoH_v2_ptds(void *, CUdeviceptr, size_t);
CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr, const void *, size_t);

#define LATE_US 20000u
static const size_t n = 4u << 20;
static unsigned long h2d, d2h, d2d;   /* main thread's copies */
static unsigned long thr_h2d, thr_d2h; /* worker threads' copies (atomic adds) */
static CUcontext ctx;

static int all_equal(const unsigned char *p, size_t len, unsigned char v)
{
    for (size_t i = 0; i < len; i++)
        if (p[i] != v)
            return 0;
    return 1;
}

/* Make p hot as a D2H destination and as an H2D source. */
static void make_hot(unsigned char *p, CUdeviceptr d, unsigned long *hc, unsigned long *dc)
{
    fill_pattern(p, n, 1);
    for (int i = 0; i < 3; i++) {
        CU(cuMemcpyHtoD(d, p, n));
        (*hc)++;
    }
    for (int i = 0; i < 3; i++) {
        CU(cuMemcpyDtoH(p, d, n));
        (*dc)++;
    }
}

/* ---- four threads at once ---- */
struct thr {
    int id;
    int ok;
    pthread_barrier_t *bar;
};

static void *worker(void *arg)
{
    struct thr *t = arg;
    unsigned long hc = 0, dc = 0;
    CU(cuCtxSetCurrent(ctx));
    CUstream bs;
    CUdeviceptr d;
    CU(cuStreamCreate(&bs, 0));
    CU(cuMemAlloc(&d, n));
    unsigned char *p = malloc(n);
    make_hot(p, d, &hc, &dc);
    t->ok = 1;
    for (int round = 0; round < 3; round++) {
        unsigned char v = (unsigned char)(0x50 + t->id * 8 + round);
        pthread_barrier_wait(t->bar);
        CU(fakecuda_launch_write(bs, d, v, n, LATE_US));
        CU(cuMemcpyDtoH(p, d, n));
        dc++;
        if (!all_equal(p, n, v))
            t->ok = 0;
        /* and the other direction: a legacy H2D after the work lands after it */
        fill_pattern(p, n, 300 + (unsigned)t->id * 8 + (unsigned)round);
        CU(fakecuda_launch_write(bs, d, 0xEE, n, LATE_US));
        CU(cuMemcpyHtoD(d, p, n));
        hc++;
        memset(p, 0, n);
        CU(cuMemcpyDtoH(p, d, n));
        dc++;
        if (!check_pattern(p, n, 300 + (unsigned)t->id * 8 + (unsigned)round))
            t->ok = 0;
    }
    CU(cuStreamDestroy(bs));
    CU(cuMemFree(d));
    free(p);
    __atomic_add_fetch(&thr_h2d, hc, __ATOMIC_RELAXED);
    __atomic_add_fetch(&thr_d2h, dc, __ATOMIC_RELAXED);
    return NULL;
}

int main(void)
{
    ctx = drvtest_init();
    printf("mode=%s\n", drvtest_mode());
    CUstream bs, nbs;
    CU(cuStreamCreate(&bs, 0));
    CU(cuStreamCreate(&nbs, CU_STREAM_NON_BLOCKING));
    CUdeviceptr dev, dev2;
    CU(cuMemAlloc(&dev, n));
    CU(cuMemAlloc(&dev2, n));
    unsigned char *hot = malloc(n), *src = malloc(n);
    CHECK(hot && src);
    make_hot(hot, dev, &h2d, &d2h);
    make_hot(src, dev, &h2d, &d2h);
    printf("info: hot registered=%d src registered=%d\n", fakecuda_registered(hot, n), fakecuda_registered(src, n));

    /* ---- blocking stream work, then legacy sync copies ---- */
    CU(fakecuda_launch_write(bs, dev, 0x5A, n, LATE_US));
    CU(cuMemcpyDtoH(hot, dev, n));
    d2h++;
    CHECKF(all_equal(hot, n, 0x5A), "legacy cuMemcpyDtoH after blocking-stream work sees the work");

    fill_pattern(src, n, 7);
    CU(fakecuda_launch_write(bs, dev, 0x5B, n, LATE_US));
    CU(cuMemcpyHtoD(dev, src, n));
    h2d++;
    memset(hot, 0, n);
    CU(cuMemcpyDtoH(hot, dev, n));
    d2h++;
    CHECKF(check_pattern(hot, n, 7), "legacy cuMemcpyHtoD after blocking-stream work lands after it");

    CU(fakecuda_launch_write(bs, dev, 0x5C, n, LATE_US));
    CU(cuMemcpy((CUdeviceptr)hot, dev, n));
    d2h++;
    CHECKF(all_equal(hot, n, 0x5C), "legacy cuMemcpy (unified, D2H) after blocking-stream work sees the work");

    CU(fakecuda_launch_write(bs, dev, 0x5D, n, LATE_US));
    CUDA_MEMCPY2D p;
    memset(&p, 0, sizeof p);
    p.srcMemoryType = CU_MEMORYTYPE_DEVICE;
    p.srcDevice = dev;
    p.srcPitch = 4096;
    p.dstMemoryType = CU_MEMORYTYPE_HOST;
    p.dstHost = hot;
    p.dstPitch = 4096;
    p.WidthInBytes = 4096;
    p.Height = n / 4096;
    CU(cuMemcpy2D(&p));
    d2h++;
    CHECKF(all_equal(hot, n, 0x5D), "legacy cuMemcpy2D D2H after blocking-stream work sees the work");

    /* ---- 4 threads at once ---- */
    {
        pthread_barrier_t bar;
        pthread_barrier_init(&bar, NULL, 4);
        pthread_t th[4];
        struct thr t[4];
        for (int i = 0; i < 4; i++) {
            t[i] = (struct thr){i, 0, &bar};
            pthread_create(&th[i], NULL, worker, &t[i]);
        }
        int ok = 1;
        for (int i = 0; i < 4; i++) {
            pthread_join(th[i], NULL);
            ok &= t[i].ok;
        }
        pthread_barrier_destroy(&bar);
        CHECKF(ok, "4 threads: each legacy copy waits for its own blocking stream's work");
    }

    /* ---- sync H2D, then legacy-stream device work reading it ---- */
    for (unsigned i = 0; i < 3; i++) {
        fill_pattern(src, n, 20 + i);
        CU(cuMemcpyHtoD(dev, src, n));
        h2d++;
        CU(cuMemcpyDtoD(dev2, dev, n));
        d2d++;
        memset(hot, 0, n);
        CU(cuMemcpyDtoH(hot, dev2, n));
        d2h++;
        CHECKF(check_pattern(hot, n, 20 + i), "sync H2D then legacy DtoD sees the H2D data (%u)", i);
    }
    fill_pattern(src, n, 25);
    CU(cuMemcpyHtoD(dev, src, n));
    h2d++;
    CU(cuMemcpyDtoDAsync(dev2, dev, n, NULL));
    d2d++;
    memset(hot, 0, n);
    CU(cuMemcpyDtoH(hot, dev2, n));
    d2h++;
    CHECKF(check_pattern(hot, n, 25), "sync H2D then legacy-stream async DtoD sees the H2D data");
    fill_pattern(src, n, 26);
    CU(cuMemcpyHtoD(dev, src, n));
    h2d++;
    CU(cuMemcpyDtoDAsync(dev2, dev, n, bs));   /* blocking stream: ordered after the legacy stream */
    d2d++;
    CU(cuStreamSynchronize(bs));
    memset(hot, 0, n);
    CU(cuMemcpyDtoH(hot, dev2, n));
    d2h++;
    CHECKF(check_pattern(hot, n, 26), "sync H2D then blocking-stream DtoD sees the H2D data");

    /* ---- per-thread default stream ---- */
    CU(fakecuda_launch_write_ptsz(NULL, dev, 0x6B, n, LATE_US));
    CU(cuMemcpyDtoH_v2_ptds(hot, dev, n));
    d2h++;
    CHECKF(all_equal(hot, n, 0x6B), "per-thread stream work, then cuMemcpyDtoH_v2_ptds sees it");

    fill_pattern(src, n, 30);
    CU(fakecuda_launch_write_ptsz(NULL, dev, 0x6C, n, LATE_US));
    CU(cuMemcpyHtoD_v2_ptds(dev, src, n));
    h2d++;
    memset(hot, 0, n);
    CU(cuMemcpyDtoH_v2_ptds(hot, dev, n));
    d2h++;
    CHECKF(check_pattern(hot, n, 30), "per-thread stream work, then cuMemcpyHtoD_v2_ptds lands after it");

    CU(fakecuda_launch_write_ptsz(NULL, dev, 0x6D, n, LATE_US));
    CU(cuMemcpyDtoH(hot, dev, n));
    d2h++;
    CHECKF(all_equal(hot, n, 0x6D), "per-thread stream work, then a legacy cuMemcpyDtoH sees it");

    /* ---- async copies after work on the same stream ---- */
    CUstream ss[2] = {bs, nbs};
    for (int k = 0; k < 2; k++) {
        const char *kind = k ? "non-blocking" : "blocking";
        CU(fakecuda_launch_write(ss[k], dev, 0x7C, n, LATE_US));
        CU(cuMemcpyDtoHAsync(hot, dev, n, ss[k]));
        d2h++;
        CU(cuStreamSynchronize(ss[k]));
        CHECKF(all_equal(hot, n, 0x7C), "%s stream: async D2H after work on the stream sees it", kind);

        fill_pattern(src, n, 40 + (unsigned)k);
        CU(fakecuda_launch_write(ss[k], dev, 0x7D, n, LATE_US));
        CU(cuMemcpyHtoDAsync(dev, src, n, ss[k]));
        h2d++;
        CU(cuStreamSynchronize(ss[k]));
        memset(hot, 0, n);
        CU(cuMemcpyDtoH(hot, dev, n));
        d2h++;
        CHECKF(check_pattern(hot, n, 40 + (unsigned)k), "%s stream: async H2D after work on the stream lands after it", kind);
    }

    CU(cuCtxSynchronize());
    free(hot);
    free(src);
    CU(cuStreamDestroy(bs));
    CU(cuStreamDestroy(nbs));
    CU(cuMemFree(dev));
    CU(cuMemFree(dev2));
    CHECKF(fakecuda_violations() == 0, "no violations (%lu)", fakecuda_violations());
    printf("EXPECTED_COPIES h2d=%lu d2h=%lu d2d=%lu\n", h2d + thr_h2d, d2h + thr_d2h, d2d);
    return TEST_SUMMARY();
}
