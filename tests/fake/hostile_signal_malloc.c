/* A signal handler that calls malloc and free (not async-signal-safe by the letter, but what
 * sampling profilers commonly do), delivered at a high rate to the main thread while it maps
 * and unmaps 1-16 MiB regions, allocates and frees large blocks and copies them to and from the
 * device, sync and async.  The C library copes (the handler's small block comes from the
 * thread's cache, in a size class no other code of the thread uses, so the interrupted code
 * never holds it; a larger block would need the arena lock, which the interrupted thread may
 * hold, and the C library alone would deadlock); a library that interposes malloc must not
 * deadlock either.
 * Signals: a POSIX timer aimed at the main thread (SIGPROF, every 50 us) and a thread sending
 * SIGUSR1 with pthread_kill in bursts.  A watchdog ends a hung run after HOSTILE_WATCHDOG
 * seconds (default 20) with a FAIL line and exit status 99.  The work runs about 4 s. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include "drvtest.h"
#include "fakecuda.h"

#define MAXN ((size_t)16 << 20)
#define HANDLER_BYTES 888   /* a size no other code of this thread asks for */

static volatile sig_atomic_t handled;
static volatile sig_atomic_t stop;
static volatile unsigned long step;
static volatile const char *doing = "start";
static pthread_t main_thread;

static void handler(int sig)
{
    int saved = errno;
    unsigned char *volatile p = malloc(HANDLER_BYTES);   /* volatile: the allocation stays */
    if (p) {
        p[0] = (unsigned char)sig;
        p[HANDLER_BYTES - 1] = 1;
        free(p);
    }
    handled++;
    errno = saved;
}

static void block_signals(void)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGPROF);
    sigaddset(&set, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
}

static void *watchdog(void *arg)
{
    block_signals();
    unsigned secs = (unsigned)(uintptr_t)arg;
    for (unsigned i = 0; i < secs * 10 && !stop; i++) usleep(100000);
    if (!stop) {
        char buf[256];
        int n = snprintf(buf, sizeof buf, "FAIL hang: not finished after %u s (step %lu, %s; %ld signals handled)\n",
                         secs, step, (const char *)doing, (long)handled);
        ssize_t w = write(1, buf, (size_t)n);
        (void)w;
        _exit(99);
    }
    return NULL;
}

static void *kicker(void *arg)
{
    (void)arg;
    block_signals();
    while (!stop) {
        for (int i = 0; i < 50 && !stop; i++) {
            pthread_kill(main_thread, SIGUSR1);
            usleep(20);
        }
        usleep(1000);
    }
    return NULL;
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

int main(void)
{
    const char *w = getenv("HOSTILE_WATCHDOG");
    unsigned secs = w && *w ? (unsigned)strtoul(w, NULL, 10) : 20;
    main_thread = pthread_self();
    pthread_t wd, kt;
    pthread_create(&wd, NULL, watchdog, (void *)(uintptr_t)secs);

    drvtest_init();
    printf("mode=%s\n", drvtest_mode());
    CUdeviceptr dev;
    CU(cuMemAlloc(&dev, MAXN));
    CUstream s;
    CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    unsigned char *check = malloc(MAXN);

    /* the handler's block is in this thread's cache before the first signal (through a
     * volatile pointer: a compiler may drop a malloc whose block is freed unused) */
    void *volatile warm = malloc(HANDLER_BYTES);
    free(warm);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    sa.sa_flags = SA_RESTART;
    /* the two handlers never interrupt each other: a nested malloc of the same size would
     * break the C library's cache as surely as any other reentry */
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, SIGPROF);
    sigaddset(&sa.sa_mask, SIGUSR1);
    sigaction(SIGPROF, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
    struct sigevent sev;
    memset(&sev, 0, sizeof sev);
    sev.sigev_notify = SIGEV_THREAD_ID;
    sev.sigev_signo = SIGPROF;
    sev._sigev_un._tid = (pid_t)syscall(SYS_gettid);
    timer_t tm;
    int have_timer = timer_create(CLOCK_MONOTONIC, &sev, &tm) == 0;
    if (have_timer) {
        struct itimerspec its = { { 0, 50000 }, { 0, 50000 } };
        timer_settime(tm, 0, &its, NULL);
    }
    pthread_create(&kt, NULL, kicker, NULL);

    unsigned long bad = 0, copies = 0;
    /* 4 seconds of work (and at least 40 steps): a deadlock shows within that in most runs */
    struct timespec ts0, ts;
    clock_gettime(CLOCK_MONOTONIC, &ts0);
    for (step = 0;; step++) {
        clock_gettime(CLOCK_MONOTONIC, &ts);
        if (step >= 40 && (ts.tv_sec - ts0.tv_sec) * 1000000000L + (ts.tv_nsec - ts0.tv_nsec) > 4000000000L)
            break;
        size_t n = ((size_t)1 << 20) + (size_t)(next() % (MAXN - ((size_t)1 << 20)));
        int use_mmap = next() & 1;
        unsigned char *p;
        doing = use_mmap ? "mmap" : "malloc";
        if (use_mmap) {
            p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (p == MAP_FAILED) p = NULL;
        } else {
            p = malloc(n);
        }
        if (!p) {
            bad++;
            continue;
        }
        fill_pattern(p, n, (unsigned)step);
        int rounds = 1 + (int)(next() % 4);
        for (int r = 0; r < rounds; r++) {
            int async = next() & 1;
            doing = async ? "async copies" : "sync copies";
            if (async) {
                CU(cuMemcpyHtoDAsync(dev, p, n, s));
                memset(check, 0, n);
                CU(cuMemcpyDtoHAsync(check, dev, n, s));
                CU(cuStreamSynchronize(s));
            } else {
                CU(cuMemcpyHtoD(dev, p, n));
                memset(check, 0, n);
                CU(cuMemcpyDtoH(check, dev, n));
            }
            copies += 2;
            if (memcmp(check, p, n) != 0) bad++;
        }
        doing = use_mmap ? "munmap" : "free";
        if (use_mmap) munmap(p, n);
        else free(p);
        /* now and then a burst of large blocks held at once */
        if (step % 16 == 0) {
            doing = "malloc burst";
            void *blk[16];
            for (int i = 0; i < 16; i++) {
                blk[i] = malloc(((size_t)256 << 10) << (next() % 5));
                if (blk[i]) memset(blk[i], i, 4096);
            }
            for (int i = 0; i < 16; i++) free(blk[i]);
        }
    }
    doing = "finish";
    if (have_timer) timer_delete(tm);
    stop = 1;
    pthread_join(kt, NULL);
    pthread_join(wd, NULL);
    CHECKF(bad == 0, "every copy round trip correct while signals arrived (%lu of %lu wrong)", bad, copies);
    CHECKF(handled > 1000, "the handler ran often (%ld times)", (long)handled);
    CU(cuStreamDestroy(s));
    CU(cuMemFree(dev));
    free(check);
    CHECKF(fakecuda_violations() == 0, "no violations (%lu)", fakecuda_violations());
    return TEST_SUMMARY();
}
