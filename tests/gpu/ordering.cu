// ordering.cu: contract rule 2 (ordering is preserved) with real kernels.
//
// Each check launches a kernel that spins ~50 ms and then writes (or reads) a buffer, and then
// issues a copy that the CUDA stream rules order after that kernel.  The host buffers are
// malloc'd and made hot first (copied several times), so under the shim the copy is the
// rewritten one (promoted memory, per-thread shim stream).  If the rewrite drops the barrier the
// copy runs during the spin and the data is stale.  Only data is asserted, never timing.
//
//   blocking_legacy_sync   kernel on a created blocking stream, then cudaMemcpy D2H (legacy
//                          stream; normal builds only: in a per-thread build cudaMemcpy is on
//                          the per-thread stream, which does not wait for blocking streams)
//   blocking_legacy_async  same with cudaMemcpyAsync(..., cudaStreamLegacy) into pageable memory:
//                          complete when the call returns (both builds)
//   default_stream         kernel on stream 0, then cudaMemcpy D2H (same stream in both builds)
//   per_thread             kernel on cudaStreamPerThread, then cudaMemcpyAsync D2H on it
//   per_thread_then_legacy kernel on cudaStreamPerThread, then D2H on cudaStreamLegacy (the
//                          per-thread stream is a blocking stream for the legacy stream)
//   event_wait             kernel on a non-blocking stream, event, cudaStreamWaitEvent(0),
//                          cudaMemcpy D2H
//   h2d_then_kernel        sync H2D (after a blocking-stream spin it must wait for), source
//                          overwritten right after the call returns, then kernels on the legacy
//                          stream and on a blocking stream read the device buffer: old data
//   war_h2d                a blocking-stream kernel spins then reads d_in; a legacy H2D into d_in
//                          issued meanwhile must not land before the kernel has read it
//   threads                4 threads at once, each with its own blocking stream and buffer
#include "common.cuh"

#include <pthread.h>

static const size_t sizes[] = {4 * KiB, 1 * MiB + 3, 32 * MiB};
static const int nsizes = 3;
static uint32_t g_seed = 1;

struct Ctx {
    cudaStream_t blocking, nonblocking, blocking2;
    uint8_t *d_in, *d_out, *d_out2;
    size_t cap;
};

static void ctx_init(Ctx *c, size_t cap)
{
    CK(cudaStreamCreateWithFlags(&c->blocking, cudaStreamDefault));
    CK(cudaStreamCreateWithFlags(&c->blocking2, cudaStreamDefault));
    CK(cudaStreamCreateWithFlags(&c->nonblocking, cudaStreamNonBlocking));
    CK(cudaMalloc(&c->d_in, cap));
    CK(cudaMalloc(&c->d_out, cap));
    CK(cudaMalloc(&c->d_out2, cap));
    c->cap = cap;
}

static void ctx_fini(Ctx *c)
{
    CK(cudaDeviceSynchronize());
    CK(cudaStreamDestroy(c->blocking));
    CK(cudaStreamDestroy(c->blocking2));
    CK(cudaStreamDestroy(c->nonblocking));
    CK(cudaFree(c->d_in));
    CK(cudaFree(c->d_out));
    CK(cudaFree(c->d_out2));
}

static char *what(const char *name, size_t n)
{
    static thread_local char buf[128];
    snprintf(buf, sizeof buf, "%s n=%zu", name, n);
    return buf;
}

// D2H checks: the kernel (spin, then fill with `seed`) is ordered before the copy.
static void d2h_checks(Ctx *c, uint8_t *h, size_t n, uint32_t seed)
{
#if !PTDS_BUILD
    t_test = "blocking_legacy_sync";
    memset(h, 0xAB, n);
    launch_fill(c->d_out, n, seed, c->blocking, SPIN_50MS);
    CK(cudaMemcpy(h, c->d_out, n, cudaMemcpyDeviceToHost));
    verify_pat(h, n, seed, what(t_test, n));
    seed++;
#endif

    t_test = "blocking_legacy_async";
    memset(h, 0xAB, n);
    launch_fill(c->d_out, n, seed, c->blocking, SPIN_50MS);
    CK(cudaMemcpyAsync(h, c->d_out, n, cudaMemcpyDeviceToHost, cudaStreamLegacy));
    verify_pat(h, n, seed, what(t_test, n));  // pageable D2H: complete at return
    seed++;

    t_test = "default_stream";
    memset(h, 0xAB, n);
    launch_fill(c->d_out, n, seed, 0, SPIN_50MS);
    CK(cudaMemcpy(h, c->d_out, n, cudaMemcpyDeviceToHost));
    verify_pat(h, n, seed, what(t_test, n));
    seed++;

    t_test = "per_thread";
    memset(h, 0xAB, n);
    launch_fill(c->d_out, n, seed, cudaStreamPerThread, SPIN_50MS);
    CK(cudaMemcpyAsync(h, c->d_out, n, cudaMemcpyDeviceToHost, cudaStreamPerThread));
    verify_pat(h, n, seed, what(t_test, n));
    seed++;

    // The per-thread default stream is a blocking stream: the legacy stream waits for it.
    t_test = "per_thread_then_legacy";
    memset(h, 0xAB, n);
    launch_fill(c->d_out, n, seed, cudaStreamPerThread, SPIN_50MS);
    CK(cudaMemcpyAsync(h, c->d_out, n, cudaMemcpyDeviceToHost, cudaStreamLegacy));
    verify_pat(h, n, seed, what(t_test, n));
    seed++;

    t_test = "event_wait";
    cudaEvent_t ev;
    CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    memset(h, 0xAB, n);
    launch_fill(c->d_out, n, seed, c->nonblocking, SPIN_50MS);
    CK(cudaEventRecord(ev, c->nonblocking));
    CK(cudaStreamWaitEvent(0, ev, 0));
    CK(cudaMemcpy(h, c->d_out, n, cudaMemcpyDeviceToHost));
    verify_pat(h, n, seed, what(t_test, n));
    CK(cudaEventDestroy(ev));
}

// H2D then kernels that read the device buffer.
static void h2d_checks(Ctx *c, uint8_t *h, uint8_t *chk, size_t n, uint32_t seed)
{
    t_test = "h2d_then_kernel";
    uint8_t salt = (uint8_t)(seed * 7);
    fill(h, n, seed);
    CK(cudaMemset(c->d_in, 0, n));
    CK(cudaDeviceSynchronize());
#if !PTDS_BUILD
    launch_spin(c->blocking, SPIN_50MS);  // the legacy copy must wait for this first
    CK(cudaMemcpy(c->d_in, h, n, cudaMemcpyHostToDevice));
#else
    launch_spin(cudaStreamPerThread, SPIN_50MS);
    CK(cudaMemcpy(c->d_in, h, n, cudaMemcpyHostToDevice));  // per-thread stream
#endif
    memset(h, 0x11, n);  // allowed: the source has been read when the call returns
    launch_xform(c->d_out, c->d_in, n, salt, 0);
#if !PTDS_BUILD
    // A blocking stream is ordered after earlier legacy-stream work.
    launch_xform(c->d_out2, c->d_in, n, salt, c->blocking2);
#else
    launch_xform(c->d_out2, c->d_in, n, salt, cudaStreamPerThread);
#endif
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(chk, c->d_out, n, cudaMemcpyDeviceToHost));
    verify_xf(chk, n, seed, salt, what("h2d_then_kernel/default stream", n));
    CK(cudaMemcpy(chk, c->d_out2, n, cudaMemcpyDeviceToHost));
    verify_xf(chk, n, seed, salt, what("h2d_then_kernel/second stream", n));

    // Explicit legacy stream, both builds: pageable async H2D (staged at return), legacy kernel.
    t_test = "h2d_then_legacy_kernel";
    seed++;
    fill(h, n, seed);
    launch_spin(c->blocking, SPIN_50MS);
    CK(cudaMemcpyAsync(c->d_in, h, n, cudaMemcpyHostToDevice, cudaStreamLegacy));
    memset(h, 0x22, n);
    launch_xform(c->d_out, c->d_in, n, salt, cudaStreamLegacy);
    CK(cudaMemcpyAsync(chk, c->d_out, n, cudaMemcpyDeviceToHost, cudaStreamLegacy));
    CK(cudaStreamSynchronize(cudaStreamLegacy));
    verify_xf(chk, n, seed, salt, what(t_test, n));

    // Write-after-read on the device: the H2D must not overwrite d_in before the kernel read it.
    t_test = "war_h2d";
    seed++;
    fill(h, n, seed);
    CK(cudaMemcpy(c->d_in, h, n, cudaMemcpyHostToDevice));
    CK(cudaDeviceSynchronize());
    fill(h, n, seed + 1000);
#if !PTDS_BUILD
    launch_xform(c->d_out, c->d_in, n, salt, c->blocking, SPIN_50MS);
    CK(cudaMemcpy(c->d_in, h, n, cudaMemcpyHostToDevice));
#else
    launch_xform(c->d_out, c->d_in, n, salt, cudaStreamPerThread, SPIN_50MS);
    CK(cudaMemcpy(c->d_in, h, n, cudaMemcpyHostToDevice));
#endif
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(chk, c->d_out, n, cudaMemcpyDeviceToHost));
    verify_xf(chk, n, seed, salt, what("war_h2d/kernel saw the new data too early", n));
    CK(cudaMemcpy(chk, c->d_in, n, cudaMemcpyDeviceToHost));
    verify_pat(chk, n, seed + 1000, what("war_h2d/new data", n));

    // Same through cudaStreamLegacy explicitly (both builds), blocking-stream kernel.
    t_test = "war_h2d_legacy";
    seed += 2;
    fill(h, n, seed);
    CK(cudaMemcpy(c->d_in, h, n, cudaMemcpyHostToDevice));
    CK(cudaDeviceSynchronize());
    fill(h, n, seed + 1000);
    launch_xform(c->d_out, c->d_in, n, salt, c->blocking, SPIN_50MS);
    CK(cudaMemcpyAsync(c->d_in, h, n, cudaMemcpyHostToDevice, cudaStreamLegacy));
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(chk, c->d_out, n, cudaMemcpyDeviceToHost));
    verify_xf(chk, n, seed, salt, what(t_test, n));
}

static void run_sizes(void)
{
    Ctx c;
    ctx_init(&c, 32 * MiB + 64);
    uint8_t *chk = (uint8_t *)pinned_alloc(32 * MiB + 64);
    for (int si = 0; si < nsizes; si++) {
        size_t n = sizes[si];
        uint8_t *h = (uint8_t *)xmalloc(n);
        memset(h, 1, n);
        make_hot(h, c.d_in, n);
        d2h_checks(&c, h, n, g_seed);
        g_seed += 10;
        h2d_checks(&c, h, chk, n, g_seed);
        g_seed += 10;
        free(h);
    }
    CK(cudaFreeHost(chk));
    ctx_fini(&c);
    pass("ordering.single_thread");
}

// ----- 4 threads at once ---------------------------------------------------------------------
static pthread_barrier_t g_bar;

static void *thread_main(void *arg)
{
    int id = (int)(intptr_t)arg;
    t_test = "threads";
    size_t n = 4 * MiB + (size_t)id * 4099;
    cudaStream_t s;
    CK(cudaStreamCreate(&s));  // blocking
    uint8_t *d, *h = (uint8_t *)xmalloc(n);
    CK(cudaMalloc(&d, n));
    memset(h, 3, n);
    make_hot(h, d, n);
    for (int rep = 0; rep < 3; rep++) {
        uint32_t seed = 50000 + id * 100 + rep * 10;
        char w[96];
        pthread_barrier_wait(&g_bar);
#if !PTDS_BUILD
        memset(h, 0xAB, n);
        launch_fill(d, n, seed, s, SPIN_50MS);
        CK(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost));
        snprintf(w, sizeof w, "threads/legacy_sync thread %d rep %d", id, rep);
        verify_pat(h, n, seed, w);
#endif
        seed++;
        memset(h, 0xAB, n);
        launch_fill(d, n, seed, s, SPIN_50MS);
        CK(cudaMemcpyAsync(h, d, n, cudaMemcpyDeviceToHost, cudaStreamLegacy));
        snprintf(w, sizeof w, "threads/legacy_async thread %d rep %d", id, rep);
        verify_pat(h, n, seed, w);
        seed++;
        memset(h, 0xAB, n);
        launch_fill(d, n, seed, cudaStreamPerThread, SPIN_50MS);
        // Normal build: cudaMemcpy is on the legacy stream, and the per-thread stream is a
        // blocking stream for it; per-thread build: the same stream.  Ordered either way.
        CK(cudaMemcpy(h, d, n, rep == 1 ? cudaMemcpyDefault : cudaMemcpyDeviceToHost));
        snprintf(w, sizeof w, "threads/per_thread_then_sync thread %d rep %d", id, rep);
        verify_pat(h, n, seed, w);
        seed++;
        memset(h, 0xAB, n);
        launch_fill(d, n, seed, cudaStreamPerThread, SPIN_50MS);
        CK(cudaMemcpyAsync(h, d, n, cudaMemcpyDeviceToHost, cudaStreamPerThread));
        snprintf(w, sizeof w, "threads/per_thread_async thread %d rep %d", id, rep);
        verify_pat(h, n, seed, w);
    }
    CK(cudaStreamSynchronize(s));
    CK(cudaStreamDestroy(s));
    CK(cudaFree(d));
    free(h);
    return nullptr;
}

static void run_threads(void)
{
    const int N = 4;
    pthread_t t[N];
    pthread_barrier_init(&g_bar, nullptr, N);
    for (int i = 0; i < N; i++) REQUIRE(pthread_create(&t[i], nullptr, thread_main, (void *)(intptr_t)i) == 0, "pthread_create");
    for (int i = 0; i < N; i++) pthread_join(t[i], nullptr);
    pthread_barrier_destroy(&g_bar);
    pass("ordering.threads");
}

int main(void)
{
    device_init();
    double t0 = now_ms();
    run_sizes();
    run_threads();
    CK(cudaDeviceSynchronize());
    CK(cudaGetLastError());
    fprintf(stderr, "ordering (%s build): %.0f ms\n", PTDS_BUILD ? "per-thread" : "legacy", now_ms() - t0);
    return 0;
}
