/* The staging pipeline (see staging.h).
 *
 * One driver thread's memcpy runs ~10 GB/s, which is why the driver's own pageable path tops out
 * at 8-15 GB/s.  Here the CPU side of each chunk is split over a pool of copy threads and
 * overlapped with the DMA of the previous chunk, through `staging_buffers` pinned buffers of
 * `staging_chunk` bytes (a "lane").
 *
 * Lanes: a lane belongs to the context it was built in (its events are that context's objects;
 * the buffers are one PORTABLE registration).  A copy takes a free lane of its context; if every
 * lane of the context is busy, one more is built while fewer than LANES_PER_CTX exist, else the
 * copy is declined (the caller takes the driver's own path) rather than blocked.  Lanes are kept
 * for the life of the process: their bytes stay reserved against the budget.
 *
 * Limitations: a lane's context is remembered by handle; a context destroyed and recreated at the
 * same address would leave a lane with dead events (its copies would then fail, not corrupt). */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>
#include <cudaTypedefs.h>
#include "base/config.h"
#include "base/os.h"
#include "base/log.h"
#include "base/nvtx.h"
#include "mem/registry.h"
#include "base/real.h"
#include "base/shim.h"
#include "copy/staging.h"
#include "stats/stats.h"
#include "copy/streams.h"

#define MAX_LANES 8
#define LANES_PER_CTX 2          /* e.g. one thread's H2D while another's D2H */
#define MAX_BUFFERS 8            /* PINSHIM_STAGING_BUFFERS' own upper bound */
#define MAX_WORKERS 63           /* PINSHIM_COPY_THREADS <= 64, the caller is one of them */
#define WORKER_SPIN_NS 50000ull  /* the next chunk's job usually comes within microseconds */

/* Smallest slice of one memcpy job handed to a thread: splitting less than this costs more in
 * wake-ups than it gains.  A sixteenth of a chunk, within [4 KiB, 1 MiB]: 1 MiB for the default
 * 16 MiB chunks, so that small chunks are split too. */
static size_t slice_min(void)
{
    size_t s = (size_t)shim_cfg.staging_chunk / 16;
    return s < 4096 ? 4096 : s > (1u << 20) ? (1u << 20) : s;
}

/* ---------------------------------------------------------------- copy thread pool */

/* One memcpy job: `rows` rows of `width` bytes, src/dst rows `spitch`/`dpitch` apart.  A job of
 * one row is split by bytes, a job of several by rows.  next/done are guarded by pool.mu. */
struct copy_job {
    char *dst;
    const char *src;
    size_t dpitch, spitch, width, rows;
    unsigned nslices, next, done;
    struct copy_job *link;       /* pool.jobs: jobs with slices not yet taken */
};

static struct {
    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv;
    struct copy_job *jobs;
    unsigned gen;                /* bumped per job, read unlocked by spinning workers */
    int stop;
    int started;
    int nworkers;
    pthread_t tid[MAX_WORKERS];
} pool = { .mu = PTHREAD_MUTEX_INITIALIZER, .work_cv = PTHREAD_COND_INITIALIZER,
            .done_cv = PTHREAD_COND_INITIALIZER };

static void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static void run_slice(const struct copy_job *j, unsigned i)
{
    if (j->rows == 1) {
        size_t per = (j->width + j->nslices - 1) / j->nslices;
        size_t off = (size_t)i * per;
        if (off < j->width)
            memcpy(j->dst + off, j->src + off, j->width - off < per ? j->width - off : per);
        return;
    }
    size_t per = (j->rows + j->nslices - 1) / j->nslices;
    size_t r0 = (size_t)i * per, r1 = r0 + per < j->rows ? r0 + per : j->rows;
    for (size_t r = r0; r < r1; r++)
        memcpy(j->dst + r * j->dpitch, j->src + r * j->spitch, j->width);
}

/* Take one slice of the first job with slices left; pool.mu held.  -1 when none. */
static long take_slice(struct copy_job **out)
{
    struct copy_job *j = pool.jobs;
    if (!j)
        return -1;
    unsigned i = j->next++;
    if (j->next == j->nslices)
        pool.jobs = j->link;
    *out = j;
    return i;
}

/* A slice finished; pool.mu held.  After the last one the owner may free the job at once, so
 * nobody touches it after this. */
static void slice_done(struct copy_job *j)
{
    if (++j->done == j->nslices)
        pthread_cond_broadcast(&pool.done_cv);
}

static void *worker_main(void *arg)
{
    shim_enter();   /* anything this thread allocates bypasses the hooks; never left */
    pthread_mutex_lock(&pool.mu);
    for (;;) {
        if (__atomic_load_n(&pool.stop, __ATOMIC_RELAXED))
            break;
        struct copy_job *j;
        long i = take_slice(&j);
        if (i >= 0) {
            pthread_mutex_unlock(&pool.mu);
            run_slice(j, (unsigned)i);
            pthread_mutex_lock(&pool.mu);
            slice_done(j);
            continue;
        }
        /* Spin a little before sleeping: in a pipeline the next chunk's job follows within
         * microseconds, and a futex wake-up per chunk per thread would show. */
        unsigned gen = pool.gen;
        pthread_mutex_unlock(&pool.mu);
        uint64_t t0 = shim_now_ns();
        int changed = 0;
        for (unsigned n = 0; !changed; n++) {
            changed = __atomic_load_n(&pool.gen, __ATOMIC_ACQUIRE) != gen ||
                      __atomic_load_n(&pool.stop, __ATOMIC_ACQUIRE);
            if ((n & 63) == 63 && shim_now_ns() - t0 > WORKER_SPIN_NS)
                break;
            cpu_relax();
        }
        pthread_mutex_lock(&pool.mu);
        if (!changed && pool.gen == gen && !__atomic_load_n(&pool.stop, __ATOMIC_RELAXED))
            pthread_cond_wait(&pool.work_cv, &pool.mu);
    }
    pthread_mutex_unlock(&pool.mu);
    return arg;
}

static int online_cpus(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* Start the workers once.  PINSHIM_COPY_THREADS counts the calling thread: 1 means no pool. */
static void pool_start(void)
{
    if (__atomic_load_n(&pool.started, __ATOMIC_ACQUIRE))
        return;
    pthread_mutex_lock(&pool.mu);
    if (!pool.started) {
        int want = (int)shim_cfg.copy_threads, cpus = online_cpus();
        if (want > cpus)
            want = cpus;
        want -= 1;
        if (want > MAX_WORKERS)
            want = MAX_WORKERS;
        __atomic_store_n(&pool.stop, 0, __ATOMIC_RELAXED);
        int started = 0;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setstacksize(&attr, 256 * 1024);
        /* The program's signal handlers must never run on the shim's threads. */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        for (int i = 0; i < want; i++) {
            if (pthread_create(&pool.tid[started], &attr, worker_main, NULL) != 0)
                break;   /* fewer threads: slower, still correct */
            pthread_setname_np(pool.tid[started], "pinshim-copy");
            started++;
        }
        __atomic_store_n(&pool.nworkers, started, __ATOMIC_RELAXED);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        pthread_attr_destroy(&attr);
        __atomic_store_n(&pool.started, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&pool.mu);
}

/* Copy rows with the pool's help; the caller takes slices too and returns when all are done. */
static void pool_copy(char *dst, size_t dpitch, const char *src, size_t spitch, size_t width,
                      size_t rows)
{
    if (rows > 1 && dpitch == width && spitch == width) {
        width *= rows;   /* contiguous on both sides: one row, split by bytes */
        rows = 1;
    }
    struct copy_job job = { dst, src, dpitch, spitch, width, rows, 1, 0, 0, NULL };
    size_t total = width * rows;
    size_t min_slice = slice_min();
    size_t n = total / min_slice;
    size_t parts = (size_t)__atomic_load_n(&pool.nworkers, __ATOMIC_RELAXED) + 1;
    if (n > parts)
        n = parts;
    if (rows > 1 && n > rows)
        n = rows;
    if (n <= 1) {
        run_slice(&job, 0);
        return;
    }
    job.nslices = (unsigned)n;
    pthread_mutex_lock(&pool.mu);
    /* Append: earlier jobs (another lane's) keep their place. */
    struct copy_job **pp = &pool.jobs;
    while (*pp)
        pp = &(*pp)->link;
    *pp = &job;
    __atomic_store_n(&pool.gen, pool.gen + 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&pool.work_cv);
    /* Only this job's slices: helping another lane's job would delay this pipeline. */
    while (job.next < job.nslices) {
        unsigned i = job.next++;
        if (job.next == job.nslices) {
            for (pp = &pool.jobs; *pp != &job; pp = &(*pp)->link)
                ;
            *pp = job.link;
        }
        pthread_mutex_unlock(&pool.mu);
        run_slice(&job, i);
        pthread_mutex_lock(&pool.mu);
        slice_done(&job);
    }
    while (job.done < job.nslices)
        pthread_cond_wait(&pool.done_cv, &pool.mu);
    pthread_mutex_unlock(&pool.mu);
}

/* ---------------------------------------------------------------- lanes */

enum { LANE_EMPTY, LANE_BUILDING, LANE_READY };

struct lane {
    int state;                   /* guarded by lanes_mu, as is busy */
    int busy;
    CUcontext ctx;
    char *mem;                   /* nbuf buffers of chunk bytes, one mapping, one registration */
    size_t chunk, len;
    unsigned nbuf;
    CUevent ev[MAX_BUFFERS];     /* last DMA that used each buffer */
    int pending[MAX_BUFFERS];    /* ev[b] recorded and not yet waited for */
};

static pthread_mutex_t lanes_mu = PTHREAD_MUTEX_INITIALIZER;
static struct lane lanes[MAX_LANES];
/* Registration refused for good (unsupported): staging is then unavailable. */
static int register_unusable;

typedef CUresult (*register_fn)(void *, size_t, unsigned);
typedef CUresult (*unregister_fn)(void *);

static size_t lane_chunk(void)
{
    return (size_t)page_up((uintptr_t)shim_cfg.staging_chunk);
}

static unsigned lane_nbuf(void)
{
    uint64_t n = shim_cfg.staging_buffers;
    return n < 2 ? 2 : n > MAX_BUFFERS ? MAX_BUFFERS : (unsigned)n;
}

/* Release everything a lane holds; its context is current and no DMA uses it. */
static void lane_destroy(struct lane *l, int registered, unsigned nev)
{
    for (unsigned i = 0; i < nev; i++)
        drv.cuEventDestroy_v2(l->ev[i]);
    if (registered && real_hook[HOOK_cuMemHostUnregister])
        ((unregister_fn)real_hook[HOOK_cuMemHostUnregister])(l->mem);
    os_unmap(l->mem, l->len);
    registry_unreserve(l->len);
    l->mem = NULL;
}

/* Build lane l in the current context ctx; l is BUILDING and ours.  0 on success. */
static int lane_build(struct lane *l, CUcontext ctx)
{
    l->chunk = lane_chunk();
    l->nbuf = lane_nbuf();
    l->len = l->chunk * l->nbuf;
    l->ctx = ctx;
    memset(l->pending, 0, sizeof l->pending);
    /* The budget first: staging memory counts like any registration (this may evict). */
    if (!registry_reserve(l->len)) {
        shim_log_once(LOG_INFO, "staging buffers do not fit in PINSHIM_BUDGET: large pageable "
                                "copies take the driver's own path");
        return -1;
    }
    l->mem = os_map(l->len);
    if (!l->mem) {
        registry_unreserve(l->len);
        return -1;
    }
    /* Touch every page: registering resident pages costs 8 times less than faulting them in. */
    for (size_t off = 0; off < l->len; off += SHIM_PAGE_SIZE)
        ((volatile char *)l->mem)[off] = 0;
    CUresult r = ((register_fn)real_hook[HOOK_cuMemHostRegister_v2])(l->mem, l->len,
                                                                      CU_MEMHOSTREGISTER_PORTABLE);
    if (r != CUDA_SUCCESS) {
        if (r == CUDA_ERROR_NOT_SUPPORTED || r == CUDA_ERROR_NOT_PERMITTED)
            __atomic_store_n(&register_unusable, 1, __ATOMIC_RELAXED);
        shim_log_once(LOG_INFO, "could not register staging buffers (error %d): large pageable "
                                "copies take the driver's own path", (int)r);
        lane_destroy(l, 0, 0);
        return -1;
    }
    for (unsigned i = 0; i < l->nbuf; i++) {
        if (drv.cuEventCreate(&l->ev[i], CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
            lane_destroy(l, 1, i);
            return -1;
        }
    }
    return 0;
}

/* A free lane of context ctx, marked busy; NULL when none can be had without waiting. */
static struct lane *lane_acquire(CUcontext ctx)
{
    pthread_mutex_lock(&lanes_mu);
    struct lane *found = NULL, *empty = NULL;
    int mine = 0;
    for (int i = 0; i < MAX_LANES; i++) {
        struct lane *l = &lanes[i];
        if (l->state == LANE_EMPTY) {
            if (!empty)
                empty = l;
            continue;
        }
        if (l->ctx != ctx)
            continue;
        mine++;
        if (l->state == LANE_READY && !l->busy && !found)
            found = l;
    }
    if (found) {
        found->busy = 1;
        pthread_mutex_unlock(&lanes_mu);
        /* Settings changed since it was built (tests do this): rebuild it to the new shape. */
        if (found->chunk != lane_chunk() || found->nbuf != lane_nbuf()) {
            lane_destroy(found, 1, found->nbuf);
            if (lane_build(found, ctx) != 0) {
                pthread_mutex_lock(&lanes_mu);
                found->state = LANE_EMPTY;
                found->busy = 0;
                pthread_mutex_unlock(&lanes_mu);
                stats_add(STAT_STAGING_FAILURES, 1);
                return NULL;
            }
        }
        return found;
    }
    if (!empty || mine >= LANES_PER_CTX) {
        pthread_mutex_unlock(&lanes_mu);
        return NULL;
    }
    empty->state = LANE_BUILDING;
    empty->busy = 1;
    empty->ctx = ctx;
    pthread_mutex_unlock(&lanes_mu);
    /* Built outside the lock: it takes milliseconds, and other contexts' copies go on. */
    int ok = lane_build(empty, ctx) == 0;
    pthread_mutex_lock(&lanes_mu);
    empty->state = ok ? LANE_READY : LANE_EMPTY;
    if (!ok)
        empty->busy = 0;
    pthread_mutex_unlock(&lanes_mu);
    if (!ok) {
        stats_add(STAT_STAGING_FAILURES, 1);
        return NULL;
    }
    return empty;
}

static void lane_release(struct lane *l)
{
    pthread_mutex_lock(&lanes_mu);
    l->busy = 0;
    pthread_mutex_unlock(&lanes_mu);
}

/* ---------------------------------------------------------------- the pipeline */

/* One chunk: rows [row, row+nrows), bytes [col, col+ncols) of each, packed in staging. */
struct piece {
    size_t row, nrows, col, ncols;
};

/* Walks the copy in chunk-sized pieces: whole rows while a row fits in a chunk, else each row
 * in chunk-wide segments. */
struct cursor {
    size_t row, col, width, height, rows_per, cols_per;
};

static void cursor_init(struct cursor *c, size_t width, size_t height, size_t chunk)
{
    c->row = c->col = 0;
    c->width = width;
    c->height = height;
    if (width <= chunk) {
        c->rows_per = chunk / width;
        c->cols_per = width;
    } else {
        c->rows_per = 1;
        c->cols_per = chunk;
    }
}

static int cursor_next(struct cursor *c, struct piece *p)
{
    if (c->row >= c->height)
        return 0;
    p->row = c->row;
    p->col = c->col;
    p->nrows = c->height - c->row < c->rows_per ? c->height - c->row : c->rows_per;
    p->ncols = c->width - c->col < c->cols_per ? c->width - c->col : c->cols_per;
    c->col += p->ncols;
    if (c->col == c->width) {
        c->col = 0;
        c->row += p->nrows;
    }
    return 1;
}

/* The DMA of one piece between staging buffer `buf` (rows packed ncols apart) and the device. */
static CUresult piece_dma(const struct stage_req *req, const struct piece *p, char *buf,
                          CUstream s)
{
    CUdeviceptr dev = req->dev + p->row * req->dev_pitch + p->col;
    size_t bytes = p->nrows * p->ncols;
    /* A single row, or rows contiguous on the device too: one linear copy. */
    if (p->nrows == 1 || req->dev_pitch == p->ncols) {
        if (req->dir == DIR_H2D)
            return ((PFN_cuMemcpyHtoDAsync_v3020)real_hook[HOOK_cuMemcpyHtoDAsync_v2])(dev, buf,
                                                                                     bytes, s);
        return ((PFN_cuMemcpyDtoHAsync_v3020)real_hook[HOOK_cuMemcpyDtoHAsync_v2])(buf, dev,
                                                                                 bytes, s);
    }
    CUDA_MEMCPY2D m;
    memset(&m, 0, sizeof m);
    if (req->dir == DIR_H2D) {
        m.srcMemoryType = CU_MEMORYTYPE_HOST;
        m.srcHost = buf;
        m.srcPitch = p->ncols;
        m.dstMemoryType = CU_MEMORYTYPE_DEVICE;
        m.dstDevice = dev;
        m.dstPitch = req->dev_pitch;
    } else {
        m.srcMemoryType = CU_MEMORYTYPE_DEVICE;
        m.srcDevice = dev;
        m.srcPitch = req->dev_pitch;
        m.dstMemoryType = CU_MEMORYTYPE_HOST;
        m.dstHost = buf;
        m.dstPitch = p->ncols;
    }
    m.WidthInBytes = p->ncols;
    m.Height = p->nrows;
    return ((PFN_cuMemcpy2DAsync_v3020)real_hook[HOOK_cuMemcpy2DAsync_v2])(&m, s);
}

static char *piece_host(const struct stage_req *req, const struct piece *p)
{
    return (char *)req->host + p->row * req->host_pitch + p->col;
}

/* Outcome of a pipeline run. */
enum { RUN_DONE, RUN_DECLINED };

/* Wait until no DMA of this copy uses the lane's buffers (after an error). */
static void lane_drain(struct lane *l, CUstream s)
{
    if (drv.cuStreamSynchronize(s) != CUDA_SUCCESS)
        for (unsigned b = 0; b < l->nbuf; b++)
            if (l->pending[b])
                drv.cuEventSynchronize(l->ev[b]);
    memset(l->pending, 0, sizeof l->pending);
}

/* H2D: chunk i goes through buffer i % nbuf; the CPU copy of chunk i overlaps the DMA of the
 * chunks before it.  Complete (synchronized) on return. */
static int run_h2d(const struct stage_req *req, struct lane *l, CUstream s, CUresult *result)
{
    struct cursor c;
    struct piece p;
    cursor_init(&c, req->width, req->height, l->chunk);
    CUresult r = CUDA_SUCCESS;
    unsigned seq = 0;
    while (cursor_next(&c, &p)) {
        unsigned b = seq % l->nbuf;
        char *buf = l->mem + (size_t)b * l->chunk;
        if (l->pending[b]) {
            if ((r = drv.cuEventSynchronize(l->ev[b])) != CUDA_SUCCESS)
                goto fail;
            l->pending[b] = 0;
        }
        pool_copy(buf, p.ncols, piece_host(req, &p), req->host_pitch, p.ncols, p.nrows);
        if ((r = piece_dma(req, &p, buf, s)) != CUDA_SUCCESS)
            goto fail;
        seq++;
        if ((r = drv.cuEventRecord(l->ev[b], s)) != CUDA_SUCCESS)
            goto fail;
        l->pending[b] = 1;
    }
    /* Stronger than the original's "source read", invisible to the program: later work in
     * any stream sees the data. */
    r = drv.cuStreamSynchronize(s);
    memset(l->pending, 0, sizeof l->pending);
    *result = r;
    return RUN_DONE;
fail:
    lane_drain(l, s);
    if (seq == 0)
        return RUN_DECLINED;   /* nothing reached the device: the original call says it best */
    *result = r;
    return RUN_DONE;
}

/* D2H: DMAs run up to nbuf ahead; as each completes its chunk is copied out by the pool. */
static int run_d2h(const struct stage_req *req, struct lane *l, CUstream s, CUresult *result)
{
    struct cursor c;
    struct piece inflight[MAX_BUFFERS];
    cursor_init(&c, req->width, req->height, l->chunk);
    CUresult r = CUDA_SUCCESS;
    unsigned issued = 0, completed = 0;
    int more = 1;
    for (;;) {
        while (more && issued - completed < l->nbuf) {
            unsigned b = issued % l->nbuf;
            if (!(more = cursor_next(&c, &inflight[b])))
                break;
            if ((r = piece_dma(req, &inflight[b], l->mem + (size_t)b * l->chunk, s)) != CUDA_SUCCESS)
                goto fail;
            issued++;
            if ((r = drv.cuEventRecord(l->ev[b], s)) != CUDA_SUCCESS)
                goto fail;
            l->pending[b] = 1;
        }
        if (completed == issued)
            break;
        unsigned b = completed % l->nbuf;
        if ((r = drv.cuEventSynchronize(l->ev[b])) != CUDA_SUCCESS)
            goto fail;
        l->pending[b] = 0;
        const struct piece *p = &inflight[b];
        pool_copy(piece_host(req, p), req->host_pitch, l->mem + (size_t)b * l->chunk, p->ncols,
                  p->ncols, p->nrows);
        completed++;
    }
    *result = CUDA_SUCCESS;
    return RUN_DONE;
fail:
    lane_drain(l, s);
    if (issued == 0)
        return RUN_DECLINED;
    *result = r;
    return RUN_DONE;
}

/* ---------------------------------------------------------------- interface */

int staging_available(size_t bytes)
{
    if (shim_cfg.mode != MODE_FULL || shim_forked_child || !real_driver_ready())
        return 0;
    uint64_t min = shim_cfg.staging_min ? shim_cfg.staging_min : shim_cfg.min_size;
    if (bytes < min)
        return 0;
    /* Buffers that can never fit, or cannot be registered here. */
    if ((uint64_t)lane_chunk() * lane_nbuf() > shim_cfg.budget ||
        __atomic_load_n(&register_unusable, __ATOMIC_RELAXED))
        return 0;
    return real_hook[HOOK_cuMemHostRegister_v2] && real_hook[HOOK_cuMemcpyHtoDAsync_v2] &&
           real_hook[HOOK_cuMemcpyDtoHAsync_v2] && real_hook[HOOK_cuMemcpy2DAsync_v2];
}

/* [dev, dev + extent) lies in one device allocation.  Otherwise the original call must run,
 * so the program gets its error code (semantics rule 3). */
static int device_range_ok(CUdeviceptr dev, size_t extent)
{
    unsigned int type = 0;
    CUdeviceptr start = 0;
    size_t size = 0;
    if (drv.cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, dev) != CUDA_SUCCESS ||
        (type != CU_MEMORYTYPE_DEVICE && type != CU_MEMORYTYPE_UNIFIED))
        return 0;
    if (drv.cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, dev) != CUDA_SUCCESS ||
        drv.cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, dev) != CUDA_SUCCESS)
        return 0;
    return dev >= start && dev - start <= size && extent <= size - (dev - start);
}

/* The copy threads may touch [p, p+n): memory the shim tracks, or memory the driver does not
 * call device (or array) memory at either end, and mapped throughout.  Otherwise the original
 * call runs and the program gets the driver's answer: a device pointer passed as the host side
 * (a wrong cudaMemcpyKind) is CUDA_ERROR_INVALID_VALUE there, never a fault in a copy thread. */
static int host_range_ok(uintptr_t p, size_t n)
{
    if (registry_host_range(p, n))
        return 1;
    uintptr_t ends[2] = { p, p + n - 1 };
    for (int i = 0; i < 2; i++) {
        unsigned int type = 0;
        if (drv.cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)ends[i]) ==
                CUDA_SUCCESS && type != CU_MEMORYTYPE_HOST)
            return 0;
    }
    return os_range_mapped(p, n);
}

/* The request's shape is one staging can move, else the driver should judge it.  *extent is the
 * device side's, *host_extent the host side's. */
static int request_ok(const struct stage_req *req, size_t *extent, size_t *host_extent)
{
    if ((req->dir != DIR_H2D && req->dir != DIR_D2H) || !req->host || !req->dev ||
        !req->width || !req->height)
        return 0;
    if (req->height == 1) {
        *extent = *host_extent = req->width;
        return 1;
    }
    /* Overlapping rows are the driver's error to report. */
    if (req->host_pitch < req->width || req->dev_pitch < req->width)
        return 0;
    size_t hi = req->height - 1;
    if (hi > (SIZE_MAX - req->width) / req->dev_pitch ||
        hi > (SIZE_MAX - req->width) / req->host_pitch)
        return 0;
    *extent = hi * req->dev_pitch + req->width;
    *host_extent = hi * req->host_pitch + req->width;
    return 1;
}

int staging_copy(const struct stage_req *req, CUresult *result)
{
    size_t extent, host_extent;
    if (!request_ok(req, &extent, &host_extent) || !staging_available(req->width * req->height) ||
        capture_active() || !drv.cuPointerGetAttribute)
        return 0;
    uint64_t t0 = shim_now_ns();
    int staged = 0;
    struct lane *l = NULL;
    struct shim_stream *ss = streams_current();
    if (!ss)
        goto out;
    if (!device_range_ok(req->dev, extent) || !host_range_ok((uintptr_t)req->host, host_extent))
        goto out;   /* the program's error, not a staging failure */
    if (!(l = lane_acquire(ss->ctx)))
        goto out;   /* busy or failed (counted inside) */
    pool_start();
    if (streams_order_after(ss, req->stream, req->flavour) != 0) {
        stats_add(STAT_STAGING_FAILURES, 1);
        goto out;
    }
    /* A copy larger than the lane's buffers cannot be read whole at the call: later chunks are
     * read once the DMA of earlier ones is done, which the stream orders after the work queued
     * before the copy.  Such work (a host function, say) may rewrite the source, and the device
     * must get either all the bytes of the call or all the rewritten ones, never a mix: so it
     * is waited for before the first byte is read. */
    if (req->dir == DIR_H2D && req->width * req->height > (size_t)l->nbuf * l->chunk &&
        drv.cuEventQuery(ss->order_event) == CUDA_ERROR_NOT_READY) {
        uint64_t w0 = shim_now_ns();
        drv.cuEventSynchronize(ss->order_event);
        stats_add(STAT_ORDERING_WAIT_NS, shim_now_ns() - w0);
    }
    /* Contiguous on both sides: one long row, cut in full chunks. */
    struct stage_req flat = *req;
    if (flat.height > 1 && flat.host_pitch == flat.width && flat.dev_pitch == flat.width) {
        flat.width *= flat.height;
        flat.height = 1;
    }
    nvtx_push("pinshim staged copy");
    int run = flat.dir == DIR_H2D ? run_h2d(&flat, l, ss->stream, result)
                                  : run_d2h(&flat, l, ss->stream, result);
    nvtx_pop();
    if (run == RUN_DECLINED) {
        stats_add(STAT_STAGING_FAILURES, 1);
        goto out;
    }
    staged = 1;
out:
    if (l)
        lane_release(l);
    if (staged) {
        stats_add(STAT_STAGED_COPIES, 1);
        stats_add(STAT_STAGED_BYTES, req->width * req->height);
        stats_add(STAT_STAGED_NS, shim_now_ns() - t0);
    }
    return staged;
}

void staging_shutdown(void)
{
    if (shim_forked_child) {
        /* The child has none of the parent's threads, and must not touch the driver: forget
         * the pool and the lanes (their locks may have been held by threads that are gone),
         * and give the buffers' pages back. */
        pthread_mutex_init(&pool.mu, NULL);
        pthread_cond_init(&pool.work_cv, NULL);
        pthread_cond_init(&pool.done_cv, NULL);
        pool.jobs = NULL;
        __atomic_store_n(&pool.nworkers, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&pool.stop, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&pool.started, 0, __ATOMIC_RELEASE);
        pthread_mutex_init(&lanes_mu, NULL);
        for (int i = 0; i < MAX_LANES; i++) {
            if (lanes[i].state == LANE_READY)
                os_unmap(lanes[i].mem, lanes[i].len);
            memset(&lanes[i], 0, sizeof lanes[i]);
        }
        return;
    }
    /* Lanes stay: at exit the process's end releases them, and reg_changing then could race
     * the driver's own teardown.  Only the threads stop. */
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
