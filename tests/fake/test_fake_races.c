/* Device memory races between streams (FAKECUDA_CHECK_DEVICE_RACES): two accesses to the same
 * device bytes, at least one a write, that nothing orders (stream order, the legacy stream's
 * implicit synchronization, an event wait, a synchronization the host saw complete).  Each
 * scenario runs in a child process, and the number of races it reports must be exact whatever
 * the timing: with no delay on async work, and with a delay long enough for the later op to run
 * first. */
#include "fk_test.h"
#include <pthread.h>

#define N (64 * 1024)
#define RACE "fakecuda: VIOLATION: device memory race"

static CUstream nb1, nb2, blk;
static CUdeviceptr d, d2;
static unsigned char *pinned;

static volatile int hostfn_done;
static void CUDA_CB mark_done(void *arg) { (void)arg; __atomic_store_n(&hostfn_done, 1, __ATOMIC_RELEASE); }

/* A device buffer every stream has seen written (by a synchronized upload). */
static void setup(void)
{
    fkt_init();
    MUST(cuStreamCreate(&nb1, CU_STREAM_NON_BLOCKING));
    MUST(cuStreamCreate(&nb2, CU_STREAM_NON_BLOCKING));
    MUST(cuStreamCreate(&blk, CU_STREAM_DEFAULT));
    MUST(cuMemAlloc_v2(&d, N));
    MUST(cuMemAlloc_v2(&d2, N));
    MUST(cuMemHostAlloc((void **)&pinned, N, 0));
    MUST(cuMemsetD8_v2(d, 1, N));
    MUST(cuMemsetD8_v2(d2, 2, N));
    MUST(cuCtxSynchronize());
}

/* A 2D copy from pinned host memory into columns [x, x+w) of the N/64-row, 64-byte-pitch
 * buffer d. */
static void columns(size_t x, size_t w, CUstream s)
{
    CUDA_MEMCPY2D p = { 0 };
    p.srcMemoryType = CU_MEMORYTYPE_HOST;
    p.srcHost = pinned;
    p.srcPitch = w;
    p.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    p.dstDevice = d;
    p.dstXInBytes = x;
    p.dstPitch = 64;
    p.WidthInBytes = w;
    p.Height = N / 64;
    MUST(cuMemcpy2DAsync_v2(&p, s));
}

/* A graph captured on nb1: a memset of d, then d copied into d2. */
static CUgraphExec memset_then_copy_graph(void)
{
    CUgraph g;
    CUgraphExec x;
    MUST(cuStreamBeginCapture_v2(nb1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    MUST(cuMemsetD8Async(d, 9, N, nb1));
    MUST(cuMemcpyDtoDAsync_v2(d2, d, N, nb1));
    MUST(cuStreamEndCapture(nb1, &g));
    MUST(cuGraphInstantiateWithFlags(&x, g, 0));
    return x;
}

static int scenario(const char *name)
{
    setup();
    unsigned char *page = malloc(N), *back = malloc(N);
    memset(page, 7, N);
    CUevent e;
    MUST(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
    if (!strcmp(name, "pageable_then_nonblocking")) {
        /* The upload may return before its DMA lands, and runs on the legacy stream, which a
         * non-blocking stream does not wait for. */
        MUST(cuMemcpyHtoD_v2(d, page, N));
        MUST(cuMemcpyDtoHAsync_v2(back, d, N, nb1));
    } else if (!strcmp(name, "then_ctx_sync")) {
        MUST(cuMemcpyHtoD_v2(d, page, N));
        MUST(cuCtxSynchronize());
        MUST(cuMemcpyDtoHAsync_v2(back, d, N, nb1));
    } else if (!strcmp(name, "then_legacy_sync")) {
        MUST(cuMemcpyHtoD_v2(d, page, N));
        MUST(cuStreamSynchronize(NULL));
        MUST(cuMemcpyDtoHAsync_v2(back, d, N, nb1));
    } else if (!strcmp(name, "then_event_wait")) {
        MUST(cuMemcpyHtoD_v2(d, page, N));
        MUST(cuEventRecord(e, NULL));
        MUST(cuStreamWaitEvent(nb1, e, 0));
        MUST(cuMemcpyDtoHAsync_v2(back, d, N, nb1));
    } else if (!strcmp(name, "then_event_sync")) {
        MUST(cuMemcpyHtoD_v2(d, page, N));
        MUST(cuEventRecord(e, NULL));
        MUST(cuEventSynchronize(e));
        MUST(cuMemcpyDtoHAsync_v2(back, d, N, nb1));
    } else if (!strcmp(name, "then_blocking_stream")) {
        MUST(cuMemcpyHtoD_v2(d, page, N));
        MUST(cuMemcpyDtoHAsync_v2(back, d, N, blk));
    } else if (!strcmp(name, "pinned_upload")) {
        /* A synchronous upload from pinned memory returns when it has landed. */
        MUST(cuMemcpyHtoD_v2(d, pinned, N));
        MUST(cuMemcpyDtoHAsync_v2(back, d, N, nb1));
    } else if (!strcmp(name, "write_write")) {
        MUST(cuMemcpyHtoDAsync_v2(d, pinned, N, nb1));
        MUST(cuMemcpyHtoDAsync_v2(d + N / 2, pinned, N / 4, nb2));
        MUST(cuCtxSynchronize());
    } else if (!strcmp(name, "write_write_event")) {
        MUST(cuMemcpyHtoDAsync_v2(d, pinned, N, nb1));
        MUST(cuEventRecord(e, nb1));
        MUST(cuStreamWaitEvent(nb2, e, 0));
        MUST(cuMemcpyHtoDAsync_v2(d + N / 2, pinned, N / 4, nb2));
        MUST(cuCtxSynchronize());
    } else if (!strcmp(name, "disjoint")) {
        MUST(cuMemcpyHtoDAsync_v2(d, pinned, N / 2, nb1));
        MUST(cuMemcpyHtoDAsync_v2(d + N / 2, pinned, N / 2, nb2));
        MUST(cuMemsetD8Async(d2, 3, N, nb2));
        MUST(cuCtxSynchronize());
    } else if (!strcmp(name, "two_reads")) {
        MUST(cuMemcpyDtoHAsync_v2(pinned, d, N / 2, nb1));
        MUST(cuMemcpyDtoDAsync_v2(d2, d, N, nb2));
        MUST(cuCtxSynchronize());
    } else if (!strcmp(name, "memset_copy")) {
        /* Both orders of the same race: the earlier-submitted op runs first, then second. */
        MUST(cuMemsetD32Async(d, 5, N / 4, nb1));
        MUST(cuMemcpyDtoDAsync_v2(d2, d, N, nb2));
        MUST(cuCtxSynchronize());
        MUST(fakecuda_launch_write(nb1, d2, 6, N, 100000));
        MUST(cuMemsetD8Async(d2 + 100, 8, 1, nb2));
        MUST(cuCtxSynchronize());
    } else if (!strcmp(name, "legacy_memset_copy")) {
        /* "Synchronous" memsets return before they run. */
        MUST(cuMemsetD8_v2(d, 5, N));
        MUST(cuMemcpyDtoDAsync_v2(d2, d, N, nb1));
        MUST(cuCtxSynchronize());
    } else if (!strcmp(name, "columns")) {
        /* 2D writes into interleaved columns meet no byte of each other; overlapping ones do. */
        columns(0, 16, nb1);
        columns(16, 16, nb2);
        MUST(cuCtxSynchronize());
        columns(8, 16, nb1);
        columns(20, 8, nb2);
        MUST(cuCtxSynchronize());
    } else if (!strcmp(name, "graph")) {
        CUgraphExec x = memset_then_copy_graph();
        /* Ordered after another stream's write to d by an event; read back in stream order. */
        MUST(fakecuda_launch_write(nb2, d, 4, N, 100000));
        MUST(cuEventRecord(e, nb2));
        MUST(cuStreamWaitEvent(nb1, e, 0));
        MUST(cuGraphLaunch(x, nb1));
        MUST(cuMemcpyDtoHAsync_v2(back, d2, N, nb1));
        /* After the host saw it complete, another stream reads what the graph wrote. */
        MUST(cuGraphLaunch(x, nb1));
        MUST(cuStreamSynchronize(nb1));
        MUST(cuMemcpyDtoHAsync_v2(back, d2, N, nb2));
    } else if (!strcmp(name, "graph_unordered")) {
        CUgraphExec x = memset_then_copy_graph();
        /* Both graph nodes race with this write: two pairs. */
        MUST(fakecuda_launch_write(nb2, d, 4, N, 100000));
        MUST(cuGraphLaunch(x, nb1));
        MUST(cuCtxSynchronize());
    } else if (!strcmp(name, "stream_query")) {
        MUST(fakecuda_launch_write(nb1, d, 4, N, 50000));
        while (cuStreamQuery(nb1) == CUDA_ERROR_NOT_READY) usleep(1000);
        MUST(cuMemcpyDtoHAsync_v2(back, d, N, nb2));
    } else if (!strcmp(name, "event_query")) {
        MUST(fakecuda_launch_write(nb1, d, 4, N, 50000));
        MUST(cuEventRecord(e, nb1));
        MUST(fakecuda_launch_write(nb1, d2, 4, N, 50000));     /* after the event: not seen */
        while (cuEventQuery(e) == CUDA_ERROR_NOT_READY) usleep(1000);
        MUST(cuMemcpyDtoHAsync_v2(back, d, N, nb2));
        MUST(cuMemcpyDtoHAsync_v2(back, d2, N, nb2));         /* races the second write */
    } else if (!strcmp(name, "host_function")) {
        /* A host function runs after the work before it: the host thread it wakes may go on. */
        MUST(fakecuda_launch_write(nb1, d, 4, N, 50000));
        MUST(cuLaunchHostFunc(nb1, mark_done, NULL));
        while (!__atomic_load_n(&hostfn_done, __ATOMIC_ACQUIRE)) usleep(1000);
        MUST(cuMemcpyDtoHAsync_v2(back, d, N, nb2));
    } else if (!strcmp(name, "ping_pong")) {
        /* Many accesses ordered by events between two streams: no race, records stay few. */
        CUevent e2;
        MUST(cuEventCreate(&e2, CU_EVENT_DISABLE_TIMING));
        for (int i = 0; i < 3000; i++) {
            MUST(cuMemsetD8Async(d + (size_t)(i % 64) * 1024, (unsigned char)i, 1024, nb1));
            MUST(cuEventRecord(e, nb1));
            MUST(cuStreamWaitEvent(nb2, e, 0));
            MUST(cuMemcpyDtoDAsync_v2(d2, d, N, nb2));
            MUST(cuEventRecord(e2, nb2));
            MUST(cuStreamWaitEvent(nb1, e2, 0));
            if (i % 500 == 499) MUST(cuCtxSynchronize());
        }
        MUST(cuCtxSynchronize());
    } else {
        return 99;
    }
    MUST(cuCtxSynchronize());
    printf("violations=%lu\n", fakecuda_violations());
    return 0;
}

static void run(const char *name, const char *delay, int want)
{
    char out[32768];
    const char *env[] = { "FAKECUDA_EXIT_STATUS=0", delay, NULL };
    int rc = fkt_run_self(name, env, out, sizeof out);
    int races = fkt_count(out, RACE), all = fkt_count(out, "fakecuda: VIOLATION:");
    char want_line[64];
    snprintf(want_line, sizeof want_line, "violations=%d", want);
    int ok = rc == 0 && races == want && all == want && strstr(out, want_line);
    CHECKF(ok, "%s (%s): exit %d, %d race(s) reported, %d expected", name, delay, rc, races, want);
    if (!ok) printf("---- output of %s ----\n%s\n----\n", name, out);
}

static void run_delays(const char *name, int want)
{
    run(name, "FAKECUDA_ASYNC_DELAY_US=0", want);
    run(name, "FAKECUDA_ASYNC_DELAY_US=100000", want);
}

int main(int argc, char **argv)
{
    if (argc > 1) return scenario(argv[1]);
    /* The motivating case, every time, whichever op the timing runs first. */
    for (int i = 0; i < 10; i++) run("pageable_then_nonblocking", "FAKECUDA_ASYNC_DELAY_US=0", 1);
    run("pageable_then_nonblocking", "FAKECUDA_ASYNC_DELAY_US=20", 1);
    run("pageable_then_nonblocking", "FAKECUDA_ASYNC_DELAY_US=200000", 1);
    run("pageable_then_nonblocking", "FAKECUDA_CHECK_DEVICE_RACES=0", 0);
    run_delays("then_ctx_sync", 0);
    run_delays("then_legacy_sync", 0);
    run_delays("then_event_wait", 0);
    run_delays("then_event_sync", 0);
    run_delays("then_blocking_stream", 0);
    run_delays("pinned_upload", 0);
    run_delays("write_write", 1);
    run_delays("write_write_event", 0);
    run_delays("disjoint", 0);
    run_delays("two_reads", 0);
    run_delays("memset_copy", 2);
    run_delays("legacy_memset_copy", 1);
    run_delays("columns", 1);
    run_delays("graph", 0);
    run_delays("graph_unordered", 2);
    run_delays("stream_query", 0);
    run_delays("event_query", 1);
    run_delays("host_function", 0);
    run("ping_pong", "FAKECUDA_ASYNC_DELAY_US=0", 0);
    return TEST_SUMMARY();
}
