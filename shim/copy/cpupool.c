/* The CPU copy threads (see cpupool.h).
 *
 * A job is one copy; it is cut into slices, one per thread at most, never smaller than
 * SLICE_MIN (splitting less costs more in wake-ups than it gains).  Workers take slices of the
 * oldest job; the job's owner takes only its own job's slices (helping another pipeline's job
 * would delay its own) and returns when all are done.  Idle workers spin briefly before
 * sleeping: in a pipeline the next job follows within microseconds.
 *
 * Slices are handed out without a lock (see struct job_slot): a staging pipeline posts a job per
 * piece of a few MiB, whose slices take tens of microseconds, and sixteen workers queueing on
 * one mutex to take them started one after another, each woken by the one before. */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "base/config.h"
#include "base/os.h"
#include "base/real.h"
#include "base/shim.h"
#include "copy/cpupool.h"

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#define MAX_WORKERS 63           /* PINSHIM_COPY_THREADS <= 64, the caller is one of them */
#define AUTO_THREADS_MAX 16      /* "auto": the GPU's local CPUs, at most this many */
#define WORKER_SPIN_NS 50000ull
#define OWNER_SPIN_NS 100000ull  /* the caller waits for its job's last slices this long awake */
#define SLICE_MIN (64u << 10)

#define MAX_JOBS 16              /* jobs at once: staging lanes' pieces and bounce copies */

enum job_kind {
    JOB_COPY,                  /* src to dst */
    JOB_SET,                   /* dst set to the byte `value` (cpupool_set) */
    JOB_PREFAULT,              /* dst faulted in (cpupool_prefault) */
    JOB_FLUSH,                 /* src's lines pushed out of the caches (cpupool_flush) */
};

struct copy_job {
    char *dst;
    const char *src;
    size_t dpitch, spitch, width, rows;
    unsigned flags;
    unsigned nslices;
    enum job_kind kind;
    int value;                 /* JOB_SET */
    size_t slice_bytes;        /* JOB_PREFAULT: slices of this many bytes from a huge-page boundary */
};

/* Where a job lives while its slices are handed out.  `word` holds the job's ticket (bits
 * 16-63: increasing, 0 when the slot holds no job), its slice count (bits 8-15) and the next
 * slice to take (bits 0-7); a thread takes a slice by one compare-and-swap of it.  A word read
 * before its job ended fails the swap once the slot holds another job (another ticket), so a
 * thread reads a job's fields only after taking one of its slices: the job is live then, and
 * its fields stay put until its owner has seen every slice done.  Slots are never freed. */
struct job_slot {
    uint64_t word;
    unsigned done;               /* slices finished */
    int owner_waiting;           /* the owner sleeps on done_cv for this job */
    int owned;                   /* taken by a caller (the word may still be 0) */
    struct copy_job job;
} __attribute__((aligned(64)));

#define WORD_NEXT(w) ((unsigned)((w) & 0xff))
#define WORD_COUNT(w) ((unsigned)(((w) >> 8) & 0xff))
#define WORD_TICKET(w) ((w) >> 16)
_Static_assert(MAX_WORKERS + 1 <= 0xff, "a job's slices (one per thread at most) fit in 8 bits");

static struct {
    pthread_mutex_t mu;          /* only for sleeping and waking */
    pthread_cond_t work_cv, done_cv;
    struct job_slot slots[MAX_JOBS];
    uint64_t tickets;            /* the last ticket given */
    unsigned gen;                /* bumped per job posted: spinning workers watch it */
    int sleepers;                /* workers in (or entering) pthread_cond_wait on work_cv */
    int stop;
    int started;
    int nworkers;
    pthread_t tid[MAX_WORKERS];
} pool = { .mu = PTHREAD_MUTEX_INITIALIZER, .work_cv = PTHREAD_COND_INITIALIZER,
           .done_cv = PTHREAD_COND_INITIALIZER };

static char device_bus_id[32];
static cpu_set_t device_local;   /* pool.mu: the device's local CPUs, read by cpupool_prefer_device */
static int device_nlocal;
static int populate_broken;      /* the kernel has no MADV_POPULATE_* (before Linux 5.14) */

/* ---- copying one slice ---- */

static void copy_plain(char *dst, const char *src, size_t n)
{
    /* The C library's memcpy itself: the shim's own memcpy export is for the program. */
    if (SHIM_LIKELY(libc.memcpy != NULL))
        libc.memcpy(dst, src, n);
    else
        __builtin_memcpy(dst, src, n);
}

#if defined(__x86_64__)
/* Streaming stores: the destination's lines are written without being read first (no
 * read-for-ownership), a third less memory traffic for a copy that is bound by it. */
static void copy_stream(char *dst, const char *src, size_t n)
{
    size_t head = (16 - ((uintptr_t)dst & 15)) & 15;
    if (head > n)
        head = n;
    copy_plain(dst, src, head);
    dst += head;
    src += head;
    n -= head;
    size_t blocks = n / 64;
    for (size_t i = 0; i < blocks; i++) {
        __m128i a = _mm_loadu_si128((const __m128i *)src);
        __m128i b = _mm_loadu_si128((const __m128i *)(src + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(src + 32));
        __m128i d = _mm_loadu_si128((const __m128i *)(src + 48));
        _mm_stream_si128((__m128i *)dst, a);
        _mm_stream_si128((__m128i *)(dst + 16), b);
        _mm_stream_si128((__m128i *)(dst + 32), c);
        _mm_stream_si128((__m128i *)(dst + 48), d);
        src += 64;
        dst += 64;
    }
    _mm_sfence();   /* ordered before whoever learns the slice is done */
    copy_plain(dst, src, n % 64);
}
#else
static void copy_stream(char *dst, const char *src, size_t n)
{
    copy_plain(dst, src, n);
}
#endif

/* ---- pushing a source's lines out of the caches ---- */

#if defined(__x86_64__)
#include <cpuid.h>

static int flush_opt = -1;   /* CLFLUSHOPT there (CPUID leaf 7, EBX bit 23); -1 not asked yet */

int cpupool_flushes(void)
{
    return 1;   /* CLFLUSH is part of x86-64 */
}

static int have_clflushopt(void)
{
    int v = __atomic_load_n(&flush_opt, __ATOMIC_RELAXED);
    if (v < 0) {
        unsigned a, b, c, d;
        v = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & (1u << 23));
        __atomic_store_n(&flush_opt, v, __ATOMIC_RELAXED);
    }
    return v;
}

/* Each 64-byte line of [p, p+n): written back if dirty, dropped from every cache.  Only memory
 * the copy just read: its pages are mapped and readable. */
static void flush_lines(const char *p, size_t n)
{
    if (!n)
        return;
    uintptr_t a = (uintptr_t)p & ~(uintptr_t)63, end = (uintptr_t)p + n;
    if (have_clflushopt()) {
        for (; a < end; a += 64)
            __asm__ __volatile__("clflushopt %0" : "+m"(*(volatile char *)a));
        __asm__ __volatile__("sfence" ::: "memory");
    } else {
        for (; a < end; a += 64)
            __asm__ __volatile__("clflush %0" : "+m"(*(volatile char *)a));
    }
}
#else
int cpupool_flushes(void)
{
    return 0;
}

static void flush_lines(const char *p, size_t n)
{
    (void)p;
    (void)n;
}
#endif

/* Fault in the pages of [p, p+n) in one call if the first one is not resident. */
static void populate(const char *p, size_t n, int advice)
{
    if (__atomic_load_n(&populate_broken, __ATOMIC_RELAXED) || !n)
        return;
    uintptr_t start = page_down((uintptr_t)p), end = page_up((uintptr_t)p + n);
    if (os_resident_bytes(start, SHIM_PAGE_SIZE) != 0)
        return;
    if (os_populate((void *)start, end - start, advice) != 0 && errno == EINVAL)
        __atomic_store_n(&populate_broken, 1, __ATOMIC_RELAXED);
}

void cpupool_copy_here(void *dst, const void *src, size_t n, unsigned flags)
{
    if (flags & CPUPOOL_FAULT_SRC)
        populate(src, n, MADV_POPULATE_READ);
    if (flags & CPUPOOL_FAULT_DST)
        populate(dst, n, MADV_POPULATE_WRITE);
    if (flags & CPUPOOL_STREAM)
        copy_stream(dst, src, n);
    else
        copy_plain(dst, src, n);
    if (flags & CPUPOOL_FLUSH_SRC)
        flush_lines(src, n);
}

/* Slice i of a one-row job: whole 64-byte lines, so that streaming stores meet at line
 * boundaries.  0 when the slice is empty. */
static size_t line_slice(const struct copy_job *j, unsigned i, size_t *off)
{
    size_t per = ((j->width + j->nslices - 1) / j->nslices + 63) & ~(size_t)63;
    *off = (size_t)i * per;
    return *off < j->width ? (j->width - *off < per ? j->width - *off : per) : 0;
}

static void run_slice(const struct copy_job *j, unsigned i)
{
    size_t off, n;
    if (j->kind == JOB_SET) {
        if ((n = line_slice(j, i, &off))) {
            if (j->flags & CPUPOOL_FAULT_DST)
                populate(j->dst + off, n, MADV_POPULATE_WRITE);
            memset(j->dst + off, j->value, n);
        }
        return;
    }
    if (j->kind == JOB_FLUSH) {
        if ((n = line_slice(j, i, &off)))
            flush_lines(j->src + off, n);
        return;
    }
    if (j->kind == JOB_PREFAULT) {
        /* Slice i of a prefault: whole huge pages, counted from the one dst lies in. */
        uintptr_t start = (uintptr_t)j->dst, end = start + j->width;
        uintptr_t lo = (start & ~(SHIM_HUGE_PAGE - 1)) + (uintptr_t)i * j->slice_bytes, hi = lo + j->slice_bytes;
        if (lo < start)
            lo = start;
        if (hi > end)
            hi = end;
        if (lo < hi)
            populate((const char *)lo, hi - lo, MADV_POPULATE_WRITE);
        return;
    }
    if (j->rows == 1) {
        if ((n = line_slice(j, i, &off)))
            cpupool_copy_here(j->dst + off, j->src + off, n, j->flags);
        return;
    }
    size_t per = (j->rows + j->nslices - 1) / j->nslices;
    size_t r0 = (size_t)i * per, r1 = r0 + per < j->rows ? r0 + per : j->rows;
    for (size_t r = r0; r < r1; r++)
        cpupool_copy_here(j->dst + r * j->dpitch, j->src + r * j->spitch, j->width, j->flags);
}

/* ---- the threads ---- */

static void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Take one slice of slot s's job: its index, or -1 when the slot holds no job with slices left.
 * *count: the job's slice count. */
static int claim(struct job_slot *s, unsigned *count)
{
    uint64_t w = __atomic_load_n(&s->word, __ATOMIC_ACQUIRE);
    while (WORD_TICKET(w) && WORD_NEXT(w) < WORD_COUNT(w)) {
        if (__atomic_compare_exchange_n(&s->word, &w, w + 1, 1, __ATOMIC_ACQUIRE, __ATOMIC_ACQUIRE)) {
            *count = WORD_COUNT(w);
            return (int)WORD_NEXT(w);
        }
    }
    return -1;
}

/* A slice of the oldest job with slices left: its slot, NULL when there is none. */
static struct job_slot *claim_oldest(int *index, unsigned *count)
{
    for (;;) {
        struct job_slot *best = NULL;
        uint64_t best_ticket = UINT64_MAX;
        for (int k = 0; k < MAX_JOBS; k++) {
            uint64_t w = __atomic_load_n(&pool.slots[k].word, __ATOMIC_RELAXED);
            if (WORD_TICKET(w) && WORD_NEXT(w) < WORD_COUNT(w) && WORD_TICKET(w) < best_ticket) {
                best = &pool.slots[k];
                best_ticket = WORD_TICKET(w);
            }
        }
        if (!best)
            return NULL;
        if ((*index = claim(best, count)) >= 0)
            return best;   /* (another job, if the slot was reused meanwhile: still a live one) */
    }
}

/* A worker finished a slice of s's job, which has `count` slices.  After the last one the owner
 * may reuse the slot at once: only its owner_waiting flag is read after (a stale read of it
 * costs one needless wake-up).  The flag and done are both sequentially consistent, so that
 * either the owner sees the last slice done or this thread sees the owner waiting. */
static void slice_done(struct job_slot *s, unsigned count)
{
    if (__atomic_add_fetch(&s->done, 1, __ATOMIC_SEQ_CST) == count &&
        __atomic_load_n(&s->owner_waiting, __ATOMIC_SEQ_CST)) {
        pthread_mutex_lock(&pool.mu);
        pthread_cond_broadcast(&pool.done_cv);
        pthread_mutex_unlock(&pool.mu);
    }
}

static void *worker_main(void *arg)
{
    shim_enter();   /* anything this thread allocates bypasses the hooks; never left */
    shim_own_thread = 1;
    /* Named by itself (a system call): naming another thread opens a file under /proc. */
    pthread_setname_np(pthread_self(), "pinshim-copy");
    while (!__atomic_load_n(&pool.stop, __ATOMIC_ACQUIRE)) {
        /* The generation first: a job posted after it is seen by the scan or changes it. */
        unsigned gen = __atomic_load_n(&pool.gen, __ATOMIC_SEQ_CST);
        int i;
        unsigned count;
        struct job_slot *s = claim_oldest(&i, &count);
        if (s) {
            run_slice(&s->job, (unsigned)i);
            slice_done(s, count);
            continue;
        }
        uint64_t t0 = shim_now_ns();
        int changed = 0;
        for (unsigned n = 0; !changed; n++) {
            changed = __atomic_load_n(&pool.gen, __ATOMIC_ACQUIRE) != gen ||
                      __atomic_load_n(&pool.stop, __ATOMIC_ACQUIRE);
            if ((n & 63) == 63 && shim_now_ns() - t0 > WORKER_SPIN_NS)
                break;
            cpu_relax();
        }
        if (changed)
            continue;
        /* Asleep: a poster that bumps gen after this thread counted itself wakes it; one that
         * bumped it before is seen here (both sides sequentially consistent). */
        pthread_mutex_lock(&pool.mu);
        __atomic_add_fetch(&pool.sleepers, 1, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&pool.gen, __ATOMIC_SEQ_CST) == gen && !__atomic_load_n(&pool.stop, __ATOMIC_SEQ_CST))
            pthread_cond_wait(&pool.work_cv, &pool.mu);
        __atomic_sub_fetch(&pool.sleepers, 1, __ATOMIC_SEQ_CST);
        pthread_mutex_unlock(&pool.mu);
    }
    return arg;
}

static int device_cpus(const char *bus_id, cpu_set_t *out);

void cpupool_prefer_device(const char *pci_bus_id)
{
    if (__atomic_load_n(&pool.started, __ATOMIC_ACQUIRE) || !pci_bus_id)
        return;
    char id[sizeof device_bus_id];
    size_t i = 0;
    for (; pci_bus_id[i] && i + 1 < sizeof id; i++)
        id[i] = (char)tolower((unsigned char)pci_bus_id[i]);
    id[i] = '\0';
    /* The sysfs file is read here, on the program's thread that asks, never on one of the
     * shim's own: a program that closes the descriptors it did not open and puts files of its
     * own under their numbers (dup2) must never meet a descriptor the shim holds open. */
    cpu_set_t local;
    int nlocal = device_cpus(id, &local);
    pthread_mutex_lock(&pool.mu);
    if (!pool.started && !device_bus_id[0]) {
        memcpy(device_bus_id, id, sizeof id);
        device_local = local;
        device_nlocal = nlocal;
    }
    pthread_mutex_unlock(&pool.mu);
}

/* The CPUs sysfs names as local to the device, within the ones this process may use; 0 when
 * unknown.  The list reads like "0-7,16-23". */
static int device_cpus(const char *bus_id, cpu_set_t *out)
{
    if (!bus_id[0])
        return 0;
    char path[96], text[512];
    snprintf(path, sizeof path, "/sys/bus/pci/devices/%s/local_cpulist", bus_id);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t len = read(fd, text, sizeof text - 1);
    close(fd);
    if (len <= 0)
        return 0;
    text[len] = '\0';
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0)
        return 0;
    CPU_ZERO(out);
    for (char *p = text; *p && *p != '\n';) {
        char *end;
        long a = strtol(p, &end, 10), b = a;
        if (end == p)
            break;
        if (*end == '-') {
            p = end + 1;
            b = strtol(p, &end, 10);
            if (end == p)
                break;
        }
        for (long c = a; c <= b && c < CPU_SETSIZE; c++)
            if (c >= 0 && CPU_ISSET((int)c, &allowed))
                CPU_SET((int)c, out);
        if (*end != ',')
            break;
        p = end + 1;
    }
    return CPU_COUNT(out);
}

static int usable_cpus(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* Start the workers once.  PINSHIM_COPY_THREADS counts the calling thread (1: no pool); 0 means
 * the CPUs local to the GPU, at most AUTO_THREADS_MAX. */
void cpupool_start(void)
{
    if (__atomic_load_n(&pool.started, __ATOMIC_ACQUIRE))
        return;
    pthread_mutex_lock(&pool.mu);
    if (!pool.started) {
        cpu_set_t local = device_local;
        int nlocal = device_nlocal, cpus = usable_cpus();
        int want = (int)shim_cfg.copy_threads;
        if (want == 0)
            want = nlocal ? nlocal : cpus;
        if (want > cpus)
            want = cpus;
        if (shim_cfg.copy_threads == 0 && want > AUTO_THREADS_MAX)
            want = AUTO_THREADS_MAX;
        want -= 1;
        if (want > MAX_WORKERS)
            want = MAX_WORKERS;
        __atomic_store_n(&pool.stop, 0, __ATOMIC_RELAXED);
        int started = 0;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setstacksize(&attr, 256 * 1024);
        /* Near the GPU: the DMA engine reads and writes the staging buffers from there. */
        if (nlocal && nlocal < cpus)
            pthread_attr_setaffinity_np(&attr, sizeof local, &local);
        /* The program's signal handlers must never run on the shim's threads. */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        for (int i = 0; i < want; i++) {
            if (pthread_create(&pool.tid[started], &attr, worker_main, NULL) != 0)
                break;   /* fewer threads: slower, still correct */
            started++;
        }
        __atomic_store_n(&pool.nworkers, started, __ATOMIC_RELAXED);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        pthread_attr_destroy(&attr);
        __atomic_store_n(&pool.started, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&pool.mu);
}

int cpupool_workers(void)
{
    return __atomic_load_n(&pool.nworkers, __ATOMIC_RELAXED);
}

int cpupool_jobs_open(void)
{
    int n = 0;
    for (int k = 0; k < MAX_JOBS; k++)
        n += __atomic_load_n(&pool.slots[k].owned, __ATOMIC_RELAXED) != 0;
    return n;
}

static void run_job(const struct copy_job *jp);
static int split_and_run(struct copy_job *job, size_t total, size_t cap);
static unsigned slice_count(size_t total, size_t cap);
static struct job_slot *post_job(const struct copy_job *jp);
static void finish_job(struct job_slot *s);

/* A copy's job, its bytes and how many slices it may take at most (one per row of a strided
 * copy; rows contiguous on both sides are one row, split by bytes). */
static struct copy_job copy_job_of(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                                   size_t rows, unsigned flags, size_t *total, size_t *cap)
{
    if (rows > 1 && dpitch == width && spitch == width) {
        width *= rows;
        rows = 1;
    }
    *total = width * rows;
    *cap = rows > 1 ? rows : SIZE_MAX;
    return (struct copy_job){ dst, src, dpitch, spitch, width, rows, flags, 1, JOB_COPY, 0, 0 };
}

int cpupool_copy(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows,
                 unsigned flags)
{
    size_t total, cap;
    struct copy_job job = copy_job_of(dst, dpitch, src, spitch, width, rows, flags, &total, &cap);
    cpupool_start();
    return split_and_run(&job, total, cap);
}

int cpupool_set(void *dst, int c, size_t n, unsigned flags)
{
    cpupool_start();
    struct copy_job job = { dst, NULL, n, 0, n, 1, flags, 1, JOB_SET, c, 0 };
    return split_and_run(&job, n, SIZE_MAX);
}

void cpupool_flush(const void *p, size_t n)
{
    if (!n || !cpupool_flushes())
        return;
    /* Over the threads already there (none are started for it); alone when they are busy. */
    struct copy_job job = { NULL, (const char *)p, n, n, n, 1, CPUPOOL_TRY, 1, JOB_FLUSH, 0, 0 };
    if (!split_and_run(&job, n, SIZE_MAX)) {
        job.nslices = 1;
        run_slice(&job, 0);
    }
}

/* How many slices a job of `total` bytes is cut into: small jobs in four at most, large ones in
 * slices of at least SLICE_MIN; one per thread, and `cap`, at most. */
static unsigned slice_count(size_t total, size_t cap)
{
    size_t min_slice = total < 16 * SLICE_MIN ? (total / 4 > 4096 ? total / 4 : 4096) : SLICE_MIN;
    size_t n = total / min_slice;
    size_t parts = (size_t)__atomic_load_n(&pool.nworkers, __ATOMIC_RELAXED) + 1;
    if (n > parts)
        n = parts;
    if (n > cap)
        n = cap;
    return n ? (unsigned)n : 1;
}

/* Cut a job of `total` bytes into slices and run it.  Returns 0 only with CPUPOOL_TRY when the
 * pool is busy. */
static int split_and_run(struct copy_job *job, size_t total, size_t cap)
{
    unsigned n = slice_count(total, cap);
    if (n <= 1) {
        job->nslices = 1;
        run_slice(job, 0);
        return 1;
    }
    job->nslices = n;
    if (job->flags & CPUPOOL_TRY)
        for (int k = 0; k < MAX_JOBS; k++)
            if (__atomic_load_n(&pool.slots[k].owned, __ATOMIC_RELAXED))
                return 0;
    run_job(job);
    return 1;
}

/* Post a job of several slices: its slot, where its owner finishes it (finish_job), or NULL
 * when every slot is busy (more pipelines at once than it was sized for) and the caller has run
 * it alone, still right. */
static struct job_slot *post_job(const struct copy_job *jp)
{
    struct job_slot *s = NULL;
    for (int k = 0; k < MAX_JOBS && !s; k++) {
        int free_slot = 0;
        if (__atomic_compare_exchange_n(&pool.slots[k].owned, &free_slot, 1, 0, __ATOMIC_ACQUIRE,
                                        __ATOMIC_RELAXED))
            s = &pool.slots[k];
    }
    if (!s) {
        for (unsigned i = 0; i < jp->nslices; i++)
            run_slice(jp, i);
        return NULL;
    }
    s->job = *jp;
    uint64_t ticket = __atomic_add_fetch(&pool.tickets, 1, __ATOMIC_RELAXED);
    __atomic_store_n(&s->word, ticket << 16 | (uint64_t)jp->nslices << 8, __ATOMIC_RELEASE);
    __atomic_add_fetch(&pool.gen, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&pool.sleepers, __ATOMIC_SEQ_CST)) {
        pthread_mutex_lock(&pool.mu);
        pthread_cond_broadcast(&pool.work_cv);
        pthread_mutex_unlock(&pool.mu);
    }
    return s;
}

/* The owner of slot s's job takes what is left of its slices and returns when all are done. */
static void finish_job(struct job_slot *s)
{
    unsigned nslices = s->job.nslices;   /* the owner's own job: its fields stay put */
    int i;
    unsigned count;
    while ((i = claim(s, &count)) >= 0) {
        run_slice(&s->job, (unsigned)i);
        __atomic_add_fetch(&s->done, 1, __ATOMIC_SEQ_CST);
    }
    /* The last slices are a few microseconds away: watch for them before sleeping, since a
     * sleeping caller is woken late (tens of microseconds on a virtual machine), once per
     * piece of a pipeline. */
    uint64_t t0 = shim_now_ns();
    for (unsigned k = 0; __atomic_load_n(&s->done, __ATOMIC_ACQUIRE) < nslices; k++) {
        if ((k & 63) == 63 && shim_now_ns() - t0 > OWNER_SPIN_NS)
            break;
        cpu_relax();
    }
    if (__atomic_load_n(&s->done, __ATOMIC_ACQUIRE) < nslices) {
        __atomic_store_n(&s->owner_waiting, 1, __ATOMIC_SEQ_CST);
        pthread_mutex_lock(&pool.mu);
        while (__atomic_load_n(&s->done, __ATOMIC_SEQ_CST) < nslices)
            pthread_cond_wait(&pool.done_cv, &pool.mu);
        pthread_mutex_unlock(&pool.mu);
        __atomic_store_n(&s->owner_waiting, 0, __ATOMIC_RELAXED);
    }
    /* Every slice done: nobody reads the job again.  The slot is free for the next. */
    __atomic_store_n(&s->done, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&s->word, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&s->owned, 0, __ATOMIC_RELEASE);
}

/* Post a job of several slices, take a share of them, return when all are done. */
static void run_job(const struct copy_job *jp)
{
    struct job_slot *s = post_job(jp);
    if (s)
        finish_job(s);
}

void cpupool_copy_post(struct cpupool_pending *h, void *dst, size_t dpitch, const void *src,
                       size_t spitch, size_t width, size_t rows, unsigned flags)
{
    size_t total, cap;
    struct copy_job job = copy_job_of(dst, dpitch, src, spitch, width, rows, flags & ~(unsigned)CPUPOOL_TRY,
                                      &total, &cap);
    h->slot = NULL;
    cpupool_start();
    job.nslices = slice_count(total, cap);
    if (job.nslices <= 1) {
        job.nslices = 1;
        run_slice(&job, 0);
        return;
    }
    h->slot = post_job(&job);
}

void cpupool_wait(struct cpupool_pending *h)
{
    if (h->slot)
        finish_job(h->slot);
    h->slot = NULL;
}

size_t cpupool_prefault(void *p, size_t n)
{
    if (!n || __atomic_load_n(&populate_broken, __ATOMIC_RELAXED))
        return 0;
    uintptr_t start = page_down((uintptr_t)p), end = page_up((uintptr_t)p + n);
    if (os_resident_bytes(start, SHIM_PAGE_SIZE) != 0)
        return 0;   /* resident already (a reused block): nothing to gain */
    cpupool_start();
    /* Each thread faults in whole huge pages: where transparent huge pages back the range, a
     * huge page split between threads is cleared by one of them while the others wait. */
    uintptr_t first = start & ~(SHIM_HUGE_PAGE - 1);
    size_t huge = (end - first + SHIM_HUGE_PAGE - 1) / SHIM_HUGE_PAGE;
    size_t parts = (size_t)__atomic_load_n(&pool.nworkers, __ATOMIC_RELAXED) + 1;
    size_t per = (huge + parts - 1) / parts;
    struct copy_job job = { (char *)start, NULL, 0, 0, end - start, 1, CPUPOOL_FAULT_DST, 0, JOB_PREFAULT, 0,
                            per * SHIM_HUGE_PAGE };
    job.nslices = (unsigned)((huge + per - 1) / per);
    if (job.nslices <= 1)
        run_slice(&job, 0);
    else
        run_job(&job);
    return __atomic_load_n(&populate_broken, __ATOMIC_RELAXED) ? 0 : end - start;
}

void cpupool_shutdown(void)
{
    if (shim_forked_child) {
        /* None of the parent's threads exist here; their lock may have been held. */
        pthread_mutex_init(&pool.mu, NULL);
        pthread_cond_init(&pool.work_cv, NULL);
        pthread_cond_init(&pool.done_cv, NULL);
        memset(pool.slots, 0, sizeof pool.slots);
        __atomic_store_n(&pool.sleepers, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&pool.nworkers, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&pool.stop, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&pool.started, 0, __ATOMIC_RELEASE);
        return;
    }
    pthread_mutex_lock(&pool.mu);
    int n = pool.started ? __atomic_load_n(&pool.nworkers, __ATOMIC_RELAXED) : 0;
    __atomic_store_n(&pool.stop, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&pool.work_cv);
    pthread_mutex_unlock(&pool.mu);
    shim_enter();
    for (int i = 0; i < n; i++)
        pthread_join(pool.tid[i], NULL);
    shim_leave();
    pthread_mutex_lock(&pool.mu);
    __atomic_store_n(&pool.nworkers, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&pool.stop, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&pool.started, 0, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&pool.mu);
}
