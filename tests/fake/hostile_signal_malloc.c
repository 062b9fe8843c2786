/* A signal handler that calls malloc and free (not async-signal-safe by the letter, but what
 * sampling profilers commonly do), delivered at a high rate to the main thread while it maps
 * and unmaps 1-16 MiB regions, allocates and frees large blocks and copies them to and from the
 * device, sync and async.  The C library copes (the handler's small block comes from the
 * thread's cache, in a size class no other code of the thread uses, so the interrupted code
 * never holds it; a larger block would need the arena lock, which the interrupted thread may
 * hold, and the C library alone would deadlock); a library that interposes malloc must not
 * deadlock either.
 * Signals: a POSIX timer aimed at the main thread (SIGPROF, every 50 us) and a thread sending
 * SIGUSR1 with pthread_kill in bursts.  A watchdog ends a run that makes no progress (no call of
 * the main loop returns) for HOSTILE_WATCHDOG seconds (default 20) with a FAIL line, each
 * thread's state and stack, and exit status 99: a hang, told apart from a machine slow enough
 * that the work takes longer.  The work runs about 4 s. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "drvtest.h"
#include "fakecuda.h"

#define MAXN ((size_t)16 << 20)
#define HANDLER_BYTES 888   /* a size no other code of this thread asks for */

static volatile sig_atomic_t handled;
static volatile sig_atomic_t stop;
static volatile unsigned long step;
static volatile unsigned long progress;   /* calls of the main loop returned */
static volatile const char *doing = "start";

/* The main loop enters a phase: what the watchdog names if it hangs there. */
#define PHASE(what) (doing = (what), progress++)
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

/* Append " what=[first line of /proc/self/task/<tid>/<what>]" to out (no allocation: a hung
 * thread may hold the allocator's lock). */
static void append_task_file(char *out, size_t cap, const char *tid, const char *what)
{
    char path[96], buf[200];
    snprintf(path, sizeof path, "/proc/self/task/%s/%s", tid, what);
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return;
    buf[n] = 0;
    buf[strcspn(buf, "\n")] = 0;
    size_t used = strlen(out);
    snprintf(out + used, cap - used, " %s=[%s]", what, buf);
}

/* Where a hung run stands, for whoever reads the log: each thread's name, kernel wait and
 * system call, and, where gdb is installed, every thread's stack. */
static void report_hang(void)
{
    char dents[4096], line[768];
    int dfd = open("/proc/self/task", O_RDONLY | O_DIRECTORY);
    long n;
    while (dfd >= 0 && (n = syscall(SYS_getdents64, dfd, dents, sizeof dents)) > 0) {
        for (long off = 0; off < n;) {
            struct dirent64 *e = (struct dirent64 *)(dents + off);
            off += e->d_reclen;
            if (e->d_name[0] == '.')
                continue;
            snprintf(line, sizeof line, "thread %s:", e->d_name);
            append_task_file(line, sizeof line, e->d_name, "comm");
            append_task_file(line, sizeof line, e->d_name, "wchan");
            append_task_file(line, sizeof line, e->d_name, "syscall");
            size_t len = strlen(line);
            line[len++] = '\n';
            ssize_t w = write(1, line, len);
            (void)w;
        }
    }
    if (dfd >= 0)
        close(dfd);
    /* gdb, a child of this process, may attach to it (Yama's default lets only ancestors); it
     * runs without the shim preloaded. */
    prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
    char cmd[200], path_env[512];
    snprintf(cmd, sizeof cmd, "command -v gdb >/dev/null && timeout 60 gdb -p %d -batch -nx "
             "-ex 'thread apply all bt' 2>&1 | grep -E '^(Thread|#)'", (int)getpid());
    const char *path = getenv("PATH");
    snprintf(path_env, sizeof path_env, "PATH=%s", path ? path : "/usr/bin:/bin");
    char *argv[] = { "sh", "-c", cmd, NULL };
    char *envp[] = { path_env, NULL };
    pid_t child;
    if (posix_spawn(&child, "/bin/sh", NULL, NULL, argv, envp) == 0)
        waitpid(child, NULL, 0);
}

static void *watchdog(void *arg)
{
    block_signals();
    unsigned secs = (unsigned)(uintptr_t)arg;
    unsigned long seen = progress;
    unsigned still = 0, ticks = 0;   /* tenths of a second without progress; in all */
    for (; still < secs * 10 && !stop; ticks++) {
        usleep(100000);
        unsigned long now = progress;
        still = now == seen ? still + 1 : 0;
        seen = now;
    }
    if (!stop) {
        char buf[256];
        int n = snprintf(buf, sizeof buf,
                         "FAIL hang: no progress for %u s (step %lu, %s; %u s into the run; %ld signals handled)\n",
                         secs, step, (const char *)doing, ticks / 10, (long)handled);
        ssize_t w = write(1, buf, (size_t)n);
        (void)w;
        report_hang();
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
        PHASE(use_mmap ? "mmap" : "malloc");
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
        PHASE("fill");
        fill_pattern(p, n, (unsigned)step);
        int rounds = 1 + (int)(next() % 4);
        for (int r = 0; r < rounds; r++) {
            int async = next() & 1;
            if (async) {
                PHASE("async H2D copy");
                CU(cuMemcpyHtoDAsync(dev, p, n, s));
                PHASE("memset");
                memset(check, 0, n);
                PHASE("async D2H copy");
                CU(cuMemcpyDtoHAsync(check, dev, n, s));
                PHASE("stream synchronize");
                CU(cuStreamSynchronize(s));
            } else {
                PHASE("sync H2D copy");
                CU(cuMemcpyHtoD(dev, p, n));
                PHASE("memset");
                memset(check, 0, n);
                PHASE("sync D2H copy");
                CU(cuMemcpyDtoH(check, dev, n));
            }
            copies += 2;
            PHASE("compare");
            if (memcmp(check, p, n) != 0) bad++;
        }
        PHASE(use_mmap ? "munmap" : "free");
        if (use_mmap) munmap(p, n);
        else free(p);
        /* now and then a burst of large blocks held at once */
        if (step % 16 == 0) {
            PHASE("malloc burst");
            void *blk[16];
            for (int i = 0; i < 16; i++) {
                blk[i] = malloc(((size_t)256 << 10) << (next() % 5));
                if (blk[i]) memset(blk[i], i, 4096);
            }
            for (int i = 0; i < 16; i++) free(blk[i]);
        }
    }
    PHASE("finish");
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
