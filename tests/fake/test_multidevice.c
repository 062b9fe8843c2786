/* Two devices, one process (issue 8): the fake driver with FAKECUDA_DEVICES=2, two threads, each
 * on the primary context of its own device, copying the SAME hot malloc'ed host buffers.
 *
 *   phase A  thread t makes source buffer t hot on device t (sync H2D, D2H into its own buffer):
 *            in pin/full with the default budget the shim promotes it, registering it (PORTABLE)
 *            in context t;
 *   phase B  each thread copies the buffer the OTHER thread's context promoted, sync and async:
 *            the registration must serve the second context too (no second registration, no
 *            CUDA error, no violation, right data);
 *   phase C  rounds in which thread 0 refills both sources and then both threads copy both to
 *            their device and back at the same time: sync copies, a sync D2H after a "kernel" on
 *            the device's legacy stream (it must see the kernel's writes), async copies on a
 *            stream each thread created, and the per-thread-default-stream flavour.
 *
 * Every copy is counted, for the observe check (EXPECTED_COPIES).  FAKECUDA_DEVICES is set
 * with setenv before cuInit: the fake reads it once, at its first cuInit (or its first test
 * query), so it must not be called before that. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include "drvtest.h"
#include "fakecuda.h"

#define NDEV 2
#define NSRC 2
#define BUF ((size_t)8 << 20)
#define WARM_ROUNDS 6
#define ROUNDS 4

static unsigned char *src[NSRC];
static pthread_barrier_t bar;
static atomic_ulong n_h2d, n_d2h;
static atomic_int cuda_errors;
/* Written by thread 0 between barriers, read by main after the joins. */
static int reg_after_warm[NSRC], back_reg_after_warm[NDEV];
static unsigned long reg_calls_after_warm;
/* The registrations holding each source and each thread's D2H buffer after phase A. */
static unsigned long long src_reg_id[NSRC], back_reg_id[NDEV];

struct worker {
    int dev;
    pthread_t th;
    CUcontext ctx;
    CUdeviceptr d[NSRC];
    CUstream s;
    unsigned char *back;          /* this thread's D2H destination (malloc, becomes hot too) */
    int warm_ok, cross_sync_ok, cross_async_ok, sync_ok, order_ok, async_ok, ptds_ok;
};
static struct worker w[NDEV];

/* A failed driver call in a worker: counted and reported, the worker carries on. */
#define TCU(call)                                                                         \
    ({                                                                                    \
        CUresult tcu_r_ = (call);                                                         \
        if (tcu_r_ != CUDA_SUCCESS) {                                                     \
            printf("FAIL %s returned %d at %s:%d\n", #call, (int)tcu_r_, __FILE__, __LINE__); \
            atomic_fetch_add(&cuda_errors, 1);                                            \
        }                                                                                 \
        tcu_r_ == CUDA_SUCCESS;                                                           \
    })

static unsigned long register_calls(void)
{
    return fakecuda_calls("cuMemHostRegister_v2") + fakecuda_calls("cuMemHostRegister");
}

static int all_equal(const unsigned char *p, size_t n, unsigned char v)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != v)
            return 0;
    return 1;
}

/* Sync H2D of source i, sync D2H into back, check against seed. */
static int sync_round_trip(struct worker *me, int i, unsigned seed)
{
    int ok = TCU(cuMemcpyHtoD(me->d[i], src[i], BUF));
    if (ok) atomic_fetch_add(&n_h2d, 1);
    memset(me->back, 0, BUF);
    if (TCU(cuMemcpyDtoH(me->back, me->d[i], BUF))) atomic_fetch_add(&n_d2h, 1); else ok = 0;
    return ok && check_pattern(me->back, BUF, seed);
}

/* The same through the thread's own stream with the async entry points. */
static int async_round_trip(struct worker *me, int i, unsigned seed)
{
    int ok = TCU(cuMemsetD8Async(me->d[i], 0, BUF, me->s));
    if (TCU(cuMemcpyHtoDAsync(me->d[i], src[i], BUF, me->s))) atomic_fetch_add(&n_h2d, 1); else ok = 0;
    memset(me->back, 0, BUF);
    if (TCU(cuMemcpyDtoHAsync(me->back, me->d[i], BUF, me->s))) atomic_fetch_add(&n_d2h, 1); else ok = 0;
    ok &= TCU(cuStreamSynchronize(me->s));
    return ok && check_pattern(me->back, BUF, seed);
}

static void *worker_main(void *arg)
{
    struct worker *me = arg;
    CUdevice dev;
    int ready = TCU(cuDeviceGet(&dev, me->dev)) && TCU(cuDevicePrimaryCtxRetain(&me->ctx, dev)) &&
                TCU(cuCtxSetCurrent(me->ctx)) && TCU(cuStreamCreate(&me->s, CU_STREAM_NON_BLOCKING));
    for (int i = 0; ready && i < NSRC; i++)
        ready = TCU(cuMemAlloc(&me->d[i], BUF));
    me->back = malloc(BUF);
    if (!me->back)
        ready = 0;
    else
        memset(me->back, 0, BUF);   /* touched: a D2H destination worth promoting */

    /* ---- phase A: source `dev` made hot on this device only ---- */
    me->warm_ok = ready;
    for (int k = 0; ready && k < WARM_ROUNDS; k++)
        me->warm_ok &= sync_round_trip(me, me->dev, 100u + (unsigned)me->dev);
    pthread_barrier_wait(&bar);
    if (me->dev == 0) {
        for (int i = 0; i < NSRC; i++) {
            reg_after_warm[i] = fakecuda_registered(src[i], BUF);
            src_reg_id[i] = fakecuda_registration_id(src[i]);
        }
        for (int t = 0; t < NDEV; t++) {
            back_reg_after_warm[t] = w[t].back && fakecuda_registered(w[t].back, BUF);
            back_reg_id[t] = w[t].back ? fakecuda_registration_id(w[t].back) : 0;
        }
        reg_calls_after_warm = register_calls();
    }
    pthread_barrier_wait(&bar);

    /* ---- phase B: the source the other context promoted ---- */
    int other = (me->dev + 1) % NSRC;
    me->cross_sync_ok = me->cross_async_ok = ready;
    for (int k = 0; ready && k < 3; k++) {
        me->cross_sync_ok &= sync_round_trip(me, other, 100u + (unsigned)other);
        me->cross_async_ok &= async_round_trip(me, other, 100u + (unsigned)other);
    }

    /* ---- phase C: both sources, both devices, at the same time ---- */
    me->sync_ok = me->order_ok = me->async_ok = me->ptds_ok = ready;
    for (int r = 0; r < ROUNDS; r++) {
        pthread_barrier_wait(&bar);
        if (me->dev == 0)
            for (int i = 0; i < NSRC; i++)
                fill_pattern(src[i], BUF, 200u + (unsigned)(r * NSRC + i));
        pthread_barrier_wait(&bar);   /* nobody writes the sources until the next round */
        for (int i = 0; ready && i < NSRC; i++) {
            unsigned seed = 200u + (unsigned)(r * NSRC + i);
            me->sync_ok &= sync_round_trip(me, i, seed);
            /* A "kernel" on this device's legacy stream, then a sync D2H: it must wait for it. */
            unsigned char v = (unsigned char)(0x40 + r * 4 + i * 2 + me->dev);
            int ok = TCU(fakecuda_launch_write(NULL, me->d[i], v, BUF, 2000));
            if (TCU(cuMemcpyDtoH(me->back, me->d[i], BUF))) atomic_fetch_add(&n_d2h, 1); else ok = 0;
            me->order_ok &= ok && all_equal(me->back, BUF, v);
            me->async_ok &= async_round_trip(me, i, seed);
            /* Per-thread default stream flavour. */
            ok = TCU(cuMemcpyHtoD_v2_ptds(me->d[i], src[i], BUF));
            if (ok) atomic_fetch_add(&n_h2d, 1);
            memset(me->back, 0, BUF);
            if (TCU(cuMemcpyDtoH_v2_ptds(me->back, me->d[i], BUF))) atomic_fetch_add(&n_d2h, 1); else ok = 0;
            me->ptds_ok &= ok && check_pattern(me->back, BUF, seed);
        }
    }

    if (ready) {
        TCU(cuCtxSynchronize());
        TCU(cuStreamDestroy(me->s));
        for (int i = 0; i < NSRC; i++)
            TCU(cuMemFree(me->d[i]));
    }
    return NULL;
}

int main(void)
{
    /* Keep a larger count if the caller asked for one. */
    const char *have = getenv("FAKECUDA_DEVICES");
    if (!have || atoi(have) < NDEV)
        setenv("FAKECUDA_DEVICES", "2", 1);
    CU(cuInit(0));
    int ndev = 0;
    CU(cuDeviceGetCount(&ndev));
    CHECKF(ndev >= NDEV, "the fake driver shows %d devices (FAKECUDA_DEVICES set before cuInit)", ndev);
    if (ndev < NDEV) {
        printf("FAIL the fake read FAKECUDA_DEVICES before main's setenv: nothing else to test\n");
        return 1;
    }
    printf("mode=%s budget=%zu devices=%d\n", drvtest_mode(), drvtest_budget(), ndev);

    for (int i = 0; i < NSRC; i++) {
        src[i] = malloc(BUF);
        if (!src[i]) {
            printf("FAIL malloc\n");
            return 1;
        }
        fill_pattern(src[i], BUF, 100u + (unsigned)i);
    }
    pthread_barrier_init(&bar, NULL, NDEV);
    for (int t = 0; t < NDEV; t++) {
        w[t].dev = t;
        pthread_create(&w[t].th, NULL, worker_main, &w[t]);
    }
    for (int t = 0; t < NDEV; t++)
        pthread_join(w[t].th, NULL);
    unsigned long new_registrations = register_calls() - reg_calls_after_warm;

    for (int t = 0; t < NDEV; t++) {
        struct worker *me = &w[t];
        CHECKF(me->warm_ok, "device %d: hot source %d round trips, sync", t, t);
        CHECKF(me->cross_sync_ok, "device %d: source promoted in the other context, sync round trips", t);
        CHECKF(me->cross_async_ok, "device %d: source promoted in the other context, async on its own stream", t);
        CHECKF(me->sync_ok, "device %d: both shared sources, sync, while the other device copies them too", t);
        CHECKF(me->order_ok, "device %d: a sync D2H after a kernel on the device's legacy stream sees its writes", t);
        CHECKF(me->async_ok, "device %d: both shared sources, async on the thread's own stream", t);
        CHECKF(me->ptds_ok, "device %d: both shared sources, per-thread default stream copies", t);
    }
    CHECKF(atomic_load(&cuda_errors) == 0, "no driver call failed (%d failed)", atomic_load(&cuda_errors));

    printf("info: after phase A sources registered %d %d, D2H buffers %d %d; registrations since: %lu\n",
           reg_after_warm[0], reg_after_warm[1], back_reg_after_warm[0], back_reg_after_warm[1],
           new_registrations);
    int reg_now[NSRC];
    for (int i = 0; i < NSRC; i++)
        reg_now[i] = fakecuda_registered(src[i], BUF);
    if (drvtest_expect_promotion(BUF)) {
        for (int i = 0; i < NSRC; i++) {
            CHECKF(reg_after_warm[i], "source %d, hot on device %d, is promoted (mode %s)", i, i, drvtest_mode());
            CHECKF(reg_now[i], "source %d stays promoted while both devices copy it", i);
            /* What makes one registration serve every context on a real driver. */
            unsigned flags = 0;
            if (reg_now[i])
                CHECKF(cuMemHostGetFlags(&flags, src[i]) == CUDA_SUCCESS && (flags & CU_MEMHOSTREGISTER_PORTABLE),
                       "source %d is registered PORTABLE (flags 0x%x)", i, flags);
        }
        /* The buffers' own registrations, not every registration call: the shim may build its
         * staging buffers for a context at any time (a thread of its own builds one context's
         * at a time). */
        if (reg_after_warm[0] && reg_after_warm[1] && back_reg_after_warm[0] && back_reg_after_warm[1]) {
            int same = 1;
            for (int i = 0; i < NSRC; i++)
                same &= fakecuda_registration_id(src[i]) == src_reg_id[i];
            for (int t = 0; t < NDEV; t++)
                same &= fakecuda_registration_id(w[t].back) == back_reg_id[t];
            CHECKF(same, "the registrations made in one context serve the other: each source and "
                         "D2H buffer is held by the registration it had once promoted (%lu "
                         "registration calls since, staging buffers included)", new_registrations);
        }
    }
    if (!drvtest_promotes())
        for (int i = 0; i < NSRC; i++)
            CHECKF(!reg_after_warm[i] && !reg_now[i], "source %d never registered without a promoting shim (mode %s)",
                   i, drvtest_mode());
    size_t budget = drvtest_budget();
    if (budget)
        CHECKF(fakecuda_registered_bytes_peak() <= budget, "registered peak %zu within PINSHIM_BUDGET %zu",
               fakecuda_registered_bytes_peak(), budget);

    for (int t = 0; t < NDEV; t++)
        free(w[t].back);
    for (int i = 0; i < NSRC; i++)
        free(src[i]);
    CHECKF(fakecuda_violations() == 0, "no violations (%lu)", fakecuda_violations());
    printf("EXPECTED_COPIES h2d=%lu d2h=%lu d2d=0\n", atomic_load(&n_h2d), atomic_load(&n_d2h));
    return TEST_SUMMARY();
}
