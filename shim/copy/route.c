/* One router for every copy.
 *
 * Each entry point's handler describes its call once (struct copy_desc: direction, the host
 * side's extent, the shape staging would see, how to make the same copy asynchronously on the
 * shim's stream) and hands it to route(), which decides, for every shape alike:
 *   observe / capture:             the original call, counted (contract rule 6)
 *   pinned or promoted host side:  sync, legacy stream, large, threads copying at once: async
 *                                  on the thread's own stream, ordered after what the original
 *                                  waited for (rule 2), then waited for; async from promoted
 *                                  memory: the original, then wait until it is done, because for
 *                                  the program that memory is still pageable (rule 1)
 *   pageable, large, stageable:    the staging pipeline
 *   otherwise:                     the original call
 * and every path ends in the statistics.  The doors (hook/doors.c) enter the shim's guard
 * around the handlers: nothing here takes or leaves it. */
#define _GNU_SOURCE
#include <cudaTypedefs.h>
#include <string.h>
#include "base/config.h"
#include "base/real.h"
#include "base/shim.h"
#include "copy/cpupool.h"
#include "copy/handlers.h"
#include "copy/staging.h"
#include "copy/streams.h"
#include "mem/registry.h"
#include "stats/stats.h"

/* ---- the descriptor ---- */

struct copy_desc {
    enum hook_id id;
    enum hook_flavour flavour;
    int is_async;
    CUstream stream;               /* as the program named it */
    enum copy_dir dir;
    size_t bytes;                  /* what the copy moves */
    uintptr_t host;                /* the host side's first byte ... */
    size_t host_extent;            /* ... and the span holding every byte it touches */
    int stageable;                 /* staging can move this shape (stage is filled in) */
    struct stage_req stage;
    int peer;                      /* a peer copy (counted as such) */
    /* The call as the program made it, and (NULL when never rewritten) the same copy made
     * asynchronously on stream s. */
    CUresult (*original)(const struct copy_desc *d);
    CUresult (*on_stream)(const struct copy_desc *d, CUstream s);
    /* the call's own arguments */
    CUdeviceptr dst, src;
    const void *params;
};

/* Is p host memory?  The shim's own knowledge first, then the driver (unified addressing). */
static int is_host_pointer(CUdeviceptr p)
{
    if (registry_known_host((uintptr_t)p))
        return 1;
    CUmemorytype type;
    if (!drv.cuPointerGetAttribute ||
        drv.cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p) != CUDA_SUCCESS)
        return 1; /* unknown to the driver: pageable host memory */
    return type == CU_MEMORYTYPE_HOST;
}

static enum copy_dir direction(int dst_host, int src_host)
{
    if (src_host)
        return dst_host ? DIR_H2H : DIR_H2D;
    return dst_host ? DIR_D2H : DIR_D2D;
}

static int memtype_is_host(CUmemorytype t, CUdeviceptr unified)
{
    return t == CU_MEMORYTYPE_HOST || (t == CU_MEMORYTYPE_UNIFIED && is_host_pointer(unified));
}

/* ---- statistics ---- */

/* The start of a copy of `bytes` for its statistics: shim_ticks(), or 0 when this copy is not
 * timed (stats.h: small copies are timed one in STATS_TIME_EVERY). */
static inline uint64_t copy_clock_start(size_t bytes)
{
    static __thread unsigned untimed_tick;
    if (bytes >= STATS_TIME_ALL_MIN || untimed_tick++ % STATS_TIME_EVERY == 0)
        return shim_ticks();
    return 0;
}

/* t0: copy_clock_start() when the copy began. */
static void record(const struct copy_desc *d, enum mem_kind kind, uint64_t t0, const char *why)
{
    struct copy_record r = {
        .dir = d->dir,
        .kind = kind,
        .bytes = d->bytes,
        .ns = t0 ? shim_ns_since(t0) : 0,
        .timed = t0 != 0,
        .is_async = d->is_async,
        .host_blocked = !d->is_async || kind == MEM_PAGEABLE || kind == MEM_STAGED ||
                        (kind == MEM_PROMOTED && !shim_cfg.trust_async),
        .why = why,
    };
    if (d->peer)
        stats_add(STAT_PEER_COPIES, 1);
    stats_record_copy(&r);
    stats_record_site(&r);
}

/* ---- the shim's own rewrites ---- */

/* Wait until the copy just issued on the program's stream has finished. */
static void wait_program_copy(CUstream stream, enum hook_flavour flavour)
{
    struct shim_stream *ss = streams_current();
    if (ss && streams_wait_copy(ss, stream, flavour) == 0)
        return;
    /* No event of the right context: wait for the whole stream instead. */
    if (flavour == PTDS && (stream == 0 || stream == CU_STREAM_PER_THREAD))
        stream = CU_STREAM_PER_THREAD;
    drv.cuStreamSynchronize(stream);
}

/* An async copy the program made from or into promoted memory has been issued: for the program
 * that memory is pageable, so wait until the copy is done (rule 1), unless the user chose to
 * trust the program; then the block is marked as having DMA that may be in flight. */
static void keep_pageable_semantics(struct copy_hold *held, CUstream stream, enum hook_flavour flavour)
{
    if (shim_cfg.trust_async) {
        registry_copy_end(held, 1);
        return;
    }
    wait_program_copy(stream, flavour);
    stats_add(STAT_REWRITE_ASYNC_WAITED, 1);
}

/* Moving a legacy sync copy to the thread's own stream pays only when other threads copy at
 * the same time (their copies then stop serializing on the legacy stream); alone it costs a few
 * microseconds per copy (on the H200, 1 MiB pinned copies lost 14%).  So it happens while large
 * sync copies of several threads overlap, and for a while after the last overlap. */
#define OVERLAP_MEMORY_NS 200000000ull
static int sync_copies_in_flight;
static uint64_t last_overlap_ns;

/* Enter a large sync copy with pinned host memory; 1 when it should be rewritten. */
static int sync_copy_begin(uint64_t now)
{
    int others = __atomic_fetch_add(&sync_copies_in_flight, 1, __ATOMIC_ACQ_REL);
    if (others > 0)
        __atomic_store_n(&last_overlap_ns, now, __ATOMIC_RELAXED);
    uint64_t last = __atomic_load_n(&last_overlap_ns, __ATOMIC_RELAXED);
    return shim_cfg.rewrite_always || others > 0 || (last && now - last < OVERLAP_MEMORY_NS);
}

static void sync_copy_end(void)
{
    __atomic_sub_fetch(&sync_copies_in_flight, 1, __ATOMIC_ACQ_REL);
}

/* A sync copy with pinned host memory, moved to the thread's own stream (rule 2).  Returns 0
 * and sets *r when done; -1 when a shim-only step failed first (the caller runs the original,
 * which reports the error the program expects). */
static int rewrite_sync(const struct copy_desc *d, CUresult *r)
{
    struct shim_stream *ss = streams_current();
    if (!ss || streams_order_after(ss, 0, LEGACY) != 0)
        return -1;
    if (d->on_stream(d, ss->stream) != CUDA_SUCCESS)
        return -1;
    if (drv.cuEventQuery(ss->order_event) == CUDA_ERROR_NOT_READY) {
        uint64_t t0 = shim_now_ns();
        drv.cuEventSynchronize(ss->order_event);
        stats_add(STAT_ORDERING_WAIT_NS, shim_now_ns() - t0);
    }
    *r = drv.cuStreamSynchronize(ss->stream);
    stats_add(STAT_REWRITE_SYNC_TO_ASYNC, 1);
    return 0;
}

/* ---- the router ---- */

/* The most bytes of a block registered on a copy's path whose lines an H2D copy flushes first:
 * blocks whose lines can all be in the caches, and whose flush costs little beside the copies
 * that follow. */
#define FRESH_FLUSH_MAX (8u << 20)

/* A block registered by this very copy may still have lines in the CPU caches: the program
 * just wrote it, or the copy threads read it while it was staged.  The copy engine reads such
 * lines slower than memory (cpupool.h): an H2D copy pushes them out first.  Without this, a
 * 1-4 MiB buffer written once and copied again and again ran at 55-80% of pinned speed once
 * registered on the copy's path; registered in the background, its last staged copies had
 * flushed it (staged_req). */
static void flush_fresh(const struct copy_desc *d, const struct copy_hold *held)
{
    if (d->dir != DIR_H2D || !held->fresh_len || held->fresh_len > FRESH_FLUSH_MAX || !cpupool_flushes())
        return;
    cpupool_flush((const void *)held->fresh_base, held->fresh_len);
    stats_add(STAT_PROMOTION_FLUSHED_BYTES, held->fresh_len);
}

/* The staging request for d.  A copy staged while its block is queued for registration or being
 * registered (held->unsettled) is among the last that read the block through the CPU: from an
 * H2D one the copy threads push the lines they read out of their caches, so that the copy
 * engine, reading the block once registered, finds them in memory (cpupool.h). */
static const struct stage_req *staged_req(const struct copy_desc *d, const struct copy_hold *held,
                                          struct stage_req *buf)
{
    if (!held->unsettled || d->dir != DIR_H2D)
        return &d->stage;
    *buf = d->stage;
    buf->flush_host = 1;
    return buf;
}

static CUresult route(const struct copy_desc *d)
{
    uint64_t t0 = copy_clock_start(d->bytes);
    if (d->dir == DIR_D2D || d->dir == DIR_H2H || !d->host_extent) {
        CUresult r = d->original(d);
        record(d, d->dir == DIR_D2D ? MEM_DEVICE : MEM_PAGEABLE, t0,
               d->dir == DIR_D2D ? "device_only" : d->dir == DIR_H2H ? "host_only" : "no_host_side");
        return r;
    }
    registry_copy_activity(1, d->bytes);
    int capturing = capture_active();
    int acting = shim_cfg.mode >= MODE_PIN && !capturing;
    struct copy_hold held = { NULL };
    struct stage_req stage;
    int could_stage = acting && d->stageable && staging_available(d->bytes);
    int stageable = could_stage && staging_ready(0);
    /* Every size is classified: a small copy inside a promoted block must still keep pageable
     * semantics; the cost model does not promote for small copies (their saving is tiny). */
    unsigned flags = (acting ? COPY_MAY_PROMOTE : 0) | (capturing ? COPY_CAPTURING : 0) |
                     (stageable ? COPY_STAGEABLE : 0);
    enum mem_kind kind = registry_copy_begin(d->host, d->host_extent, d->dir, flags, &held);
    CUresult r;
    if (!acting) {
        if (capturing)
            stats_add(STAT_CAPTURE_PASSTHROUGH, 1);
        r = d->original(d);
    } else if (kind == MEM_PINNED || kind == MEM_PROMOTED) {
        flush_fresh(d, &held);
        int candidate = !d->is_async && d->on_stream && shim_cfg.mode == MODE_FULL &&
                        d->flavour == LEGACY && d->bytes >= shim_cfg.rewrite_min;
        int concurrent = candidate && sync_copy_begin(shim_now_ns());
        if (!(concurrent && rewrite_sync(d, &r) == 0)) {
            r = d->original(d);
            if (d->is_async && kind == MEM_PROMOTED && r == CUDA_SUCCESS)
                keep_pageable_semantics(&held, d->stream, d->flavour);
        }
        if (candidate)
            sync_copy_end();
    } else if (stageable && staging_copy(staged_req(d, &held, &stage), &r)) {
        kind = MEM_STAGED;
    } else if (could_stage && !stageable && kind == MEM_PAGEABLE && staging_ready(1) &&
               staging_copy(&d->stage, &r)) {
        /* Judged while the staging buffers were still being built, and left to the driver's
         * pageable path: staged once they are there (staging.c says why it waits for them). */
        kind = MEM_STAGED;
    } else {
        if (held.unsettled) {
            /* Staging declined while the block is being registered: the driver's own path
             * needs its registration settled either way first. */
            registry_copy_end(&held, 0);
            kind = registry_copy_begin(d->host, d->host_extent, d->dir, flags & ~COPY_STAGEABLE, &held);
        }
        r = d->original(d);
        if (d->is_async && kind == MEM_PROMOTED && r == CUDA_SUCCESS)
            keep_pageable_semantics(&held, d->stream, d->flavour);
    }
    registry_copy_end(&held, 0);
    registry_copy_activity(0, d->bytes);
    record(d, kind, t0, acting ? held.why : capturing ? "capturing" : "observe_mode");
    return r;
}

/* ---- one-dimensional copies ---- */

static CUresult original_htod(const struct copy_desc *d)
{
    if (d->is_async)
        return ((PFN_cuMemcpyHtoDAsync_v3020)real_hook[d->id])(d->dst, (const void *)d->src, d->bytes, d->stream);
    return ((PFN_cuMemcpyHtoD_v3020)real_hook[d->id])(d->dst, (const void *)d->src, d->bytes);
}

static CUresult original_dtoh(const struct copy_desc *d)
{
    if (d->is_async)
        return ((PFN_cuMemcpyDtoHAsync_v3020)real_hook[d->id])((void *)d->dst, d->src, d->bytes, d->stream);
    return ((PFN_cuMemcpyDtoH_v3020)real_hook[d->id])((void *)d->dst, d->src, d->bytes);
}

static CUresult original_memcpy(const struct copy_desc *d)
{
    if (d->is_async)
        return ((PFN_cuMemcpyAsync_v4000)real_hook[d->id])(d->dst, d->src, d->bytes, d->stream);
    return ((PFN_cuMemcpy_v4000)real_hook[d->id])(d->dst, d->src, d->bytes);
}

static CUresult original_dtod(const struct copy_desc *d)
{
    if (d->is_async)
        return ((PFN_cuMemcpyDtoDAsync_v3020)real_hook[d->id])(d->dst, d->src, d->bytes, d->stream);
    return ((PFN_cuMemcpyDtoD_v3020)real_hook[d->id])(d->dst, d->src, d->bytes);
}

/* The same 1D copy, async on the shim's stream, by direction. */
static CUresult on_stream_1d(const struct copy_desc *d, CUstream s)
{
    if (d->original == original_memcpy)
        return ((PFN_cuMemcpyAsync_v4000)real_hook[HOOK_cuMemcpyAsync])(d->dst, d->src, d->bytes, s);
    if (d->dir == DIR_H2D)
        return ((PFN_cuMemcpyHtoDAsync_v3020)real_hook[HOOK_cuMemcpyHtoDAsync_v2])(
            d->dst, (const void *)d->src, d->bytes, s);
    return ((PFN_cuMemcpyDtoHAsync_v3020)real_hook[HOOK_cuMemcpyDtoHAsync_v2])(
        (void *)d->dst, d->src, d->bytes, s);
}

static CUresult route_1d(enum hook_id id, enum copy_dir dir, CUresult (*original)(const struct copy_desc *),
                         CUdeviceptr dst, CUdeviceptr src, size_t n, int is_async, CUstream s)
{
    struct copy_desc d = {
        .id = id, .flavour = hook_table[id].flavour, .is_async = is_async, .stream = s,
        .dir = dir, .bytes = n, .original = original, .on_stream = on_stream_1d,
        .dst = dst, .src = src,
    };
    if (dir == DIR_H2D || dir == DIR_D2H) {
        d.host = dir == DIR_H2D ? (uintptr_t)src : (uintptr_t)dst;
        d.host_extent = n;
        d.stageable = 1;
        d.stage = (struct stage_req){
            .dir = dir, .host = (void *)d.host, .host_pitch = n,
            .dev = dir == DIR_H2D ? dst : src, .dev_pitch = n,
            .width = n, .height = 1, .stream = is_async ? s : 0, .flavour = d.flavour,
        };
    }
    return route(&d);
}

CUresult on_htod(enum hook_id id, CUdeviceptr dst, const void *src, size_t n)
{
    return route_1d(id, DIR_H2D, original_htod, dst, (CUdeviceptr)src, n, 0, 0);
}

CUresult on_dtoh(enum hook_id id, void *dst, CUdeviceptr src, size_t n)
{
    return route_1d(id, DIR_D2H, original_dtoh, (CUdeviceptr)dst, src, n, 0, 0);
}

CUresult on_htod_async(enum hook_id id, CUdeviceptr dst, const void *src, size_t n, CUstream s)
{
    return route_1d(id, DIR_H2D, original_htod, dst, (CUdeviceptr)src, n, 1, s);
}

CUresult on_dtoh_async(enum hook_id id, void *dst, CUdeviceptr src, size_t n, CUstream s)
{
    return route_1d(id, DIR_D2H, original_dtoh, (CUdeviceptr)dst, src, n, 1, s);
}

CUresult on_memcpy(enum hook_id id, CUdeviceptr dst, CUdeviceptr src, size_t n)
{
    return route_1d(id, direction(is_host_pointer(dst), is_host_pointer(src)), original_memcpy, dst, src, n, 0, 0);
}

CUresult on_memcpy_async(enum hook_id id, CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)
{
    return route_1d(id, direction(is_host_pointer(dst), is_host_pointer(src)), original_memcpy, dst, src, n, 1, s);
}

CUresult on_dtod(enum hook_id id, CUdeviceptr dst, CUdeviceptr src, size_t n)
{
    return route_1d(id, DIR_D2D, original_dtod, dst, src, n, 0, 0);
}

CUresult on_dtod_async(enum hook_id id, CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)
{
    return route_1d(id, DIR_D2D, original_dtod, dst, src, n, 1, s);
}

/* ---- peer copies: counted, passed through ---- */

static CUresult original_peer(const struct copy_desc *d)
{
    const CUcontext *ctx = d->params;
    if (d->is_async)
        return ((PFN_cuMemcpyPeerAsync_v4000)real_hook[d->id])(d->dst, ctx[0], d->src, ctx[1], d->bytes, d->stream);
    return ((PFN_cuMemcpyPeer_v4000)real_hook[d->id])(d->dst, ctx[0], d->src, ctx[1], d->bytes);
}

static CUresult route_peer(enum hook_id id, CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src,
                           CUcontext src_ctx, size_t n, int is_async, CUstream s)
{
    CUcontext ctx[2] = { dst_ctx, src_ctx };
    struct copy_desc d = {
        .id = id, .flavour = hook_table[id].flavour, .is_async = is_async, .stream = s,
        .dir = DIR_D2D, .bytes = n, .peer = 1, .original = original_peer,
        .dst = dst, .src = src, .params = ctx,
    };
    return route(&d);
}

CUresult on_peer(enum hook_id id, CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src,
                 CUcontext src_ctx, size_t n)
{
    return route_peer(id, dst, dst_ctx, src, src_ctx, n, 0, 0);
}

CUresult on_peer_async(enum hook_id id, CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src,
                       CUcontext src_ctx, size_t n, CUstream s)
{
    return route_peer(id, dst, dst_ctx, src, src_ctx, n, 1, s);
}

/* ---- 2D and 3D copies ---- */

static CUresult original_2d(const struct copy_desc *d)
{
    if (d->is_async)
        return ((PFN_cuMemcpy2DAsync_v3020)real_hook[d->id])(d->params, d->stream);
    return ((PFN_cuMemcpy2D_v3020)real_hook[d->id])(d->params);
}

static CUresult on_stream_2d(const struct copy_desc *d, CUstream s)
{
    return ((PFN_cuMemcpy2DAsync_v3020)real_hook[HOOK_cuMemcpy2DAsync_v2])(d->params, s);
}

static CUresult original_3d(const struct copy_desc *d)
{
    if (d->is_async)
        return ((PFN_cuMemcpy3DAsync_v3020)real_hook[d->id])(d->params, d->stream);
    return ((PFN_cuMemcpy3D_v3020)real_hook[d->id])(d->params);
}

static CUresult original_3dpeer(const struct copy_desc *d)
{
    if (d->is_async)
        return ((PFN_cuMemcpy3DPeerAsync_v4000)real_hook[d->id])(d->params, d->stream);
    return ((PFN_cuMemcpy3DPeer_v4000)real_hook[d->id])(d->params);
}

/* The host side of a copy of `rows` rows of `width` bytes, `depth` slices of `slice_rows` rows,
 * starting at (x, y, z) of a host buffer with rows `pitch` apart. */
static void host_side(struct copy_desc *d, const void *host, size_t pitch, size_t slice_rows,
                      size_t x, size_t y, size_t z, size_t width, size_t rows, size_t depth)
{
    d->host = (uintptr_t)host + (z * slice_rows + y) * pitch + x;
    d->host_extent = depth && rows ? ((depth - 1) * slice_rows + (rows - 1)) * pitch + width : 0;
}

static CUresult route_2d(enum hook_id id, const CUDA_MEMCPY2D *p, CUstream s, int is_async)
{
    struct copy_desc d = {
        .id = id, .flavour = hook_table[id].flavour, .is_async = is_async, .stream = s,
        .bytes = p->WidthInBytes * p->Height, .original = original_2d, .on_stream = on_stream_2d,
        .params = p,
    };
    d.dir = direction(memtype_is_host(p->dstMemoryType, p->dstDevice),
                      memtype_is_host(p->srcMemoryType, p->srcDevice));
    if (d.dir != DIR_H2D && d.dir != DIR_D2H)
        return route(&d);
    int host_is_src = d.dir == DIR_H2D;
    CUmemorytype host_type = host_is_src ? p->srcMemoryType : p->dstMemoryType;
    const void *host = host_is_src ? (host_type == CU_MEMORYTYPE_HOST ? p->srcHost : (const void *)p->srcDevice)
                                   : (host_type == CU_MEMORYTYPE_HOST ? p->dstHost : (const void *)p->dstDevice);
    if (host_is_src)
        host_side(&d, host, p->srcPitch, 0, p->srcXInBytes, p->srcY, 0, p->WidthInBytes, p->Height, 1);
    else
        host_side(&d, host, p->dstPitch, 0, p->dstXInBytes, p->dstY, 0, p->WidthInBytes, p->Height, 1);
    /* Staging moves host rows to and from linear device memory, not CUDA arrays. */
    d.stageable = (host_is_src ? p->dstMemoryType : p->srcMemoryType) != CU_MEMORYTYPE_ARRAY;
    d.stage = (struct stage_req){
        .dir = d.dir,
        .host = (void *)d.host,
        .host_pitch = host_is_src ? p->srcPitch : p->dstPitch,
        .dev = host_is_src ? p->dstDevice + p->dstY * p->dstPitch + p->dstXInBytes
                           : p->srcDevice + p->srcY * p->srcPitch + p->srcXInBytes,
        .dev_pitch = host_is_src ? p->dstPitch : p->srcPitch,
        .width = p->WidthInBytes,
        .height = p->Height,
        .stream = is_async ? s : 0,
        .flavour = d.flavour,
    };
    return route(&d);
}

CUresult on_2d(enum hook_id id, const CUDA_MEMCPY2D *p)
{
    if (!p)
        return ((PFN_cuMemcpy2D_v3020)real_hook[id])(p);
    return route_2d(id, p, 0, 0);
}

CUresult on_2d_async(enum hook_id id, const CUDA_MEMCPY2D *p, CUstream s)
{
    if (!p)
        return ((PFN_cuMemcpy2DAsync_v3020)real_hook[id])(p, s);
    return route_2d(id, p, s, 1);
}

/* 3D copies: promotion and pageable semantics as for the others; neither staged nor rewritten
 * (no on_stream, not stageable). */
static CUresult route_3d(enum hook_id id, const CUDA_MEMCPY3D *p, CUstream s, int is_async)
{
    struct copy_desc d = {
        .id = id, .flavour = hook_table[id].flavour, .is_async = is_async, .stream = s,
        .bytes = p->WidthInBytes * p->Height * p->Depth, .original = original_3d, .params = p,
    };
    d.dir = direction(memtype_is_host(p->dstMemoryType, p->dstDevice),
                      memtype_is_host(p->srcMemoryType, p->srcDevice));
    if (d.dir == DIR_H2D)
        host_side(&d, p->srcMemoryType == CU_MEMORYTYPE_HOST ? p->srcHost : (const void *)p->srcDevice,
                  p->srcPitch, p->srcHeight, p->srcXInBytes, p->srcY, p->srcZ, p->WidthInBytes,
                  p->Height, p->Depth);
    else if (d.dir == DIR_D2H)
        host_side(&d, p->dstMemoryType == CU_MEMORYTYPE_HOST ? p->dstHost : (const void *)p->dstDevice,
                  p->dstPitch, p->dstHeight, p->dstXInBytes, p->dstY, p->dstZ, p->WidthInBytes,
                  p->Height, p->Depth);
    return route(&d);
}

CUresult on_3d(enum hook_id id, const CUDA_MEMCPY3D *p)
{
    if (!p)
        return ((PFN_cuMemcpy3D_v3020)real_hook[id])(p);
    return route_3d(id, p, 0, 0);
}

CUresult on_3d_async(enum hook_id id, const CUDA_MEMCPY3D *p, CUstream s)
{
    if (!p)
        return ((PFN_cuMemcpy3DAsync_v3020)real_hook[id])(p, s);
    return route_3d(id, p, s, 1);
}

/* 3D peer copies: counted by direction, passed through (no host extent: never classified). */
static CUresult route_3dpeer(enum hook_id id, const CUDA_MEMCPY3D_PEER *p, CUstream s, int is_async)
{
    struct copy_desc d = {
        .id = id, .flavour = hook_table[id].flavour, .is_async = is_async, .stream = s,
        .bytes = p->WidthInBytes * p->Height * p->Depth, .peer = 1, .original = original_3dpeer,
        .params = p,
    };
    d.dir = direction(memtype_is_host(p->dstMemoryType, p->dstDevice),
                      memtype_is_host(p->srcMemoryType, p->srcDevice));
    return route(&d);
}

CUresult on_3dpeer(enum hook_id id, const CUDA_MEMCPY3D_PEER *p)
{
    if (!p)
        return ((PFN_cuMemcpy3DPeer_v4000)real_hook[id])(p);
    return route_3dpeer(id, p, 0, 0);
}

CUresult on_3dpeer_async(enum hook_id id, const CUDA_MEMCPY3D_PEER *p, CUstream s)
{
    if (!p)
        return ((PFN_cuMemcpy3DPeerAsync_v4000)real_hook[id])(p, s);
    return route_3dpeer(id, p, s, 1);
}

/* ---- batches: counted, passed through ---- */

/* After a batch that touched promoted memory, wait for it: for the program that memory is
 * pageable (rule 1).  Nothing to do during a capture (the batch was only recorded). */
static CUresult finish_batch(enum hook_id id, CUresult r, int promoted, size_t count, CUstream s)
{
    struct copy_hold none = { NULL };
    if (promoted && r == CUDA_SUCCESS && !capture_active())
        keep_pageable_semantics(&none, s, hook_table[id].flavour);
    stats_add(STAT_BATCH_COPIES, count);
    return r;
}

static int batch_touches_promoted(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t count)
{
    if (!dsts || !srcs)
        return 0;
    for (size_t i = 0; i < count; i++)
        if (registry_promoted_at((uintptr_t)dsts[i]) || registry_promoted_at((uintptr_t)srcs[i]))
            return 1;
    return 0;
}

static int batch3d_touches_promoted(const CUDA_MEMCPY3D_BATCH_OP *ops, size_t n)
{
    if (!ops)
        return 0;
    for (size_t i = 0; i < n; i++)
        if ((ops[i].src.type == CU_MEMCPY_OPERAND_TYPE_POINTER && registry_promoted_at((uintptr_t)ops[i].src.op.ptr.ptr)) ||
            (ops[i].dst.type == CU_MEMCPY_OPERAND_TYPE_POINTER && registry_promoted_at((uintptr_t)ops[i].dst.op.ptr.ptr)))
            return 1;
    return 0;
}

CUresult on_batch_v1(enum hook_id id, CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
                     CUmemcpyAttributes *attrs, size_t *attr_idxs, size_t num_attrs, size_t *fail_idx,
                     CUstream s)
{
    int promoted = batch_touches_promoted(dsts, srcs, count);
    CUresult r = ((PFN_cuMemcpyBatchAsync_v12080)real_hook[id])(dsts, srcs, sizes, count, attrs, attr_idxs,
                                                                num_attrs, fail_idx, s);
    return finish_batch(id, r, promoted, count, s);
}

CUresult on_batch_v2(enum hook_id id, CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
                     CUmemcpyAttributes *attrs, size_t *attr_idxs, size_t num_attrs, CUstream s)
{
    int promoted = batch_touches_promoted(dsts, srcs, count);
    CUresult r = ((PFN_cuMemcpyBatchAsync_v13000)real_hook[id])(dsts, srcs, sizes, count, attrs, attr_idxs,
                                                                num_attrs, s);
    return finish_batch(id, r, promoted, count, s);
}

CUresult on_batch3d_v1(enum hook_id id, size_t num_ops, CUDA_MEMCPY3D_BATCH_OP *ops, size_t *fail_idx,
                       unsigned long long flags, CUstream s)
{
    int promoted = batch3d_touches_promoted(ops, num_ops);
    CUresult r = ((PFN_cuMemcpy3DBatchAsync_v12080)real_hook[id])(num_ops, ops, fail_idx, flags, s);
    return finish_batch(id, r, promoted, num_ops, s);
}

CUresult on_batch3d_v2(enum hook_id id, size_t num_ops, CUDA_MEMCPY3D_BATCH_OP *ops,
                       unsigned long long flags, CUstream s)
{
    int promoted = batch3d_touches_promoted(ops, num_ops);
    CUresult r = ((PFN_cuMemcpy3DBatchAsync_v13000)real_hook[id])(num_ops, ops, flags, s);
    return finish_batch(id, r, promoted, num_ops, s);
}
