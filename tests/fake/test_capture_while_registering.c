/* Contract rule 6: a stream capture the program begins while the shim's own threads are
 * registering memory is not touched by them.
 *
 * Registration takes time on a real GPU (45-366 ms per GiB); here every cuMemHostRegister is made
 * to take 300 ms (fakecuda_set_register_delay_us).  A registration made in the default capture
 * mode while another thread's global-mode capture runs is refused and invalidates that capture,
 * so the shim's threads must register in relaxed mode.  Two cases, each with a global capture on
 * a non-blocking stream of pinned-memory copies that stays open for 0.6 s:
 *   - the program's first cuMemAlloc has the staging buffers built by a thread of their own;
 *     the capture begins before their registration ends;
 *   - a buffer copied again and again is queued for registration in the background; the capture
 *     begins right after its last copy.
 * Each capture must end with CUDA_SUCCESS and its graph must move the right data; the pageable
 * copies around it must land.  (Without the relaxed mode the first case fails: the builder's
 * registration invalidates the capture.) */
#define _GNU_SOURCE
#include <time.h>
#include "drvtest.h"
#include "fakecuda.h"

static const size_t n = 8u << 20;
static CUdeviceptr dev_a, dev_b;
static unsigned char *pin_in, *pin_out, *check;

/* A global capture on s of pinned H2D then D2H, held open for hold_ms, ended and launched. */
static void capture_meanwhile(const char *name, CUstream s, unsigned seed, long hold_ms)
{
    fill_pattern(pin_in, n, seed);
    memset(pin_out, 0, n);
    CUresult r = cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL);
    CHECKF(r == CUDA_SUCCESS, "%s: cuStreamBeginCapture (got %d)", name, (int)r);
    if (r != CUDA_SUCCESS)
        return;
    r = cuMemcpyHtoDAsync(dev_b, pin_in, n, s);
    CHECKF(r == CUDA_SUCCESS, "%s: captured H2D from pinned memory (got %d)", name, (int)r);
    r = cuMemcpyDtoHAsync(pin_out, dev_b, n, s);
    CHECKF(r == CUDA_SUCCESS, "%s: captured D2H into pinned memory (got %d)", name, (int)r);
    drvtest_sleep_ms(hold_ms);
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    CU(cuStreamIsCapturing(s, &st));
    CHECKF(st == CU_STREAM_CAPTURE_STATUS_ACTIVE, "%s: the capture is still active after %ld ms (status %d)", name,
           hold_ms, (int)st);
    CUgraph g = NULL;
    r = cuStreamEndCapture(s, &g);
    CHECKF(r == CUDA_SUCCESS && g, "%s: cuStreamEndCapture succeeds (got %d)", name, (int)r);
    if (r != CUDA_SUCCESS || !g)
        return;
    CUgraphExec ge;
    CU(cuGraphInstantiateWithFlags(&ge, g, 0));
    CU(cuGraphLaunch(ge, s));
    CU(cuStreamSynchronize(s));
    CHECKF(check_pattern(pin_out, n, seed), "%s: the graph moved the pinned input through the device", name);
    CU(cuGraphExecDestroy(ge));
    CU(cuGraphDestroy(g));
}

static void expect_on_device(const char *name, CUdeviceptr d, unsigned seed)
{
    memset(check, 0, n);
    CU(cuMemcpyDtoH(check, d, n));
    CHECKF(check_pattern(check, n, seed), "%s: the device holds the pageable source's bytes", name);
}

int main(void)
{
    drvtest_init();
    printf("mode=%s\n", drvtest_mode());
    /* Before the first cuMemAlloc, which has the staging buffers built. */
    fakecuda_set_register_delay_us(300000);
    CU(cuMemAlloc(&dev_a, n));
    CU(cuMemAlloc(&dev_b, n));
    CU(cuMemHostAlloc((void **)&pin_in, n, 0));
    CU(cuMemHostAlloc((void **)&pin_out, n, 0));
    CU(cuMemHostAlloc((void **)&check, n, 0));
    CUstream s;
    CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));

    /* 1: the staging buffers, whose thread started at the first cuMemAlloc, are still being
     * registered when the capture begins; the first large pageable copy comes after it. */
    capture_meanwhile("capture while the staging buffers are registered", s, 2, 600);
    unsigned char *first = malloc(n);
    CHECK(first != NULL);
    fill_pattern(first, n, 1);
    CU(cuMemcpyHtoD(dev_a, first, n));
    expect_on_device("first copy", dev_a, 1);

    /* 2: a buffer copied again and again, registered in the background. */
    unsigned char *reused = malloc(n);
    CHECK(reused != NULL);
    fill_pattern(reused, n, 3);
    for (int i = 0; i < 4; i++)
        CU(cuMemcpyHtoD(dev_a, reused, n));
    capture_meanwhile("capture while a reused buffer is registered", s, 4, 600);
    expect_on_device("reused buffer", dev_a, 3);

    /* After both: further one-shot copies work. */
    fakecuda_set_register_delay_us(0);
    for (unsigned i = 0; i < 4; i++) {
        unsigned char *once = malloc(n);
        CHECK(once != NULL);
        fill_pattern(once, n, 10 + i);
        CU(cuMemcpyHtoD(dev_a, once, n));
        expect_on_device("one-shot copy after the captures", dev_a, 10 + i);
        free(once);
    }

    CU(cuCtxSynchronize());
    CU(cuStreamDestroy(s));
    free(first);
    free(reused);
    CU(cuMemFreeHost(pin_in));
    CU(cuMemFreeHost(pin_out));
    CU(cuMemFreeHost(check));
    return TEST_SUMMARY();
}
