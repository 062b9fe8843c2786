/* Stream capture in the fake driver: recording instead of executing, replay through graphs, the
 * "potentially unsafe API" rule by capture mode, implicit legacy dependencies. */
#include "fk_test.h"
#include <pthread.h>

static CUdeviceptr d;
static CUcontext ctx;
static CUresult other_rc;

static void *other_thread(void *arg)
{
    MUST(cuCtxSetCurrent(ctx));
    if (arg) {
        CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
        MUST(cuThreadExchangeStreamCaptureMode(&m));
    }
    static char buf[8192];
    other_rc = cuMemHostRegister_v2(buf, sizeof buf, 0);
    if (other_rc == CUDA_SUCCESS) cuMemHostUnregister(buf);
    return NULL;
}

static CUresult from_other_thread(int relaxed)
{
    pthread_t th;
    pthread_create(&th, NULL, other_thread, relaxed ? (void *)1 : NULL);
    pthread_join(th, NULL);
    return other_rc;
}

int main(void)
{
    ctx = fkt_init();
    CUstream s, snb;
    MUST(cuStreamCreate(&s, CU_STREAM_DEFAULT));
    MUST(cuStreamCreate(&snb, CU_STREAM_NON_BLOCKING));
    MUST(cuMemAlloc_v2(&d, 4096));
    MUST(cuMemsetD8_v2(d, 0, 4096));
    unsigned char *pin;
    MUST(cuMemHostAlloc((void **)&pin, 4096, 0));
    memset(pin, 0x5c, 4096);
    CUgraph g = NULL;
    CUstreamCaptureStatus cs;

    EXPECT_RC(cuStreamBeginCapture_v2(NULL, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    EXPECT_RC(cuStreamBeginCapture_v2(CU_STREAM_LEGACY, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);

    /* Capture, nothing runs; replay runs it. */
    MUST(cuStreamBeginCapture_v2(snb, CU_STREAM_CAPTURE_MODE_GLOBAL));
    MUST(cuStreamIsCapturing(snb, &cs));
    CHECK(cs == CU_STREAM_CAPTURE_STATUS_ACTIVE);
    EXPECT_RC(cuStreamBeginCapture_v2(snb, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_ERROR_ILLEGAL_STATE);
    MUST(fakecuda_launch_write(snb, d, 0x11, 4096, 1000));
    MUST(cuMemcpyHtoDAsync_v2(d + 100, pin, 100, snb));
    CUevent ev;
    MUST(cuEventCreate(&ev, 0));
    MUST(cuEventRecord(ev, snb));
    MUST(cuMemcpyDtoD_v2(d, d, 0));          /* zero bytes: nothing to do, allowed */
    usleep(20000);
    MUST(cuStreamEndCapture(snb, &g));
    CHECK(g != NULL);
    CHECKF(fkt_dev_all(d, 4096, 0), "captured work did not execute");
    CUgraphExec gx;
    MUST(cuGraphInstantiateWithFlags(&gx, g, 0));
    MUST(cuGraphLaunch(gx, s));
    MUST(cuStreamSynchronize(s));
    unsigned char back[4096];
    MUST(cuMemcpyDtoH_v2(back, d, 4096));
    CHECKF(back[0] == 0x11 && back[99] == 0x11 && back[100] == 0x5c && back[199] == 0x5c && back[200] == 0x11,
           "graph replay ran the captured work in order");
    EXPECT_RC(cuEventQuery(ev), CUDA_SUCCESS);
    MUST(cuGraphExecDestroy(gx));
    MUST(cuGraphDestroy(g));

    /* Unsafe call on the capturing thread (global mode): fails, invalidates. */
    MUST(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CUdeviceptr d2;
    EXPECT_RC(cuMemAlloc_v2(&d2, 64), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    MUST(cuStreamIsCapturing(s, &cs));
    CHECK(cs == CU_STREAM_CAPTURE_STATUS_INVALIDATED);
    EXPECT_RC(cuMemcpyHtoDAsync_v2(d, pin, 16, s), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    g = (CUgraph)1;
    EXPECT_RC(cuStreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    CHECK(g == NULL);

    /* Global capture: another thread in GLOBAL mode is stopped; in RELAXED mode it is not. */
    MUST(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    EXPECT_RC(from_other_thread(1), CUDA_SUCCESS);
    MUST(cuStreamIsCapturing(s, &cs));
    CHECK(cs == CU_STREAM_CAPTURE_STATUS_ACTIVE);
    EXPECT_RC(from_other_thread(0), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    EXPECT_RC(cuStreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);

    /* Thread-local capture: other threads unaffected, the capturing thread is. */
    MUST(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    EXPECT_RC(from_other_thread(0), CUDA_SUCCESS);
    EXPECT_RC(cuMemcpyDtoH_v2(back, d, 16), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    EXPECT_RC(cuStreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);

    /* Relaxed capture: unsafe calls allowed; a relaxed thread mode too. */
    MUST(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_RELAXED));
    EXPECT_RC(cuMemAlloc_v2(&d2, 64), CUDA_SUCCESS);
    MUST(cuStreamEndCapture(s, &g));
    MUST(cuGraphDestroy(g));
    MUST(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
    MUST(cuThreadExchangeStreamCaptureMode(&m));
    CHECK(m == CU_STREAM_CAPTURE_MODE_GLOBAL);
    EXPECT_RC(cuCtxSynchronize(), CUDA_SUCCESS);
    MUST(cuThreadExchangeStreamCaptureMode(&m));
    EXPECT_RC(cuEventQuery(ev), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    EXPECT_RC(cuStreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);

    /* Legacy-stream work while a blocking stream captures: implicit dependency, invalidated. */
    MUST(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_RELAXED));
    EXPECT_RC(cuMemsetD8_v2(d, 1, 16), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    EXPECT_RC(cuStreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    /* ... a non-blocking capturing stream does not care. */
    MUST(cuStreamBeginCapture_v2(snb, CU_STREAM_CAPTURE_MODE_RELAXED));
    EXPECT_RC(cuMemsetD8_v2(d, 1, 16), CUDA_SUCCESS);
    MUST(cuStreamEndCapture(snb, &g));
    MUST(cuGraphDestroy(g));

    /* Sync calls on a capturing stream itself. */
    MUST(cuStreamBeginCapture_v2(snb, CU_STREAM_CAPTURE_MODE_RELAXED));
    EXPECT_RC(cuStreamSynchronize(snb), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    EXPECT_RC(cuStreamEndCapture(snb, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);

    /* Per-thread stream capture: async ptsz work is captured; a sync ptds copy is refused. */
    MUST(cuStreamBeginCapture_v2_ptsz(NULL, CU_STREAM_CAPTURE_MODE_RELAXED));
    MUST(cuStreamIsCapturing(CU_STREAM_PER_THREAD, &cs));
    CHECK(cs == CU_STREAM_CAPTURE_STATUS_ACTIVE);
    MUST(cuMemcpyHtoDAsync_v2_ptsz(d, pin, 16, NULL));
    EXPECT_RC(cuMemcpyHtoD_v2_ptds(d, pin, 16), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    EXPECT_RC(cuStreamEndCapture_ptsz(NULL, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);

    /* Fork/join through events. */
    CUevent fork_ev, join_ev;
    MUST(cuEventCreate(&fork_ev, CU_EVENT_DISABLE_TIMING));
    MUST(cuEventCreate(&join_ev, CU_EVENT_DISABLE_TIMING));
    MUST(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    MUST(cuEventRecord(fork_ev, s));
    MUST(cuStreamWaitEvent(snb, fork_ev, 0));
    MUST(cuStreamIsCapturing(snb, &cs));
    CHECK(cs == CU_STREAM_CAPTURE_STATUS_ACTIVE);
    MUST(fakecuda_launch_write(snb, d, 0x77, 64, 0));
    MUST(cuEventRecord(join_ev, snb));
    MUST(cuStreamWaitEvent(s, join_ev, 0));
    MUST(cuStreamEndCapture(s, &g));
    MUST(cuStreamIsCapturing(snb, &cs));
    CHECK(cs == CU_STREAM_CAPTURE_STATUS_NONE);
    MUST(cuGraphInstantiateWithFlags(&gx, g, 0));
    MUST(cuGraphLaunch(gx, s));
    MUST(cuStreamSynchronize(s));
    CHECKF(fkt_dev_all(d, 64, 0x77), "joined stream's captured work replayed");

    CHECK(fakecuda_violations() == 0);
    return TEST_SUMMARY();
}
