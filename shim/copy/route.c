/* Classify and route one copy.
 *
 *   classify: which memory is the host side?  program-pinned range, promoted block, tracked
 *             pageable block (which the policy may promote now), or untracked pageable memory
 *   route:    observe / capture / small: the original call
 *             pinned or promoted, synchronous, legacy stream, large: async on the thread's own
 *                 stream, ordered after what the original waited for, then waited for
 *             promoted, asynchronous: the original call, then wait until it finished, because
 *                 for the program the memory is still pageable (semantics rule 1)
 *             pageable, large: the staging pipeline
 *   every path ends in stats. */
#define _GNU_SOURCE
#include <cudaTypedefs.h>
#include <string.h>
#include "base/config.h"
#include "copy/handlers.h"
#include "base/log.h"
#include "mem/registry.h"
#include "base/real.h"
#include "base/shim.h"
#include "copy/staging.h"
#include "stats/stats.h"
#include "copy/streams.h"

int copy_engaged(void)
{
    return shim_cfg.mode != MODE_OFF && !shim_busy && !shim_forked_child;
}

/* ---- classify ---------------------------------------------------------------------------- */

/* Classify the host range [p, p+n) of a copy in direction dir.  A promoted block comes back
 * held: eviction leaves it alone until copy_release(). */
static enum mem_kind classify_host(uintptr_t p, size_t n, enum copy_dir dir, int may_promote,
                                   int capturing, struct copy_hold *held)
{
    unsigned flags = (may_promote ? COPY_MAY_PROMOTE : 0) | (capturing ? COPY_CAPTURING : 0);
    return registry_copy_begin(p, n, dir, flags, held);
}

static void copy_release(struct copy_hold *held, int async_pending)
{
    registry_copy_end(held, async_pending);
}

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

static enum copy_dir memtype_dir(CUmemorytype dst, const void *dst_host, CUdeviceptr dst_dev,
                                 CUmemorytype src, const void *src_host, CUdeviceptr src_dev)
{
    int dst_is_host = dst == CU_MEMORYTYPE_HOST ||
                      (dst == CU_MEMORYTYPE_UNIFIED && is_host_pointer(dst_dev));
    int src_is_host = src == CU_MEMORYTYPE_HOST ||
                      (src == CU_MEMORYTYPE_UNIFIED && is_host_pointer(src_dev));
    (void)dst_host;
    (void)src_host;
    return direction(dst_is_host, src_is_host);
}

/* ---- stats ------------------------------------------------------------------------------- */

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
static void record(enum copy_dir dir, enum mem_kind kind, size_t bytes, uint64_t t0, int is_async)
{
    struct copy_record r = {
        .dir = dir,
        .kind = kind,
        .bytes = bytes,
        .ns = t0 ? shim_ns_since(t0) : 0,
        .timed = t0 != 0,
        .is_async = is_async,
        .host_blocked = !is_async || kind == MEM_PAGEABLE || kind == MEM_STAGED ||
                        (kind == MEM_PROMOTED && !shim_cfg.trust_async),
    };
    stats_record_copy(&r);
    stats_record_site(&r);
}

/* ---- one-dimensional copies ------------------------------------------------------------ */

enum op1d { OP_HTOD, OP_DTOH, OP_MEMCPY, OP_HTOD_ASYNC, OP_DTOH_ASYNC, OP_MEMCPY_ASYNC };

struct call1d {
    enum hook_id id;
    enum op1d op;
    CUdeviceptr dst, src;
    size_t n;
    CUstream stream;
};

static CUresult call_original(const struct call1d *c)
{
    void *f = real_hook[c->id];
    switch (c->op) {
    case OP_HTOD:
        return ((PFN_cuMemcpyHtoD_v3020)f)(c->dst, (const void *)c->src, c->n);
    case OP_DTOH:
        return ((PFN_cuMemcpyDtoH_v3020)f)((void *)c->dst, c->src, c->n);
    case OP_MEMCPY:
        return ((PFN_cuMemcpy_v4000)f)(c->dst, c->src, c->n);
    case OP_HTOD_ASYNC:
        return ((PFN_cuMemcpyHtoDAsync_v3020)f)(c->dst, (const void *)c->src, c->n, c->stream);
    case OP_DTOH_ASYNC:
        return ((PFN_cuMemcpyDtoHAsync_v3020)f)((void *)c->dst, c->src, c->n, c->stream);
    case OP_MEMCPY_ASYNC:
        return ((PFN_cuMemcpyAsync_v4000)f)(c->dst, c->src, c->n, c->stream);
    }
    return CUDA_ERROR_INVALID_VALUE;
}

/* The same copy, asynchronous, on the shim's own stream. */
static CUresult call_async_on(const struct call1d *c, enum copy_dir dir, CUstream s)
{
    if (c->op == OP_MEMCPY || c->op == OP_MEMCPY_ASYNC)
        return ((PFN_cuMemcpyAsync_v4000)real_hook[HOOK_cuMemcpyAsync])(c->dst, c->src, c->n, s);
    if (dir == DIR_H2D)
        return ((PFN_cuMemcpyHtoDAsync_v3020)real_hook[HOOK_cuMemcpyHtoDAsync_v2])(
            c->dst, (const void *)c->src, c->n, s);
    return ((PFN_cuMemcpyDtoHAsync_v3020)real_hook[HOOK_cuMemcpyDtoHAsync_v2])(
        (void *)c->dst, c->src, c->n, s);
}

static int is_async_op(enum op1d op)
{
    return op == OP_HTOD_ASYNC || op == OP_DTOH_ASYNC || op == OP_MEMCPY_ASYNC;
}

/* Wait until the copy just issued on the program's stream has finished. */
static void wait_program_copy(CUstream stream, enum hook_flavour flavour)
{
    struct shim_stream *ss = streams_current();
    if (ss && streams_wait_copy(ss, stream, flavour) == 0)
        return;
    /* No event of the right context: wait for the whole stream instead. */
    CUresult (*sync)(CUstream) = drv.cuStreamSynchronize;
    if (flavour == PTDS && (stream == 0 || stream == CU_STREAM_PER_THREAD))
        stream = CU_STREAM_PER_THREAD;
    sync(stream);
}

/* An async copy the program made from or into promoted memory has been issued: for the program
 * that memory is pageable, so wait until the copy is done (semantics rule 1), unless the user
 * chose to trust the program; then the block is marked as having DMA that may be in flight. */
static void keep_pageable_semantics(struct copy_hold *held, CUstream stream, enum hook_flavour flavour)
{
    if (shim_cfg.trust_async) {
        copy_release(held, 1);
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

/* Sync copy with pinned host memory, moved to the thread's own stream (rule 2): issue(arg, s)
 * makes the same copy asynchronously on s.  Returns 0 and sets *r when done; -1 when a
 * shim-only step failed first (the caller runs the original). */
static int rewrite_sync(CUresult (*issue)(const void *arg, CUstream s), const void *arg, CUresult *r)
{
    struct shim_stream *ss = streams_current();
    if (!ss || streams_order_after(ss, 0, LEGACY) != 0)
        return -1;
    if (issue(arg, ss->stream) != CUDA_SUCCESS)
        return -1; /* the original reports the error the program expects */
    if (drv.cuEventQuery(ss->order_event) == CUDA_ERROR_NOT_READY) {
        uint64_t t0 = shim_now_ns();
        drv.cuEventSynchronize(ss->order_event);
        stats_add(STAT_ORDERING_WAIT_NS, shim_now_ns() - t0);
    }
    *r = drv.cuStreamSynchronize(ss->stream);
    stats_add(STAT_REWRITE_SYNC_TO_ASYNC, 1);
    return 0;
}

struct issue_1d {
    const struct call1d *c;
    enum copy_dir dir;
};

static CUresult issue_1d_async(const void *arg, CUstream s)
{
    const struct issue_1d *a = arg;
    return call_async_on(a->c, a->dir, s);
}

static CUresult route_1d(struct call1d *c)
{
    uint64_t t0 = copy_clock_start(c->n);
    enum hook_flavour flavour = hook_table[c->id].flavour;
    int async = is_async_op(c->op);
    enum copy_dir dir;
    switch (c->op) {
    case OP_HTOD:
    case OP_HTOD_ASYNC:
        dir = DIR_H2D;
        break;
    case OP_DTOH:
    case OP_DTOH_ASYNC:
        dir = DIR_D2H;
        break;
    default:
        dir = direction(is_host_pointer(c->dst), is_host_pointer(c->src));
        break;
    }
    if (dir == DIR_D2D || dir == DIR_H2H) {
        CUresult r = call_original(c);
        record(dir, dir == DIR_D2D ? MEM_DEVICE : MEM_PAGEABLE, c->n, t0, async);
        return r;
    }
    uintptr_t host = dir == DIR_H2D ? (uintptr_t)c->src : (uintptr_t)c->dst;
    CUdeviceptr dev = dir == DIR_H2D ? c->dst : c->src;
    int capturing = capture_active();
    int acting = shim_cfg.mode >= MODE_PIN && !capturing;
    struct copy_hold held = { NULL };
    /* Every size is classified: a small copy inside a promoted block must still keep pageable
     * semantics; the policy does not promote for small copies (their saving is tiny). */
    enum mem_kind kind = classify_host(host, c->n, dir, acting, capturing, &held);
    CUresult r;
    if (!acting) {
        if (capturing)
            stats_add(STAT_CAPTURE_PASSTHROUGH, 1);
        r = call_original(c);
    } else if (kind == MEM_PINNED || kind == MEM_PROMOTED) {
        if (!async) {
            int candidate = shim_cfg.mode == MODE_FULL && flavour == LEGACY && c->n >= shim_cfg.rewrite_min;
            int concurrent = candidate && sync_copy_begin(shim_now_ns());
            struct issue_1d issue = {c, dir};
            if (!(concurrent && rewrite_sync(issue_1d_async, &issue, &r) == 0))
                r = call_original(c);
            if (candidate)
                sync_copy_end();
        } else {
            r = call_original(c);
            if (kind == MEM_PROMOTED && r == CUDA_SUCCESS)
                keep_pageable_semantics(&held, c->stream, flavour);
        }
    } else {
        struct stage_req req = {
            .dir = dir, .host = (void *)host, .host_pitch = c->n, .dev = dev, .dev_pitch = c->n,
            .width = c->n, .height = 1, .stream = async ? c->stream : 0, .flavour = flavour,
        };
        if (staging_available(c->n) && staging_copy(&req, &r))
            kind = MEM_STAGED;
        else
            r = call_original(c);
    }
    copy_release(&held, 0);
    record(dir, kind, c->n, t0, async);
    return r;
}

static CUresult handle_1d(struct call1d *c)
{
    if (!copy_engaged())
        return call_original(c);
    shim_enter();
    CUresult r = route_1d(c);
    shim_leave();
    return r;
}

CUresult on_htod(enum hook_id id, CUdeviceptr dst, const void *src, size_t n)
{
    struct call1d c = {id, OP_HTOD, dst, (CUdeviceptr)src, n, 0};
    return handle_1d(&c);
}

CUresult on_dtoh(enum hook_id id, void *dst, CUdeviceptr src, size_t n)
{
    struct call1d c = {id, OP_DTOH, (CUdeviceptr)dst, src, n, 0};
    return handle_1d(&c);
}

CUresult on_memcpy(enum hook_id id, CUdeviceptr dst, CUdeviceptr src, size_t n)
{
    struct call1d c = {id, OP_MEMCPY, dst, src, n, 0};
    return handle_1d(&c);
}

CUresult on_htod_async(enum hook_id id, CUdeviceptr dst, const void *src, size_t n, CUstream s)
{
    struct call1d c = {id, OP_HTOD_ASYNC, dst, (CUdeviceptr)src, n, s};
    return handle_1d(&c);
}

CUresult on_dtoh_async(enum hook_id id, void *dst, CUdeviceptr src, size_t n, CUstream s)
{
    struct call1d c = {id, OP_DTOH_ASYNC, (CUdeviceptr)dst, src, n, s};
    return handle_1d(&c);
}

CUresult on_memcpy_async(enum hook_id id, CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)
{
    struct call1d c = {id, OP_MEMCPY_ASYNC, dst, src, n, s};
    return handle_1d(&c);
}

/* ---- device-only copies: counted, passed through -------------------------------------- */

static CUresult count_device_copy(size_t n, int is_async, int peer, uint64_t t0)
{
    if (peer)
        stats_add(STAT_PEER_COPIES, 1);
    record(DIR_D2D, MEM_DEVICE, n, t0, is_async);
    return CUDA_SUCCESS;
}

CUresult on_dtod(enum hook_id id, CUdeviceptr dst, CUdeviceptr src, size_t n)
{
    uint64_t t0 = copy_clock_start(n);
    CUresult r = ((PFN_cuMemcpyDtoD_v3020)real_hook[id])(dst, src, n);
    if (copy_engaged())
        count_device_copy(n, 0, 0, t0);
    return r;
}

CUresult on_dtod_async(enum hook_id id, CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)
{
    uint64_t t0 = copy_clock_start(n);
    CUresult r = ((PFN_cuMemcpyDtoDAsync_v3020)real_hook[id])(dst, src, n, s);
    if (copy_engaged())
        count_device_copy(n, 1, 0, t0);
    return r;
}

CUresult on_peer(enum hook_id id, CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src,
                 CUcontext src_ctx, size_t n)
{
    uint64_t t0 = copy_clock_start(n);
    CUresult r = ((PFN_cuMemcpyPeer_v4000)real_hook[id])(dst, dst_ctx, src, src_ctx, n);
    if (copy_engaged())
        count_device_copy(n, 0, 1, t0);
    return r;
}

CUresult on_peer_async(enum hook_id id, CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src,
                       CUcontext src_ctx, size_t n, CUstream s)
{
    uint64_t t0 = copy_clock_start(n);
    CUresult r = ((PFN_cuMemcpyPeerAsync_v4000)real_hook[id])(dst, dst_ctx, src, src_ctx, n, s);
    if (copy_engaged())
        count_device_copy(n, 1, 1, t0);
    return r;
}

/* ---- 2D and 3D copies ------------------------------------------------------------------- */

/* The host side of a 2D/3D copy: its first byte and extent. */
struct host_extent {
    uintptr_t start;
    size_t extent;
};

static struct host_extent extent_2d(const void *host, size_t pitch, size_t x, size_t y,
                                    size_t width, size_t height)
{
    struct host_extent e = {(uintptr_t)host + y * pitch + x, 0};
    if (height)
        e.extent = (height - 1) * pitch + width;
    return e;
}

static CUresult call_2d(enum hook_id id, const CUDA_MEMCPY2D *p, CUstream s, int async)
{
    if (async)
        return ((PFN_cuMemcpy2DAsync_v3020)real_hook[id])(p, s);
    return ((PFN_cuMemcpy2D_v3020)real_hook[id])(p);
}

static CUresult issue_2d_async(const void *p, CUstream s)
{
    return ((PFN_cuMemcpy2DAsync_v3020)real_hook[HOOK_cuMemcpy2DAsync_v2])(p, s);
}

static CUresult route_2d(enum hook_id id, const CUDA_MEMCPY2D *p, CUstream s, int async)
{
    size_t bytes = p->WidthInBytes * p->Height;
    uint64_t t0 = copy_clock_start(bytes);
    enum hook_flavour flavour = hook_table[id].flavour;
    enum copy_dir dir = memtype_dir(p->dstMemoryType, p->dstHost, p->dstDevice, p->srcMemoryType,
                                    p->srcHost, p->srcDevice);
    if (dir == DIR_D2D || dir == DIR_H2H) {
        CUresult r = call_2d(id, p, s, async);
        record(dir, dir == DIR_D2D ? MEM_DEVICE : MEM_PAGEABLE, bytes, t0, async);
        return r;
    }
    int host_is_src = dir == DIR_H2D;
    const void *host = host_is_src ? (p->srcMemoryType == CU_MEMORYTYPE_HOST ? p->srcHost
                                                                             : (const void *)p->srcDevice)
                                   : (p->dstMemoryType == CU_MEMORYTYPE_HOST ? p->dstHost
                                                                             : (const void *)p->dstDevice);
    struct host_extent e = host_is_src
                               ? extent_2d(host, p->srcPitch, p->srcXInBytes, p->srcY, p->WidthInBytes, p->Height)
                               : extent_2d(host, p->dstPitch, p->dstXInBytes, p->dstY, p->WidthInBytes, p->Height);
    int capturing = capture_active();
    int acting = shim_cfg.mode >= MODE_PIN && !capturing && e.extent;
    struct copy_hold held = { NULL };
    enum mem_kind kind = classify_host(e.start, e.extent, dir, acting, capturing, &held);
    CUresult r;
    if (!acting) {
        if (capturing)
            stats_add(STAT_CAPTURE_PASSTHROUGH, 1);
        r = call_2d(id, p, s, async);
    } else if (kind == MEM_PINNED || kind == MEM_PROMOTED) {
        int candidate = !async && shim_cfg.mode == MODE_FULL && flavour == LEGACY && bytes >= shim_cfg.rewrite_min;
        int concurrent = candidate && sync_copy_begin(shim_now_ns());
        if (!(concurrent && rewrite_sync(issue_2d_async, p, &r) == 0)) {
            r = call_2d(id, p, s, async);
            if (async && kind == MEM_PROMOTED && r == CUDA_SUCCESS)
                keep_pageable_semantics(&held, s, flavour);
        }
        if (candidate)
            sync_copy_end();
    } else {
        int plain = (host_is_src ? p->dstMemoryType : p->srcMemoryType) != CU_MEMORYTYPE_ARRAY;
        struct stage_req req = {
            .dir = dir,
            .host = (void *)e.start,
            .host_pitch = host_is_src ? p->srcPitch : p->dstPitch,
            .dev = host_is_src ? p->dstDevice + p->dstY * p->dstPitch + p->dstXInBytes
                               : p->srcDevice + p->srcY * p->srcPitch + p->srcXInBytes,
            .dev_pitch = host_is_src ? p->dstPitch : p->srcPitch,
            .width = p->WidthInBytes,
            .height = p->Height,
            .stream = async ? s : 0,
            .flavour = flavour,
        };
        if (plain && staging_available(bytes) && staging_copy(&req, &r))
            kind = MEM_STAGED;
        else
            r = call_2d(id, p, s, async);
    }
    copy_release(&held, 0);
    record(dir, kind, bytes, t0, async);
    return r;
}

CUresult on_2d(enum hook_id id, const CUDA_MEMCPY2D *p)
{
    if (!copy_engaged() || !p)
        return call_2d(id, p, 0, 0);
    shim_enter();
    CUresult r = route_2d(id, p, 0, 0);
    shim_leave();
    return r;
}

CUresult on_2d_async(enum hook_id id, const CUDA_MEMCPY2D *p, CUstream s)
{
    if (!copy_engaged() || !p)
        return call_2d(id, p, s, 1);
    shim_enter();
    CUresult r = route_2d(id, p, s, 1);
    shim_leave();
    return r;
}

static CUresult call_3d(enum hook_id id, const CUDA_MEMCPY3D *p, CUstream s, int async)
{
    if (async)
        return ((PFN_cuMemcpy3DAsync_v3020)real_hook[id])(p, s);
    return ((PFN_cuMemcpy3D_v3020)real_hook[id])(p);
}

/* 3D copies: promotion and pageable semantics as for 1D, no staging, no rewrite. */
static CUresult route_3d(enum hook_id id, const CUDA_MEMCPY3D *p, CUstream s, int async)
{
    size_t bytes = p->WidthInBytes * p->Height * p->Depth;
    uint64_t t0 = copy_clock_start(bytes);
    enum copy_dir dir = memtype_dir(p->dstMemoryType, p->dstHost, p->dstDevice, p->srcMemoryType,
                                    p->srcHost, p->srcDevice);
    if (dir == DIR_D2D || dir == DIR_H2H) {
        CUresult r = call_3d(id, p, s, async);
        record(dir, dir == DIR_D2D ? MEM_DEVICE : MEM_PAGEABLE, bytes, t0, async);
        return r;
    }
    int host_is_src = dir == DIR_H2D;
    const void *host = host_is_src ? (p->srcMemoryType == CU_MEMORYTYPE_HOST ? p->srcHost : (const void *)p->srcDevice)
                                   : (p->dstMemoryType == CU_MEMORYTYPE_HOST ? p->dstHost : (const void *)p->dstDevice);
    size_t pitch = host_is_src ? p->srcPitch : p->dstPitch;
    size_t slice_rows = host_is_src ? p->srcHeight : p->dstHeight;
    size_t x = host_is_src ? p->srcXInBytes : p->dstXInBytes;
    size_t y = host_is_src ? p->srcY : p->dstY;
    size_t z = host_is_src ? p->srcZ : p->dstZ;
    uintptr_t start = (uintptr_t)host + (z * slice_rows + y) * pitch + x;
    size_t extent = p->Depth && p->Height ? ((p->Depth - 1) * slice_rows + (p->Height - 1)) * pitch + p->WidthInBytes : 0;
    int capturing = capture_active();
    int acting = shim_cfg.mode >= MODE_PIN && !capturing && extent;
    struct copy_hold held = { NULL };
    enum mem_kind kind = classify_host(start, extent, dir, acting, capturing, &held);
    if (capturing)
        stats_add(STAT_CAPTURE_PASSTHROUGH, 1);
    CUresult r = call_3d(id, p, s, async);
    if (acting && async && kind == MEM_PROMOTED && r == CUDA_SUCCESS)
        keep_pageable_semantics(&held, s, hook_table[id].flavour);
    copy_release(&held, 0);
    record(dir, kind, bytes, t0, async);
    return r;
}

CUresult on_3d(enum hook_id id, const CUDA_MEMCPY3D *p)
{
    if (!copy_engaged() || !p)
        return call_3d(id, p, 0, 0);
    shim_enter();
    CUresult r = route_3d(id, p, 0, 0);
    shim_leave();
    return r;
}

CUresult on_3d_async(enum hook_id id, const CUDA_MEMCPY3D *p, CUstream s)
{
    if (!copy_engaged() || !p)
        return call_3d(id, p, s, 1);
    shim_enter();
    CUresult r = route_3d(id, p, s, 1);
    shim_leave();
    return r;
}

/* 3D peer copies: counted by direction, passed through. */
static enum copy_dir peer3d_dir(const CUDA_MEMCPY3D_PEER *p)
{
    return memtype_dir(p->dstMemoryType, p->dstHost, p->dstDevice, p->srcMemoryType, p->srcHost,
                       p->srcDevice);
}

CUresult on_3dpeer(enum hook_id id, const CUDA_MEMCPY3D_PEER *p)
{
    uint64_t t0 = copy_clock_start(p ? p->WidthInBytes * p->Height * p->Depth : 0);
    CUresult r = ((PFN_cuMemcpy3DPeer_v4000)real_hook[id])(p);
    if (copy_engaged() && p) {
        shim_enter();
        enum copy_dir d = peer3d_dir(p);
        stats_add(STAT_PEER_COPIES, 1);
        record(d, d == DIR_D2D ? MEM_DEVICE : MEM_PAGEABLE, p->WidthInBytes * p->Height * p->Depth, t0, 0);
        shim_leave();
    }
    return r;
}

CUresult on_3dpeer_async(enum hook_id id, const CUDA_MEMCPY3D_PEER *p, CUstream s)
{
    uint64_t t0 = copy_clock_start(p ? p->WidthInBytes * p->Height * p->Depth : 0);
    CUresult r = ((PFN_cuMemcpy3DPeerAsync_v4000)real_hook[id])(p, s);
    if (copy_engaged() && p) {
        shim_enter();
        enum copy_dir d = peer3d_dir(p);
        stats_add(STAT_PEER_COPIES, 1);
        record(d, d == DIR_D2D ? MEM_DEVICE : MEM_PAGEABLE, p->WidthInBytes * p->Height * p->Depth, t0, 1);
        shim_leave();
    }
    return r;
}

/* ---- batches: counted, passed through --------------------------------------------------- */

/* Does p lie in a block the shim registered?  Then a batch copy touching it would run truly
 * asynchronously where the program expects pageable behaviour. */
static int touches_promoted(CUdeviceptr p)
{
    return registry_promoted_at((uintptr_t)p);
}

/* After a batch that touched promoted memory, wait for it: for the program that memory is
 * pageable (semantics rule 1).  Nothing to do during a capture (the batch was only recorded). */
static CUresult finish_batch(enum hook_id id, CUresult r, int promoted, size_t count, CUstream s)
{
    struct copy_hold none = { NULL };
    if (promoted && r == CUDA_SUCCESS && !capture_active())
        keep_pageable_semantics(&none, s, hook_table[id].flavour);
    stats_add(STAT_BATCH_COPIES, count);
    shim_leave();
    return r;
}

static int batch_touches_promoted(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t count)
{
    if (!dsts || !srcs)
        return 0;
    for (size_t i = 0; i < count; i++)
        if (touches_promoted(dsts[i]) || touches_promoted(srcs[i]))
            return 1;
    return 0;
}

static int batch3d_touches_promoted(const CUDA_MEMCPY3D_BATCH_OP *ops, size_t n)
{
    if (!ops)
        return 0;
    for (size_t i = 0; i < n; i++)
        if ((ops[i].src.type == CU_MEMCPY_OPERAND_TYPE_POINTER && touches_promoted(ops[i].src.op.ptr.ptr)) ||
            (ops[i].dst.type == CU_MEMCPY_OPERAND_TYPE_POINTER && touches_promoted(ops[i].dst.op.ptr.ptr)))
            return 1;
    return 0;
}

CUresult on_batch_v1(enum hook_id id, CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
                     CUmemcpyAttributes *attrs, size_t *attr_idxs, size_t num_attrs, size_t *fail_idx,
                     CUstream s)
{
    PFN_cuMemcpyBatchAsync_v12080 real = (PFN_cuMemcpyBatchAsync_v12080)real_hook[id];
    if (!copy_engaged())
        return real(dsts, srcs, sizes, count, attrs, attr_idxs, num_attrs, fail_idx, s);
    shim_enter();
    int promoted = batch_touches_promoted(dsts, srcs, count);
    CUresult r = real(dsts, srcs, sizes, count, attrs, attr_idxs, num_attrs, fail_idx, s);
    return finish_batch(id, r, promoted, count, s);
}

CUresult on_batch_v2(enum hook_id id, CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
                     CUmemcpyAttributes *attrs, size_t *attr_idxs, size_t num_attrs, CUstream s)
{
    PFN_cuMemcpyBatchAsync_v13000 real = (PFN_cuMemcpyBatchAsync_v13000)real_hook[id];
    if (!copy_engaged())
        return real(dsts, srcs, sizes, count, attrs, attr_idxs, num_attrs, s);
    shim_enter();
    int promoted = batch_touches_promoted(dsts, srcs, count);
    CUresult r = real(dsts, srcs, sizes, count, attrs, attr_idxs, num_attrs, s);
    return finish_batch(id, r, promoted, count, s);
}

CUresult on_batch3d_v1(enum hook_id id, size_t num_ops, CUDA_MEMCPY3D_BATCH_OP *ops, size_t *fail_idx,
                       unsigned long long flags, CUstream s)
{
    PFN_cuMemcpy3DBatchAsync_v12080 real = (PFN_cuMemcpy3DBatchAsync_v12080)real_hook[id];
    if (!copy_engaged())
        return real(num_ops, ops, fail_idx, flags, s);
    shim_enter();
    int promoted = batch3d_touches_promoted(ops, num_ops);
    CUresult r = real(num_ops, ops, fail_idx, flags, s);
    return finish_batch(id, r, promoted, num_ops, s);
}

CUresult on_batch3d_v2(enum hook_id id, size_t num_ops, CUDA_MEMCPY3D_BATCH_OP *ops,
                       unsigned long long flags, CUstream s)
{
    PFN_cuMemcpy3DBatchAsync_v13000 real = (PFN_cuMemcpy3DBatchAsync_v13000)real_hook[id];
    if (!copy_engaged())
        return real(num_ops, ops, flags, s);
    shim_enter();
    int promoted = batch3d_touches_promoted(ops, num_ops);
    CUresult r = real(num_ops, ops, flags, s);
    return finish_batch(id, r, promoted, num_ops, s);
}
