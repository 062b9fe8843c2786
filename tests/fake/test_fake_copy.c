/* The fake driver's copy semantics: pageable snapshots, blocking rules, pinned asynchrony,
 * unified addressing, 2D/3D, memsets, batches, argument errors. */
#include "fk_test.h"
#include <signal.h>
#include <sys/mman.h>

#define N (64 * 1024)

static void fill(unsigned char *p, size_t n, unsigned char v) { memset(p, v, n); }
static int all(const unsigned char *p, size_t n, unsigned char v)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != v) return 0;
    return 1;
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "deref")) {
        fkt_init();
        CUdeviceptr d;
        MUST(cuMemAlloc_v2(&d, 64));
        volatile char c = *(volatile char *)(uintptr_t)d;   /* must fault, as on a GPU */
        (void)c;
        return 0;
    }
    fkt_init();
    CUstream s;
    MUST(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CUdeviceptr d, d2;
    MUST(cuMemAlloc_v2(&d, N));
    MUST(cuMemAlloc_v2(&d2, N));
    unsigned char *pg = malloc(N), *out = malloc(N);
    unsigned char *pin;
    MUST(cuMemHostAlloc((void **)&pin, N, 0));

    /* Sync HtoD pageable: the stream is synced first, the source is staged, the caller may
     * overwrite it at once. */
    fill(pg, N, 1);
    double t0 = fkt_ms();
    MUST(fakecuda_launch_write(NULL, d, 9, N, 100000));
    MUST(cuMemcpyHtoD_v2(d, pg, N));
    CHECKF(fkt_ms() - t0 >= 90, "sync pageable HtoD syncs the stream before copying");
    fill(pg, N, 2);
    MUST(cuMemcpyDtoH_v2(out, d, N));
    CHECKF(all(out, N, 1), "sync pageable HtoD used the source as it was at the call");

    /* Async HtoD pageable: no wait, snapshot. */
    MUST(fakecuda_launch_write(s, d, 9, N, 200000));
    t0 = fkt_ms();
    fill(pg, N, 3);
    MUST(cuMemcpyHtoDAsync_v2(d, pg, N, s));
    CHECKF(fkt_ms() - t0 < 150, "async pageable HtoD returns at once");
    fill(pg, N, 4);
    MUST(cuStreamSynchronize(s));
    MUST(cuMemcpyDtoH_v2(out, d, N));
    CHECKF(all(out, N, 3), "async pageable HtoD snapshot the source");

    /* Async DtoH pageable: blocks until complete. */
    MUST(fakecuda_launch_write(s, d, 5, N, 100000));
    t0 = fkt_ms();
    MUST(cuMemcpyDtoHAsync_v2(out, d, N, s));
    CHECKF(fkt_ms() - t0 >= 90 && all(out, N, 5), "async pageable DtoH blocks until complete");

    /* Async with pinned memory: truly asynchronous both ways. */
    fill(pin, N, 0);
    MUST(fakecuda_launch_write(s, d, 6, N, 100000));
    t0 = fkt_ms();
    MUST(cuMemcpyDtoHAsync_v2(pin, d, N, s));
    CHECKF(fkt_ms() - t0 < 80 && all(pin, N, 0), "async pinned DtoH returns before the data arrives");
    MUST(cuStreamSynchronize(s));
    CHECK(all(pin, N, 6));
    fill(pin, N, 7);
    MUST(fakecuda_launch_write(s, d, 0, N, 100000));
    t0 = fkt_ms();
    MUST(cuMemcpyHtoDAsync_v2(d, pin, N, s));
    CHECKF(fkt_ms() - t0 < 80, "async pinned HtoD returns at once");
    MUST(cuStreamSynchronize(s));
    CHECK(fkt_dev_all(d, N, 7));

    /* Sync HtoD pinned: returns when complete (behind earlier legacy work). */
    fill(pin, N, 8);
    MUST(fakecuda_launch_write(NULL, d, 0, N, 100000));
    t0 = fkt_ms();
    MUST(cuMemcpyHtoD_v2(d, pin, N));
    CHECKF(fkt_ms() - t0 >= 90, "sync pinned HtoD returns when complete");
    CHECK(fkt_dev_all(d, N, 8));

    /* Sync DtoD: no host synchronization. */
    MUST(fakecuda_launch_write(NULL, d2, 0, N, 200000));
    t0 = fkt_ms();
    MUST(cuMemcpyDtoD_v2(d2, d, N));
    CHECKF(fkt_ms() - t0 < 150, "sync DtoD does not block the host");
    CHECK(fkt_dev_all(d2, N, 8));

    /* Unified addressing: cuMemcpy classifies each pointer. */
    fill(pg, N, 0x21);
    MUST(cuMemcpy(d, (CUdeviceptr)(uintptr_t)pg, N));
    MUST(cuMemcpy(d2, d, N));
    MUST(cuMemcpy((CUdeviceptr)(uintptr_t)out, d2, N));
    CHECKF(all(out, N, 0x21), "cuMemcpy HtoD, DtoD, DtoH by address");
    fill(pg, N, 0x22);
    MUST(cuMemcpy((CUdeviceptr)(uintptr_t)out, (CUdeviceptr)(uintptr_t)pg, N));
    CHECKF(all(out, N, 0x22), "cuMemcpy HtoH");
    MUST(cuMemcpyAsync_ptsz((CUdeviceptr)(uintptr_t)out, d2, N, NULL));
    CHECKF(all(out, N, 0x21), "cuMemcpyAsync_ptsz DtoH pageable completes before return");

    /* 2D: pitches and offsets honoured. */
    unsigned char h2[16 * 4], back[32 * 4];
    for (int i = 0; i < 64; i++) h2[i] = (unsigned char)i;
    MUST(cuMemsetD8_v2(d, 0xee, 128));
    CUDA_MEMCPY2D p2 = { 0 };
    p2.srcMemoryType = CU_MEMORYTYPE_HOST; p2.srcHost = h2; p2.srcPitch = 16; p2.srcXInBytes = 2;
    p2.dstMemoryType = CU_MEMORYTYPE_DEVICE; p2.dstDevice = d; p2.dstPitch = 32; p2.dstXInBytes = 1;
    p2.WidthInBytes = 10; p2.Height = 4;
    MUST(cuMemcpy2D_v2(&p2));
    MUST(cuMemcpyDtoH_v2(back, d, 128));
    int ok2 = 1;
    for (int y = 0; y < 4; y++)
        for (int x = 0; x < 32; x++) {
            unsigned char want = (x >= 1 && x < 11) ? (unsigned char)(y * 16 + 2 + x - 1) : 0xee;
            if (back[y * 32 + x] != want) ok2 = 0;
        }
    CHECKF(ok2, "cuMemcpy2D honours pitches and X offsets");
    p2.srcPitch = 8;
    EXPECT_RC(cuMemcpy2D_v2(&p2), CUDA_ERROR_INVALID_VALUE);
    p2.srcPitch = 16;
    p2.dstMemoryType = CU_MEMORYTYPE_ARRAY;
    EXPECT_RC(cuMemcpy2DUnaligned_v2(&p2), CUDA_ERROR_NOT_SUPPORTED);
    p2.dstMemoryType = CU_MEMORYTYPE_UNIFIED;
    p2.dstDevice = d + 200;
    MUST(cuMemcpy2DAsync_v2(&p2, s));
    MUST(cuStreamSynchronize(s));
    p2.dstPitch = N;   /* 4 rows of pitch N run past the allocation */
    EXPECT_RC(cuMemcpy2D_v2(&p2), CUDA_ERROR_INVALID_VALUE);

    /* 3D: a 4x3x2 box. */
    unsigned char box[2][3][4], box2[2][3][4];
    for (int i = 0; i < 24; i++) ((unsigned char *)box)[i] = (unsigned char)(100 + i);
    CUDA_MEMCPY3D p3 = { 0 };
    p3.srcMemoryType = CU_MEMORYTYPE_HOST; p3.srcHost = box; p3.srcPitch = 4; p3.srcHeight = 3;
    p3.dstMemoryType = CU_MEMORYTYPE_DEVICE; p3.dstDevice = d; p3.dstPitch = 64; p3.dstHeight = 8;
    p3.WidthInBytes = 4; p3.Height = 3; p3.Depth = 2;
    MUST(cuMemcpy3D_v2(&p3));
    CUDA_MEMCPY3D q3 = p3;
    q3.srcMemoryType = CU_MEMORYTYPE_DEVICE; q3.srcDevice = d; q3.srcPitch = 64; q3.srcHeight = 8; q3.srcHost = NULL;
    q3.dstMemoryType = CU_MEMORYTYPE_HOST; q3.dstHost = box2; q3.dstPitch = 4; q3.dstHeight = 3; q3.dstDevice = 0;
    MUST(cuMemcpy3D_v2(&q3));
    CHECKF(!memcmp(box, box2, sizeof box), "cuMemcpy3D round trip through a padded device box");

    /* Memsets. */
    MUST(cuMemsetD32_v2(d, 0x01020304u, 4));
    MUST(cuMemcpyDtoH_v2(out, d, 16));
    unsigned int w[4];
    memcpy(w, out, 16);
    CHECK(w[0] == 0x01020304u && w[3] == 0x01020304u);
    EXPECT_RC(cuMemsetD32_v2(d + 1, 0, 4), CUDA_ERROR_INVALID_VALUE);
    MUST(cuMemsetD8Async(d, 0x5a, N, s));
    MUST(cuStreamSynchronize(s));
    CHECK(fkt_dev_all(d, N, 0x5a));

    /* Batch (13.0 signature). */
    CUdeviceptr dsts[2] = { d, (CUdeviceptr)(uintptr_t)out };
    CUdeviceptr srcs[2] = { (CUdeviceptr)(uintptr_t)pin, d2 };
    size_t sizes[2] = { 256, 256 };
    CUmemcpyAttributes at = { 0 };
    at.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
    size_t idx = 0;
    fill(pin, 256, 0x31);
    MUST(cuMemcpyBatchAsync_v2(dsts, srcs, sizes, 2, &at, &idx, 1, s));
    MUST(cuStreamSynchronize(s));
    CHECKF(fkt_dev_all(d, 256, 0x31) && all(out, 256, 0x21), "cuMemcpyBatchAsync_v2 runs every copy");
    EXPECT_RC(cuMemcpyBatchAsync_v2(dsts, srcs, sizes, 2, &at, &idx, 1, NULL), CUDA_ERROR_INVALID_VALUE);

    /* Argument errors. */
    EXPECT_RC(cuMemcpyHtoD_v2(d, pg, N + 1), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuMemcpyHtoD_v2(d + 1, pg, N), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuMemcpyHtoD_v2(d, NULL, 16), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuMemcpyHtoD_v2(0, pg, 16), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuMemcpyDtoH_v2(out, (CUdeviceptr)(uintptr_t)pg, 16), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuMemcpyHtoDAsync_v2(d, pg, 16, (CUstream)(uintptr_t)0x1234), CUDA_ERROR_INVALID_HANDLE);
    EXPECT_RC(cuMemcpyHtoD_v2(d, pg, 0), CUDA_SUCCESS);
    CUdeviceptr d3;
    MUST(cuMemAlloc_v2(&d3, 64));
    MUST(cuMemFree_v2(d3));
    EXPECT_RC(cuMemcpyHtoD_v2(d3, pg, 16), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuMemFree_v2(d3), CUDA_ERROR_INVALID_VALUE);

    /* Device pointers are not host-dereferenceable. */
    char buf[4096];
    int st = fkt_run_self("deref", NULL, buf, sizeof buf);
    CHECKF(st == 128 + SIGSEGV || (st != 0 && strstr(buf, "SEGV")), "host dereference of a device pointer faults (status %d)", st);

    MUST(cuMemFreeHost(pin));
    CHECK(fakecuda_violations() == 0);
    free(pg);
    free(out);
    return TEST_SUMMARY();
}
