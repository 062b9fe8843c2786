/* One staging lane used in both directions (copy/staging.c, lane_layout): an H2D copy cycles
 * through the lane's buffers and returns with its last DMAs still reading them; a D2H copy of
 * up to two buffers' size cuts the same memory into halves.  Thread A's async H2D copy returns
 * with its DMAs queued on its own stream, and thread B's D2H copy at once takes the same lane
 * on another stream: its DMAs must not write the lane's memory before A's have read it (the
 * fake flags a pinned source changed before its DMA read it, and A's bytes would arrive torn).  Then one thread alternates
 * the directions with sizes of one piece to many.  Every byte lands both ways, in every
 * variant; where the shim stages (mode full, its defaults) every copy is staged
 * (EXPECTED_STAGED). */
#define _GNU_SOURCE
#include <pthread.h>
#include <sys/mman.h>
#include "drvtest.h"
#include "fakecuda.h"

#define M (1u << 20)

static CUcontext ctx;
static CUdeviceptr dev_a, dev_b;
static const size_t dev_len = 48 * M;
static unsigned h2d, d2h;   /* copies made */

/* Fresh anonymous memory for each copy: a one-shot copy, which the shim stages rather than
 * registers, and which no pinned cache serves again. */
static unsigned char *fresh(size_t n)
{
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(p != MAP_FAILED);
    return p;
}

struct handoff {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int h2d_returned;
    size_t n;
    unsigned seed;
};

static void *d2h_thread(void *arg)
{
    struct handoff *h = arg;
    CU(cuCtxSetCurrent(ctx));
    pthread_mutex_lock(&h->mu);
    while (!h->h2d_returned)
        pthread_cond_wait(&h->cv, &h->mu);
    pthread_mutex_unlock(&h->mu);
    unsigned char *dst = fresh(h->n);
    CU(cuMemcpyDtoH(dst, dev_b, h->n));
    CHECKF(check_pattern(dst, h->n, h->seed), "thread B's D2H of %zu bytes: every byte lands", h->n);
    munmap(dst, h->n);
    return NULL;
}

/* Thread A's async H2D of n bytes on a new stream, thread B's D2H of nb bytes once A's call has
 * returned; both copies' bytes checked. */
static void one_round(size_t n, size_t nb, unsigned seed_a, unsigned seed_b)
{
    unsigned char *b_src = fresh(nb);
    fill_pattern(b_src, nb, seed_b);
    CU(cuMemcpyHtoD(dev_b, b_src, nb));
    munmap(b_src, nb);
    CU(cuCtxSynchronize());

    CUstream s;
    CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    unsigned char *a_src = fresh(n);
    fill_pattern(a_src, n, seed_a);
    struct handoff h = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, nb, seed_b };
    pthread_t t;
    CHECK(pthread_create(&t, NULL, d2h_thread, &h) == 0);
    CU(cuMemcpyHtoDAsync(dev_a, a_src, n, s));
    pthread_mutex_lock(&h.mu);
    h.h2d_returned = 1;
    pthread_cond_signal(&h.cv);
    pthread_mutex_unlock(&h.mu);
    pthread_join(t, NULL);
    CU(cuStreamSynchronize(s));
    CU(cuStreamDestroy(s));
    munmap(a_src, n);
    h2d += 2;
    d2h++;

    unsigned char *back = fresh(n);
    CU(cuMemcpyDtoH(back, dev_a, n));
    d2h++;
    CHECKF(check_pattern(back, n, seed_a), "thread A's async H2D of %zu bytes: every byte lands", n);
    munmap(back, n);
}

int main(void)
{
    ctx = drvtest_init();
    CU(cuMemAlloc(&dev_a, dev_len));
    CU(cuMemAlloc(&dev_b, dev_len));
    /* The process's first copy waits for the staging buffers (built from the first cuMemAlloc)
     * where a resident source might have been registered for it instead: 1 MiB into fresh
     * memory, whose registration would cost more than the driver's own path. */
    unsigned char *first = fresh(M);
    CU(cuMemcpyDtoH(first, dev_b, M));
    munmap(first, M);
    d2h++;

    /* A's H2D size, then B's D2H size: up to twice a buffer (16 MiB by default), a D2H copy
     * uses the buffers' halves. */
    static const size_t sizes[][2] = { { 40 * M, 24 * M + 4096 }, { 48 * M, 5 * M + 123 }, { 24 * M, 32 * M },
                                       { 48 * M, 16 * M }, { 5 * M, 2 * M }, { 40 * M, 40 * M },
                                       { 33 * M + 7, 12 * M }, { 48 * M, 48 * M } };

    /* A's H2D in flight while B's D2H takes the lane: each DMA made to wait 5 ms before it
     * runs, so that A's last ones certainly still wait when B's begin (with the run's usual
     * delay, B's DMAs landed before them in most runs, not all). */
    fakecuda_set_async_delay_us(5000);
    for (unsigned round = 0; round < sizeof sizes / sizeof sizes[0]; round++)
        one_round(sizes[round][0], sizes[round][1], 60 + round, 70 + round);
    const char *delay = getenv("FAKECUDA_ASYNC_DELAY_US");
    fakecuda_set_async_delay_us(delay ? (unsigned)atoi(delay) : 50);

    /* One thread, the directions alternating, sizes from one piece to many. */
    static const size_t alternating[] = { 2 * M, 33 * M, 7 * M + 5, 48 * M, M, 17 * M };
    for (unsigned i = 0; i < sizeof alternating / sizeof alternating[0]; i++) {
        size_t n = alternating[i];
        unsigned char *src = fresh(n), *dst = fresh(n);
        fill_pattern(src, n, 80 + i);
        CU(cuMemcpyHtoDAsync(dev_a, src, n, 0));
        CU(cuMemcpyDtoH(dst, dev_a, n));
        CHECKF(check_pattern(dst, n, 80 + i), "alternating, %zu bytes: every byte lands both ways", n);
        munmap(src, n);
        munmap(dst, n);
        h2d++;
        d2h++;
    }

    CU(cuMemFree(dev_a));
    CU(cuMemFree(dev_b));
    printf("EXPECTED_COPIES h2d=%u d2h=%u d2d=0\n", h2d, d2h);
    const char *budget = getenv("PINSHIM_BUDGET"), *min = getenv("PINSHIM_STAGING_MIN");
    if (!strcmp(drvtest_mode(), "full") && !budget && !min)
        printf("EXPECTED_STAGED copies=%u\n", h2d + d2h);
    return TEST_SUMMARY();
}
