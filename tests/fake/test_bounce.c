/* Bounce copies: the program's memcpy and memmove give exactly what the C library gives, whoever
 * copies them (with the shim preloaded, large calls into or out of pinned memory are shared
 * among its copy threads, PINSHIM_BOUNCE):
 *   - sizes around the threshold (PINSHIM_BOUNCE_MIN, default 1 MiB) and the threads' slice
 *     boundaries, unaligned source and destination, between malloc memory and cuMemHostAlloc
 *     memory both ways, into never-touched memory, and between two malloc blocks;
 *   - memmove with overlapping ranges, both ways;
 *   - the fortified forms (__memcpy_chk, __memmove_chk) within their destination size;
 *   - several threads copying at once;
 *   - a copy racing fork (the child copies too: no threads may start there);
 *   - a memcpy from a signal handler that interrupts large copies.
 * Every result is compared with a byte loop's.  The calls are shared in mode full only, and not
 * with PINSHIM_BOUNCE=off (EXPECTED_BOUNCE, read by run_all.sh and check_bounce_off.sh). */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>
#include "drvtest.h"
#include "fakecuda.h"

void *__memcpy_chk(void *dst, const void *src, size_t n, size_t dst_len);
void *__memmove_chk(void *dst, const void *src, size_t n, size_t dst_len);

#define M (1u << 20)
#define MAXN (17u * M)

/* Called through volatile pointers: the compiler must not inline or fold the calls. */
static void *(*volatile do_memcpy)(void *, const void *, size_t) = memcpy;
static void *(*volatile do_memmove)(void *, const void *, size_t) = memmove;

static void fill(unsigned char *p, size_t n, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 7;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        p[i] = (unsigned char)(x >> 24);
    }
}

/* Byte by byte, as the reference. */
static void ref_move(unsigned char *d, const unsigned char *s, size_t n)
{
    if (d < s)
        for (size_t i = 0; i < n; i++)
            d[i] = s[i];
    else
        for (size_t i = n; i-- > 0;)
            d[i] = s[i];
}

static int same(const unsigned char *a, const unsigned char *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i])
            return 0;
    return 1;
}

static unsigned char *pinned, *pageable, *expect;
static CUcontext ctx;

/* memcpy of n bytes from src+soff to dst+doff; the page around the destination range unchanged. */
static int one_copy(unsigned char *dst, size_t doff, const unsigned char *src, size_t soff, size_t n, uint32_t seed)
{
    size_t lo = doff > 4096 ? doff - 4096 : 0, hi = doff + n + 4096 < MAXN ? doff + n + 4096 : MAXN;
    fill(dst + lo, hi - lo, seed);
    memcpy(expect + lo, dst + lo, hi - lo);
    ref_move(expect + doff, src + soff, n);
    do_memcpy(dst + doff, src + soff, n);
    return same(dst + lo, expect + lo, hi - lo);
}

static void sizes_and_alignments(void)
{
    static const size_t sizes[] = { 0, 1, 4095, 65536, M - 1, M, M + 1, M + 63, 2 * M + 4096 + 17,
                                    4 * M, 7 * M + 3, 16 * M };
    static const size_t offsets[][2] = { { 0, 0 }, { 1, 0 }, { 0, 7 }, { 13, 4093 }, { 4096, 64 } };
    int ok_to = 1, ok_from = 1, ok_heap = 1;
    uint32_t seed = 1;
    fill(pinned, MAXN, 99);
    fill(pageable, MAXN, 98);
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        for (size_t k = 0; k < sizeof offsets / sizeof offsets[0]; k++) {
            size_t n = sizes[i], doff = offsets[k][0], soff = offsets[k][1];
            if (n + doff > MAXN || n + soff > MAXN)
                continue;
            unsigned char *src = malloc(n + soff + 1);
            fill(src, n + soff + 1, seed++);
            ok_to &= one_copy(pinned, doff, src, soff, n, seed++);
            fill(pinned + soff, n, seed++);
            ok_from &= one_copy(pageable, doff, pinned, soff, n, seed++);
            ok_heap &= one_copy(pageable, doff, src, soff, n, seed++);
            free(src);
        }
    }
    CHECKF(ok_to, "memcpy into pinned memory: every size and alignment as the C library's");
    CHECKF(ok_from, "memcpy out of pinned memory: every size and alignment as the C library's");
    CHECKF(ok_heap, "memcpy between heap blocks: every size and alignment as the C library's");

    /* Into memory never touched (a fresh result array). */
    for (size_t n = M; n <= 16 * M; n *= 4) {
        unsigned char *fresh = malloc(n + 64);
        fill(pinned, n, (uint32_t)n);
        do_memcpy(fresh + 64, pinned, n);
        CHECKF(same(fresh + 64, pinned, n), "memcpy of %zu bytes into never-touched memory", n);
        free(fresh);
    }
    /* The fortified forms within their destination's size. */
    fill(pageable, 4 * M, 5);
    __memcpy_chk(pinned, pageable, 4 * M, MAXN);
    CHECKF(same(pinned, pageable, 4 * M), "__memcpy_chk");
    __memmove_chk(pinned + 1, pageable, 4 * M, MAXN - 1);
    CHECKF(same(pinned + 1, pageable, 4 * M), "__memmove_chk");
}

static void overlapping_memmove(void)
{
    static const size_t shifts[] = { 1, 63, 4096, M / 2, 3 * M };
    int ok = 1;
    for (size_t i = 0; i < sizeof shifts / sizeof shifts[0]; i++) {
        size_t n = 8 * M, sh = shifts[i];
        /* forward overlap: dst above src */
        fill(pinned, MAXN, (uint32_t)i);
        memcpy(expect, pinned, MAXN);
        ref_move(expect + sh, expect, n);
        do_memmove(pinned + sh, pinned, n);
        ok &= same(pinned, expect, MAXN);
        /* backward overlap: dst below src */
        fill(pinned, MAXN, (uint32_t)i + 100);
        memcpy(expect, pinned, MAXN);
        ref_move(expect, expect + sh, n);
        do_memmove(pinned, pinned + sh, n);
        ok &= same(pinned, expect, MAXN);
    }
    CHECKF(ok, "memmove with overlapping ranges, both ways, as the C library's");
}

#define THREADS 4

static void *thread_copies(void *arg)
{
    uintptr_t id = (uintptr_t)arg;
    size_t n = 3 * M + id * 4099;
    unsigned char *src = malloc(n), *dst = malloc(n), *pin;
    int ok = 1;
    if (cuCtxSetCurrent(ctx) != CUDA_SUCCESS || cuMemHostAlloc((void **)&pin, n, 0) != CUDA_SUCCESS)
        return (void *)0;
    for (unsigned r = 0; r < 20 && ok; r++) {
        fill(src, n, (uint32_t)(id * 1000 + r));
        do_memcpy(pin, src, n);
        memset(dst, 0, n);
        do_memcpy(dst, pin, n);
        ok = same(dst, src, n);
    }
    cuMemFreeHost(pin);
    free(src);
    free(dst);
    return (void *)(uintptr_t)ok;
}

static void threads(void)
{
    pthread_t t[THREADS];
    for (uintptr_t i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, thread_copies, (void *)i);
    int ok = 1;
    for (int i = 0; i < THREADS; i++) {
        void *r;
        pthread_join(t[i], &r);
        ok &= r != NULL;
    }
    CHECKF(ok, "%d threads copying into and out of pinned memory at once", THREADS);
}

static int stop_copier;   /* atomic: read by the copier thread */

static void *copier(void *arg)
{
    unsigned char *src = malloc(4 * M);
    fill(src, 4 * M, 77);
    while (!__atomic_load_n(&stop_copier, __ATOMIC_RELAXED))
        do_memcpy(pinned, src, 4 * M);
    free(src);
    return arg;
}

static void fork_race(void)
{
    pthread_t t;
    __atomic_store_n(&stop_copier, 0, __ATOMIC_RELAXED);
    pthread_create(&t, NULL, copier, NULL);
    int ok = 1;
    for (int i = 0; i < 5; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            /* The child copies too, in pinned memory it shares with the parent's mapping. */
            unsigned char *a = malloc(4 * M), *b = malloc(4 * M);
            fill(a, 4 * M, 5);
            do_memcpy(b, a, 4 * M);
            _exit(same(a, b, 4 * M) ? 0 : 1);
        }
        int status = 0;
        ok &= pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    }
    __atomic_store_n(&stop_copier, 1, __ATOMIC_RELAXED);
    pthread_join(t, NULL);
    CHECKF(ok, "fork while another thread copies: the child's copies right, no hang");
}

static unsigned char *sig_src, *sig_dst;
static volatile sig_atomic_t sig_count, sig_bad;

static void on_signal(int sig)
{
    (void)sig;
    do_memcpy(sig_dst, sig_src, 2 * M);
    if (!same(sig_dst, sig_src, 2 * M))
        sig_bad = 1;
    sig_count++;
}

static void signal_handler_copies(void)
{
    sig_src = malloc(2 * M);
    sig_dst = malloc(2 * M);
    fill(sig_src, 2 * M, 31);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    unsigned char *src = malloc(8 * M);
    fill(src, 8 * M, 32);
    int ok = 1;
    for (int i = 0; i < 200 && ok; i++) {
        /* One signal per round, at a varying point of the copy: a repeating timer shorter than the
         * handler (a slow build, a sanitizer) would leave no time between signals for the loop. */
        struct itimerval once = { { 0, 0 }, { 0, 50 + (i * 137) % 2000 } };
        setitimer(ITIMER_REAL, &once, NULL);
        do_memcpy(pinned, src, 8 * M);
        ok = same(pinned, src, 8 * M);
    }
    struct itimerval off = { { 0, 0 }, { 0, 0 } };
    setitimer(ITIMER_REAL, &off, NULL);
    signal(SIGALRM, SIG_DFL);
    CHECKF(ok && !sig_bad && sig_count > 0, "memcpy from a signal handler during large copies (%d signals)", (int)sig_count);
    free(src);
    free(sig_src);
    free(sig_dst);
}

int main(void)
{
    ctx = drvtest_init();
    printf("mode=%s\n", drvtest_mode());
    /* Whether the shim shares large copies here: mode full, PINSHIM_BOUNCE not off (run_all.sh
     * checks the stats' bounce count against it: observe and pin leave every call to libc). */
    const char *bounce = getenv("PINSHIM_BOUNCE");
    int shares = strcmp(drvtest_mode(), "full") == 0 && !(bounce && strcmp(bounce, "off") == 0);
    printf("EXPECTED_BOUNCE shared=%d\n", shares);
    CU(cuMemHostAlloc((void **)&pinned, MAXN, 0));
    pageable = malloc(MAXN);
    expect = malloc(MAXN);
    sizes_and_alignments();
    overlapping_memmove();
    threads();
    fork_race();
    signal_handler_copies();
    CHECKF(fakecuda_violations() == 0, "no violations (%lu)", fakecuda_violations());
    cuMemFreeHost(pinned);
    free(pageable);
    free(expect);
    return TEST_SUMMARY();
}
