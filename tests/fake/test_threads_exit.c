/* Threads come and go; the process ends with work in flight.
 *   - 50 rounds of 3 threads: each copies sync and async on its own stream (blocking or
 *     non-blocking), checks, frees its buffers (promoted ones go to the shim's cache), one hands a
 *     promoted buffer to a thread that never used CUDA, which frees it, and one leaves an async
 *     copy from cuMemHostAlloc memory in flight when it exits; then they exit (the shim's
 *     per-thread streams go with them);
 *   - the program returns from main while an async copy from cuMemHostAlloc memory is still in
 *     flight behind 150 ms of device work on a blocking stream; an atexit handler then does one
 *     more sync copy (legacy stream: it waits for the blocking stream) and checks the data. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <unistd.h>
#include "drvtest.h"
#include "fakecuda.h"

#define ROUNDS 50
#define PER_ROUND 3
static const size_t n = 1u << 20;
static CUcontext ctx;
static CUdeviceptr inflight_dev;      /* PER_ROUND regions of n bytes */
static unsigned char *inflight_src;   /* pinned, PER_ROUND regions */
static int threads_ok = 1;

/* the final copy */
static CUdeviceptr final_dev;
static unsigned char *final_src;

struct job {
    int id;
    unsigned round;
    unsigned char *handoff;   /* out: a promoted buffer for another thread to free */
};

static void fail_thread(void)
{
    __atomic_store_n(&threads_ok, 0, __ATOMIC_RELAXED);
}

#define TCU(call)                                  \
    do {                                           \
        if ((call) != CUDA_SUCCESS)                \
            fail_thread();                         \
    } while (0)

static void *copier(void *arg)
{
    struct job *j = arg;
    unsigned seed = j->round * 16u + (unsigned)j->id;
    TCU(cuCtxSetCurrent(ctx));
    CUstream s;
    TCU(cuStreamCreate(&s, j->id % 2 ? CU_STREAM_NON_BLOCKING : 0));
    CUdeviceptr d;
    TCU(cuMemAlloc(&d, n));
    unsigned char *src = malloc(n), *dst = malloc(n);
    if (!src || !dst) {
        fail_thread();
        return NULL;
    }
    for (unsigned k = 0; k < 3; k++) {
        fill_pattern(src, n, seed + k);
        TCU(cuMemcpyHtoD(d, src, n));
        memset(dst, 0, n);
        TCU(cuMemcpyDtoH(dst, d, n));
        if (!check_pattern(dst, n, seed + k))
            fail_thread();
    }
    fill_pattern(src, n, seed + 5);
    TCU(cuMemcpyHtoDAsync(d, src, n, s));
    if (!drvtest_trust_async())
        memset(src, 0, n);   /* pageable semantics: the source may be reused at once */
    memset(dst, 0, n);
    TCU(cuMemcpyDtoHAsync(dst, d, n, s));
    TCU(cuStreamSynchronize(s));
    if (!check_pattern(dst, n, seed + 5))
        fail_thread();

    if (j->id == 2) {
        /* leave an async copy from pinned memory in flight, and go */
        unsigned char *ps = inflight_src + (size_t)j->id * n;
        fill_pattern(ps, n, 1000 + j->round);
        TCU(fakecuda_launch_write(s, inflight_dev + (size_t)j->id * n, 0, 4096, 2000));
        TCU(cuMemcpyHtoDAsync(inflight_dev + (size_t)j->id * n, ps, n, s));
    }
    TCU(cuStreamDestroy(s));
    TCU(cuMemFree(d));
    if (j->id == 1) {
        j->handoff = src;   /* promoted (maybe): freed by a thread without CUDA */
        src = NULL;
    }
    free(src);
    free(dst);
    return NULL;
}

static void *freer(void *arg)
{
    free(arg);   /* this thread never touched CUDA */
    return NULL;
}

static void at_exit_check(void)
{
    unsigned char *out = malloc(n);
    memset(out, 0, n);
    CUresult r = cuMemcpyDtoH(out, final_dev, n);
    int ok = r == CUDA_SUCCESS && check_pattern(out, n, 77);
    printf("%s atexit: a sync copy after main returned sees the in-flight async copy's data (r=%d)\n",
           ok ? "PASS" : "FAIL", (int)r);
    unsigned long v = fakecuda_violations();
    printf("%s atexit: no violations (%lu)\n", v == 0 ? "PASS" : "FAIL", v);
    fflush(stdout);
    free(out);
    if (!ok || v)
        _exit(1);
}

int main(void)
{
    ctx = drvtest_init();
    printf("mode=%s\n", drvtest_mode());
    CU(cuMemAlloc(&inflight_dev, PER_ROUND * n));
    CU(cuMemHostAlloc((void **)&inflight_src, PER_ROUND * n, 0));
    unsigned long created0 = fakecuda_calls("cuStreamCreate");
    unsigned long destroyed0 = fakecuda_calls("cuStreamDestroy_v2");

    int inflight_ok = 1;
    for (unsigned round = 0; round < ROUNDS; round++) {
        pthread_t th[PER_ROUND];
        struct job jobs[PER_ROUND];
        for (int i = 0; i < PER_ROUND; i++) {
            jobs[i] = (struct job){i, round, NULL};
            pthread_create(&th[i], NULL, copier, &jobs[i]);
        }
        for (int i = 0; i < PER_ROUND; i++)
            pthread_join(th[i], NULL);
        if (jobs[1].handoff) {
            pthread_t f;
            pthread_create(&f, NULL, freer, jobs[1].handoff);
            pthread_join(f, NULL);
        }
        /* the copy the exited thread left in flight */
        CU(cuCtxSynchronize());
        unsigned char *chk = malloc(n);
        memset(chk, 0, n);
        CU(cuMemcpyDtoH(chk, inflight_dev + 2 * n, n));
        inflight_ok &= check_pattern(chk, n, 1000 + round);
        free(chk);
    }
    CHECKF(threads_ok, "%d threads: every copy and driver call was right", ROUNDS * PER_ROUND);
    CHECKF(inflight_ok, "async copies left in flight by exiting threads completed right");
    unsigned long created = fakecuda_calls("cuStreamCreate") - created0;
    unsigned long destroyed = fakecuda_calls("cuStreamDestroy_v2") - destroyed0;
    printf("info: streams created %lu, destroyed %lu\n", created, destroyed);
    CHECKF(created - destroyed <= 2, "streams do not pile up as threads exit (%lu left)", created - destroyed);

    /* a block freed by a thread without CUDA can be allocated and used again */
    unsigned char *again = malloc(n);
    CUdeviceptr d;
    CU(cuMemAlloc(&d, n));
    fill_pattern(again, n, 88);
    CU(cuMemcpyHtoD(d, again, n));
    memset(again, 0, n);
    CU(cuMemcpyDtoH(again, d, n));
    CHECKF(check_pattern(again, n, 88), "a new block after the hand-offs copies right");
    free(again);

    /* the last copy: still in flight when main returns */
    CU(cuMemAlloc(&final_dev, n));
    CU(cuMemHostAlloc((void **)&final_src, n, 0));
    fill_pattern(final_src, n, 77);
    CUstream fs;
    CU(cuStreamCreate(&fs, 0));
    CU(fakecuda_launch_write(fs, final_dev, 0x11, n, 150000));
    CU(cuMemcpyHtoDAsync(final_dev, final_src, n, fs));
    CUresult q = cuStreamQuery(fs);
    CHECKF(q == CUDA_ERROR_NOT_READY, "the final async copy is in flight when main returns (query %d)", (int)q);
    atexit(at_exit_check);
    CHECKF(fakecuda_violations() == 0, "no violations before exit (%lu)", fakecuda_violations());
    return TEST_SUMMARY();
}
