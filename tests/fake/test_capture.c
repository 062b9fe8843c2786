/* Contract rule 6: while a stream captures a graph, the shim changes nothing.
 *   - global and thread-local capture on a created blocking stream, and a global capture of the
 *     per-thread default stream through the _ptsz entry points: async H2D from a hot (promoted)
 *     buffer and from a warm pageable buffer copied again and again, async D2H into
 *     cuMemHostAlloc memory; cuStreamEndCapture succeeds (the capture was not invalidated by a
 *     register, an event on the legacy stream or a rewrite); no bytes get registered during the
 *     capture; the instantiated graph launches and moves the right data;
 *   - the program unmaps, and discards (MADV_DONTNEED), promoted mappings during a global
 *     capture: without the shim no driver call happens and the capture stays valid; with it the
 *     registration must still go (rule 4) without invalidating the capture. */
#define _GNU_SOURCE
#include <sys/mman.h>
#include "drvtest.h"
#include "fakecuda.h"

CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr, const void *, size_t, CUstream);
CUresult cuMemcpyDtoHAsync_v2_ptsz(void *, CUdeviceptr, size_t, CUstream);
CUresult cuStreamBeginCapture_v2_ptsz(CUstream, CUstreamCaptureMode);
CUresult cuStreamEndCapture_ptsz(CUstream, CUgraph *);
CUresult cuGraphLaunch_ptsz(CUgraphExec, CUstream);
CUresult cuStreamSynchronize_ptsz(CUstream);

static const size_t n = 4u << 20;
static CUdeviceptr dev_a, dev_b;
static unsigned char *hot, *warm, *pinned, *check;

#define EXPECT(call, want)                                                                   \
    do {                                                                                     \
        CUresult r_ = (call);                                                                \
        CHECKF(r_ == (want), "%s -> %s (got %d)", #call, #want, (int)r_);                    \
    } while (0)

static unsigned long register_calls(void)
{
    return fakecuda_calls("cuMemHostRegister_v2") + fakecuda_calls("cuMemHostRegister") +
           fakecuda_calls("cuMemHostUnregister");
}

/* Capture the copies on s (ptsz: through the per-thread entry points), end, launch, check. */
static void capture_case(const char *name, CUstream s, CUstreamCaptureMode mode, int ptsz, unsigned seed)
{
    fill_pattern(hot, n, seed);
    fill_pattern(warm, n, seed + 1);
    memset(pinned, 0, n);
    size_t bytes0 = fakecuda_registered_bytes();
    unsigned long calls0 = register_calls();
    int unchanged = 1;

    EXPECT(ptsz ? cuStreamBeginCapture_v2_ptsz(s, mode) : cuStreamBeginCapture_v2(s, mode), CUDA_SUCCESS);
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    CU(ptsz ? cuStreamIsCapturing_ptsz(s, &st) : cuStreamIsCapturing(s, &st));
    CHECKF(st == CU_STREAM_CAPTURE_STATUS_ACTIVE, "%s: capturing", name);
    EXPECT(ptsz ? cuMemcpyHtoDAsync_v2_ptsz(dev_a, hot, n, s) : cuMemcpyHtoDAsync(dev_a, hot, n, s), CUDA_SUCCESS);
    unchanged &= fakecuda_registered_bytes() == bytes0;
    for (int i = 0; i < 4; i++) {
        EXPECT(ptsz ? cuMemcpyHtoDAsync_v2_ptsz(dev_b, warm, n, s) : cuMemcpyHtoDAsync(dev_b, warm, n, s),
               CUDA_SUCCESS);
        unchanged &= fakecuda_registered_bytes() == bytes0;
    }
    EXPECT(ptsz ? cuMemcpyDtoHAsync_v2_ptsz(pinned, dev_a, n, s) : cuMemcpyDtoHAsync(pinned, dev_a, n, s),
           CUDA_SUCCESS);
    unchanged &= fakecuda_registered_bytes() == bytes0;
    CU(ptsz ? cuStreamIsCapturing_ptsz(s, &st) : cuStreamIsCapturing(s, &st));
    CHECKF(st == CU_STREAM_CAPTURE_STATUS_ACTIVE, "%s: still capturing (not invalidated) before the end", name);
    CUgraph g = NULL;
    CUresult r = ptsz ? cuStreamEndCapture_ptsz(s, &g) : cuStreamEndCapture(s, &g);
    CHECKF(r == CUDA_SUCCESS && g != NULL, "%s: cuStreamEndCapture succeeds (got %d)", name, (int)r);
    CHECKF(unchanged && fakecuda_registered_bytes() == bytes0, "%s: no bytes registered during the capture", name);
    CHECKF(register_calls() == calls0, "%s: no register or unregister during the capture", name);
    if (r != CUDA_SUCCESS || !g)
        return;

    CUgraphExec ge;
    EXPECT(cuGraphInstantiateWithFlags(&ge, g, 0), CUDA_SUCCESS);
    EXPECT(ptsz ? cuGraphLaunch_ptsz(ge, s) : cuGraphLaunch(ge, s), CUDA_SUCCESS);
    CU(ptsz ? cuStreamSynchronize_ptsz(s) : cuStreamSynchronize(s));
    CHECKF(check_pattern(pinned, n, seed), "%s: the graph's D2H into pinned memory has the hot buffer's data", name);
    memset(check, 0, n);
    CU(cuMemcpyDtoH(check, dev_b, n));
    CHECKF(check_pattern(check, n, seed + 1), "%s: the graph's H2D from the warm buffer landed", name);
    CU(cuGraphExecDestroy(ge));
    CU(cuGraphDestroy(g));

    /* after the capture the buffers work as ever */
    fill_pattern(warm, n, seed + 2);
    for (int i = 0; i < 3; i++)
        CU(cuMemcpyHtoD(dev_b, warm, n));
    memset(check, 0, n);
    CU(cuMemcpyDtoH(check, dev_b, n));
    CHECKF(check_pattern(check, n, seed + 2), "%s: copies after the capture are correct", name);
}

static int all_zero_after_dontneed(const unsigned char *p)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return 0;
    return 1;
}

/* A promoted mapping is unmapped, another discarded, while a global capture is active. */
static void unmap_during_capture(CUstream s)
{
    const int prot = PROT_READ | PROT_WRITE, fl = MAP_PRIVATE | MAP_ANONYMOUS;
    unsigned char *m1 = mmap(NULL, n, prot, fl, -1, 0), *m2 = mmap(NULL, n, prot, fl, -1, 0);
    CHECK(m1 != MAP_FAILED && m2 != MAP_FAILED);
    fill_pattern(m1, n, 60);
    fill_pattern(m2, n, 61);
    for (int i = 0; i < 4; i++) {
        CU(cuMemcpyHtoD(dev_a, m1, n));
        CU(cuMemcpyHtoD(dev_b, m2, n));
    }
    printf("info: mappings promoted: %d %d\n", fakecuda_registered(m1, n), fakecuda_registered(m2, n));
    fill_pattern(hot, n, 62);
    EXPECT(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    EXPECT(cuMemcpyHtoDAsync(dev_a, hot, n, s), CUDA_SUCCESS);
    CHECK(munmap(m1, n) == 0);
    CHECKF(!fakecuda_registered(m1, n), "munmap during a capture: the registration is gone");
    CHECK(madvise(m2, n, MADV_DONTNEED) == 0);
    CHECKF(!fakecuda_registered(m2, n), "MADV_DONTNEED during a capture: the registration is gone");
    EXPECT(cuMemcpyDtoHAsync(pinned, dev_a, n, s), CUDA_SUCCESS);
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    CU(cuStreamIsCapturing(s, &st));
    CHECKF(st == CU_STREAM_CAPTURE_STATUS_ACTIVE, "munmap/madvise during a global capture: the capture is not invalidated");
    CUgraph g = NULL;
    CUresult r = cuStreamEndCapture(s, &g);
    CHECKF(r == CUDA_SUCCESS && g, "munmap/madvise during a global capture: cuStreamEndCapture succeeds (got %d)", (int)r);
    if (r == CUDA_SUCCESS && g) {
        CUgraphExec ge;
        CU(cuGraphInstantiateWithFlags(&ge, g, 0));
        memset(pinned, 0, n);
        CU(cuGraphLaunch(ge, s));
        CU(cuStreamSynchronize(s));
        CHECKF(check_pattern(pinned, n, 62), "the graph captured around the munmap moves the right data");
        CU(cuGraphExecDestroy(ge));
        CU(cuGraphDestroy(g));
    }
    CHECKF(all_zero_after_dontneed(m2), "MADV_DONTNEED during a capture: pages read zero");
    munmap(m2, n);
}

int main(void)
{
    drvtest_init();
    printf("mode=%s\n", drvtest_mode());
    CU(cuMemAlloc(&dev_a, n));
    CU(cuMemAlloc(&dev_b, n));
    CU(cuMemHostAlloc((void **)&pinned, n, 0));
    CU(cuMemHostAlloc((void **)&check, n, 0));
    hot = malloc(n);
    warm = malloc(n);
    fill_pattern(hot, n, 1);
    for (int i = 0; i < 4; i++)
        CU(cuMemcpyHtoD(dev_a, hot, n));
    drvtest_wait_registered(hot, n);
    printf("info: hot registered=%d\n", fakecuda_registered(hot, n));
    if (drvtest_expect_promotion(n))
        CHECKF(fakecuda_registered(hot, n), "the hot buffer is promoted before the captures");

    CUstream s, s2;
    CU(cuStreamCreate(&s, 0));
    CU(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
    capture_case("global capture, blocking stream", s, CU_STREAM_CAPTURE_MODE_GLOBAL, 0, 10);
    capture_case("thread-local capture, blocking stream", s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL, 0, 20);
    capture_case("global capture, non-blocking stream", s2, CU_STREAM_CAPTURE_MODE_GLOBAL, 0, 30);
    capture_case("relaxed capture, blocking stream", s, CU_STREAM_CAPTURE_MODE_RELAXED, 0, 40);
    capture_case("global capture, per-thread stream (_ptsz)", NULL, CU_STREAM_CAPTURE_MODE_GLOBAL, 1, 50);
    unmap_during_capture(s);

    CU(cuCtxSynchronize());
    CU(cuStreamDestroy(s));
    CU(cuStreamDestroy(s2));
    free(hot);
    free(warm);
    CU(cuMemFreeHost(pinned));
    CU(cuMemFreeHost(check));
    CU(cuMemFree(dev_a));
    CU(cuMemFree(dev_b));
    CHECKF(fakecuda_violations() == 0, "no violations (%lu)", fakecuda_violations());
    return TEST_SUMMARY();
}
