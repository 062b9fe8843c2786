/* Randomized differential stress program for pinshim on the checking fake driver.
 *
 *   stress --seed N [--threads T] [--ops K] [--watchdog SECONDS] [--pool B]
 *
 * T worker threads each run K operations drawn from a generator seeded by (seed, thread id):
 * host buffers allocated every way a program can (malloc, calloc, posix_memalign, aligned_alloc,
 * memalign, realloc, mmap, cuMemHostAlloc), resized (realloc, partial munmap, mremap), discarded
 * (madvise DONTNEED, MAP_FIXED over a mapping), pinned and unpinned by the program itself
 * (cuMemHostRegister / cuMemHostUnregister, including ranges the shim may have promoted and
 * calls whose answer is an error), filled with seeded content and copied in every direction
 * (HtoD, DtoH, DtoD, unified cuMemcpy, 2D and 3D with pitches; into never-touched memory too,
 * which staging faults in ahead of its DMAs), sync and async, through every
 * door (linked symbols, the linked _ptds/_ptsz symbols, dlsym, cuGetProcAddress with flags 0 and
 * with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM), on the legacy stream, the per-thread
 * default stream and created blocking and non-blocking streams, with device work
 * (fakecuda_launch_write, memsets) in between, and host buffers copied into one another with the
 * program's own memcpy/memmove (overlapping within one buffer too) and set with its memset.
 * Mappings are made read-only with mprotect for a while (copied from, never written) and
 * writable again before the host writes them; the
 * process forks now and then while the other threads work (the child checks the memory it
 * inherited, allocates and frees large blocks, gets the driver's own error from a copy); each
 * thread keeps a working set of B (default 256) live 64-256 KiB blocks that are replaced (some
 * handed over to be freed by another thread), resized and sent to the device and back, their
 * content checked every time the host touches them and no two of them overlapping; and now
 * and then a checkpoint round: a few blocks of one size allocated afresh, filled from the
 * device and freed together.
 * STRESS_HOSTILE=1 adds what is legal but hostile: mappings created read-only (a library may
 * pin them read-only) and written later, and one more thread that signals interrupt at a high
 * rate (a POSIX timer and pthread_kill) with a handler that calls malloc, while it maps,
 * allocates and copies.
 *
 * The program is a correct CUDA program: work on one buffer from different streams is ordered
 * by the documented implicit rules (legacy <-> blocking streams) or explicitly (an event waited
 * on, or a stream/event/context synchronization), and memory the program pinned itself is never
 * touched by the host while an async copy may still use it.  Pageable buffers are reused the
 * moment a call returns, as the contract allows.
 *
 * Every device-to-host result, and the host content at chosen points (after calloc, realloc,
 * mremap, madvise, before free), is hashed (FNV-1a over 64-bit words) into a per-thread log; the
 * final line `CHECKSUM <hex>` folds the logs in thread order.  A thread's operations and data
 * depend only on (seed, thread id), never on timing or addresses, so the checksum of a run under
 * the shim must equal the plain run's.
 *
 * Checked in the program itself (a failure prints MISMATCH/BUDGET/WATCHDOG with the seed, and
 * the exit status is non-zero):
 *   - every call returns exactly what the driver returns without the shim (known from the
 *     program's own model of its registrations: 0, 712 on overlap, 713 for memory it did not
 *     register, 1 for an interior pointer or bad arguments);
 *   - calloc memory reads zero, madvise(DONTNEED) pages read zero;
 *   - a sampler thread checks fakecuda_registered_bytes() minus the bytes the program registered
 *     itself against PINSHIM_BUDGET (and against 0 when no promoting shim is loaded);
 *   - the fake driver reports no violation;
 *   - a watchdog ends the process, with the seed and each thread's current operation, after
 *     --watchdog seconds (default 90).
 * STRESS_DUMP=FILE writes every log entry (thread, op, tag, value) to FILE, to find the first
 * operation at which two runs differ. */
#define _GNU_SOURCE
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "fakecuda.h"
#include "fake/drvtest.h"

#define NSLOT 10
#define NDEV 3
#define MAXSZ ((size_t)8 << 20)
#define DEVSZ (MAXSZ + ((size_t)512 << 10))
#define NREG 3
#define PAGE 4096ul

enum { S_LEG, S_PT, S_BLK, S_NB, NSTREAM };
enum { K_NONE, K_HEAP, K_MMAP, K_HOST };
enum { H_PAGE, H_PIN, H_MIXED };

/* ---------------------------------------------------------------- doors */
typedef struct {
    const char *name;
    int ptds;      /* NULL stream and sync copies mean the per-thread default stream */
    PFN_cuMemcpyHtoD_v3020 htod;
    PFN_cuMemcpyDtoH_v3020 dtoh;
    PFN_cuMemcpyDtoD_v3020 dtod;
    PFN_cuMemcpy_v4000 cpy;
    PFN_cuMemcpy2D_v3020 cpy2d;
    PFN_cuMemcpy2DUnaligned_v3020 cpy2du;
    PFN_cuMemcpy3D_v3020 cpy3d;
    PFN_cuMemcpyHtoDAsync_v3020 htoda;
    PFN_cuMemcpyDtoHAsync_v3020 dtoha;
    PFN_cuMemcpyDtoDAsync_v3020 dtoda;
    PFN_cuMemcpyAsync_v4000 cpya;
    PFN_cuMemcpy2DAsync_v3020 cpy2da;
    PFN_cuMemcpy3DAsync_v3020 cpy3da;
    PFN_cuMemsetD8_v3020 memset8;
    PFN_cuMemsetD8Async_v3020 memset8a;
    PFN_cuStreamSynchronize_v2000 ssync;
    PFN_cuEventRecord_v2000 erecord;
    PFN_cuStreamWaitEvent_v3020 swait;
} door_t;

enum { D_LINK, D_LINK_PT, D_DLSYM, D_GPA, D_GPA_PT, NDOOR };
static door_t doors[NDOOR];

/* ---------------------------------------------------------------- globals */
static CUcontext g_ctx;
static unsigned long long g_seed;
static int g_threads = 4;
static unsigned long g_ops = 300;
static unsigned g_watchdog = 90;
static size_t g_budget;           /* bytes; 0: no byte ceiling to check */
static int g_promotes;            /* a shim that may register memory is loaded */
static volatile int g_done;
static unsigned long g_fail;       /* MISMATCH / BUDGET findings */
static pthread_rwlock_t g_reglock = PTHREAD_RWLOCK_INITIALIZER;
static size_t g_own_reg;           /* bytes the program registered itself (under g_reglock) */
static size_t g_excess_max;
static unsigned long g_samples;
static int g_hostile;              /* STRESS_HOSTILE=1: read-only mappings, signal-handler malloc */
static int g_pool = 256;           /* live 64-256 KiB blocks per thread (--pool) */
static int g_nthr;                 /* worker threads, plus the signal target when hostile */

/* ---------------------------------------------------------------- per thread */
typedef struct { size_t off, len; int on; } reg_t;
typedef struct {
    int kind;
    unsigned char *p;
    size_t n, maplen;
    reg_t reg[NREG];
    int pend;          /* stream with host-asynchronous work on this buffer, or -1 */
    int ndef;          /* deferred D2H hashes waiting for that stream */
    unsigned long uses;
    int ro;            /* mapping PROT_READ now (mprotect, or mapped so) */
} slot_t;
typedef struct { int slot; size_t off, w, h, d, pitch, slice, logi; } defer_t;
typedef struct { uint32_t op, tag; uint64_t v; } logent_t;
typedef struct { CUdeviceptr d; int pend; } dbuf_t;

typedef struct {
    int id;
    uint64_t rng;
    slot_t s[NSLOT];
    dbuf_t dv[NDEV];
    CUstream us[2];
    CUevent ev;
    defer_t *def;
    size_t ndef, capdef;
    logent_t *log;
    size_t nlog, caplog;
    volatile unsigned long op;
    volatile const char *what;
    unsigned long fails;
    unsigned long copies;
    unsigned long nops;          /* operations this thread runs */
    /* the working set of many live large blocks */
    unsigned char **pool_p;
    size_t *pool_n;
    uint64_t *pool_key;
    CUdeviceptr dpool;
    pthread_t self;
    pid_t tid;
} thr_t;

static thr_t *g_thr;

/* ---------------------------------------------------------------- utilities */
static uint64_t rnext(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t rnd(thr_t *t, uint64_t n)
{
    return n ? rnext(&t->rng) % n : 0;
}

#define FNV_OFF 0xcbf29ce484222325ull
#define FNV_PRIME 0x100000001b3ull

/* FNV-1a over 64-bit words (then the tail bytes), with a fold so high bits reach low ones. */
static uint64_t fnv(uint64_t h, const unsigned char *p, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h ^= w;
        h *= FNV_PRIME;
        h ^= h >> 32;
    }
    for (; i < n; i++) {
        h ^= p[i];
        h *= FNV_PRIME;
    }
    return h;
}

static uint64_t hash_rows(const unsigned char *p, size_t w, size_t h, size_t d, size_t pitch, size_t slice)
{
    uint64_t x = FNV_OFF;
    for (size_t z = 0; z < d; z++)
        for (size_t y = 0; y < h; y++)
            x = fnv(x, p + z * slice + y * pitch, w);
    return x;
}

static void fill(unsigned char *p, size_t n, uint64_t key)
{
    uint64_t x = key | 1;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        memcpy(p + i, &x, 8);
    }
    for (; i < n; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        p[i] = (unsigned char)(x >> 24);
    }
}

/* 1 if p holds exactly what fill(p, n, key) wrote. */
static int is_fill(const unsigned char *p, size_t n, uint64_t key)
{
    uint64_t x = key | 1;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        if (memcmp(p + i, &x, 8)) return 0;
    }
    for (; i < n; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        if (p[i] != (unsigned char)(x >> 24)) return 0;
    }
    return 1;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void fail(thr_t *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(thr_t *t, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    t->fails++;
    __atomic_add_fetch(&g_fail, 1, __ATOMIC_RELAXED);
    if (t->fails <= 20)
        printf("MISMATCH seed=%llu thread=%d op=%lu (%s): %s\n", g_seed, t->id, t->op, (const char *)t->what, buf);
    fflush(stdout);
}

/* A call that must return exactly `want` (the driver's answer without the shim). */
#define EXPECT(t, want, call)                                                                  \
    do {                                                                                       \
        CUresult r_ = (call);                                                                  \
        if (r_ != (CUresult)(want))                                                            \
            fail(t, "%s returned %d, the driver without the shim returns %d", #call, (int)r_, \
                 (int)(want));                                                                 \
    } while (0)
#define OK(t, call) EXPECT(t, CUDA_SUCCESS, call)

static void logv(thr_t *t, uint32_t tag, uint64_t v)
{
    if (t->nlog == t->caplog) {
        t->caplog = t->caplog ? t->caplog * 2 : 1024;
        t->log = realloc(t->log, t->caplog * sizeof *t->log);
        if (!t->log) abort();
    }
    t->log[t->nlog++] = (logent_t){ (uint32_t)t->op, tag, v };
}

/* Log tags */
enum { L_D2H = 1, L_CALLOC, L_REALLOC, L_FREE, L_MREMAP, L_MADV, L_SUM, L_RC, L_D2H_LATE, L_UNIFIED, L_2D, L_3D,
       L_FORK, L_PROT, L_SIG, L_BOUNCE, L_ROUND };

/* ---------------------------------------------------------------- streams and ordering */
static int ordered(int y, int x)
{
    if (y == x) return 1;
    if (y == S_LEG) return x == S_PT || x == S_BLK;
    if (x == S_LEG) return y == S_PT || y == S_BLK;
    return 0;
}

/* A handle naming stream idx, as seen through a door of the given kind. */
static CUstream handle(thr_t *t, int idx, int ptds_door)
{
    switch (idx) {
    case S_LEG: return ptds_door ? CU_STREAM_LEGACY : (rnd(t, 2) ? NULL : CU_STREAM_LEGACY);
    case S_PT: return ptds_door ? (rnd(t, 2) ? NULL : CU_STREAM_PER_THREAD) : CU_STREAM_PER_THREAD;
    default: return t->us[idx - S_BLK];
    }
}

static void settle_deferred(thr_t *t, int slot)
{
    size_t k = 0;
    for (size_t i = 0; i < t->ndef; i++) {
        defer_t *d = &t->def[i];
        if (d->slot != slot) {
            t->def[k++] = *d;
            continue;
        }
        slot_t *s = &t->s[slot];
        t->log[d->logi].v = hash_rows(s->p + d->off, d->w, d->h, d->d, d->pitch, d->slice);
    }
    t->ndef = k;
    t->s[slot].ndef = 0;
}

/* Stream idx is idle as far as the host can tell: nothing of the thread pends on it. */
static void settled(thr_t *t, int idx)
{
    for (int i = 0; i < NDEV; i++)
        if (idx < 0 || t->dv[i].pend == idx) t->dv[i].pend = -1;
    for (int i = 0; i < NSLOT; i++)
        if (t->s[i].kind && t->s[i].pend >= 0 && (idx < 0 || t->s[i].pend == idx)) {
            settle_deferred(t, i);
            t->s[i].pend = -1;
        }
}

/* Host-level synchronization with stream idx, one of several equivalent ways. */
static void host_sync(thr_t *t, int idx)
{
    int how = (int)rnd(t, 12);
    door_t *dr = &doors[rnd(t, NDOOR)];
    CUstream h = handle(t, idx, dr->ptds);
    if (how < 6) {
        OK(t, dr->ssync(h));
    } else if (how < 9) {
        OK(t, dr->erecord(t->ev, h));
        OK(t, cuEventSynchronize(t->ev));
    } else if (how < 11) {
        CUresult r;
        h = handle(t, idx, 0);
        while ((r = cuStreamQuery(h)) == CUDA_ERROR_NOT_READY)
            usleep(20);
        if (r != CUDA_SUCCESS) fail(t, "cuStreamQuery returned %d", (int)r);
    } else {
        OK(t, cuCtxSynchronize());
        settled(t, -1);
        return;
    }
    settled(t, idx);
}

/* Work about to run on stream x must come after what is pending on *pend. */
static void order_after(thr_t *t, int pend, int x)
{
    if (pend < 0 || ordered(pend, x)) return;
    if (rnd(t, 3) == 0) {
        host_sync(t, pend);
        return;
    }
    door_t *dr = &doors[rnd(t, NDOOR)];
    OK(t, dr->erecord(t->ev, handle(t, pend, dr->ptds)));
    dr = &doors[rnd(t, NDOOR)];
    OK(t, dr->swait(handle(t, x, dr->ptds), t->ev, 0));
}

static void dev_before(thr_t *t, int d, int x)
{
    order_after(t, t->dv[d].pend, x);
}

static void slot_before_gpu(thr_t *t, int i, int x)
{
    slot_t *s = &t->s[i];
    if (s->pend < 0) return;
    if (s->ndef) {
        host_sync(t, s->pend);
        return;
    }
    order_after(t, s->pend, x);
}

/* The host is about to touch slot i (read, write, free, unregister). */
static void slot_before_host(thr_t *t, int i)
{
    if (t->s[i].pend >= 0) host_sync(t, t->s[i].pend);
}

/* ---------------------------------------------------------------- registrations */
static int hclass(const slot_t *s, size_t off, size_t span)
{
    if (s->kind == K_HOST) return H_PIN;
    int over = 0;
    for (int k = 0; k < NREG; k++) {
        const reg_t *r = &s->reg[k];
        if (!r->on) continue;
        if (off >= r->off && off + span <= r->off + r->len) return H_PIN;
        if (off < r->off + r->len && r->off < off + span) over = 1;
    }
    return over ? H_MIXED : H_PAGE;
}

static CUresult do_register(thr_t *t, void *p, size_t len, unsigned flags, int want_ok)
{
    pthread_rwlock_rdlock(&g_reglock);
    if (want_ok) __atomic_add_fetch(&g_own_reg, len, __ATOMIC_RELAXED);
    CUresult r = rnd(t, 2) ? cuMemHostRegister(p, len, flags) : cuMemHostRegister_v2(p, len, flags);
    if (want_ok && r != CUDA_SUCCESS) __atomic_sub_fetch(&g_own_reg, len, __ATOMIC_RELAXED);
    if (!want_ok && r == CUDA_SUCCESS) __atomic_add_fetch(&g_own_reg, len, __ATOMIC_RELAXED);
    pthread_rwlock_unlock(&g_reglock);
    return r;
}

static CUresult do_unregister(void *p, size_t len_if_ok)
{
    pthread_rwlock_rdlock(&g_reglock);
    CUresult r = cuMemHostUnregister(p);
    if (r == CUDA_SUCCESS) __atomic_sub_fetch(&g_own_reg, len_if_ok, __ATOMIC_RELAXED);
    pthread_rwlock_unlock(&g_reglock);
    return r;
}

static void unregister_all(thr_t *t, int i)
{
    slot_t *s = &t->s[i];
    slot_before_host(t, i);
    for (int k = 0; k < NREG; k++)
        if (s->reg[k].on) {
            CUresult r = do_unregister(s->p + s->reg[k].off, s->reg[k].len);
            if (r != CUDA_SUCCESS) fail(t, "cuMemHostUnregister of the program's own registration returned %d", (int)r);
            s->reg[k].on = 0;
        }
}

/* The host is about to write slot i: a mapping made read-only gets its write permission back
 * first, as a program does.  Whatever pinned it meanwhile must cope with the change. */
static void slot_writable(thr_t *t, int i)
{
    slot_t *s = &t->s[i];
    if (!s->ro) return;
    if (mprotect(s->p, s->maplen, PROT_READ | PROT_WRITE) != 0) fail(t, "mprotect read-write: %s", strerror(errno));
    s->ro = 0;
}

/* ---------------------------------------------------------------- sizes and choices */
static size_t rand_size(thr_t *t)
{
    unsigned bits = rnd(t, 100) < 30 ? (unsigned)rnd(t, 16) : 16 + (unsigned)rnd(t, 7);
    size_t sz = ((size_t)1 << bits) + (size_t)rnd(t, (size_t)1 << bits);
    return sz > MAXSZ ? MAXSZ : sz;
}

/* A random live slot of one of the kinds in mask (1 << kind), or -1. */
static int pick_slot(thr_t *t, unsigned mask)
{
    int c[NSLOT], n = 0;
    for (int i = 0; i < NSLOT; i++)
        if (t->s[i].kind && (mask & (1u << t->s[i].kind))) c[n++] = i;
    return n ? c[rnd(t, (uint64_t)n)] : -1;
}

static int free_slot(thr_t *t)
{
    for (int i = 0; i < NSLOT; i++)
        if (!t->s[i].kind) return i;
    return -1;
}

/* A sub-range [off, off+len) of n bytes: the whole of it half of the time. */
static void sub_range(thr_t *t, size_t n, size_t *off, size_t *len)
{
    if (rnd(t, 2)) {
        *off = 0;
        *len = n;
        return;
    }
    *off = (size_t)rnd(t, n);
    *len = 1 + (size_t)rnd(t, n - *off);
}

static door_t *pick_door(thr_t *t)
{
    return &doors[rnd(t, NDOOR)];
}

/* The stream of an async call: a handle as the door sees it, and which stream it means. */
static CUstream pick_stream(thr_t *t, const door_t *dr, int *idx)
{
    *idx = (int)rnd(t, NSTREAM);
    return handle(t, *idx, dr->ptds);
}

/* ---------------------------------------------------------------- operations */
static int all_zero(const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i]) return 0;
    return 1;
}

static void op_alloc(thr_t *t)
{
    int i = free_slot(t);
    if (i < 0) return;
    slot_t *s = &t->s[i];
    memset(s, 0, sizeof *s);
    s->pend = -1;
    size_t n = rand_size(t);
    int how = (int)rnd(t, 10);
    unsigned char *p = NULL;
    int zero = 0;
    s->kind = K_HEAP;
    switch (how) {
    case 0: case 1: case 2:
        t->what = "malloc";
        p = malloc(n);
        break;
    case 3: {
        t->what = "calloc";
        size_t m = rnd(t, 2) ? 1 : 1 + (size_t)rnd(t, 16);
        n = (n + m - 1) / m * m;
        if (n > MAXSZ) n = MAXSZ / m * m;
        p = calloc(m, n / m);
        zero = 1;
        break;
    }
    case 4: {
        t->what = "posix_memalign";
        size_t al = (size_t)8 << rnd(t, 19);
        void *q = NULL;
        if (posix_memalign(&q, al, n) != 0) q = NULL;
        p = q;
        if (p && ((uintptr_t)p & (al - 1))) fail(t, "posix_memalign(%zu) returned a misaligned %p", al, (void *)p);
        break;
    }
    case 5: {
        t->what = "aligned_alloc/memalign";
        size_t al = (size_t)16 << rnd(t, 17);
        p = rnd(t, 2) ? aligned_alloc(al, (n + al - 1) / al * al) : memalign(al, n);
        if (p && ((uintptr_t)p & (al - 1))) fail(t, "aligned allocation (%zu) returned a misaligned %p", al, (void *)p);
        break;
    }
    case 6:
        t->what = "realloc(NULL)";
        p = realloc(NULL, n);
        break;
    case 7: case 8: {
        t->what = "mmap";
        if (n < PAGE) n = PAGE + (size_t)rnd(t, PAGE);
        size_t ml = (n + PAGE - 1) & ~(PAGE - 1);
        /* hostile: mapped read-only (a library may pin it read-only), written later */
        s->ro = g_hostile && rnd(t, 3) == 0;
        void *m = mmap(NULL, ml, s->ro ? PROT_READ : PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        p = m == MAP_FAILED ? NULL : m;
        s->kind = K_MMAP;
        s->maplen = ml;
        zero = 1;
        break;
    }
    default: {
        t->what = "cuMemHostAlloc";
        static const unsigned fl[] = { 0, CU_MEMHOSTALLOC_PORTABLE, CU_MEMHOSTALLOC_DEVICEMAP,
                                       CU_MEMHOSTALLOC_WRITECOMBINED };
        void *q = NULL;
        if (rnd(t, 4) == 0) OK(t, cuMemAllocHost(&q, n));
        else OK(t, cuMemHostAlloc(&q, n, fl[rnd(t, 4)]));
        p = q;
        s->kind = K_HOST;
        break;
    }
    }
    if (!p) {
        fail(t, "%s of %zu bytes failed", (const char *)t->what, n);
        s->kind = K_NONE;
        return;
    }
    s->p = p;
    s->n = n;
    if (zero) {
        if (!all_zero(p, n)) fail(t, "new %s memory of %zu bytes does not read zero", (const char *)t->what, n);
        logv(t, L_CALLOC, hash_rows(p, n, 1, 1, n, n));
    }
    if (!s->ro && (!zero || rnd(t, 2))) fill(p, n, rnext(&t->rng));
    /* the common pattern: pin a buffer right after allocating it */
    if (s->kind != K_HOST && rnd(t, 8) == 0) {
        t->what = "register after alloc";
        slot_writable(t, i);
        OK(t, do_register(t, p, n, 0, 1));
        s->reg[0] = (reg_t){ 0, n, 1 };
    }
}

static void op_free(thr_t *t)
{
    int i = pick_slot(t, (1u << K_HEAP) | (1u << K_MMAP) | (1u << K_HOST));
    if (i < 0) return;
    slot_t *s = &t->s[i];
    t->what = "free";
    unregister_all(t, i);
    logv(t, L_FREE, hash_rows(s->p, s->n, 1, 1, s->n, s->n));
    if (s->kind == K_HEAP) free(s->p);
    else if (s->kind == K_MMAP) {
        if (munmap(s->p, s->maplen) != 0) fail(t, "munmap: %s", strerror(errno));
    } else OK(t, cuMemFreeHost(s->p));
    s->kind = K_NONE;
}

static void op_realloc(thr_t *t)
{
    int i = pick_slot(t, 1u << K_HEAP);
    if (i < 0) return;
    slot_t *s = &t->s[i];
    t->what = "realloc";
    unregister_all(t, i);
    size_t nn = rnd(t, 3) == 0 ? 1 + (size_t)rnd(t, s->n) : rand_size(t);
    unsigned char *q = realloc(s->p, nn);
    if (!q) {
        fail(t, "realloc to %zu failed", nn);
        return;
    }
    size_t keep = nn < s->n ? nn : s->n;
    logv(t, L_REALLOC, hash_rows(q, keep, 1, 1, keep, keep));
    if (nn > keep) fill(q + keep, nn - keep, rnext(&t->rng));
    s->p = q;
    s->n = nn;
}

static void op_fill(thr_t *t)
{
    int i = pick_slot(t, ~0u);
    if (i < 0) return;
    slot_t *s = &t->s[i];
    t->what = "fill";
    slot_before_host(t, i);
    slot_writable(t, i);
    size_t off, len;
    sub_range(t, s->n, &off, &len);
    fill(s->p + off, len, rnext(&t->rng));
}

static void op_hostsum(thr_t *t)
{
    int i = pick_slot(t, ~0u);
    if (i < 0) return;
    slot_t *s = &t->s[i];
    t->what = "host checksum";
    slot_before_host(t, i);
    logv(t, L_SUM, hash_rows(s->p, s->n, 1, 1, s->n, s->n));
}

/* The program's own memcpy/memmove between two host buffers of any kind, or within one
 * (overlapping), or its memset of one: a framework's copy into or out of its pinned staging
 * memory, or its clearing of a result array.  The shim may share
 * a large one among its copy threads (contract rule 11); the bytes must be the C library's. */
static void op_bounce(thr_t *t)
{
    int i = pick_slot(t, ~0u), j = pick_slot(t, ~0u);
    if (i < 0 || j < 0) return;
    slot_t *src = &t->s[i], *dst = &t->s[j];
    t->what = i == j ? "memmove within a buffer" : "memcpy/memmove between buffers";
    slot_before_host(t, i);
    slot_before_host(t, j);
    slot_writable(t, j);
    size_t soff, len;
    sub_range(t, src->n, &soff, &len);
    if (len > dst->n) len = dst->n;
    size_t doff = (size_t)rnd(t, dst->n - len + 1);
    unsigned how = (unsigned)rnd(t, 3);
    if (how == 0) {
        t->what = "memset";
        memset(dst->p + doff, (int)rnd(t, 512) - 128, len);
    } else if (i == j || how == 1) {
        memmove(dst->p + doff, src->p + soff, len);
    } else {
        memcpy(dst->p + doff, src->p + soff, len);
    }
    logv(t, L_BOUNCE, hash_rows(dst->p + doff, len, 1, 1, len, len));
}

/* After a copy with host side [off, off+span) of slot i on stream x. */
static void after_host_read(thr_t *t, int i, int cls, int async, int x, int *devpend_clear)
{
    slot_t *s = &t->s[i];
    *devpend_clear = 0;
    if (cls == H_PAGE) return;
    if (cls == H_PIN && !async) {
        s->pend = -1;
        *devpend_clear = 1;
        return;
    }
    s->pend = x;
}

/* Reuse a pageable source right after the call returned: the contract allows it. */
static void maybe_reuse(thr_t *t, int i, int cls, size_t off, size_t span)
{
    if (cls == H_PAGE && rnd(t, 2)) {
        slot_writable(t, i);
        fill(t->s[i].p + off, span, rnext(&t->rng));
    }
}

static void defer_or_hash(thr_t *t, int i, int cls, int async, int x, size_t off, size_t w, size_t h, size_t d,
                          size_t pitch, size_t slice, uint32_t tag, int *devpend_clear)
{
    slot_t *s = &t->s[i];
    if (cls == H_PAGE || !async) {
        logv(t, tag, hash_rows(s->p + off, w, h, d, pitch, slice));
        if (cls != H_PAGE) s->pend = -1;
        *devpend_clear = 1;
        return;
    }
    logv(t, L_D2H_LATE, 0);
    if (t->ndef == t->capdef) {
        t->capdef = t->capdef ? t->capdef * 2 : 16;
        t->def = realloc(t->def, t->capdef * sizeof *t->def);
        if (!t->def) abort();
    }
    t->def[t->ndef++] = (defer_t){ i, off, w, h, d, pitch, slice, t->nlog - 1 };
    s->ndef++;
    s->pend = x;
    *devpend_clear = 0;
}

/* The common start of a host<->device copy: a slot and a sub-range of it, a device and an
 * offset there, a door, sync or async (and then a stream), the host memory's class; ordered
 * after the work the copy must follow.  0 when there is no slot to copy. */
typedef struct {
    int i, d, async, x, cls;
    slot_t *s;
    size_t off, len, doff;
    door_t *dr;
    CUstream h;
} hcopy_t;

static int begin_host_copy(thr_t *t, const char *what, const char *what_async, hcopy_t *c)
{
    c->i = pick_slot(t, ~0u);
    if (c->i < 0) return 0;
    c->s = &t->s[c->i];
    c->d = (int)rnd(t, NDEV);
    sub_range(t, c->s->n, &c->off, &c->len);
    c->doff = (size_t)rnd(t, DEVSZ - c->len + 1);
    c->dr = pick_door(t);
    c->async = (int)rnd(t, 2);
    c->h = NULL;
    if (c->async) c->h = pick_stream(t, c->dr, &c->x);
    else c->x = c->dr->ptds ? S_PT : S_LEG;
    c->cls = hclass(c->s, c->off, c->len);
    t->what = c->async ? what_async : what;
    dev_before(t, c->d, c->x);
    slot_before_gpu(t, c->i, c->x);
    return 1;
}

static void op_h2d(thr_t *t)
{
    hcopy_t c;
    if (!begin_host_copy(t, "HtoD", "HtoD async", &c)) return;
    int i = c.i, d = c.d, async = c.async, x = c.x, cls = c.cls;
    slot_t *s = c.s;
    size_t off = c.off, len = c.len, doff = c.doff;
    door_t *dr = c.dr;
    CUstream h = c.h;
    int unified = rnd(t, 4) == 0;
    CUdeviceptr dst = t->dv[d].d + doff;
    if (unified) {
        t->what = async ? "cuMemcpyAsync HtoD" : "cuMemcpy HtoD";
        OK(t, async ? dr->cpya(dst, (CUdeviceptr)(uintptr_t)(s->p + off), len, h)
                    : dr->cpy(dst, (CUdeviceptr)(uintptr_t)(s->p + off), len));
    } else {
        OK(t, async ? dr->htoda(dst, s->p + off, len, h) : dr->htod(dst, s->p + off, len));
    }
    t->copies++;
    s->uses++;
    int clr;
    after_host_read(t, i, cls, async, x, &clr);
    t->dv[d].pend = clr ? -1 : x;
    maybe_reuse(t, i, cls, off, len);
}

static void op_d2h(thr_t *t)
{
    hcopy_t c;
    if (!begin_host_copy(t, "DtoH", "DtoH async", &c)) return;
    slot_writable(t, c.i);
    int i = c.i, d = c.d, async = c.async, x = c.x, cls = c.cls;
    slot_t *s = c.s;
    size_t off = c.off, len = c.len, doff = c.doff;
    door_t *dr = c.dr;
    CUstream h = c.h;
    /* poison the destination first: a copy that never lands shows */
    if (s->pend < 0 && rnd(t, 2)) memset(s->p + off, 0xA5, len);
    int unified = rnd(t, 4) == 0;
    CUdeviceptr src = t->dv[d].d + doff;
    if (unified) {
        t->what = async ? "cuMemcpyAsync DtoH" : "cuMemcpy DtoH";
        OK(t, async ? dr->cpya((CUdeviceptr)(uintptr_t)(s->p + off), src, len, h)
                    : dr->cpy((CUdeviceptr)(uintptr_t)(s->p + off), src, len));
    } else {
        OK(t, async ? dr->dtoha(s->p + off, src, len, h) : dr->dtoh(s->p + off, src, len));
    }
    t->copies++;
    s->uses++;
    int clr;
    defer_or_hash(t, i, cls, async, x, off, len, 1, 1, len, len, unified ? L_UNIFIED : L_D2H, &clr);
    t->dv[d].pend = clr ? -1 : x;
}

static void op_d2d(thr_t *t)
{
    int a = (int)rnd(t, NDEV), b = (int)rnd(t, NDEV);
    size_t len = rand_size(t);
    size_t so = (size_t)rnd(t, DEVSZ - len + 1), dof = (size_t)rnd(t, DEVSZ - len + 1);
    if (a == b) {
        /* the same buffer: no overlap (memcpy semantics) */
        if (len > DEVSZ / 2) len = DEVSZ / 2;
        so = (size_t)rnd(t, DEVSZ / 2 - len + 1);
        dof = DEVSZ / 2 + (size_t)rnd(t, DEVSZ / 2 - len + 1);
    }
    door_t *dr = pick_door(t);
    int async = (int)rnd(t, 2), x;
    CUstream h = NULL;
    if (async) h = pick_stream(t, dr, &x);
    else x = dr->ptds ? S_PT : S_LEG;
    t->what = async ? "DtoD async" : "DtoD";
    dev_before(t, a, x);
    if (b != a) dev_before(t, b, x);
    CUdeviceptr src = t->dv[a].d + so, dst = t->dv[b].d + dof;
    int unified = rnd(t, 3) == 0;
    if (unified) OK(t, async ? dr->cpya(dst, src, len, h) : dr->cpy(dst, src, len));
    else OK(t, async ? dr->dtoda(dst, src, len, h) : dr->dtod(dst, src, len));
    t->copies++;
    t->dv[a].pend = t->dv[b].pend = x;
}

/* 2D or 3D copy between a host slot and a device buffer (or device to device). */
static void op_nd(thr_t *t, int three)
{
    int i = pick_slot(t, ~0u);
    if (i < 0) return;
    slot_t *s = &t->s[i];
    int dir = (int)rnd(t, 5);    /* 0,1: HtoD  2,3: DtoH  4: DtoD */
    int d = (int)rnd(t, NDEV), d2 = (int)rnd(t, NDEV);
    size_t hoff = (size_t)rnd(t, s->n);
    size_t avail = s->n - hoff;
    size_t depth = three ? 1 + (size_t)rnd(t, 4) : 1;
    size_t rows = 1 + (size_t)rnd(t, 64);
    if (rows * depth > avail) { depth = 1; rows = 1 + (size_t)rnd(t, avail < 64 ? avail : 64); }
    size_t w = 1 + (size_t)rnd(t, avail / (rows * depth));
    /* host pitch and slice height so that the span fits in avail */
    size_t hh = rows, hp = w;
    if (rows * depth > 1) {
        size_t hpmax = (avail - w) / (rows * depth - 1);
        hp = w + (size_t)rnd(t, hpmax - w + 1);
        if (depth > 1) {
            size_t hhmax = (avail - w - (rows - 1) * hp) / ((depth - 1) * hp);
            hh = rows + (size_t)rnd(t, hhmax - rows + 1);
        }
    }
    size_t hspan = (depth - 1) * hh * hp + (rows - 1) * hp + w;
    /* device pitch */
    size_t dp = w + (size_t)rnd(t, 4096), dh = rows + (size_t)rnd(t, 3);
    size_t dspan = (depth - 1) * dh * dp + (rows - 1) * dp + w;
    while (dspan > DEVSZ) {
        dp = w;
        dh = rows;
        dspan = (depth - 1) * dh * dp + (rows - 1) * dp + w;
        if (dspan > DEVSZ) { depth = 1; dspan = (rows - 1) * dp + w; hspan = (rows - 1) * hp + w; }
    }
    size_t doff = (size_t)rnd(t, DEVSZ - dspan + 1);
    size_t doff2 = (size_t)rnd(t, DEVSZ - dspan + 1);
    door_t *dr = pick_door(t);
    int async = (int)rnd(t, 2), x;
    CUstream h = NULL;
    if (async) h = pick_stream(t, dr, &x);
    else x = dr->ptds ? S_PT : S_LEG;
    int cls = hclass(s, hoff, hspan);
    int htype = rnd(t, 3) == 0 ? CU_MEMORYTYPE_UNIFIED : CU_MEMORYTYPE_HOST;
    int dtype = rnd(t, 3) == 0 ? CU_MEMORYTYPE_UNIFIED : CU_MEMORYTYPE_DEVICE;
    t->what = three ? (async ? "3D async" : "3D") : (async ? "2D async" : "2D");
    int usehost = dir < 4;
    if (dir == 4 && d2 == d && dspan * 2 > DEVSZ) d2 = (d + 1) % NDEV;
    if (dir == 4 && d2 == d) doff2 = DEVSZ / 2 + (size_t)rnd(t, DEVSZ / 2 - dspan + 1), doff = (size_t)rnd(t, DEVSZ / 2 - dspan + 1);
    dev_before(t, d, x);
    if (dir == 4 && d2 != d) dev_before(t, d2, x);
    if (usehost) slot_before_gpu(t, i, x);
    if (dir >= 2 && dir < 4) slot_writable(t, i);
    if (dir >= 2 && dir < 4 && s->pend < 0 && rnd(t, 2)) memset(s->p + hoff, 0x5A, hspan);
    /* the host address split into X/Y (and Z) offsets from a base, as a program might */
    size_t hz = 0, hy = 0, hx = hoff;
    if (rnd(t, 2)) {
        if (three && hoff >= hh * hp) { hz = hoff / (hh * hp); hx = hoff - hz * hh * hp; }
        if (hx >= hp) { hy = hx / hp; hx -= hy * hp; }
    }
    CUresult r;
    if (!three) {
        CUDA_MEMCPY2D p;
        memset(&p, 0, sizeof p);
        p.WidthInBytes = w;
        p.Height = rows;
        if (dir < 2) {
            p.srcMemoryType = (CUmemorytype)htype;
            if (htype == CU_MEMORYTYPE_HOST) p.srcHost = s->p; else p.srcDevice = (CUdeviceptr)(uintptr_t)s->p;
            p.srcXInBytes = hx; p.srcY = hy; p.srcPitch = hp;
            p.dstMemoryType = (CUmemorytype)dtype; p.dstDevice = t->dv[d].d + doff; p.dstPitch = dp;
        } else if (dir < 4) {
            p.srcMemoryType = (CUmemorytype)dtype; p.srcDevice = t->dv[d].d + doff; p.srcPitch = dp;
            p.dstMemoryType = (CUmemorytype)htype;
            if (htype == CU_MEMORYTYPE_HOST) p.dstHost = s->p; else p.dstDevice = (CUdeviceptr)(uintptr_t)s->p;
            p.dstXInBytes = hx; p.dstY = hy; p.dstPitch = hp;
        } else {
            p.srcMemoryType = CU_MEMORYTYPE_DEVICE; p.srcDevice = t->dv[d].d + doff; p.srcPitch = dp;
            p.dstMemoryType = (CUmemorytype)dtype; p.dstDevice = t->dv[d2].d + doff2; p.dstPitch = dp;
        }
        if (async) r = dr->cpy2da(&p, h);
        else r = rnd(t, 4) == 0 ? dr->cpy2du(&p) : dr->cpy2d(&p);
    } else {
        CUDA_MEMCPY3D p;
        memset(&p, 0, sizeof p);
        p.WidthInBytes = w;
        p.Height = rows;
        p.Depth = depth;
        if (dir < 2) {
            p.srcMemoryType = (CUmemorytype)htype;
            if (htype == CU_MEMORYTYPE_HOST) p.srcHost = s->p; else p.srcDevice = (CUdeviceptr)(uintptr_t)s->p;
            p.srcXInBytes = hx; p.srcY = hy; p.srcZ = hz; p.srcPitch = hp; p.srcHeight = hh;
            p.dstMemoryType = (CUmemorytype)dtype; p.dstDevice = t->dv[d].d + doff; p.dstPitch = dp; p.dstHeight = dh;
        } else if (dir < 4) {
            p.srcMemoryType = (CUmemorytype)dtype; p.srcDevice = t->dv[d].d + doff; p.srcPitch = dp; p.srcHeight = dh;
            p.dstMemoryType = (CUmemorytype)htype;
            if (htype == CU_MEMORYTYPE_HOST) p.dstHost = s->p; else p.dstDevice = (CUdeviceptr)(uintptr_t)s->p;
            p.dstXInBytes = hx; p.dstY = hy; p.dstZ = hz; p.dstPitch = hp; p.dstHeight = hh;
        } else {
            p.srcMemoryType = CU_MEMORYTYPE_DEVICE; p.srcDevice = t->dv[d].d + doff; p.srcPitch = dp; p.srcHeight = dh;
            p.dstMemoryType = (CUmemorytype)dtype; p.dstDevice = t->dv[d2].d + doff2; p.dstPitch = dp; p.dstHeight = dh;
        }
        r = async ? dr->cpy3da(&p, h) : dr->cpy3d(&p);
    }
    if (r != CUDA_SUCCESS)
        fail(t, "%s (dir %d, w %zu rows %zu depth %zu, host pitch %zu height %zu, dev pitch %zu) returned %d",
             (const char *)t->what, dir, w, rows, depth, hp, hh, dp, (int)r);
    t->copies++;
    int clr = 0;
    if (dir < 2) {
        s->uses++;
        after_host_read(t, i, cls, async, x, &clr);
        t->dv[d].pend = clr ? -1 : x;
        maybe_reuse(t, i, cls, hoff, hspan);
    } else if (dir < 4) {
        s->uses++;
        defer_or_hash(t, i, cls, async, x, hoff, w, rows, depth, hp, hh * hp, three ? L_3D : L_2D, &clr);
        t->dv[d].pend = clr ? -1 : x;
    } else {
        t->dv[d].pend = t->dv[d2].pend = x;
    }
}

static void op_kernel(thr_t *t)
{
    int d = (int)rnd(t, NDEV);
    size_t len = 1 + (size_t)rnd(t, (size_t)1 << (10 + rnd(t, 11)));
    size_t off = (size_t)rnd(t, DEVSZ - len + 1);
    int ptsz = (int)rnd(t, 2);
    int kind = (int)rnd(t, 6);       /* 0-3: a kernel; 4: memset on a stream; 5: "sync" memset */
    int x = kind == 5 ? (ptsz ? S_PT : S_LEG) : (int)rnd(t, NSTREAM);
    CUstream h = handle(t, x, ptsz);
    int val = (int)rnd(t, 256);
    door_t *dr = &doors[ptsz ? D_LINK_PT : D_LINK];
    t->what = kind < 4 ? "kernel" : "memset";
    dev_before(t, d, x);
    if (kind < 4) {
        unsigned delay = (unsigned)rnd(t, 300);
        OK(t, ptsz ? fakecuda_launch_write_ptsz(h, t->dv[d].d + off, val, len, delay)
                   : fakecuda_launch_write(h, t->dv[d].d + off, val, len, delay));
    } else if (kind == 4) {
        OK(t, dr->memset8a(t->dv[d].d + off, (unsigned char)val, len, h));
    } else {
        OK(t, dr->memset8(t->dv[d].d + off, (unsigned char)val, len));
    }
    t->dv[d].pend = x;
}

static void op_sync(thr_t *t)
{
    t->what = "sync";
    host_sync(t, (int)rnd(t, NSTREAM));
}

static void op_register(thr_t *t)
{
    int i = pick_slot(t, ~0u);
    if (i < 0) return;
    slot_t *s = &t->s[i];
    static const unsigned fl[] = { 0, CU_MEMHOSTREGISTER_PORTABLE, CU_MEMHOSTREGISTER_DEVICEMAP,
                                   CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP };
    unsigned flags = fl[rnd(t, 4)];
    size_t off, len;
    int odd = (int)rnd(t, 16);
    t->what = "cuMemHostRegister";
    slot_writable(t, i);   /* (the driver registers read-only memory only when asked to) */
    if (s->kind == K_MMAP && rnd(t, 2)) {
        /* page-aligned pieces of a mapping */
        size_t pages = (s->n + PAGE - 1) / PAGE;
        off = (size_t)rnd(t, pages) * PAGE;
        if (off >= s->n) off = 0;
        len = 1 + (size_t)rnd(t, s->n - off);
    } else {
        sub_range(t, s->n, &off, &len);
    }
    if (odd == 0) {
        /* errors are the driver's own: a zero size, unknown flags */
        EXPECT(t, CUDA_ERROR_INVALID_VALUE, do_register(t, s->p + off, 0, flags, 0));
        EXPECT(t, CUDA_ERROR_INVALID_VALUE, do_register(t, s->p + off, len, 0x100, 0));
        logv(t, L_RC, 1);
        return;
    }
    CUresult want;
    int slotk = -1;
    if (s->kind == K_HOST) {
        want = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    } else {
        want = CUDA_SUCCESS;
        for (int k = 0; k < NREG; k++) {
            reg_t *r = &s->reg[k];
            if (r->on && off < r->off + r->len && r->off < off + len) want = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
            if (!r->on && slotk < 0) slotk = k;
        }
        if (want == CUDA_SUCCESS && slotk < 0) {
            /* no room to track another: try an overlapping one instead */
            off = s->reg[0].off;
            len = s->reg[0].len;
            want = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
        }
    }
    /* registering does not touch the content, but the program's own pending work is ordered */
    CUresult r = do_register(t, s->p + off, len, flags, want == CUDA_SUCCESS);
    if (r != want)
        fail(t, "cuMemHostRegister(slot %d kind %d, off %zu, len %zu of %zu, flags %u) returned %d, the driver "
             "without the shim returns %d", i, s->kind, off, len, s->n, flags, (int)r, (int)want);
    logv(t, L_RC, (uint64_t)want);
    if (r == CUDA_SUCCESS && want == CUDA_SUCCESS) s->reg[slotk] = (reg_t){ off, len, 1 };
}

static void op_unregister(thr_t *t)
{
    int i = pick_slot(t, ~0u);
    if (i < 0) return;
    slot_t *s = &t->s[i];
    t->what = "cuMemHostUnregister";
    int ks[NREG], nk = 0;
    for (int k = 0; k < NREG; k++)
        if (s->reg[k].on) ks[nk++] = k;
    int how = (int)rnd(t, 4);
    if (nk && how < 3) {
        reg_t *r = &s->reg[ks[rnd(t, (uint64_t)nk)]];
        if (how == 2 && r->len > 1) {
            /* an interior pointer: the driver refuses it */
            size_t in = 1 + (size_t)rnd(t, r->len - 1);
            EXPECT(t, CUDA_ERROR_INVALID_VALUE, do_unregister(s->p + r->off + in, 0));
            logv(t, L_RC, 2);
            return;
        }
        slot_before_host(t, i);
        EXPECT(t, CUDA_SUCCESS, do_unregister(s->p + r->off, r->len));
        r->on = 0;
        logv(t, L_RC, 3);
        return;
    }
    /* a pointer the program never registered: the slot's base (maybe promoted by the shim), or
     * somewhere inside it */
    size_t off = rnd(t, 2) ? 0 : (size_t)rnd(t, s->n);
    CUresult want = CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    if (s->kind != K_HOST)
        for (int k = 0; k < NREG; k++) {
            reg_t *r = &s->reg[k];
            if (r->on && off >= r->off && off < r->off + r->len)
                want = off == r->off ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
        }
    if (want == CUDA_SUCCESS) {
        for (int k = 0; k < NREG; k++)
            if (s->reg[k].on && s->reg[k].off == off) {
                slot_before_host(t, i);
                EXPECT(t, CUDA_SUCCESS, do_unregister(s->p + off, s->reg[k].len));
                s->reg[k].on = 0;
            }
    } else {
        CUresult r = do_unregister(s->p + off, 0);
        if (r != want)
            fail(t, "cuMemHostUnregister(slot %d kind %d + %zu of %zu, never registered there) returned %d, the "
                 "driver without the shim returns %d", i, s->kind, off, s->n, (int)r, (int)want);
    }
    logv(t, L_RC, (uint64_t)want + 10);
}

static void op_mmap_change(thr_t *t)
{
    int i = pick_slot(t, 1u << K_MMAP);
    if (i < 0) return;
    slot_t *s = &t->s[i];
    unregister_all(t, i);
    slot_writable(t, i);
    size_t pages = s->maplen / PAGE;
    int how = (int)rnd(t, 6);
    size_t k = pages > 1 ? 1 + (size_t)rnd(t, pages - 1) : 0;
    switch (how) {
    case 0: /* drop tail pages */
        t->what = "munmap tail";
        if (!k) break;
        if (munmap(s->p + (pages - k) * PAGE, k * PAGE) != 0) fail(t, "munmap tail: %s", strerror(errno));
        s->maplen -= k * PAGE;
        if (s->n > s->maplen) s->n = s->maplen;
        break;
    case 1: /* drop head pages */
        t->what = "munmap head";
        if (!k || s->n <= k * PAGE) break;
        if (munmap(s->p, k * PAGE) != 0) fail(t, "munmap head: %s", strerror(errno));
        s->p += k * PAGE;
        s->maplen -= k * PAGE;
        s->n -= k * PAGE;
        break;
    case 2: { /* grow, maybe moving */
        t->what = "mremap grow";
        size_t nl = s->maplen + PAGE * (1 + (size_t)rnd(t, 512));
        if (nl > MAXSZ) nl = MAXSZ > s->maplen ? MAXSZ : s->maplen;
        void *q = mremap(s->p, s->maplen, nl, MREMAP_MAYMOVE);
        if (q == MAP_FAILED) {
            fail(t, "mremap grow: %s", strerror(errno));
            break;
        }
        s->p = q;
        logv(t, L_MREMAP, hash_rows(s->p, s->n, 1, 1, s->n, s->n));
        size_t nn = nl - (size_t)rnd(t, PAGE);
        if (nn <= s->n) nn = s->n;
        fill(s->p + s->n, nn - s->n, rnext(&t->rng));
        s->maplen = nl;
        s->n = nn;
        break;
    }
    case 3: { /* shrink in place */
        t->what = "mremap shrink";
        if (!k) break;
        size_t nl = s->maplen - k * PAGE;
        void *q = mremap(s->p, s->maplen, nl, 0);
        if (q != s->p) {
            fail(t, "mremap shrink: %s", q == MAP_FAILED ? strerror(errno) : "moved");
            break;
        }
        s->maplen = nl;
        if (s->n > nl) s->n = nl;
        logv(t, L_MREMAP, hash_rows(s->p, s->n, 1, 1, s->n, s->n));
        break;
    }
    case 4: { /* discard some pages */
        t->what = "madvise DONTNEED (mapping)";
        size_t a = (size_t)rnd(t, pages), b = a + 1 + (size_t)rnd(t, pages - a);
        if (madvise(s->p + a * PAGE, (b - a) * PAGE, MADV_DONTNEED) != 0) fail(t, "madvise: %s", strerror(errno));
        size_t lo = a * PAGE < s->n ? a * PAGE : s->n, hi = b * PAGE < s->n ? b * PAGE : s->n;
        if (!all_zero(s->p + lo, hi - lo)) fail(t, "pages discarded with MADV_DONTNEED do not read zero");
        logv(t, L_MADV, hash_rows(s->p, s->n, 1, 1, s->n, s->n));
        break;
    }
    default: { /* a new mapping at the same address */
        t->what = "mmap MAP_FIXED";
        void *q = mmap(s->p, s->maplen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
        if (q != s->p) {
            fail(t, "mmap MAP_FIXED: %s", strerror(errno));
            break;
        }
        if (!all_zero(s->p, s->n)) fail(t, "a fresh MAP_FIXED mapping does not read zero");
        fill(s->p, s->n, rnext(&t->rng));
        break;
    }
    }
}

static void op_madvise_heap(thr_t *t)
{
    int i = pick_slot(t, 1u << K_HEAP);
    if (i < 0) return;
    slot_t *s = &t->s[i];
    t->what = "madvise DONTNEED (heap)";
    unregister_all(t, i);
    /* Which pages lie wholly inside the block depends on the address: check that they read zero,
     * then give the whole block fresh content, so nothing address-dependent reaches the log. */
    uintptr_t lo = ((uintptr_t)s->p + PAGE - 1) & ~(uintptr_t)(PAGE - 1);
    uintptr_t hi = ((uintptr_t)s->p + s->n) & ~(uintptr_t)(PAGE - 1);
    uint64_t key = rnext(&t->rng);
    if (hi > lo) {
        if (madvise((void *)lo, hi - lo, MADV_DONTNEED) != 0) fail(t, "madvise heap: %s", strerror(errno));
        if (!all_zero((const unsigned char *)lo, hi - lo)) fail(t, "heap pages discarded with MADV_DONTNEED do not read zero");
    }
    fill(s->p, s->n, key);
}

/* Protection changes of a mapping: read-only for a while (copied to the device meanwhile, never
 * written), then writable again before the next host write (slot_writable).  Pending async
 * work on the slot finishes first: a DMA into a page the CPU may not write is the program's
 * business only when the device mapping allows it. */
static void op_mprotect(thr_t *t)
{
    int i = pick_slot(t, 1u << K_MMAP);
    if (i < 0) return;
    slot_t *s = &t->s[i];
    t->what = "mprotect";
    slot_before_host(t, i);
    if (s->ro) {
        slot_writable(t, i);
    } else {
        if (mprotect(s->p, s->maplen, PROT_READ) != 0) fail(t, "mprotect read-only: %s", strerror(errno));
        s->ro = 1;
    }
    logv(t, L_PROT, (uint64_t)s->ro);
}

/* fork while the other threads allocate, copy and pin: the child sees the memory as it was, may
 * write it (its own copy), allocates, reallocs, callocs and frees large blocks, gets the
 * driver's own error from a copy, and ends; no lock may be left held across fork. */
static void op_fork(thr_t *t)
{
    int i = pick_slot(t, ~0u);
    t->what = "fork";
    uint64_t want = 0;
    if (i >= 0) {
        slot_before_host(t, i);
        want = hash_rows(t->s[i].p, t->s[i].n, 1, 1, t->s[i].n, t->s[i].n);
    }
    size_t big = ((size_t)256 << 10) + (size_t)rnd(t, (size_t)4 << 20);
    uint64_t key = rnext(&t->rng);
    int free_it = (int)rnd(t, 2);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        int bad = 0;
        slot_t *s = i >= 0 ? &t->s[i] : NULL;
        if (s && hash_rows(s->p, s->n, 1, 1, s->n, s->n) != want) bad |= 1;
        if (s && !s->ro && s->kind != K_HOST) fill(s->p, s->n, key);
        unsigned char *b = malloc(big);
        if (!b) bad |= 2;
        else {
            fill(b, big, key);
            unsigned char *q = realloc(b, big * 2);
            if (!q || !is_fill(q, big, key)) bad |= 4;
            free(q ? q : b);
        }
        unsigned char *z = calloc(1, big);
        if (!z || !all_zero(z, big)) bad |= 8;
        free(z);
        if (s && free_it && s->kind == K_HEAP) free(s->p);
        if (s && free_it && s->kind == K_MMAP && munmap(s->p, s->maplen) != 0) bad |= 16;
        unsigned char c[16] = { 0 };
        if (cuMemcpyHtoD(t->dv[0].d, c, sizeof c) != CUDA_ERROR_NOT_INITIALIZED) bad |= 32;
        _exit(bad);
    }
    if (pid < 0) {
        fail(t, "fork: %s", strerror(errno));
        return;
    }
    int st = 0;
    double end = now_s() + 30;
    pid_t w;
    while ((w = waitpid(pid, &st, WNOHANG)) == 0 && now_s() < end) usleep(1000);
    if (w == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
        fail(t, "the forked child did not finish within 30 s (a lock held across fork?)");
        logv(t, L_FORK, 999);
        return;
    }
    int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (code)
        fail(t, "the forked child ended with status %d (1 inherited memory differs, 2/4/8 malloc/realloc/calloc, "
             "16 munmap, 32 a copy's answer was not the driver's NOT_INITIALIZED)", code);
    logv(t, L_FORK, (uint64_t)code);
}

/* ---------------------------------------------------------------- the working set */
/* g_pool live blocks of 64-256 KiB per thread, each holding fill(key): replaced, resized and
 * sent to the device and back; their content is checked whenever the host touches them, and
 * at the end no two of them overlap. */
static size_t pool_size(thr_t *t) { return ((size_t)64 << 10) + (size_t)rnd(t, ((size_t)192 << 10) + 1); }

static void pool_new(thr_t *t, int j)
{
    size_t n = pool_size(t);
    uint64_t key = rnext(&t->rng);
    unsigned char *p = NULL;
    switch (rnd(t, 4)) {
    case 0: {
        p = calloc(1, n);
        if (p && !all_zero(p, n)) fail(t, "calloc of a working-set block (%zu bytes) does not read zero", n);
        break;
    }
    case 1: {
        void *q = NULL;
        p = posix_memalign(&q, PAGE, n) == 0 ? q : NULL;
        break;
    }
    default:
        p = malloc(n);
    }
    if (!p) {
        fail(t, "allocating a working-set block of %zu bytes failed", n);
        abort();
    }
    fill(p, n, key);
    t->pool_p[j] = p;
    t->pool_n[j] = n;
    t->pool_key[j] = key;
}

static void pool_check(thr_t *t, int j, const char *when)
{
    if (!is_fill(t->pool_p[j], t->pool_n[j], t->pool_key[j]))
        fail(t, "working-set block %d (%zu bytes) changed %s", j, t->pool_n[j], when);
}

/* Working-set blocks handed from thread to thread: a replaced block is sometimes left in a
 * mailbox slot instead of freed, and whoever next takes that slot checks and frees it.  A block
 * freed by another thread than the one that allocated it goes back to where it came from (the
 * shim's arena returns it to its segment's home).  Which thread frees which block depends on
 * timing; nothing of it is logged, so the checksum does not. */
#define MAILBOX 32
static struct mail { unsigned char *p; size_t n; uint64_t key; } g_mail[MAILBOX];
static pthread_mutex_t g_mail_mu = PTHREAD_MUTEX_INITIALIZER;

static void mail_check_free(thr_t *t, struct mail m, const char *when)
{
    if (!m.p) return;
    if (!is_fill(m.p, m.n, m.key)) fail(t, "a handed-over working-set block (%zu bytes) changed %s", m.n, when);
    free(m.p);
}

static void pool_setup(thr_t *t)
{
    if (!g_pool) return;
    t->pool_p = calloc((size_t)g_pool, sizeof *t->pool_p);
    t->pool_n = calloc((size_t)g_pool, sizeof *t->pool_n);
    t->pool_key = calloc((size_t)g_pool, sizeof *t->pool_key);
    if (!t->pool_p || !t->pool_n || !t->pool_key) abort();
    for (int j = 0; j < g_pool; j++) pool_new(t, j);
    OK(t, cuMemAlloc(&t->dpool, (size_t)256 << 10));
}

static void op_pool(thr_t *t)
{
    int j = (int)rnd(t, (uint64_t)g_pool);
    unsigned what = (unsigned)rnd(t, 10);
    if (what < 5) {
        t->what = "working set: replace";
        pool_check(t, j, "before its free");
        if (what == 0) {
            t->what = "working set: hand over";
            struct mail mine = { t->pool_p[j], t->pool_n[j], t->pool_key[j] };
            int k = (int)rnd(t, MAILBOX);
            pthread_mutex_lock(&g_mail_mu);
            struct mail theirs = g_mail[k];
            g_mail[k] = mine;
            pthread_mutex_unlock(&g_mail_mu);
            mail_check_free(t, theirs, "in the mailbox");
        } else {
            free(t->pool_p[j]);
        }
        pool_new(t, j);
    } else if (what < 7) {
        t->what = "working set: realloc";
        pool_check(t, j, "before its realloc");
        size_t nn = pool_size(t), keep = nn < t->pool_n[j] ? nn : t->pool_n[j];
        unsigned char *q = realloc(t->pool_p[j], nn);
        if (!q) {
            fail(t, "realloc of a working-set block to %zu failed", nn);
            abort();
        }
        /* (whole words: fill's last few bytes depend on the length) */
        if (!is_fill(q, keep & ~(size_t)7, t->pool_key[j])) fail(t, "realloc of a working-set block lost its content");
        t->pool_p[j] = q;
        t->pool_n[j] = nn;
        fill(q, nn, t->pool_key[j]);
    } else {
        /* to the device and back into the same block, poisoned in between */
        t->what = "working set: round trip";
        unsigned char *p = t->pool_p[j];
        size_t n = t->pool_n[j];
        door_t *dr = pick_door(t);
        int x;
        if (rnd(t, 2)) {
            CUstream h = pick_stream(t, dr, &x);
            OK(t, dr->htoda(t->dpool, p, n, h));
            memset(p, 0xC3, n);       /* pageable to the program: its source may be reused now */
            OK(t, dr->dtoha(p, t->dpool, n, h));
            OK(t, dr->ssync(h));
            settled(t, x);
        } else {
            OK(t, dr->htod(t->dpool, p, n));
            memset(p, 0xC3, n);
            OK(t, dr->dtoh(p, t->dpool, n));
        }
        t->copies += 2;
        pool_check(t, j, "after its round trip through the device");
    }
}

/* A checkpoint round: a few blocks of one size allocated afresh, each filled from the device,
 * checked and all freed (the shim's pinned cache learns the demand of that size and serves
 * later rounds with blocks it registered on their way out, racing its own registrar).  Up to
 * eight blocks, and sometimes a second round at once: its allocations take back blocks of the
 * first still waiting for the registrar, which holds a burst off while other threads copy. */
static void op_round(thr_t *t)
{
    t->what = "checkpoint round";
    OK(t, cuCtxSynchronize());
    settled(t, -1);
    size_t n = ((size_t)1 + rnd(t, 2)) << 20;
    int k = 2 + (int)rnd(t, 7), d = (int)rnd(t, NDEV), rounds = 1 + (int)rnd(t, 2);
    unsigned char *b[8];
    door_t *dr = pick_door(t);
    for (int r = 0; r < rounds; r++) {
        for (int i = 0; i < k; i++) {
            b[i] = malloc(n);
            if (!b[i]) abort();
            OK(t, dr->dtoh(b[i], t->dv[d].d + (size_t)i * 4096, n));
            t->copies++;
        }
        for (int i = 0; i < k; i++) {
            logv(t, L_ROUND, hash_rows(b[i], n, 1, 1, n, n));
            free(b[i]);
        }
    }
}

static int cmp_range(const void *a, const void *b)
{
    const uintptr_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

static void pool_teardown(thr_t *t)
{
    if (!g_pool) return;
    uintptr_t (*r)[2] = malloc((size_t)g_pool * sizeof *r);
    if (!r) abort();
    for (int j = 0; j < g_pool; j++) {
        pool_check(t, j, "by the end");
        r[j][0] = (uintptr_t)t->pool_p[j];
        r[j][1] = t->pool_n[j];
    }
    qsort(r, (size_t)g_pool, sizeof *r, cmp_range);
    for (int j = 1; j < g_pool; j++)
        if (r[j - 1][0] + r[j - 1][1] > r[j][0]) {
            fail(t, "two live working-set blocks overlap (%#lx+%zu and %#lx)", (unsigned long)r[j - 1][0],
                 (size_t)r[j - 1][1], (unsigned long)r[j][0]);
            break;
        }
    free(r);
    for (int j = 0; j < g_pool; j++) free(t->pool_p[j]);
    free(t->pool_p);
    free(t->pool_n);
    free(t->pool_key);
    OK(t, cuMemFree(t->dpool));
}

/* ---------------------------------------------------------------- signals (hostile) */
/* One more thread, the signals' only target: a POSIX timer (SIGPROF, every 50 us) and a thread
 * sending SIGUSR1 in bursts interrupt it while it maps and unmaps, allocates and frees large
 * blocks and copies them through the device; the handler calls malloc and free, as sampling
 * profilers do.  Its small block is in a size class the target never asks for otherwise, so the
 * C library serves it from the thread's cache without a lock (a larger one would deadlock the C
 * library itself); the two signals never nest. */
#define SIG_BYTES 888
static volatile sig_atomic_t g_sig_handled;
static volatile int g_sig_ready, g_sig_stop;

/* Set by the signal target around its driver calls.  A driver allocates from the C library
 * inside its calls (the fake does, for its operations and snapshots), and the C library's
 * calloc and large allocations take its arena lock: a handler allocating then would wait for
 * it forever with or without a library in between.  So the handler allocates only outside
 * driver calls (in the library's malloc, free, mmap and munmap hooks, among others), and counts
 * every signal. */
static __thread volatile sig_atomic_t g_in_driver;
static volatile sig_atomic_t g_sig_in_driver;

static void sig_handler(int sig)
{
    int saved = errno;
    if (!g_in_driver) {
        unsigned char *volatile p = malloc(SIG_BYTES);   /* volatile: the allocation stays */
        if (p) {
            p[0] = (unsigned char)sig;
            p[SIG_BYTES - 1] = 1;
            free(p);
        }
    } else {
        g_sig_in_driver++;
    }
    g_sig_handled++;
    errno = saved;
}

static void block_sigs(void)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGPROF);
    sigaddset(&set, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
}

static void *sig_kicker(void *arg)
{
    thr_t *t = arg;
    block_sigs();
    while (!__atomic_load_n(&g_sig_ready, __ATOMIC_ACQUIRE) && !__atomic_load_n(&g_sig_stop, __ATOMIC_ACQUIRE))
        usleep(100);
    while (!__atomic_load_n(&g_sig_stop, __ATOMIC_ACQUIRE)) {
        for (int i = 0; i < 50; i++) {
            pthread_kill(t->self, SIGUSR1);
            usleep(20);
        }
        usleep(1000);
    }
    return NULL;
}

static void *sig_target(void *arg)
{
    thr_t *t = arg;
    t->rng = g_seed * 0x100000001B3ull + 0x51ED270B27u * (uint64_t)(t->id + 1);
    rnext(&t->rng);
    t->what = "setup";
    OK(t, cuCtxSetCurrent(g_ctx));
    const size_t maxn = (size_t)4 << 20;
    CUdeviceptr dev;
    OK(t, cuMemAlloc(&dev, maxn));
    CUstream st;
    OK(t, cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
    unsigned char *back = malloc(maxn);
    if (!back) abort();
    /* the handler's block waits in this thread's cache (through a volatile pointer: a compiler
     * may drop a malloc whose block is freed unused) */
    void *volatile warm = malloc(SIG_BYTES);
    free(warm);
    struct sigevent sev;
    memset(&sev, 0, sizeof sev);
    sev.sigev_notify = SIGEV_THREAD_ID;
    sev.sigev_signo = SIGPROF;
    sev._sigev_un._tid = t->tid = (pid_t)syscall(SYS_gettid);
    timer_t tm;
    int have_timer = timer_create(CLOCK_MONOTONIC, &sev, &tm) == 0;
    if (have_timer) {
        struct itimerspec its = { { 0, 50000 }, { 0, 50000 } };
        timer_settime(tm, 0, &its, NULL);
    }
    __atomic_store_n(&g_sig_ready, 1, __ATOMIC_RELEASE);
    for (unsigned long k = 0; k < t->nops; k++) {
        t->op = k;
        size_t n = ((size_t)1 << 20) + (size_t)rnd(t, maxn - ((size_t)1 << 20) + 1);
        int use_mmap = (int)rnd(t, 2);
        unsigned char *p;
        t->what = use_mmap ? "signals: mmap" : "signals: malloc";
        if (use_mmap) {
            p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (p == MAP_FAILED) p = NULL;
        } else {
            p = malloc(n);
        }
        if (!p) {
            fail(t, "allocating %zu bytes failed", n);
            continue;
        }
        uint64_t key = rnext(&t->rng);
        fill(p, n, key);
        int async = (int)rnd(t, 2);
        t->what = async ? "signals: async copies" : "signals: sync copies";
        g_in_driver = 1;
        if (async) {
            OK(t, cuMemcpyHtoDAsync(dev, p, n, st));
            OK(t, cuMemcpyDtoHAsync(back, dev, n, st));
            OK(t, cuStreamSynchronize(st));
        } else {
            OK(t, cuMemcpyHtoD(dev, p, n));
            OK(t, cuMemcpyDtoH(back, dev, n));
        }
        g_in_driver = 0;
        t->copies += 2;
        if (!is_fill(back, n, key)) fail(t, "a round trip of %zu bytes came back wrong while signals arrived", n);
        logv(t, L_SIG, hash_rows(back, n, 1, 1, n, n));
        t->what = use_mmap ? "signals: munmap" : "signals: free";
        if (use_mmap) munmap(p, n);
        else free(p);
        if (k % 16 == 0) {
            t->what = "signals: malloc burst";
            void *blk[8];
            for (int i = 0; i < 8; i++) {
                blk[i] = malloc(((size_t)256 << 10) << rnd(t, 4));
                if (blk[i]) memset(blk[i], i, 4096);
            }
            for (int i = 0; i < 8; i++) free(blk[i]);
        }
    }
    t->op = t->nops;
    t->what = "teardown";
    if (have_timer) timer_delete(tm);
    block_sigs();
    OK(t, cuStreamDestroy(st));
    OK(t, cuMemFree(dev));
    free(back);
    t->what = "done";
    return NULL;
}

static void op_streams(thr_t *t)
{
    int k = (int)rnd(t, 2);
    t->what = "stream re-create";
    host_sync(t, S_BLK + k);
    OK(t, cuStreamDestroy(t->us[k]));
    unsigned flags = k ? CU_STREAM_NON_BLOCKING : CU_STREAM_DEFAULT;
    if (rnd(t, 2)) OK(t, cuStreamCreate(&t->us[k], flags));
    else OK(t, cuStreamCreateWithPriority(&t->us[k], flags, -(int)rnd(t, 3)));
}

/* ---------------------------------------------------------------- threads */
static void *worker(void *arg)
{
    thr_t *t = arg;
    t->rng = g_seed * 0x100000001B3ull + 0x51ED270B27u * (uint64_t)(t->id + 1);
    rnext(&t->rng);
    t->what = "setup";
    OK(t, cuCtxSetCurrent(g_ctx));
    for (int i = 0; i < NDEV; i++) {
        OK(t, cuMemAlloc(&t->dv[i].d, DEVSZ));
        OK(t, cuMemsetD8(t->dv[i].d, 0, DEVSZ));
        t->dv[i].pend = S_LEG;
    }
    OK(t, cuStreamCreate(&t->us[0], CU_STREAM_DEFAULT));
    OK(t, cuStreamCreate(&t->us[1], CU_STREAM_NON_BLOCKING));
    OK(t, cuEventCreate(&t->ev, CU_EVENT_DISABLE_TIMING));
    for (int i = 0; i < NSLOT; i++) t->s[i].pend = -1;
    t->what = "working set";
    pool_setup(t);

    for (unsigned long k = 0; k < g_ops; k++) {
        t->op = k;
        unsigned w = (unsigned)rnd(t, 100);
        unsigned w2 = (unsigned)rnd(t, 1000);
        int live = 0;
        for (int i = 0; i < NSLOT; i++) live += t->s[i].kind != K_NONE;
        if (w2 < 4) op_fork(t);
        else if (w2 < 40) op_mprotect(t);
        else if (w2 < 140 && g_pool) op_pool(t);
        else if (w2 < 143) op_round(t);
        else if (live < 3 || w < 9) op_alloc(t);
        else if (w < 14) op_free(t);
        else if (w < 18) op_realloc(t);
        else if (w < 23) op_fill(t);
        else if (w < 37) op_h2d(t);
        else if (w < 51) op_d2h(t);
        else if (w < 55) op_d2d(t);
        else if (w < 62) op_nd(t, 0);
        else if (w < 65) op_nd(t, 1);
        else if (w < 71) op_kernel(t);
        else if (w < 75) op_sync(t);
        else if (w < 82) op_register(t);
        else if (w < 87) op_unregister(t);
        else if (w < 90) op_mmap_change(t);
        else if (w < 92) op_bounce(t);
        else if (w < 94) op_madvise_heap(t);
        else if (w < 96) op_hostsum(t);
        else if (w < 98) op_bounce(t);
        else if (w < 99) op_streams(t);
        else { t->what = "cuCtxSynchronize"; OK(t, cuCtxSynchronize()); settled(t, -1); }
    }
    t->op = g_ops;
    t->what = "teardown";
    OK(t, cuCtxSynchronize());
    settled(t, -1);
    for (int d = 0; d < NDEV; d++) {
        /* the device buffers' final content */
        unsigned char *b = malloc(DEVSZ);
        if (!b) abort();
        OK(t, cuMemcpyDtoH(b, t->dv[d].d, DEVSZ));
        logv(t, L_D2H, hash_rows(b, DEVSZ, 1, 1, DEVSZ, DEVSZ));
        free(b);
    }
    for (int i = 0; i < NSLOT; i++) {
        slot_t *s = &t->s[i];
        if (!s->kind) continue;
        unregister_all(t, i);
        logv(t, L_FREE, hash_rows(s->p, s->n, 1, 1, s->n, s->n));
        if (s->kind == K_HEAP) free(s->p);
        else if (s->kind == K_MMAP) munmap(s->p, s->maplen);
        else OK(t, cuMemFreeHost(s->p));
        s->kind = K_NONE;
    }
    pool_teardown(t);
    OK(t, cuStreamDestroy(t->us[0]));
    OK(t, cuStreamDestroy(t->us[1]));
    OK(t, cuEventDestroy(t->ev));
    for (int d = 0; d < NDEV; d++) OK(t, cuMemFree(t->dv[d].d));
    t->what = "done";
    return NULL;
}

static void check_budget_now(const char *when)
{
    pthread_rwlock_wrlock(&g_reglock);
    size_t all = fakecuda_registered_bytes();
    size_t own = g_own_reg;
    pthread_rwlock_unlock(&g_reglock);
    size_t excess = all > own ? all - own : 0;
    if (all < own) {
        printf("MISMATCH seed=%llu: the driver counts %zu registered bytes, fewer than the program's own %zu (%s)\n",
               g_seed, all, own, when);
        __atomic_add_fetch(&g_fail, 1, __ATOMIC_RELAXED);
    }
    if (excess > g_excess_max) {
        g_excess_max = excess;
        size_t limit = g_promotes ? g_budget : 0;
        if ((g_budget || !g_promotes) && excess > limit) {
            printf("BUDGET seed=%llu: the shim keeps %zu bytes registered (driver %zu - program's own %zu), budget %zu (%s)\n",
                   g_seed, excess, all, own, limit, when);
            __atomic_add_fetch(&g_fail, 1, __ATOMIC_RELAXED);
        }
    }
}

static void *sampler(void *arg)
{
    (void)arg;
    while (!__atomic_load_n(&g_done, __ATOMIC_ACQUIRE)) {
        check_budget_now("sampled");
        g_samples++;
        usleep(200);
    }
    return NULL;
}

static void *watchdog(void *arg)
{
    (void)arg;
    double end = now_s() + g_watchdog;
    while (!__atomic_load_n(&g_done, __ATOMIC_ACQUIRE)) {
        if (now_s() > end) {
            char buf[4096];
            int n = snprintf(buf, sizeof buf, "WATCHDOG seed=%llu: not finished after %u s; threads:", g_seed, g_watchdog);
            for (int i = 0; i < g_nthr && n < (int)sizeof buf - 100; i++)
                n += snprintf(buf + n, sizeof buf - (size_t)n, " [t%d op %lu/%lu %s]", i, g_thr[i].op, g_thr[i].nops,
                              (const char *)g_thr[i].what);
            n += snprintf(buf + n, sizeof buf - (size_t)n, "\n");
            ssize_t wr = write(1, buf, (size_t)n);
            wr = write(2, buf, (size_t)n);
            (void)wr;
            _exit(99);
        }
        usleep(100000);
    }
    return NULL;
}

/* ---------------------------------------------------------------- doors set-up */
static void *gpa_lookup(PFN_cuGetProcAddress_v12000 gpa, const char *name, int ver, int pt)
{
    void *fn = NULL;
    CUdriverProcAddressQueryResult st;
    CUresult r = gpa(name, &fn, ver, pt ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : CU_GET_PROC_ADDRESS_DEFAULT, &st);
    if (r != CUDA_SUCCESS || !fn) {
        printf("FAIL cuGetProcAddress(%s, %d, %d) returned %d\n", name, ver, pt, (int)r);
        exit(1);
    }
    return fn;
}

static void *dl(void *lib, const char *name)
{
    void *f = dlsym(lib, name);
    if (!f) {
        printf("FAIL dlsym(%s) found nothing\n", name);
        exit(1);
    }
    return f;
}

static void setup_doors(void)
{
    door_t *d = &doors[D_LINK];
    *d = (door_t){ "linked", 0, cuMemcpyHtoD, cuMemcpyDtoH, cuMemcpyDtoD, cuMemcpy, cuMemcpy2D, cuMemcpy2DUnaligned,
                   cuMemcpy3D, cuMemcpyHtoDAsync, cuMemcpyDtoHAsync, cuMemcpyDtoDAsync, cuMemcpyAsync,
                   cuMemcpy2DAsync, cuMemcpy3DAsync, cuMemsetD8, cuMemsetD8Async, cuStreamSynchronize,
                   cuEventRecord, cuStreamWaitEvent };
    d = &doors[D_LINK_PT];
    *d = (door_t){ "linked ptds", 1, cuMemcpyHtoD_v2_ptds, cuMemcpyDtoH_v2_ptds, cuMemcpyDtoD_v2_ptds, cuMemcpy_ptds,
                   cuMemcpy2D_v2_ptds, NULL, cuMemcpy3D_v2_ptds, cuMemcpyHtoDAsync_v2_ptsz,
                   cuMemcpyDtoHAsync_v2_ptsz, cuMemcpyDtoDAsync_v2_ptsz, cuMemcpyAsync_ptsz,
                   cuMemcpy2DAsync_v2_ptsz, cuMemcpy3DAsync_v2_ptsz, cuMemsetD8_v2_ptds, cuMemsetD8Async_ptsz,
                   cuStreamSynchronize_ptsz, cuEventRecord_ptsz, cuStreamWaitEvent_ptsz };
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        printf("FAIL dlopen(libcuda.so.1): %s\n", dlerror());
        exit(1);
    }
    doors[D_LINK_PT].cpy2du = (PFN_cuMemcpy2DUnaligned_v3020)dl(lib, "cuMemcpy2DUnaligned_v2_ptds");
    d = &doors[D_DLSYM];
    d->name = "dlsym";
    d->ptds = 0;
    d->htod = dl(lib, "cuMemcpyHtoD_v2");
    d->dtoh = dl(lib, "cuMemcpyDtoH_v2");
    d->dtod = dl(lib, "cuMemcpyDtoD_v2");
    d->cpy = dl(lib, "cuMemcpy");
    d->cpy2d = dl(lib, "cuMemcpy2D_v2");
    d->cpy2du = dl(lib, "cuMemcpy2DUnaligned_v2");
    d->cpy3d = dl(lib, "cuMemcpy3D_v2");
    d->htoda = dl(lib, "cuMemcpyHtoDAsync_v2");
    d->dtoha = dl(lib, "cuMemcpyDtoHAsync_v2");
    d->dtoda = dl(lib, "cuMemcpyDtoDAsync_v2");
    d->cpya = dl(lib, "cuMemcpyAsync");
    d->cpy2da = dl(lib, "cuMemcpy2DAsync_v2");
    d->cpy3da = dl(lib, "cuMemcpy3DAsync_v2");
    d->memset8 = dl(lib, "cuMemsetD8_v2");
    d->memset8a = dl(lib, "cuMemsetD8Async");
    d->ssync = dl(lib, "cuStreamSynchronize");
    d->erecord = dl(lib, "cuEventRecord");
    d->swait = dl(lib, "cuStreamWaitEvent");
    PFN_cuGetProcAddress_v12000 gpa = (PFN_cuGetProcAddress_v12000)dl(lib, "cuGetProcAddress_v2");
    /* as the CUDA runtime does: look cuGetProcAddress itself up first */
    gpa = (PFN_cuGetProcAddress_v12000)gpa_lookup(gpa, "cuGetProcAddress", 12000, 0);
    for (int pt = 0; pt < 2; pt++) {
        d = &doors[pt ? D_GPA_PT : D_GPA];
        int v = pt ? 7000 : 0;
        d->name = pt ? "cuGetProcAddress per-thread" : "cuGetProcAddress";
        d->ptds = pt;
        d->htod = gpa_lookup(gpa, "cuMemcpyHtoD", v ? v : 3020, pt);
        d->dtoh = gpa_lookup(gpa, "cuMemcpyDtoH", v ? v : 3020, pt);
        d->dtod = gpa_lookup(gpa, "cuMemcpyDtoD", v ? v : 3020, pt);
        d->cpy = gpa_lookup(gpa, "cuMemcpy", v ? v : 4000, pt);
        d->cpy2d = gpa_lookup(gpa, "cuMemcpy2D", v ? v : 3020, pt);
        d->cpy2du = gpa_lookup(gpa, "cuMemcpy2DUnaligned", v ? v : 3020, pt);
        d->cpy3d = gpa_lookup(gpa, "cuMemcpy3D", v ? v : 3020, pt);
        d->htoda = gpa_lookup(gpa, "cuMemcpyHtoDAsync", v ? v : 3020, pt);
        d->dtoha = gpa_lookup(gpa, "cuMemcpyDtoHAsync", v ? v : 3020, pt);
        d->dtoda = gpa_lookup(gpa, "cuMemcpyDtoDAsync", v ? v : 3020, pt);
        d->cpya = gpa_lookup(gpa, "cuMemcpyAsync", v ? v : 4000, pt);
        d->cpy2da = gpa_lookup(gpa, "cuMemcpy2DAsync", v ? v : 3020, pt);
        d->cpy3da = gpa_lookup(gpa, "cuMemcpy3DAsync", v ? v : 3020, pt);
        d->memset8 = gpa_lookup(gpa, "cuMemsetD8", v ? v : 3020, pt);
        d->memset8a = gpa_lookup(gpa, "cuMemsetD8Async", v ? v : 3020, pt);
        d->ssync = gpa_lookup(gpa, "cuStreamSynchronize", v ? v : 2000, pt);
        d->erecord = gpa_lookup(gpa, "cuEventRecord", v ? v : 2000, pt);
        d->swait = gpa_lookup(gpa, "cuStreamWaitEvent", v ? v : 3020, pt);
    }
}

static void usage(void)
{
    fprintf(stderr, "usage: stress --seed N [--threads T] [--ops K] [--watchdog SECONDS] [--pool B]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    int have_seed = 0;
    for (int i = 1; i < argc; i++) {
        if (i + 1 >= argc) usage();
        if (!strcmp(argv[i], "--seed")) { g_seed = strtoull(argv[++i], NULL, 0); have_seed = 1; }
        else if (!strcmp(argv[i], "--threads")) g_threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--ops")) g_ops = strtoul(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--watchdog")) g_watchdog = (unsigned)strtoul(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--pool")) g_pool = atoi(argv[++i]);
        else usage();
    }
    if (!have_seed || g_threads < 1 || g_threads > 64 || g_pool < 0) usage();
    const char *hv = getenv("STRESS_HOSTILE");
    g_hostile = hv && !strcmp(hv, "1");
    g_nthr = g_threads + g_hostile;
    setvbuf(stdout, NULL, _IOLBF, 0);
    g_promotes = drvtest_promotes();
    g_budget = drvtest_shim_loaded() ? drvtest_budget() : 0;
    printf("seed=%llu threads=%d ops=%lu pool=%d hostile=%d mode=%s budget=%zu%s\n", g_seed, g_threads, g_ops, g_pool,
           g_hostile, drvtest_mode(), g_budget, g_promotes && !g_budget ? " (no byte ceiling to check)" : "");

    pthread_t wd, sp;
    pthread_create(&wd, NULL, watchdog, NULL);
    double t0 = now_s();
    g_ctx = drvtest_init();
    setup_doors();
    g_thr = calloc((size_t)g_nthr, sizeof *g_thr);
    pthread_t *th = calloc((size_t)g_nthr, sizeof *th);
    if (!g_thr || !th) abort();
    pthread_create(&sp, NULL, sampler, NULL);
    pthread_t kick;
    if (g_hostile) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = sig_handler;
        sa.sa_flags = SA_RESTART;
        sigemptyset(&sa.sa_mask);
        sigaddset(&sa.sa_mask, SIGPROF);
        sigaddset(&sa.sa_mask, SIGUSR1);
        sigaction(SIGPROF, &sa, NULL);
        sigaction(SIGUSR1, &sa, NULL);
    }
    for (int i = 0; i < g_nthr; i++) {
        g_thr[i].id = i;
        g_thr[i].what = "start";
        /* the signal target's operations are large round trips: a quarter as many */
        g_thr[i].nops = i < g_threads ? g_ops : (g_ops / 4 > 20 ? g_ops / 4 : 20);
        pthread_create(&th[i], NULL, i < g_threads ? worker : sig_target, &g_thr[i]);
        g_thr[i].self = th[i];
    }
    if (g_hostile) pthread_create(&kick, NULL, sig_kicker, &g_thr[g_threads]);
    for (int i = 0; i < g_nthr; i++) pthread_join(th[i], NULL);
    if (g_hostile) {
        __atomic_store_n(&g_sig_stop, 1, __ATOMIC_RELEASE);
        pthread_join(kick, NULL);
        printf("info: %ld signals handled, %ld of them during driver calls (no allocation there)\n",
               (long)g_sig_handled, (long)g_sig_in_driver);
    }
    for (int k = 0; k < MAILBOX; k++) {
        mail_check_free(&g_thr[0], g_mail[k], "by the end");
        g_mail[k].p = NULL;
    }
    OK(&g_thr[0], cuCtxSynchronize());
    check_budget_now("at the end");
    __atomic_store_n(&g_done, 1, __ATOMIC_RELEASE);
    pthread_join(sp, NULL);
    pthread_join(wd, NULL);

    uint64_t all = FNV_OFF;
    unsigned long ops = 0, copies = 0, entries = 0;
    FILE *dump = NULL;
    const char *dp = getenv("STRESS_DUMP");
    if (dp && *dp) dump = fopen(dp, "w");
    for (int i = 0; i < g_nthr; i++) {
        thr_t *t = &g_thr[i];
        uint64_t h = FNV_OFF;
        for (size_t k = 0; k < t->nlog; k++) {
            h = fnv(h, (const unsigned char *)&t->log[k].tag, 4);
            h = fnv(h, (const unsigned char *)&t->log[k].op, 4);
            h = fnv(h, (const unsigned char *)&t->log[k].v, 8);
            if (dump) fprintf(dump, "t%d op%u tag%u %016llx\n", i, t->log[k].op, t->log[k].tag,
                              (unsigned long long)t->log[k].v);
        }
        printf("THREAD %d entries=%zu copies=%lu hash=%016llx\n", i, t->nlog, t->copies, (unsigned long long)h);
        all = fnv(all, (const unsigned char *)&h, 8);
        ops += t->nops;
        copies += t->copies;
        entries += t->nlog;
    }
    if (dump) fclose(dump);
    unsigned long viol = fakecuda_violations();
    size_t peak = fakecuda_registered_bytes_peak();
    printf("info: %.2f s, %lu samples, shim-registered max %zu, driver peak (incl. the program's) %zu, now %zu\n",
           now_s() - t0, g_samples, g_excess_max, peak, fakecuda_registered_bytes());
    printf("OPS %lu\n", ops);
    printf("COPIES %lu\n", copies);
    printf("VIOLATIONS %lu\n", viol);
    printf("FINDINGS %lu\n", g_fail);
    printf("CHECKSUM %016llx\n", (unsigned long long)all);
    (void)entries;
    return (viol || g_fail) ? 1 : 0;
}
