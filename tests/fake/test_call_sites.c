/* Call sites in the statistics are true to what the program did.
 *   - a short run (the main thread): three sites, 22 copies each (two H2D sizes and one D2H),
 *     as a small program makes them: each site's count and bytes exact, not marked sampled;
 *   - a long run (a second thread, whose exact walks are used up by a warm-up site first): two
 *     sites with many copies of two sizes, interleaved with a third that has a smaller but
 *     noticeable share of the bytes (about a sixth): every one present, marked sampled, its bytes and count
 *     within a third of the truth;
 *   - two sites whose chains differ in one frame above a shared helper, alternating: each exact
 *     (the walk memo tells them apart), and on x86-64 the stacks walked are about one per chain
 *     (EXPECTED_WALKS: copies from a remembered chain are not walked again).
 * run_all.sh reads the EXPECTED_SITE lines against the stats file's call_sites (sites told
 * apart by their copy size); the sampling constants come from stats.h, so the phases stay long
 * enough when they change. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "drvtest.h"
#include "stats/stats.h"

#define MIB (1u << 20)
static CUcontext ctx;
static CUdeviceptr dev;
static unsigned char *host;
static int bad;

/* Each site a function of its own (the key is its return addresses); never inlined. */
__attribute__((noinline)) static void site_h2d(size_t n)
{
    if (cuMemcpyHtoD(dev, host, n) != CUDA_SUCCESS)
        bad++;
    __asm__ volatile("");
}

__attribute__((noinline)) static void site_h2d_other(size_t n)
{
    if (cuMemcpyHtoD(dev, host, n) != CUDA_SUCCESS)
        bad++;
    __asm__ volatile("");
}

__attribute__((noinline)) static void site_d2h(size_t n)
{
    if (cuMemcpyDtoH(host, dev, n) != CUDA_SUCCESS)
        bad++;
    __asm__ volatile("");
}

/* Two sites whose chains differ only above a shared helper, at the same depth: the walk memo
 * must tell them apart by the frame where they differ. */
__attribute__((noinline)) static void copy_helper(size_t n)
{
    if (cuMemcpyHtoD(dev, host, n) != CUDA_SUCCESS)
        bad++;
    __asm__ volatile("");
}

__attribute__((noinline)) static void site_via_helper_a(size_t n)
{
    copy_helper(n);
    __asm__ volatile("");
}

__attribute__((noinline)) static void site_via_helper_b(size_t n)
{
    copy_helper(n);
    __asm__ volatile("");
}

static void expect(const char *how, size_t size, unsigned long long copies)
{
    printf("EXPECTED_SITE %s size=%zu copies=%llu bytes=%llu\n", how, size, copies,
           copies * (unsigned long long)size);
}

/* Long-run sizes: all of them distinct from the short run's. */
#define WARM_SIZE (1 * MIB)
#define BIG_SIZE (5 * MIB)
#define MID_SIZE (3 * MIB)
#define SMALLER_SIZE (2 * MIB)

static void *long_run(void *arg)
{
    (void)arg;
    if (cuCtxSetCurrent(ctx) != CUDA_SUCCESS)
        bad++;
    /* The exact walks of this thread go to a warm-up site. */
    for (int i = 0; i < STATS_SITE_EXACT_FIRST; i++)
        site_d2h(WARM_SIZE);
    expect("exact", WARM_SIZE, STATS_SITE_EXACT_FIRST);
    /* Then 100 rounds of: 5 MiB H2D x2, 3 MiB D2H x3, 2 MiB H2D x2 (its share: 400 MiB of
     * ~2.2 GiB, several sampling periods).  Loops not unrolled: one call instruction a site. */
    unsigned long long big = 0, mid = 0, smaller = 0;
    for (int r = 0; r < 100; r++) {
        for (volatile int k = 0; k < 2; k++, big++)
            site_h2d(BIG_SIZE);
        for (volatile int k = 0; k < 3; k++, mid++)
            site_d2h(MID_SIZE);
        for (volatile int k = 0; k < 2; k++, smaller++)
            site_h2d_other(SMALLER_SIZE);
    }
    expect("sampled", BIG_SIZE, big);
    expect("sampled", MID_SIZE, mid);
    expect("sampled", SMALLER_SIZE, smaller);
    return NULL;
}

int main(void)
{
    ctx = drvtest_init();
    printf("mode=%s\n", drvtest_mode());
    host = malloc(8 * MIB);
    CHECK(host != NULL);
    memset(host, 7, 8 * MIB);
    CU(cuMemAlloc(&dev, 8 * MIB));

    /* The short run: what make demo's workload does, site by site. */
    for (int i = 0; i < 22; i++)
        site_h2d(8 * MIB);
    for (int i = 0; i < 22; i++)
        site_h2d_other(6 * MIB);
    for (int i = 0; i < 22; i++)
        site_d2h(4 * MIB);
    expect("exact", 8 * MIB, 22);
    expect("exact", 6 * MIB, 22);
    expect("exact", 4 * MIB, 22);
    /* Alternating between two chains that differ in one frame: each copy on its own site. */
    for (int i = 0; i < 30; i++) {
        site_via_helper_a(7 * MIB);
        site_via_helper_b(3 * MIB / 2);
    }
    expect("exact", 7 * MIB, 30);
    expect("exact", 3 * MIB / 2, 30);

    pthread_t t;
    CHECK(pthread_create(&t, NULL, long_run, NULL) == 0);
    pthread_join(t, NULL);
#if defined(__x86_64__)
    /* Each thread walks a chain once and finds it in its memo after that (stats.c, site_key):
     * 5 chains in the main thread, 4 in the other, 1,067 copies in all. */
    printf("EXPECTED_WALKS max=%d\n", 2 * (5 + 4));
#endif
    CHECKF(bad == 0, "every copy succeeded (%d failed)", bad);
    cuMemFree(dev);
    free(host);
    return TEST_SUMMARY();
}
