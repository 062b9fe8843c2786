/* Contract rule 1: memory the shim promoted is still pageable memory for the program.
 *   - cuMemcpyHtoDAsync (and _ptsz, and 2D async) from a hot buffer: the source may be overwritten
 *     the moment the call returns; the device still gets the old content;
 *   - cuMemcpyDtoHAsync (and _ptsz, and 2D async) into a hot buffer: the data is there when the
 *     call returns, before any synchronization;
 *   - sync cuMemcpyHtoD (legacy and _ptds) from a hot buffer, source overwritten right after:
 *     the device has the old content.
 * Device work queued ahead of each copy (20 ms) makes any copy that was left in flight run late,
 * after the overwrite.  With PINSHIM_TRUST_ASYNC=1 (the documented unsafe opt-in) async copies
 * from promoted memory are allowed to stay in flight: there the program only checks the data
 * after synchronizing, as a program that trusts its buffers would. */
#define _GNU_SOURCE
#include "drvtest.h"
#include "fakecuda.h"

CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr, const void *, size_t, CUstream);
CUresult cuMemcpyDtoHAsync_v2_ptsz(void *, CUdeviceptr, size_t, CUstream);
CUresult cuMemcpy2DAsync_v2_ptsz(const CUDA_MEMCPY2D *, CUstream);
CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr, const void *, size_t);
CUresult cuStreamSynchronize_ptsz(CUstream);

#define LATE_US 20000u
static const size_t n = 8u << 20;
static unsigned long h2d, d2h, d2d;
static CUdeviceptr dev, scratch;
static unsigned char *check;   /* pinned read-back */
static int trust;

/* The device holds the pattern `seed` (read back through pinned memory, legacy stream). */
static int device_has(unsigned seed)
{
    memset(check, 0, n);
    CU(cuMemcpyDtoH(check, dev, n));
    d2h++;
    return check_pattern(check, n, seed);
}

static void set_device(unsigned seed)
{
    fill_pattern(check, n, seed);
    CU(cuMemcpyHtoD(dev, check, n));
    h2d++;
}

/* Make a buffer hot: several copies in its direction. */
static void make_hot_h2d(unsigned char *p)
{
    for (unsigned i = 0; i < 5; i++) {
        fill_pattern(p, n, 200 + i);
        CU(cuMemcpyHtoD(dev, p, n));
        h2d++;
    }
    drvtest_wait_registered(p, n);
}

static void make_hot_d2h(unsigned char *p)
{
    set_device(210);
    for (unsigned i = 0; i < 5; i++) {
        CU(cuMemcpyDtoH(p, dev, n));
        d2h++;
    }
    drvtest_wait_registered(p, n);
}

/* Queue LATE_US of device work on s ahead of the next copy (ptsz: s as a per-thread handle). */
static void delay_stream(CUstream s, int ptsz)
{
    if (ptsz)
        CU(fakecuda_launch_write_ptsz(s, scratch, 0x33, 4096, LATE_US));
    else
        CU(fakecuda_launch_write(s, scratch, 0x33, 4096, LATE_US));
}

typedef CUresult (*htod_async_fn)(CUdeviceptr, const void *, size_t, CUstream);
typedef CUresult (*dtoh_async_fn)(void *, CUdeviceptr, size_t, CUstream);

static void async_h2d_case(const char *name, htod_async_fn fn, unsigned char *hot, CUstream s, int ptsz,
                           unsigned seed)
{
    set_device(seed + 100);
    fill_pattern(hot, n, seed);
    delay_stream(s, ptsz);
    CU(fn(dev, hot, n, s));
    h2d++;
    if (!trust)
        fill_pattern(hot, n, seed + 1);   /* the program may reuse a pageable source at once */
    if (ptsz)
        CU(cuStreamSynchronize_ptsz(s));
    else
        CU(cuStreamSynchronize(s));
    CHECKF(device_has(seed), "%s from a hot buffer: the device has the content at the call%s", name,
           trust ? " (trust: checked after sync)" : ", not the overwrite");
}

static void async_d2h_case(const char *name, dtoh_async_fn fn, unsigned char *hot, CUstream s, int ptsz,
                           unsigned seed)
{
    set_device(seed);
    memset(hot, 0, n);
    delay_stream(s, ptsz);
    CU(fn(hot, dev, n, s));
    d2h++;
    if (!trust) {
        CHECKF(check_pattern(hot, n, seed), "%s into a hot buffer: the data is there when the call returns", name);
    }
    if (ptsz)
        CU(cuStreamSynchronize_ptsz(s));
    else
        CU(cuStreamSynchronize(s));
    CHECKF(check_pattern(hot, n, seed), "%s into a hot buffer: the data is there after sync", name);
}

/* 2D: a 4000-byte-wide window of 2048 rows with a 4096-byte pitch on both sides. */
#define W2 4000u
#define P2 4096u
#define H2 2048u

static int rows_match(const unsigned char *a, const unsigned char *b)
{
    for (size_t y = 0; y < H2; y++)
        if (memcmp(a + y * P2, b + y * P2, W2) != 0)
            return 0;
    return 1;
}

static CUDA_MEMCPY2D desc_h2d(const void *host)
{
    CUDA_MEMCPY2D p;
    memset(&p, 0, sizeof p);
    p.srcMemoryType = CU_MEMORYTYPE_HOST;
    p.srcHost = host;
    p.srcPitch = P2;
    p.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    p.dstDevice = dev;
    p.dstPitch = P2;
    p.WidthInBytes = W2;
    p.Height = H2;
    return p;
}

static CUDA_MEMCPY2D desc_d2h(void *host)
{
    CUDA_MEMCPY2D p;
    memset(&p, 0, sizeof p);
    p.srcMemoryType = CU_MEMORYTYPE_DEVICE;
    p.srcDevice = dev;
    p.srcPitch = P2;
    p.dstMemoryType = CU_MEMORYTYPE_HOST;
    p.dstHost = host;
    p.dstPitch = P2;
    p.WidthInBytes = W2;
    p.Height = H2;
    return p;
}

static void case_2d(const char *name, int ptsz, unsigned char *hot, unsigned char *hot2, unsigned char *ref,
                    CUstream s, unsigned seed)
{
    /* H2D */
    set_device(seed + 50);
    fill_pattern(hot, n, seed);
    memcpy(ref, hot, n);
    CUDA_MEMCPY2D p = desc_h2d(hot);
    delay_stream(s, ptsz);
    CU(ptsz ? cuMemcpy2DAsync_v2_ptsz(&p, s) : cuMemcpy2DAsync(&p, s));
    h2d++;
    if (!trust)
        fill_pattern(hot, n, seed + 1);
    CU(ptsz ? cuStreamSynchronize_ptsz(s) : cuStreamSynchronize(s));
    memset(check, 0, n);
    CU(cuMemcpyDtoH(check, dev, n));
    d2h++;
    CHECKF(rows_match(check, ref), "%s H2D from a hot buffer: the device has the rows at the call", name);

    /* D2H */
    set_device(seed + 2);
    memset(hot2, 0, n);
    p = desc_d2h(hot2);
    delay_stream(s, ptsz);
    CU(ptsz ? cuMemcpy2DAsync_v2_ptsz(&p, s) : cuMemcpy2DAsync(&p, s));
    d2h++;
    fill_pattern(ref, n, seed + 2);
    if (!trust)
        CHECKF(rows_match(hot2, ref), "%s D2H into a hot buffer: the rows are there when the call returns", name);
    CU(ptsz ? cuStreamSynchronize_ptsz(s) : cuStreamSynchronize(s));
    CHECKF(rows_match(hot2, ref), "%s D2H into a hot buffer: the rows are there after sync", name);
}

/* Other entry points and shapes: a small copy inside the hot buffer, cuMemcpyAsync (unified
 * addressing), cuMemcpy3DAsync, and cuMemcpyBatchAsync (stream-ordered source access, which the
 * checking fake treats like cuMemcpyAsync: a pageable source is read during the call and a
 * pageable destination is written before it returns).  Batch copies are left out of
 * EXPECTED_COPIES: the shim counts them apart. */
static void other_entry_points(unsigned char *hot, unsigned char *hot2, CUstream s)
{
    /* small, at an odd offset inside the promoted buffer */
    const size_t off = (1u << 20) + 123, sm = 4096;
    set_device(140);
    fill_pattern(hot, n, 141);
    delay_stream(s, 0);
    CU(cuMemcpyHtoDAsync(dev + off, hot + off, sm, s));
    h2d++;
    if (!trust)
        fill_pattern(hot, n, 142);
    CU(cuStreamSynchronize(s));
    memset(check, 0, n);
    CU(cuMemcpyDtoH(check, dev, n));
    d2h++;
    unsigned char *ref = malloc(n);
    fill_pattern(ref, n, 141);
    int ok = memcmp(check + off, ref + off, sm) == 0;
    fill_pattern(ref, n, 140);
    ok &= memcmp(check, ref, off) == 0;
    CHECKF(ok, "4 KiB async H2D from inside a hot buffer: the device has the content at the call");

    set_device(143);
    memset(hot2, 0, n);
    delay_stream(s, 0);
    CU(cuMemcpyDtoHAsync(hot2 + off, dev + off, sm, s));
    d2h++;
    fill_pattern(ref, n, 143);
    if (!trust)
        CHECKF(memcmp(hot2 + off, ref + off, sm) == 0, "4 KiB async D2H into a hot buffer: there when the call returns");
    CU(cuStreamSynchronize(s));
    CHECKF(memcmp(hot2 + off, ref + off, sm) == 0, "4 KiB async D2H into a hot buffer: there after sync");

    /* cuMemcpyAsync, unified addressing */
    set_device(144);
    fill_pattern(hot, n, 145);
    delay_stream(s, 0);
    CU(cuMemcpyAsync(dev, (CUdeviceptr)hot, n, s));
    h2d++;
    if (!trust)
        fill_pattern(hot, n, 146);
    CU(cuStreamSynchronize(s));
    CHECKF(device_has(145), "cuMemcpyAsync from a hot buffer: the device has the content at the call");
    set_device(147);
    memset(hot2, 0, n);
    delay_stream(s, 0);
    CU(cuMemcpyAsync((CUdeviceptr)hot2, dev, n, s));
    d2h++;
    if (!trust)
        CHECKF(check_pattern(hot2, n, 147), "cuMemcpyAsync into a hot buffer: there when the call returns");
    CU(cuStreamSynchronize(s));
    CHECKF(check_pattern(hot2, n, 147), "cuMemcpyAsync into a hot buffer: there after sync");

    /* cuMemcpy3DAsync: 64 rows x 16 slices of 4000 bytes, pitch 4096 */
    CUDA_MEMCPY3D p3;
    memset(&p3, 0, sizeof p3);
    p3.srcMemoryType = CU_MEMORYTYPE_HOST;
    p3.srcHost = hot;
    p3.srcPitch = 4096;
    p3.srcHeight = 64;
    p3.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    p3.dstDevice = dev;
    p3.dstPitch = 4096;
    p3.dstHeight = 64;
    p3.WidthInBytes = 4000;
    p3.Height = 64;
    p3.Depth = 16;
    set_device(148);
    fill_pattern(hot, n, 149);
    memcpy(ref, hot, n);
    delay_stream(s, 0);
    CU(cuMemcpy3DAsync(&p3, s));
    h2d++;
    if (!trust)
        fill_pattern(hot, n, 150);
    CU(cuStreamSynchronize(s));
    memset(check, 0, n);
    CU(cuMemcpyDtoH(check, dev, n));
    d2h++;
    ok = 1;
    for (size_t r = 0; r < 64 * 16; r++)
        ok &= memcmp(check + r * 4096, ref + r * 4096, 4000) == 0;
    CHECKF(ok, "cuMemcpy3DAsync from a hot buffer: the device has the content at the call");

    CUDA_MEMCPY3D q3 = p3;
    q3.srcMemoryType = CU_MEMORYTYPE_DEVICE;
    q3.srcHost = NULL;
    q3.srcDevice = dev;
    q3.dstMemoryType = CU_MEMORYTYPE_HOST;
    q3.dstDevice = 0;
    q3.dstHost = hot2;
    set_device(151);
    fill_pattern(ref, n, 151);
    memset(hot2, 0, n);
    delay_stream(s, 0);
    CU(cuMemcpy3DAsync(&q3, s));
    d2h++;
    if (!trust) {
        ok = 1;
        for (size_t r = 0; r < 64 * 16; r++)
            ok &= memcmp(hot2 + r * 4096, ref + r * 4096, 4000) == 0;
        CHECKF(ok, "cuMemcpy3DAsync into a hot buffer: there when the call returns");
    }
    CU(cuStreamSynchronize(s));

    /* cuMemcpyBatchAsync, stream-ordered source access */
    CUmemcpyAttributes attr;
    memset(&attr, 0, sizeof attr);
    attr.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
    size_t idx = 0, size = n;
    set_device(152);
    fill_pattern(hot, n, 153);
    CUdeviceptr dsts[1] = {dev}, srcs[1] = {(CUdeviceptr)hot};
    delay_stream(s, 0);
    CU(cuMemcpyBatchAsync(dsts, srcs, &size, 1, &attr, &idx, 1, s));
    if (!trust)
        fill_pattern(hot, n, 154);
    CU(cuStreamSynchronize(s));
    CHECKF(device_has(153), "cuMemcpyBatchAsync from a hot buffer: the device has the content at the call");
    set_device(155);
    memset(hot2, 0, n);
    dsts[0] = (CUdeviceptr)hot2;
    srcs[0] = dev;
    delay_stream(s, 0);
    CU(cuMemcpyBatchAsync(dsts, srcs, &size, 1, &attr, &idx, 1, s));
    if (!trust)
        CHECKF(check_pattern(hot2, n, 155), "cuMemcpyBatchAsync into a hot buffer: there when the call returns");
    CU(cuStreamSynchronize(s));
    CHECKF(check_pattern(hot2, n, 155), "cuMemcpyBatchAsync into a hot buffer: there after sync");
    free(ref);
}

int main(void)
{
    drvtest_init();
    trust = drvtest_trust_async();
    printf("mode=%s trust=%d\n", drvtest_mode(), trust);
    CU(cuMemAlloc(&dev, n));
    CU(cuMemAlloc(&scratch, 4096));
    CU(cuMemHostAlloc((void **)&check, n, 0));
    CUstream s, nb;
    CU(cuStreamCreate(&s, 0));
    CU(cuStreamCreate(&nb, CU_STREAM_NON_BLOCKING));

    unsigned char *hot = malloc(n), *hot2 = malloc(n), *ref = malloc(n);
    CHECK(hot && hot2 && ref);
    make_hot_h2d(hot);
    make_hot_d2h(hot2);
    printf("info: hot H2D source registered=%d, hot D2H destination registered=%d\n",
           fakecuda_registered(hot, n), fakecuda_registered(hot2, n));
    if (drvtest_expect_promotion(n))
        CHECKF(fakecuda_registered(hot, n) && fakecuda_registered(hot2, n),
               "both hot buffers are promoted (the cases below test promoted memory)");

    /* 1D async, legacy entry points, created streams (blocking and non-blocking) */
    async_h2d_case("cuMemcpyHtoDAsync (blocking stream)", cuMemcpyHtoDAsync, hot, s, 0, 1);
    async_h2d_case("cuMemcpyHtoDAsync (non-blocking stream)", cuMemcpyHtoDAsync, hot, nb, 0, 3);
    async_d2h_case("cuMemcpyDtoHAsync (blocking stream)", cuMemcpyDtoHAsync, hot2, s, 0, 5);
    async_d2h_case("cuMemcpyDtoHAsync (non-blocking stream)", cuMemcpyDtoHAsync, hot2, nb, 0, 7);
    /* the legacy stream itself */
    async_h2d_case("cuMemcpyHtoDAsync (legacy stream)", cuMemcpyHtoDAsync, hot, NULL, 0, 9);
    async_d2h_case("cuMemcpyDtoHAsync (legacy stream)", cuMemcpyDtoHAsync, hot2, NULL, 0, 11);

    /* per-thread entry points: a created stream, and the per-thread default stream */
    async_h2d_case("cuMemcpyHtoDAsync_v2_ptsz (created stream)", cuMemcpyHtoDAsync_v2_ptsz, hot, s, 1, 13);
    async_h2d_case("cuMemcpyHtoDAsync_v2_ptsz (per-thread stream)", cuMemcpyHtoDAsync_v2_ptsz, hot, NULL, 1, 15);
    async_d2h_case("cuMemcpyDtoHAsync_v2_ptsz (created stream)", cuMemcpyDtoHAsync_v2_ptsz, hot2, s, 1, 17);
    async_d2h_case("cuMemcpyDtoHAsync_v2_ptsz (per-thread stream)", cuMemcpyDtoHAsync_v2_ptsz, hot2, NULL, 1, 19);

    /* 2D async */
    case_2d("cuMemcpy2DAsync", 0, hot, hot2, ref, s, 21);
    case_2d("cuMemcpy2DAsync_v2_ptsz", 1, hot, hot2, ref, NULL, 24);

    other_entry_points(hot, hot2, s);

    /* sync H2D from the promoted buffer, overwritten right after the call */
    set_device(130);
    fill_pattern(hot, n, 27);
    delay_stream(s, 0);   /* blocking stream: the legacy copy waits for it */
    CU(cuMemcpyHtoD(dev, hot, n));
    h2d++;
    fill_pattern(hot, n, 28);
    CHECKF(device_has(27), "sync cuMemcpyHtoD from a hot buffer, source overwritten at once: the device has the old data");

    set_device(131);
    fill_pattern(hot, n, 29);
    delay_stream(NULL, 1);
    CU(cuMemcpyHtoD_v2_ptds(dev, hot, n));
    h2d++;
    fill_pattern(hot, n, 30);
    CU(cuStreamSynchronize(CU_STREAM_PER_THREAD));
    CHECKF(device_has(29), "sync cuMemcpyHtoD_v2_ptds from a hot buffer, source overwritten at once: the device has the old data");

    /* a sync D2H into the hot destination is complete at return */
    set_device(32);
    memset(hot2, 0, n);
    delay_stream(s, 0);
    CU(cuMemcpyDtoH(hot2, dev, n));
    d2h++;
    CHECKF(check_pattern(hot2, n, 32), "sync cuMemcpyDtoH into a hot buffer: complete at return");

    CU(cuCtxSynchronize());
    free(hot);
    free(hot2);
    free(ref);
    CU(cuStreamDestroy(s));
    CU(cuStreamDestroy(nb));
    CU(cuMemFreeHost(check));
    CU(cuMemFree(dev));
    CU(cuMemFree(scratch));
    CHECKF(fakecuda_violations() == 0, "no violations (%lu)", fakecuda_violations());
    printf("EXPECTED_COPIES h2d=%lu d2h=%lu d2d=%lu\n", h2d, d2h, d2d);
    return TEST_SUMMARY();
}
