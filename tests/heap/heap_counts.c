/* What the heap costs the system, counted (not timed): run without and under the shim by
 * tests/check_heap_counts.sh, which compares the two.
 *
 *   heap_counts maps N LO HI   N live blocks of LO..HI bytes (seeded sizes), one byte of each
 *                              touched, left from 2N by freeing every other one (so that no
 *                              allocator can keep them in one run of pages); prints the
 *                              process's mappings at the peak, and checks that mmap,
 *                              pthread_create and (on a driver) cuMemHostAlloc still work there
 *   heap_counts loop SIZE PAIRS THREADS
 *                              malloc, touch every page, free, one live block per thread;
 *                              prints the minor page faults of the loop (with more than one
 *                              thread: after every thread's first pair, whose fresh pages
 *                              fault with any allocator)
 *   heap_counts set SIZE LIVE OPS
 *                              a working set of LIVE blocks of SIZE..2*SIZE, ops random
 *                              replacements (every page of a new block touched); faults
 *   heap_counts spread SIZE BLOCKS THREADS
 *                              THREADS threads allocate BLOCKS blocks of SIZE each, one block
 *                              each in turn (a barrier between turns), and free them in turns;
 *                              then as many new threads do it again: prints the 2 MiB regions
 *                              of address space the second cohort's blocks lie in, summed over
 *                              its threads (threads whose blocks are spread over everyone's
 *                              walk page tables no cache holds on every page they touch),
 *                              and the second cohort's minor page faults
 *   heap_counts aslimit        the address space limited (RLIMIT_AS) to what the process maps
 *                              plus 48 MiB, then blocks of 300 KiB-1 MiB allocated (malloc,
 *                              calloc, posix_memalign), grown and shrunk with realloc, written
 *                              and freed: prints how many calls failed and the calloc'd bytes
 *                              that were not zero (an allocator that wants 64 MiB of address
 *                              space for a new size fails where the C library does not)
 *   heap_counts letgo BYTES LO HI
 *                              blocks of LO..HI bytes, BYTES in all, every byte written, all
 *                              freed (lone ones and runs of neighbours), then as many
 *                              calloc'd again: prints the bytes of them that are not zero
 *                              (an allocator that gives freed pages back, or keeps them, must
 *                              zero what calloc returns either way) */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include "../testutil.h"

static long minor_faults(void)
{
    struct rusage r;
    getrusage(RUSAGE_SELF, &r);
    return r.ru_minflt;
}

static uint64_t rng = 88172645463325252ull;
static uint64_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static void *thread_ok(void *arg) { return arg; }

static int maps_mode(long n, size_t lo, size_t hi)
{
    char **blocks = calloc((size_t)n, sizeof *blocks), **gaps = calloc((size_t)n, sizeof *gaps);
    if (!blocks || !gaps)
        return 2;
    for (long i = 0; i < n; i++) {
        size_t sz = lo + (size_t)(next_rand() % (hi - lo + 1));
        gaps[i] = malloc(sz);
        blocks[i] = malloc(sz);
        if (!blocks[i] || !gaps[i]) {
            printf("FAIL malloc %ld of %ld failed\n", i, n);
            return 1;
        }
        blocks[i][0] = (char)i;
    }
    for (long i = 0; i < n; i++)
        free(gaps[i]);
    free(gaps);
    long maps = test_count_mappings();
    int ok = 1;
    void *m = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
        printf("FAIL mmap at the peak\n");
        ok = 0;
    } else {
        munmap(m, 1 << 20);
    }
    pthread_t t;
    if (pthread_create(&t, NULL, thread_ok, NULL) != 0) {
        printf("FAIL pthread_create at the peak\n");
        ok = 0;
    } else {
        pthread_join(t, NULL);
    }
    /* With a driver (the fake's, when LD_LIBRARY_PATH names it): pinned memory still comes. */
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD) ? NULL : dlopen("libcuda.so.1", RTLD_NOW);
    if (h) {
        int (*init)(unsigned) = dlsym(h, "cuInit");
        int (*dev_get)(int *, int) = dlsym(h, "cuDeviceGet");
        int (*retain)(void **, int) = dlsym(h, "cuDevicePrimaryCtxRetain");
        int (*set)(void *) = dlsym(h, "cuCtxSetCurrent");
        int (*host_alloc)(void **, size_t, unsigned) = dlsym(h, "cuMemHostAlloc");
        int (*free_host)(void *) = dlsym(h, "cuMemFreeHost");
        int dev;
        void *ctx, *p = NULL;
        if (init && dev_get && retain && set && host_alloc && free_host && init(0) == 0 &&
            dev_get(&dev, 0) == 0 && retain(&ctx, 0) == 0 && set(ctx) == 0) {
            if (host_alloc(&p, 1 << 20, 0) != 0 || !p) {
                printf("FAIL cuMemHostAlloc at the peak\n");
                ok = 0;
            } else {
                free_host(p);
            }
        }
    }
    for (long i = 0; i < n; i++) {
        if (blocks[i][0] != (char)i) {
            printf("FAIL block %ld lost its content\n", i);
            ok = 0;
            break;
        }
        free(blocks[i]);
    }
    free(blocks);
    printf("MAPPINGS %ld\n", maps);
    return ok ? 0 : 1;
}

static size_t loop_size;
static long loop_pairs;
static pthread_barrier_t warmed, counting;
static int loop_threads;

static void *loop_thread(void *arg)
{
    for (long i = 0; i < loop_pairs; i++) {
        if (i == 1 && loop_threads > 1) {
            pthread_barrier_wait(&warmed);     /* every thread has its first block */
            pthread_barrier_wait(&counting);   /* the count starts */
        }
        volatile char *p = malloc(loop_size);
        if (!p)
            return (void *)1;
        for (size_t o = 0; o < loop_size; o += 4096)
            p[o] = (char)i;
        free((void *)p);
    }
    return arg;
}

static int loop_mode(size_t size, long pairs, int threads)
{
    loop_size = size;
    loop_pairs = pairs;
    pthread_t t[64];
    if (threads > 64)
        threads = 64;
    loop_threads = threads;
    long f0 = minor_faults();
    int ok = 1;
    pthread_barrier_init(&warmed, NULL, (unsigned)threads + 1);
    pthread_barrier_init(&counting, NULL, (unsigned)threads + 1);
    for (int i = 0; i < threads; i++)
        pthread_create(&t[i], NULL, loop_thread, NULL);
    if (threads > 1 && pairs > 1) {
        pthread_barrier_wait(&warmed);
        f0 = minor_faults();
        pthread_barrier_wait(&counting);
    }
    for (int i = 0; i < threads; i++) {
        void *r;
        pthread_join(t[i], &r);
        ok &= r == NULL;
    }
    printf("FAULTS %ld\n", minor_faults() - f0);
    return ok ? 0 : 1;
}

static int set_mode(size_t size, long live, long ops)
{
    char **blocks = calloc((size_t)live, sizeof *blocks);
    if (!blocks)
        return 2;
    for (long i = 0; i < live; i++)
        blocks[i] = malloc(size);
    long f0 = minor_faults();
    for (long k = 0; k < ops; k++) {
        long i = (long)(next_rand() % (uint64_t)live);
        free(blocks[i]);
        size_t sz = size + (size_t)(next_rand() % size);
        volatile char *p = malloc(sz);
        if (!p)
            return 1;
        for (size_t o = 0; o < sz; o += 4096)
            p[o] = (char)k;
        blocks[i] = (char *)p;
    }
    printf("FAULTS %ld\n", minor_faults() - f0);
    for (long i = 0; i < live; i++)
        free(blocks[i]);
    free(blocks);
    return 0;
}

static size_t spread_size;
static long spread_blocks;
static pthread_barrier_t turn;

static int cmp_addr(const void *x, const void *y)
{
    uintptr_t a = *(const uintptr_t *)x, b = *(const uintptr_t *)y;
    return a < b ? -1 : a > b;
}

/* One cohort's thread: its blocks, allocated and freed in turns with the others'; returns the
 * distinct 2 MiB regions its blocks' pages lie in (or -1). */
static void *spread_thread(void *arg)
{
    (void)arg;
    char **blocks = calloc((size_t)spread_blocks, sizeof *blocks);
    size_t pages = (spread_size + 4095) / 4096, nr = 0;
    uintptr_t *regions = calloc((size_t)spread_blocks * pages, sizeof *regions);
    if (!blocks || !regions)
        return (void *)-1l;
    for (long i = 0; i < spread_blocks; i++) {
        pthread_barrier_wait(&turn);
        if (!(blocks[i] = malloc(spread_size)))
            return (void *)-1l;
        for (size_t o = 0; o < spread_size; o += 4096) {
            blocks[i][o] = 1;
            regions[nr++] = (uintptr_t)(blocks[i] + o) >> 21;
        }
    }
    for (long i = 0; i < spread_blocks; i++) {
        pthread_barrier_wait(&turn);
        free(blocks[i]);
    }
    qsort(regions, nr, sizeof *regions, cmp_addr);
    long distinct = 0;
    for (size_t k = 0; k < nr; k++)
        distinct += k == 0 || regions[k] != regions[k - 1];
    free(regions);
    free(blocks);
    return (void *)distinct;
}

static int spread_mode(size_t size, long nblocks, int threads)
{
    spread_size = size;
    spread_blocks = nblocks;
    if (threads > 64)
        threads = 64;
    long regions = 0, f0 = 0;
    pthread_barrier_init(&turn, NULL, (unsigned)threads);
    for (int cohort = 0; cohort < 2; cohort++) {
        pthread_t t[64];
        regions = 0;
        f0 = minor_faults();
        for (int i = 0; i < threads; i++)
            pthread_create(&t[i], NULL, spread_thread, NULL);
        for (int i = 0; i < threads; i++) {
            void *r;
            pthread_join(t[i], &r);
            if ((long)r < 0)
                return 1;
            regions += (long)r;
        }
    }
    printf("REGIONS %ld\nFAULTS %ld\n", regions, minor_faults() - f0);
    return 0;
}

static int aslimit_mode(void)
{
    void *warm = malloc(100 << 10);   /* an allocator's first large block, before the limit */
    long vm = test_status_value("VmSize") * 1024;   /* the address space mapped */
    if (!warm || vm < 0)
        return 2;
    struct rlimit r = { (rlim_t)vm + (48 << 20), (rlim_t)vm + (48 << 20) };
    if (setrlimit(RLIMIT_AS, &r) != 0)
        return 2;
    long failed = 0, nonzero = 0;
    enum { N = 12 };
    char *b[N];
    for (int i = 0; i < N; i++) {
        size_t n = (size_t)(300 + 61 * i) << 10;
        if (i % 3 == 0) {
            b[i] = malloc(n);
        } else if (i % 3 == 1) {
            b[i] = calloc(1, n);
            for (size_t k = 0; b[i] && k < n; k++)
                nonzero += b[i][k] != 0;
        } else {
            void *q = NULL;
            b[i] = posix_memalign(&q, 4096, n) == 0 ? q : NULL;
        }
        if (!b[i]) {
            failed++;
            continue;
        }
        memset(b[i], i, n);
        char *q = realloc(b[i], i % 2 ? n / 2 : n + (200 << 10));
        if (!q) {
            failed++;
            continue;
        }
        b[i] = q;
        if (q[0] != (char)i || q[n / 2 - 1] != (char)i)
            failed++;   /* realloc lost the block's content */
    }
    for (int i = 0; i < N; i++)
        free(b[i]);
    free(warm);
    printf("FAILED %ld\nNONZERO %ld\n", failed, nonzero);
    return 0;
}

static int letgo_mode(size_t bytes, size_t lo, size_t hi)
{
    size_t n = bytes / ((lo + hi) / 2) + 1;
    char **blocks = calloc(n, sizeof *blocks);
    size_t *sizes = calloc(n, sizeof *sizes);
    if (!blocks || !sizes)
        return 2;
    for (size_t i = 0; i < n; i++) {
        sizes[i] = lo + (size_t)(next_rand() % (uint64_t)(hi - lo + 1));
        if (!(blocks[i] = malloc(sizes[i])))
            return 1;
        memset(blocks[i], 0xA5, sizes[i]);
    }
    /* Freed in an order with runs of neighbours and lone blocks: the odd ones of the first
     * half, the second half in order, then the even ones of the first half. */
    for (size_t i = 1; i < n / 2; i += 2)
        free(blocks[i]);
    for (size_t i = n / 2; i < n; i++)
        free(blocks[i]);
    for (size_t i = 0; i < n / 2; i += 2)
        free(blocks[i]);
    size_t nonzero = 0;
    for (size_t i = 0; i < n; i++) {
        if (!(blocks[i] = calloc(1, sizes[i])))
            return 1;
        for (size_t k = 0; k < sizes[i]; k++)
            nonzero += blocks[i][k] != 0;
    }
    printf("BLOCKS %zu\nNONZERO %zu\n", n, nonzero);
    for (size_t i = 0; i < n; i++)
        free(blocks[i]);
    free(blocks);
    free(sizes);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 5 && !strcmp(argv[1], "maps"))
        return maps_mode(atol(argv[2]), strtoul(argv[3], NULL, 0), strtoul(argv[4], NULL, 0));
    if (argc == 5 && !strcmp(argv[1], "loop"))
        return loop_mode(strtoul(argv[2], NULL, 0), atol(argv[3]), atoi(argv[4]));
    if (argc == 5 && !strcmp(argv[1], "set"))
        return set_mode(strtoul(argv[2], NULL, 0), atol(argv[3]), atol(argv[4]));
    if (argc == 5 && !strcmp(argv[1], "spread"))
        return spread_mode(strtoul(argv[2], NULL, 0), atol(argv[3]), atoi(argv[4]));
    if (argc == 2 && !strcmp(argv[1], "aslimit"))
        return aslimit_mode();
    if (argc == 5 && !strcmp(argv[1], "letgo"))
        return letgo_mode(strtoul(argv[2], NULL, 0), strtoul(argv[3], NULL, 0), strtoul(argv[4], NULL, 0));
    fprintf(stderr, "usage: heap_counts maps N LO HI | loop SIZE PAIRS THREADS | set SIZE LIVE OPS | "
                    "spread SIZE BLOCKS THREADS | aslimit | letgo BYTES LO HI\n");
    return 2;
}
