/* The program's memset gives exactly what the C library gives, whoever sets the bytes (with the
 * shim preloaded, large calls into driver-pinned memory or into a heap block that carries
 * transfers are shared among its copy threads, PINSHIM_BOUNCE):
 *   - sizes around the threshold (PINSHIM_BOUNCE_MIN, default 1 MiB) and the threads' slice
 *     boundaries, unaligned destinations, several byte values (an int beyond a byte included),
 *     into cuMemHostAlloc memory and into malloc memory;
 *   - a result array: a heap block of a mapping of its own (beyond the arena's blocks) filled by
 *     a memcpy out of pinned memory, freed, allocated again at its size and cleared (JAX does
 *     this for every array it returns);
 *   - the fortified form (__memset_chk) within its destination's size;
 *   - several threads setting pinned memory at once, a fork child, a signal handler that sets
 *     memory while large memsets run.
 * The bytes around each destination are checked unchanged.  Shared in mode full only, not with
 * PINSHIM_BOUNCE=off (EXPECTED_BOUNCE_SETS, read by run_all.sh and check_bounce_off.sh). */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>
#include "drvtest.h"
#include "fakecuda.h"

void *__memset_chk(void *dst, int c, size_t n, size_t dst_len);

#define M (1u << 20)
#define MAXN (17u * M)
#define GUARD 4096u

/* Called through a volatile pointer: the compiler must not inline or fold the calls. */
static void *(*volatile do_memset)(void *, int, size_t) = memset;

static unsigned char *pinned;
static CUcontext ctx;

static void fill(unsigned char *p, size_t n, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 7;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        p[i] = (unsigned char)(x >> 24);
    }
}

/* memset(base + off, c, n) of a buffer of len bytes: [off, off+n) reads (unsigned char)c after,
 * the GUARD bytes either side keep what they held. */
static int one_set(unsigned char *base, size_t len, size_t off, int c, size_t n, uint32_t seed)
{
    size_t lo = off > GUARD ? off - GUARD : 0, hi = off + n + GUARD < len ? off + n + GUARD : len;
    fill(base + lo, hi - lo, seed);
    unsigned char before_lo = lo < off ? base[off - 1] : 0, before_hi = off + n < hi ? base[off + n] : 0;
    uint32_t sum_lo = 0, sum_hi = 0;
    for (size_t i = lo; i < off; i++)
        sum_lo = sum_lo * 31 + base[i];
    for (size_t i = off + n; i < hi; i++)
        sum_hi = sum_hi * 31 + base[i];
    if (do_memset(base + off, c, n) != base + off)
        return 0;
    for (size_t i = off; i < off + n; i++)
        if (base[i] != (unsigned char)c)
            return 0;
    uint32_t after_lo = 0, after_hi = 0;
    for (size_t i = lo; i < off; i++)
        after_lo = after_lo * 31 + base[i];
    for (size_t i = off + n; i < hi; i++)
        after_hi = after_hi * 31 + base[i];
    return after_lo == sum_lo && after_hi == sum_hi && (lo == off || base[off - 1] == before_lo) &&
           (off + n == hi || base[off + n] == before_hi);
}

static void sizes_and_alignments(unsigned char *heap)
{
    static const size_t sizes[] = { 0, 1, 4095, 65536, M - 1, M, M + 1, M + 63, 2 * M + 4096 + 17,
                                    4 * M, 7 * M + 3, 16 * M };
    static const size_t offsets[] = { 0, 1, 13, 4093, 4096 + 64 };
    static const int values[] = { 0, 0xa5, 0x1ff, -1 };
    int ok_pinned = 1, ok_heap = 1;
    uint32_t seed = 1;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        for (size_t k = 0; k < sizeof offsets / sizeof offsets[0]; k++) {
            size_t n = sizes[i], off = offsets[k];
            if (n + off > MAXN)
                continue;
            int c = values[(i + k) % 4];
            ok_pinned &= one_set(pinned, MAXN, off, c, n, seed++);
            ok_heap &= one_set(heap, MAXN, off, c, n, seed++);
        }
    CHECKF(ok_pinned, "memset of pinned memory: every size, alignment and value as the C library's");
    CHECKF(ok_heap, "memset of heap memory: every size, alignment and value as the C library's");
    fill(pinned, 4 * M + 2, 3);
    unsigned char first = pinned[0], last = pinned[4 * M + 1];
    __memset_chk(pinned + 1, 0x3c, 4 * M, MAXN - 1);
    int ok = pinned[0] == first && pinned[4 * M + 1] == last;
    for (size_t i = 1; i <= 4 * M; i++)
        ok &= pinned[i] == 0x3c;
    CHECKF(ok, "__memset_chk");
}

/* A result array: filled out of pinned memory, freed, allocated again and cleared. */
static void result_arrays(void)
{
    const size_t n = 48 * M;   /* beyond the arena's largest block: a mapping of its own */
    int ok = 1;
    for (int round = 0; round < 4 && ok; round++) {
        unsigned char *a = malloc(n);
        CHECK(a != NULL);
        ok &= one_set(a, n, 0, 0, n, (uint32_t)round + 40);
        fill(pinned, MAXN, (uint32_t)round);
        for (size_t off = 0; off < n; off += MAXN)
            memcpy(a + off, pinned, n - off < MAXN ? n - off : MAXN);
        ok &= memcmp(a, pinned, MAXN) == 0 && memcmp(a + 2 * MAXN, pinned, n - 2 * MAXN) == 0;
        free(a);
    }
    CHECKF(ok, "result arrays cleared, filled out of pinned memory, freed, allocated again");
}

#define THREADS 4

static void *thread_sets(void *arg)
{
    uintptr_t id = (uintptr_t)arg;
    size_t n = 3 * M + id * 4099;
    unsigned char *pin;
    int ok = 1;
    if (cuCtxSetCurrent(ctx) != CUDA_SUCCESS || cuMemHostAlloc((void **)&pin, n + 2 * GUARD, 0) != CUDA_SUCCESS)
        return (void *)0;
    for (unsigned r = 0; r < 20 && ok; r++)
        ok = one_set(pin, n + 2 * GUARD, GUARD + (r % 3), (int)(id * 16 + r), n - 3, (uint32_t)(id * 1000 + r));
    cuMemFreeHost(pin);
    return (void *)(uintptr_t)ok;
}

static void threads(void)
{
    pthread_t t[THREADS];
    for (uintptr_t i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, thread_sets, (void *)i);
    int ok = 1;
    for (int i = 0; i < THREADS; i++) {
        void *r;
        pthread_join(t[i], &r);
        ok &= r != NULL;
    }
    CHECKF(ok, "%d threads setting pinned memory at once", THREADS);
}

static void fork_child(void)
{
    int ok = 1;
    for (int i = 0; i < 3; i++) {
        pid_t pid = fork();
        if (pid == 0)
            _exit(one_set(pinned, MAXN, 5, 0x77, 4 * M, 9) ? 0 : 1);   /* no threads may start here */
        int status = 0;
        ok &= pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    }
    CHECKF(ok, "memset in a fork child");
}

static unsigned char *sig_buf;
static volatile sig_atomic_t sig_count, sig_bad;

static void on_signal(int sig)
{
    (void)sig;
    do_memset(sig_buf, 0x42, 2 * M);
    for (size_t i = 0; i < 2 * M; i += 4096)
        if (sig_buf[i] != 0x42)
            sig_bad = 1;
    sig_count++;
}

static void signal_handler_sets(void)
{
    sig_buf = malloc(2 * M);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    int ok = 1;
    for (int i = 0; i < 200 && ok; i++) {
        struct itimerval once = { { 0, 0 }, { 0, 50 + (i * 137) % 2000 } };
        setitimer(ITIMER_REAL, &once, NULL);
        ok = one_set(pinned, MAXN, 0, i & 0xff, 8 * M, (uint32_t)i);
    }
    struct itimerval off = { { 0, 0 }, { 0, 0 } };
    setitimer(ITIMER_REAL, &off, NULL);
    signal(SIGALRM, SIG_DFL);
    CHECKF(ok && !sig_bad && sig_count > 0, "memset from a signal handler during large memsets (%d signals)",
           (int)sig_count);
    free(sig_buf);
}

int main(void)
{
    ctx = drvtest_init();
    const char *bounce = getenv("PINSHIM_BOUNCE");
    int shares = strcmp(drvtest_mode(), "full") == 0 && !(bounce && strcmp(bounce, "off") == 0);
    printf("EXPECTED_BOUNCE_SETS shared=%d\n", shares);
    CU(cuMemHostAlloc((void **)&pinned, MAXN, 0));
    unsigned char *heap = malloc(MAXN);
    CHECK(heap != NULL);
    sizes_and_alignments(heap);
    result_arrays();
    threads();
    fork_child();
    signal_handler_sets();
    CHECKF(fakecuda_violations() == 0, "no violations (%lu)", fakecuda_violations());
    cuMemFreeHost(pinned);
    free(heap);
    return TEST_SUMMARY();
}
