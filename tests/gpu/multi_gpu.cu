// multi_gpu.cu: one process, two GPUs, the same pageable host buffers (issue 8).
//
//   multi_gpu [SIZE_MiB [ITERS]]     (default 64 MiB, 4 iterations; run_gpu_tests.sh runs it so)
//
// Prints "SKIP: fewer than 2 GPUs" and exits 0 when fewer than two devices are visible.
// Otherwise two threads, thread t on device t (cudaSetDevice), share NSRC malloc'ed source
// buffers and each has its own malloc'ed D2H destination:
//   warm     each thread round-trips every shared source through its device (sync copies), so a
//            preloaded shim finds them hot and promotes them (in whichever thread's context
//            copies first: the registration must serve the other device too);
//   h2d      both threads at once copy every source to their device, ITERS times (sync
//            cudaMemcpy); aggregate GB/s over both devices; then each device's copy is checked;
//   d2h      both threads at once copy from their device into their own destination, ITERS
//            times; aggregate GB/s; the destination is checked;
//   async    on a stream each thread created: H2D of a shared source, a kernel, D2H into the
//            thread's destination, synchronize, check the transformed bytes (twice per source);
//   dual     the legacy/default stream of one device and a created stream of the other at once
//            from one thread: a shared source to both devices, then both back, checked.
// Prints PASS lines and "RESULT multi_gpu h2d_gbps=... d2h_gbps=... size_mib=... iters=...".
#include "common.cuh"

#include <pthread.h>

#define NDEV 2
#define NSRC 2

static size_t S;
static int ITERS;
static uint8_t *src[NSRC];
static pthread_barrier_t bar;
static double t_h2d[2], t_d2h[2];   // [0] start (after the barrier), [1] end (last thread)
static pthread_mutex_t t_mu = PTHREAD_MUTEX_INITIALIZER;

struct worker {
    int dev;
    uint8_t *d[NSRC];
    uint8_t *back;
    cudaStream_t s;
};
static worker w[NDEV];

static void mark_end(double *t)
{
    double now = now_ms();
    pthread_mutex_lock(&t_mu);
    if (now > t[1]) t[1] = now;
    pthread_mutex_unlock(&t_mu);
}

// Device buffer check through the host: D2H into `back`, then compare.
static void check_device(worker *me, int i, uint32_t seed, const char *what)
{
    memset(me->back, 0, S);
    CK(cudaMemcpy(me->back, me->d[i], S, cudaMemcpyDeviceToHost));
    verify_pat(me->back, S, seed, what);
}

static void *worker_main(void *arg)
{
    worker *me = (worker *)arg;
    static thread_local char name[32];
    snprintf(name, sizeof name, "device%d", me->dev);
    t_test = name;
    CK(cudaSetDevice(me->dev));
    CK(cudaFree(0));
    CK(cudaStreamCreateWithFlags(&me->s, cudaStreamNonBlocking));
    for (int i = 0; i < NSRC; i++) CK(cudaMalloc(&me->d[i], S));
    me->back = (uint8_t *)xmalloc(S);
    memset(me->back, 0, S);

    // warm: every shared source through this device, sync, checked.  Device 0 goes first on
    // source 0 and device 1 on source 1, so each source is first promoted in a different context.
    pthread_barrier_wait(&bar);
    for (int k = 0; k < 3; k++)
        for (int j = 0; j < NSRC; j++) {
            int i = (j + me->dev) % NSRC;
            CK(cudaMemcpy(me->d[i], src[i], S, cudaMemcpyHostToDevice));
            check_device(me, i, 100u + (uint32_t)i, "warm: shared source through this device");
        }
    pthread_barrier_wait(&bar);
    if (me->dev == 0) pass("warm: both devices round-trip both shared sources");

    // h2d, both devices at once
    for (int i = 0; i < NSRC; i++) CK(cudaMemset(me->d[i], 0, S));
    CK(cudaDeviceSynchronize());
    pthread_barrier_wait(&bar);
    if (me->dev == 0) t_h2d[0] = now_ms();
    pthread_barrier_wait(&bar);
    for (int it = 0; it < ITERS; it++)
        for (int i = 0; i < NSRC; i++)
            CK(cudaMemcpy(me->d[i], src[i], S, cudaMemcpyHostToDevice));
    mark_end(t_h2d);
    for (int i = 0; i < NSRC; i++)
        check_device(me, i, 100u + (uint32_t)i, "h2d: shared source on this device");
    pthread_barrier_wait(&bar);
    if (me->dev == 0) pass("h2d: both devices at once, data right on each");

    // d2h, both devices at once, into each thread's own destination
    pthread_barrier_wait(&bar);
    if (me->dev == 0) t_d2h[0] = now_ms();
    pthread_barrier_wait(&bar);
    for (int it = 0; it < ITERS; it++)
        for (int i = 0; i < NSRC; i++)
            CK(cudaMemcpy(me->back, me->d[i], S, cudaMemcpyDeviceToHost));
    mark_end(t_d2h);
    verify_pat(me->back, S, 100u + (uint32_t)(NSRC - 1), "d2h: this thread's destination");
    pthread_barrier_wait(&bar);
    if (me->dev == 0) pass("d2h: both devices at once into per-thread destinations, data right");

    // async on the thread's own stream, with a kernel in between
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < NSRC; i++) {
            uint8_t salt = (uint8_t)(1 + me->dev * 16 + k * 4 + i);
            memset(me->back, 0, S);
            CK(cudaMemcpyAsync(me->d[i], src[i], S, cudaMemcpyHostToDevice, me->s));
            launch_xform(me->d[i], me->d[i], S, salt, me->s);
            CK(cudaMemcpyAsync(me->back, me->d[i], S, cudaMemcpyDeviceToHost, me->s));
            CK(cudaStreamSynchronize(me->s));
            verify_xf(me->back, S, 100u + (uint32_t)i, salt, "async: shared source, kernel, back");
        }
    pthread_barrier_wait(&bar);
    if (me->dev == 0) pass("async: created streams on both devices, kernels between, data right");
    return nullptr;
}

int main(int argc, char **argv)
{
    t_test = "main";
    S = (size_t)(argc > 1 ? atof(argv[1]) : 64) * MiB;
    ITERS = argc > 2 ? atoi(argv[2]) : 4;
    REQUIRE(S >= MiB && ITERS >= 1, "usage: %s [SIZE_MiB [ITERS]]", argv[0]);
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n < NDEV) {
        printf("SKIP: fewer than 2 GPUs (%d visible%s%s)\n", e == cudaSuccess ? n : 0,
               e == cudaSuccess ? "" : ": ", e == cudaSuccess ? "" : cudaGetErrorString(e));
        return 0;
    }
    for (int i = 0; i < NSRC; i++) {
        src[i] = (uint8_t *)xmalloc(S);
        fill(src[i], S, 100u + (uint32_t)i);
    }
    pthread_barrier_init(&bar, nullptr, NDEV);
    pthread_t th[NDEV];
    for (int t = 0; t < NDEV; t++) {
        w[t].dev = t;
        pthread_create(&th[t], nullptr, worker_main, &w[t]);
    }
    for (int t = 0; t < NDEV; t++) pthread_join(th[t], nullptr);

    // dual: one thread, both devices, the legacy/default stream of device 0 and a created stream
    // of device 1 at once.
    t_test = "dual";
    for (int i = 0; i < NSRC; i++) {
        CK(cudaSetDevice(0));
        CK(cudaMemset(w[0].d[i], 0, S));
        CK(cudaMemcpyAsync(w[0].d[i], src[i], S, cudaMemcpyHostToDevice, 0));
        CK(cudaSetDevice(1));
        CK(cudaMemsetAsync(w[1].d[i], 0, S, w[1].s));
        CK(cudaMemcpyAsync(w[1].d[i], src[i], S, cudaMemcpyHostToDevice, w[1].s));
        CK(cudaStreamSynchronize(w[1].s));
        CK(cudaSetDevice(0));
        CK(cudaDeviceSynchronize());
        for (int t = 0; t < NDEV; t++) {
            CK(cudaSetDevice(t));
            check_device(&w[t], i, 100u + (uint32_t)i, "dual: one thread, both devices");
        }
    }
    pass("dual: one thread copies a shared source to both devices, data right on each");

    double bytes = (double)NDEV * ITERS * NSRC * S;
    double h2d = bytes / ((t_h2d[1] - t_h2d[0]) * 1e6), d2h = bytes / ((t_d2h[1] - t_d2h[0]) * 1e6);
    printf("RESULT multi_gpu h2d_gbps=%.2f d2h_gbps=%.2f size_mib=%zu iters=%d\n", h2d, d2h, S / MiB, ITERS);
    for (int t = 0; t < NDEV; t++) {
        CK(cudaSetDevice(t));
        CK(cudaStreamDestroy(w[t].s));
        for (int i = 0; i < NSRC; i++) CK(cudaFree(w[t].d[i]));
        free(w[t].back);
    }
    for (int i = 0; i < NSRC; i++) free(src[i]);
    return 0;
}
