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
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <cudaTypedefs.h>
#include "base/config.h"
#include "base/os.h"
#include "base/log.h"
#include "base/nvtx.h"
#include "mem/registry.h"
#include "base/real.h"
#include "base/shim.h"
#include "copy/cpupool.h"
#include "copy/staging.h"
#include "stats/stats.h"
#include "stats/trace.h"
#include "copy/streams.h"

#define MAX_LANES 8
#define LANES_PER_CTX 2          /* e.g. one thread's H2D while another's D2H */
#define MAX_BUFFERS 8            /* PINSHIM_STAGING_BUFFERS' own upper bound */
/* A D2H copy whose pieces fit in half a buffer (a copy of up to two buffers' size) cycles
 * through the buffers' halves: a D2H slot takes its next DMA only once its piece is copied out,
 * and with three slots the copy engine waited between pieces (staged D2H of 16 MiB: 21.7-25.1
 * GB/s with three buffers, 24.3-26.9 with six, H100 hosts, bench/RESULTS.md runs 48 and 51).
 * Halves give it six slots in the same pinned memory.  Larger copies keep whole buffers: how
 * pieces of half the size would do there is not measured (a quarter of the size halved the
 * rate: PINSHIM_STAGING_CHUNK=4M). */
#define D2H_SPLIT 2
#define MAX_SLOTS (MAX_BUFFERS * D2H_SPLIT)

/* ---------------------------------------------------------------- lanes */

enum { LANE_EMPTY, LANE_BUILDING, LANE_READY };

struct lane {
    int state;                   /* guarded by lanes_mu, as is busy */
    int busy;
    CUcontext ctx;
    char *mem;                   /* nbuf buffers of chunk bytes, one mapping, one registration */
    size_t chunk, len;
    unsigned nbuf;
    unsigned nev;                /* events made: one per slot of the finest layout */
    /* The layout the last copy used: nslot slots of slot bytes, the buffers themselves or
     * their halves (D2H_SPLIT).  A copy of the other layout waits for the DMAs still using the
     * old slots before it cuts them anew (only an H2D copy leaves any). */
    int halves;
    unsigned nslot;
    size_t slot;
    CUevent ev[MAX_SLOTS];       /* last DMA that used each slot */
    int pending[MAX_SLOTS];      /* ev[i] recorded and not yet waited for */
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

/* Release everything a lane holds; its context is current.  The last DMAs of an H2D copy may
 * still be reading its buffers: they are waited for first. */
static void lane_destroy(struct lane *l, int registered)
{
    for (unsigned i = 0; i < l->nev; i++) {
        if (l->pending[i])
            drv.cuEventSynchronize(l->ev[i]);
        l->pending[i] = 0;
        drv.cuEventDestroy_v2(l->ev[i]);
    }
    if (registered && real_hook[HOOK_cuMemHostUnregister]) {
        CUstreamCaptureMode before = drv_relax_capture();
        ((unregister_fn)real_hook[HOOK_cuMemHostUnregister])(l->mem);
        drv_restore_capture(before);
    }
    os_unmap(l->mem, l->len);
    registry_unreserve(l->len);
    l->mem = NULL;
    l->nev = 0;
}

/* Cut lane l's memory into slots for the next copy, in direction dir and of pieces of `piece`
 * bytes: a D2H copy whose pieces fit in half a buffer gets the buffers' halves, any other the
 * buffers (see D2H_SPLIT). */
static void lane_layout(struct lane *l, enum copy_dir dir, size_t piece)
{
    size_t half = page_down(l->chunk / D2H_SPLIT);
    int halves = dir == DIR_D2H && half && piece <= half && l->nev >= l->nbuf * D2H_SPLIT;
    if (l->nslot && l->halves == halves)
        return;
    for (unsigned i = 0; i < l->nev; i++) {
        if (l->pending[i])
            drv.cuEventSynchronize(l->ev[i]);   /* an error shows in the copy's own calls */
        l->pending[i] = 0;
    }
    l->halves = halves;
    if (halves) {
        l->nslot = l->nbuf * D2H_SPLIT;
        l->slot = half;
    } else {
        l->nslot = l->nbuf;
        l->slot = l->chunk;
    }
}

/* Build lane l in the current context ctx; l is BUILDING and ours.  0 on success. */
static int lane_build(struct lane *l, CUcontext ctx)
{
    l->chunk = lane_chunk();
    l->nbuf = lane_nbuf();
    l->len = l->chunk * l->nbuf;
    l->nev = 0;
    l->nslot = 0;   /* cut by the first copy (lane_layout) */
    l->ctx = ctx;
    memset(l->pending, 0, sizeof l->pending);
    /* The budget first: staging memory counts like any registration (this may evict). */
    if (!registry_reserve(l->len)) {
        shim_log_once(LOG_INFO, "staging buffers do not fit in PINSHIM_BUDGET: large pageable "
                                "copies take the driver's own path");
        return -1;
    }
    /* In huge pages where the system allows them, faulted in by one call: the first copy of a
     * process waits for this (staging_ready), and 48 MiB of 4 KiB pages touched one by one took
     * about 30 ms on the H200's host.  Resident before registering: registering resident pages
     * costs 8 times less than faulting them in. */
    uint64_t t0 = shim_ticks();
    l->mem = os_map_aligned(l->len, SHIM_HUGE_PAGE, 0);
    if (!l->mem) {
        registry_unreserve(l->len);
        return -1;
    }
    os_madvise(l->mem, l->len, MADV_HUGEPAGE);
    if (os_populate(l->mem, l->len, MADV_POPULATE_WRITE) != 0)
        for (size_t off = 0; off < l->len; off += SHIM_PAGE_SIZE)
            ((volatile char *)l->mem)[off] = 0;   /* a kernel before 5.14 */
    CUstreamCaptureMode before = drv_relax_capture();
    CUresult r = ((register_fn)real_hook[HOOK_cuMemHostRegister_v2])(l->mem, l->len,
                                                                      CU_MEMHOSTREGISTER_PORTABLE);
    drv_restore_capture(before);
    if (trace_on())
        trace_event(shim_ns_since(t0), "staging_buffers", "bytes=%zu buffers=%u ok=%d", l->len, l->nbuf,
                    r == CUDA_SUCCESS);
    if (r != CUDA_SUCCESS) {
        if (r == CUDA_ERROR_NOT_SUPPORTED || r == CUDA_ERROR_NOT_PERMITTED)
            __atomic_store_n(&register_unusable, 1, __ATOMIC_RELAXED);
        shim_log_once(LOG_INFO, "could not register staging buffers (error %d): large pageable "
                                "copies take the driver's own path", (int)r);
        lane_destroy(l, 0);
        return -1;
    }
    for (unsigned i = 0; i < l->nbuf * D2H_SPLIT; i++) {
        if (drv.cuEventCreate(&l->ev[i], CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
            lane_destroy(l, 1);
            return -1;
        }
        l->nev = i + 1;
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
            lane_destroy(found, 1);
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

/* ---- lanes built by a thread of their own ----
 * Building a lane takes milliseconds (its buffers faulted in and registered, the first ever
 * registration of a process the slowest), so staging_ready() has a thread build it, and a copy
 * meanwhile is judged as if staging did not exist: a resident block worth registering for this
 * copy alone is registered on its path.  A copy the driver's pageable path would take instead
 * waits for the builder (staging_ready(1)), up to BUILD_WAIT_NS: back-to-back pageable copies
 * keep the builder out of the driver, which serializes its registration behind them (on the
 * H200 a loop of 256 MiB copies kept it out for half a second; in other runs for a few copies).
 * A build that takes longer is left to finish on its own. */
#define BUILD_WAIT_NS 100000000ull
static pthread_t builder;
static int builder_running, builder_done;   /* lanes_mu; builder_done also atomic */
static pthread_cond_t builder_cv = PTHREAD_COND_INITIALIZER;   /* with lanes_mu: a build ended */

static void prefer_local_cpus(void);

static void *builder_main(void *arg)
{
    shim_enter();   /* this thread's work is the shim's own; never left */
    shim_own_thread = 1;
    /* Its registration must not touch a capture the program begins meanwhile (base/real.h). */
    drv_relax_capture();
    CUcontext ctx = arg, popped;
    if (drv.cuCtxPushCurrent_v2(ctx) == CUDA_SUCCESS) {
        struct lane *l = lane_acquire(ctx);
        if (l) {
            lane_release(l);
            /* The copy threads too, placed near this device (staging_ready read where): started
             * by the first staged copy instead, their start lay on its path. */
            cpupool_start();
        }
        drv.cuCtxPopCurrent_v2(&popped);
    }
    pthread_mutex_lock(&lanes_mu);
    __atomic_store_n(&builder_done, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&builder_cv);
    pthread_mutex_unlock(&lanes_mu);
    return NULL;
}

/* lanes_mu held: reap a builder that has finished. */
static void builder_reap(void)
{
    if (builder_running && __atomic_load_n(&builder_done, __ATOMIC_ACQUIRE)) {
        pthread_join(builder, NULL);
        builder_running = 0;
    }
}

/* lanes_mu held: whether ctx has a lane ready (*building: or one being built). */
static int lane_ready(CUcontext ctx, int *building)
{
    int ready = 0;
    *building = 0;
    for (int i = 0; i < MAX_LANES; i++) {
        if (lanes[i].state == LANE_EMPTY || lanes[i].ctx != ctx)
            continue;
        ready |= lanes[i].state == LANE_READY;
        *building |= lanes[i].state == LANE_BUILDING;
    }
    return ready;
}

int staging_ready(int wait)
{
    CUcontext ctx = NULL;
    if (shim_forked_child || !drv.cuCtxGetCurrent || drv.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx)
        return 0;
    int building;
    /* Here, on the program's thread: the builder's copy threads go to the CPUs it reads. */
    prefer_local_cpus();
    pthread_mutex_lock(&lanes_mu);
    int ready = lane_ready(ctx, &building);
    builder_reap();
    if (!ready && !building && !builder_running) {
        /* The program's signal handlers must never run on the shim's threads. */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        __atomic_store_n(&builder_done, 0, __ATOMIC_RELAXED);
        if (pthread_create(&builder, NULL, builder_main, ctx) == 0)
            builder_running = 1;
        pthread_sigmask(SIG_SETMASK, &old, NULL);
    }
    if (wait && !ready && builder_running) {
        struct timespec deadline;
        clock_gettime(CLOCK_MONOTONIC, &deadline);
        deadline.tv_nsec += (long)(BUILD_WAIT_NS % 1000000000ull);
        deadline.tv_sec += (time_t)(BUILD_WAIT_NS / 1000000000ull) + deadline.tv_nsec / 1000000000L;
        deadline.tv_nsec %= 1000000000L;
        while (!__atomic_load_n(&builder_done, __ATOMIC_ACQUIRE) &&
               pthread_cond_clockwait(&builder_cv, &lanes_mu, CLOCK_MONOTONIC, &deadline) != ETIMEDOUT)
            ;
        ready = lane_ready(ctx, &building);
    }
    pthread_mutex_unlock(&lanes_mu);
    return ready;
}

/* The program's device allocations (cuMemAlloc): a context that receives device memory is about
 * to be copied into, so its staging buffers are built from here, off the first copy's path.
 * Built at the first copy instead, their registration ran beside that copy's own and the driver
 * made one wait for the other (an H100 host: a 1 MiB first copy took 10.8 ms, its registration
 * 3.3 ms behind the buffers' 7.6).  Never waits; a context with buffers costs one lookup.  The
 * call-site walks' unwinder is loaded here too, for a program linked to the driver directly
 * (no lookup loaded it). */
CUresult on_mem_alloc(enum hook_id id, CUdeviceptr *dp, size_t n)
{
    CUresult r = ((PFN_cuMemAlloc_v3020)real_hook[id])(dp, n);
    if (r != CUDA_SUCCESS)
        return r;
    stats_prepare_sites();
    if (staging_available(SIZE_MAX) && !capture_active())
        staging_ready(0);
    return r;
}

/* ---------------------------------------------------------------- the pipeline */

/* One chunk: rows [row, row+nrows), bytes [col, col+ncols) of each, packed in staging. */
struct piece {
    size_t row, nrows, col, ncols;
};

/* Walks the copy in chunk-sized pieces: whole rows while a row fits in a chunk, else each row
 * in chunk-wide segments.  A single row may taper (PINSHIM_STAGING_TAPER): its pieces start at
 * TAPER_MIN and double up to the chunk, and end by halving down to TAPER_MIN again.  A pipeline's
 * first step (the first piece's CPU copy, H2D, or its DMA, D2H) and its last step overlap
 * nothing: with pieces of a quarter of a 14 MiB tensor or of a 16 MiB buffer, those two steps
 * cost more than the few extra pieces do. */
#define TAPER_MIN (1u << 20)

struct cursor {
    size_t row, col, width, height, rows_per, cols_per;
    size_t taper;                /* 0, or the smallest piece of a tapered row */
    unsigned index;              /* pieces given so far */
};

static void cursor_init(struct cursor *c, size_t width, size_t height, size_t chunk)
{
    c->row = c->col = 0;
    c->index = 0;
    c->width = width;
    c->height = height;
    /* Tapering pays only where there are pieces of more than TAPER_MIN to shrink. */
    c->taper = shim_cfg.staging_taper && height == 1 && chunk > TAPER_MIN && width > 4 * (size_t)TAPER_MIN
                   ? TAPER_MIN : 0;
    if (width <= chunk) {
        c->rows_per = chunk / width;
        c->cols_per = width;
    } else {
        c->rows_per = 1;
        c->cols_per = chunk;
    }
}

/* The next tapered piece's width: doubling from the start, at most a piece, at most half of
 * what is left (so that the end halves down); a rest of less than half a piece more goes with
 * it, never beyond a piece (a staging buffer's size). */
static size_t taper_width(const struct cursor *c)
{
    size_t left = c->width - c->col;
    size_t n = c->cols_per;
    if (c->index < 16 && (c->taper << c->index) < n)
        n = c->taper << c->index;
    size_t half = page_down(left / 2);
    if (half < c->taper)
        half = c->taper;
    if (half < n)
        n = half;
    if (left <= n + n / 2 && left <= c->cols_per)
        return left;
    return n < left ? n : left;
}

static int cursor_next(struct cursor *c, struct piece *p)
{
    if (c->row >= c->height)
        return 0;
    p->row = c->row;
    p->col = c->col;
    p->nrows = c->height - c->row < c->rows_per ? c->height - c->row : c->rows_per;
    p->ncols = c->width - c->col < c->cols_per ? c->width - c->col : c->cols_per;
    if (c->taper)
        p->ncols = taper_width(c);
    c->index++;
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

/* The CPU side of a piece: streaming stores where the other side is not read back soon, and
 * pages faulted in by slice, in the copy threads, where the program's side may be new. */
static unsigned pool_flags(enum copy_dir dir)
{
    unsigned f = shim_cfg.streaming_stores ? CPUPOOL_STREAM : 0;
    return f | (dir == DIR_H2D ? CPUPOOL_FAULT_SRC : CPUPOOL_FAULT_DST);
}

/* Where one staged copy's time went, for its trace line and, once the copy is done, the
 * statistics' sums: the pipeline's time with a piece being copied by the CPU (pieces that
 * overlap count once; busy_until is where the last one ended), its waits for DMAs, and how long
 * its first piece took to be handed to the copy threads (D2H: its first DMA, and the
 * pre-faulting of a fresh destination). */
struct pipe_times {
    uint64_t start, first_post, busy_until;   /* shim_ticks() */
    uint64_t cpu_ns, wait_ns;
    unsigned pieces;
};

/* Wait until no DMA uses buffer b of the lane: an earlier copy's (also another thread's: an
 * H2D copy returns before its last DMAs are done). */
static CUresult buffer_free(struct lane *l, unsigned b, struct pipe_times *pt)
{
    if (!l->pending[b])
        return CUDA_SUCCESS;
    CUresult r = drv.cuEventQuery(l->ev[b]);
    if (r == CUDA_ERROR_NOT_READY) {
        uint64_t t0 = shim_ticks();
        r = drv.cuEventSynchronize(l->ev[b]);
        pt->wait_ns += shim_ns_since(t0);
    }
    if (r == CUDA_SUCCESS)
        l->pending[b] = 0;
    return r;
}

/* Wait until no DMA of this copy uses the lane's buffers (after an error). */
static void lane_drain(struct lane *l, CUstream s)
{
    if (drv.cuStreamSynchronize(s) != CUDA_SUCCESS)
        for (unsigned b = 0; b < l->nev; b++)
            if (l->pending[b])
                drv.cuEventSynchronize(l->ev[b]);
    memset(l->pending, 0, sizeof l->pending);
}

/* A piece whose CPU side is posted to the copy threads and not yet waited for. */
struct posted_piece {
    struct piece p;
    unsigned buf;
    uint64_t posted;             /* shim_ticks() at posting */
    struct cpupool_pending job;
};

/* Post piece p's CPU side between the program's memory and staging buffer b. */
static void piece_post(struct posted_piece *pp, const struct stage_req *req, struct lane *l,
                       const struct piece *p, unsigned b, unsigned flags, struct pipe_times *pt)
{
    pp->p = *p;
    pp->buf = b;
    pp->posted = shim_ticks();
    if (!pt->first_post)
        pt->first_post = pp->posted;
    char *buf = l->mem + (size_t)b * l->slot;
    if (req->dir == DIR_H2D)
        cpupool_copy_post(&pp->job, buf, p->ncols, piece_host(req, p), req->host_pitch, p->ncols,
                          p->nrows, flags);
    else
        cpupool_copy_post(&pp->job, piece_host(req, p), req->host_pitch, buf, p->ncols, p->ncols,
                          p->nrows, flags);
}

/* Wait for a posted piece's CPU side, and count its CPU time (see struct pipe_times). */
static void piece_wait(struct posted_piece *pp, struct pipe_times *pt)
{
    cpupool_wait(&pp->job);
    uint64_t now = shim_ticks();
    uint64_t from = pp->posted > pt->busy_until ? pp->posted : pt->busy_until;
    if (now > from)
        pt->cpu_ns += shim_ticks_to_ns(now - from);
    pt->busy_until = now;
    pt->pieces++;
}

/* H2D: piece i goes through slot i % nslot (the buffers themselves).  The next piece's CPU copy
 * is posted before the current one is waited for, so that the copy threads go on to it while
 * this thread issues the current piece's DMA; each DMA overlaps the CPU copies after it.
 * Returns once every byte of the source is in a buffer and its DMA issued: the source is the
 * program's again; the DMAs finish on the shim's stream (the caller orders the program's later
 * work after them). */
static int run_h2d(const struct stage_req *req, struct lane *l, CUstream s, size_t piece, CUresult *result,
                   struct pipe_times *pt)
{
    struct cursor c;
    struct piece p;
    cursor_init(&c, req->width, req->height, piece);
    CUresult r = CUDA_SUCCESS;
    unsigned seq = 0;            /* DMAs issued */
    unsigned flags = pool_flags(DIR_H2D);
    int flush = req->flush_host && cpupool_flushes();
    if (flush)
        flags |= CPUPOOL_FLUSH_SRC;
    struct posted_piece cur = { .job = { NULL } }, next = { .job = { NULL } };
    int have_cur = 0;
    for (;;) {
        int more = cursor_next(&c, &p);
        if (more) {
            unsigned b = (seq + (unsigned)have_cur) % l->nslot;
            if ((r = buffer_free(l, b, pt)) != CUDA_SUCCESS)
                goto fail;
            piece_post(&next, req, l, &p, b, flags, pt);
        }
        if (have_cur) {
            piece_wait(&cur, pt);
            if (flush)
                stats_add(STAT_STAGING_FLUSHED_BYTES, cur.p.ncols * cur.p.nrows);
            if ((r = piece_dma(req, &cur.p, l->mem + (size_t)cur.buf * l->slot, s)) != CUDA_SUCCESS)
                goto fail;
            seq++;
            if ((r = drv.cuEventRecord(l->ev[cur.buf], s)) != CUDA_SUCCESS)
                goto fail;
            l->pending[cur.buf] = 1;
        }
        if (!more)
            break;
        cur = next;
        next.job.slot = NULL;
        have_cur = 1;
    }
    *result = CUDA_SUCCESS;
    return RUN_DONE;
fail:
    /* No copy thread may still be writing a buffer (or reading the program's memory) once the
     * copy returns. */
    cpupool_wait(&cur.job);
    cpupool_wait(&next.job);
    lane_drain(l, s);
    if (seq == 0)
        return RUN_DECLINED;   /* nothing reached the device: the original call says it best */
    *result = r;
    return RUN_DONE;
}

/* A D2H copy's destination of at least PREFAULT_MIN contiguous bytes, never touched, is faulted
 * in by all the copy threads at once while the first DMAs run (cpupool_prefault).  Faulted in
 * piece by piece, after each piece's DMA, no fault overlaps a DMA, and the threads that split a
 * piece of a few MiB share its huge pages (one clears each while the others wait): staged
 * copies into a checkpoint's fresh CPU tensors ran at 12 GB/s that way.  Below two huge pages,
 * the pieces' own slices fault as well. */
#define PREFAULT_MIN (2 * SHIM_HUGE_PAGE)

static void prefault_destination(const struct stage_req *req)
{
    if (req->height != 1 && req->host_pitch != req->width)
        return;   /* rows with gaps: only the rows are the program's to write */
    size_t n = req->width * req->height;
    if (n >= PREFAULT_MIN)
        stats_add(STAT_STAGING_PREFAULTED_BYTES, cpupool_prefault(req->host, n));
}

/* D2H: DMAs run ahead into the buffers free of copying out; as each completes its piece's copy
 * out is posted to the copy threads before the previous piece's is waited for, so that the
 * threads go on to it while this thread issues the next DMA into the buffer just emptied.
 * Complete on return (the program may read its memory at once). */
static int run_d2h(const struct stage_req *req, struct lane *l, CUstream s, size_t piece, CUresult *result,
                   struct pipe_times *pt)
{
    struct cursor c;
    struct piece inflight[MAX_SLOTS];
    cursor_init(&c, req->width, req->height, piece);
    CUresult r = CUDA_SUCCESS;
    unsigned issued = 0, posted = 0, finished = 0;   /* DMAs; copies out posted, waited for */
    unsigned flags = pool_flags(DIR_D2H);
    struct posted_piece out = { .job = { NULL } };
    int have_out = 0;
    int more = 1;
    for (;;) {
        /* A buffer takes a DMA once its previous piece is copied out. */
        while (more && issued - finished < l->nslot) {
            unsigned b = issued % l->nslot;
            if ((r = buffer_free(l, b, pt)) != CUDA_SUCCESS)
                goto fail;
            if (!(more = cursor_next(&c, &inflight[b])))
                break;
            if ((r = piece_dma(req, &inflight[b], l->mem + (size_t)b * l->slot, s)) != CUDA_SUCCESS)
                goto fail;
            issued++;
            if ((r = drv.cuEventRecord(l->ev[b], s)) != CUDA_SUCCESS)
                goto fail;
            l->pending[b] = 1;
        }
        if (posted == issued) {
            if (!have_out)
                break;
            piece_wait(&out, pt);
            finished++;
            have_out = 0;
            continue;
        }
        if (posted == 0)
            prefault_destination(req);   /* once, with the first DMAs under way */
        unsigned b = posted % l->nslot;
        if ((r = buffer_free(l, b, pt)) != CUDA_SUCCESS)
            goto fail;
        struct posted_piece next;
        piece_post(&next, req, l, &inflight[b], b, flags, pt);
        posted++;
        if (have_out) {
            piece_wait(&out, pt);
            finished++;
        }
        out = next;
        have_out = 1;
    }
    *result = CUDA_SUCCESS;
    return RUN_DONE;
fail:
    cpupool_wait(&out.job);   /* no copy thread writes the program's memory after the return */
    /* The pieces whose DMAs ended before the failure land, in order up to the first that did
     * not, as the driver's own path leaves the chunks it copied before an error. */
    for (; posted < issued; posted++) {
        unsigned b = posted % l->nslot;
        if (!l->pending[b] || drv.cuEventSynchronize(l->ev[b]) != CUDA_SUCCESS)
            break;
        l->pending[b] = 0;
        piece_post(&out, req, l, &inflight[b], b, flags, pt);
        piece_wait(&out, pt);
    }
    lane_drain(l, s);
    if (issued == 0)
        return RUN_DECLINED;
    *result = r;
    return RUN_DONE;
}

/* Whether the copy is cut into more pieces than n (tapered pieces are more than even ones). */
static int more_pieces_than(const struct stage_req *req, size_t piece, unsigned n)
{
    struct cursor c;
    struct piece p;
    unsigned count = 0;
    cursor_init(&c, req->width, req->height, piece);
    while (cursor_next(&c, &p))
        if (++count > n)
            return 1;
    return 0;
}

/* The size of a copy's pieces: a quarter of it, within [1 MiB, the buffer size], so that a copy
 * of a few MiB still overlaps its CPU copies with its DMAs, and a large one keeps every buffer
 * full. */
static size_t piece_size(size_t total, size_t chunk)
{
    size_t lo = chunk < (1u << 20) ? chunk : (1u << 20);
    size_t q = page_up(total / 4);
    return q < lo ? lo : q > chunk ? chunk : q;
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
 * so the program gets its error code (contract rule 3). */
static int device_range_ok(CUdeviceptr dev, size_t extent)
{
    unsigned int type = 0;
    CUdeviceptr start = 0;
    size_t size = 0;
    if (drv.cuPointerGetAttributes) {
        /* One call for the three (unknown pointers read as zero). */
        CUpointer_attribute attrs[3] = { CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                         CU_POINTER_ATTRIBUTE_RANGE_SIZE };
        void *data[3] = { &type, &start, &size };
        if (drv.cuPointerGetAttributes(3, attrs, data, dev) != CUDA_SUCCESS)
            return 0;
    } else if (drv.cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, dev) != CUDA_SUCCESS ||
               drv.cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, dev) != CUDA_SUCCESS ||
               drv.cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, dev) != CUDA_SUCCESS) {
        return 0;
    }
    if (type != CU_MEMORYTYPE_DEVICE && type != CU_MEMORYTYPE_UNIFIED)
        return 0;
    return size && dev >= start && dev - start <= size && extent <= size - (dev - start);
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

/* The copy threads go where the current device's DMA engine is (decided before their start). */
static void prefer_local_cpus(void)
{
    static int asked;
    CUdevice dev;
    char bus_id[32];
    /* A load first: this runs for every staged copy, and a store would bounce the line between
     * the copying threads. */
    if (__atomic_load_n(&asked, __ATOMIC_RELAXED) || __atomic_exchange_n(&asked, 1, __ATOMIC_RELAXED) ||
        !drv.cuDeviceGetPCIBusId ||
        drv.cuCtxGetDevice(&dev) != CUDA_SUCCESS ||
        drv.cuDeviceGetPCIBusId(bus_id, (int)sizeof bus_id, dev) != CUDA_SUCCESS)
        return;
    cpupool_prefer_device(bus_id);
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
    prefer_local_cpus();
    if (streams_order_after(ss, req->stream, req->flavour) != 0) {
        stats_add(STAT_STAGING_FAILURES, 1);
        goto out;
    }
    size_t total = req->width * req->height;
    size_t piece = piece_size(total, l->chunk);
    lane_layout(l, req->dir, piece);
    /* Contiguous on both sides: one long row, cut in full pieces. */
    struct stage_req flat = *req;
    if (flat.height > 1 && flat.host_pitch == flat.width && flat.dev_pitch == flat.width) {
        flat.width *= flat.height;
        flat.height = 1;
    }
    /* A copy in more pieces than the lane has buffers cannot be read whole at the call: later
     * pieces are read once the DMA of earlier ones is done, which the stream orders after the
     * work queued before the copy.  Such work (a host function, say) may rewrite the source,
     * and the device must get either all the bytes of the call or all the rewritten ones, never
     * a mix: so it is waited for before the first byte is read. */
    uint64_t order_wait = 0;
    if (flat.dir == DIR_H2D && more_pieces_than(&flat, piece, l->nslot) &&
        drv.cuEventQuery(ss->order_event) == CUDA_ERROR_NOT_READY) {
        uint64_t w0 = shim_now_ns();
        drv.cuEventSynchronize(ss->order_event);
        order_wait = shim_now_ns() - w0;
        stats_add(STAT_ORDERING_WAIT_NS, order_wait);
    }
    nvtx_push("pinshim staged copy");
    struct pipe_times pt = { .start = shim_ticks() };
    int run = flat.dir == DIR_H2D ? run_h2d(&flat, l, ss->stream, piece, result, &pt)
                                  : run_d2h(&flat, l, ss->stream, piece, result, &pt);
    nvtx_pop();
    stats_add(STAT_STAGING_CPU_NS, pt.cpu_ns);
    stats_add(STAT_STAGING_WAIT_NS, pt.wait_ns);
    stats_add(STAT_STAGING_PIECES, pt.pieces);
    if (run == RUN_DECLINED) {
        stats_add(STAT_STAGING_FAILURES, 1);
        goto out;
    }
    /* H2D: the last DMAs are still running.  The program's later work on its stream (for the
     * legacy stream: in every blocking stream too) is ordered after them, as it would be after
     * the original call's own DMA; where that cannot be arranged, they are waited for. */
    if (flat.dir == DIR_H2D && *result == CUDA_SUCCESS &&
        streams_program_waits(ss, req->stream, req->flavour) != 0)
        *result = drv.cuStreamSynchronize(ss->stream);
    staged = 1;
    if (trace_on())
        trace_event(shim_now_ns() - t0, "staged",
                    "dir=%s bytes=%zu pieces=%u first_us=%llu cpu_us=%llu dma_wait_us=%llu order_wait_us=%llu",
                    flat.dir == DIR_H2D ? "h2d" : "d2h", total, pt.pieces,
                    (unsigned long long)(pt.first_post > pt.start ? shim_ticks_to_ns(pt.first_post - pt.start) / 1000 : 0),
                    (unsigned long long)(pt.cpu_ns / 1000), (unsigned long long)(pt.wait_ns / 1000),
                    (unsigned long long)(order_wait / 1000));
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
    if (!shim_forked_child) {
        pthread_mutex_lock(&lanes_mu);
        int running = builder_running;
        builder_running = 0;
        pthread_mutex_unlock(&lanes_mu);
        if (running)
            pthread_join(builder, NULL);   /* a build in progress ends before the driver does */
    } else {
        builder_running = 0;
    }
    cpupool_shutdown();   /* after the builder, which starts the copy threads */
    if (shim_forked_child) {
        /* The child must not touch the driver: forget the lanes (their lock may have been held
         * by a thread that is gone) and give the buffers' pages back. */
        pthread_mutex_init(&lanes_mu, NULL);
        for (int i = 0; i < MAX_LANES; i++) {
            if (lanes[i].state == LANE_READY)
                os_unmap(lanes[i].mem, lanes[i].len);
            memset(&lanes[i], 0, sizeof lanes[i]);
        }
    }
    /* Lanes stay at exit: the process's end releases them, and unregistering then could race
     * the driver's own teardown. */
}
