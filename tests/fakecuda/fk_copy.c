/* fk_copy.c: every copy and memset entry point, with the host-side semantics of the real driver:
 *   sync  HtoD pageable: stream synced first, source snapshot, returns; DMA later in order
 *   sync  HtoD pinned  : returns when complete
 *   sync  DtoH any     : returns when complete
 *   sync  DtoD         : no host synchronization
 *   async HtoD pageable: source snapshot, returns; DMA later in order
 *   async DtoH pageable: returns when complete
 *   async with pinned  : truly asynchronous (host memory touched when the worker runs it)
 * "Pinned" is decided at enqueue: the host range lies inside one registration or host allocation. */
#include "fk_internal.h"
#include <string.h>

typedef struct {
    fk_end src, dst;
    size_t w, h, d;
    int src_hostdev, dst_hostdev;   /* a "device" pointer that is really mapped pinned host memory */
} xfer;

static size_t end_span(const fk_end *e, size_t w, size_t h, size_t d)
{
    return (d - 1) * e->slice + (h - 1) * e->pitch + w;
}

static CUresult set_host(fk_end *e, const void *p)
{
    if (!p || fk_is_devaddr((uintptr_t)p)) return CUDA_ERROR_INVALID_VALUE;
    e->isdev = 0;
    e->addr = (char *)p;
    return CUDA_SUCCESS;
}

/* A CUdeviceptr argument: device memory, or (unified addressing) mapped pinned host memory. */
static CUresult set_dev(fk_end *e, int *hostdev, CUdeviceptr p)
{
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    e->isdev = fk_is_devaddr((uintptr_t)p);
    e->addr = (char *)(uintptr_t)p;
    *hostdev = !e->isdev;
    return CUDA_SUCCESS;
}

/* cuMemcpy / CU_MEMORYTYPE_UNIFIED: the address says where it is. */
static CUresult set_unified(fk_end *e, CUdeviceptr p)
{
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    e->isdev = fk_is_devaddr((uintptr_t)p);
    e->addr = (char *)(uintptr_t)p;
    return CUDA_SUCCESS;
}

static void linear(xfer *x, size_t n)
{
    x->w = n;
    x->h = x->d = 1;
    x->src.pitch = x->dst.pitch = n;
    x->src.slice = x->dst.slice = n;
}

/* Bounds of device sides; "device" pointers that are host memory must be pinned. Lock held. */
static CUresult validate(xfer *x)
{
    fk_end *es[2] = { &x->src, &x->dst };
    int hd[2] = { x->src_hostdev, x->dst_hostdev };
    for (int i = 0; i < 2; i++) {
        fk_end *e = es[i];
        size_t span = end_span(e, x->w, x->h, x->d);
        if (e->isdev) {
            if (!(e->backing = fk_dev_resolve((uintptr_t)e->addr, span, NULL))) return CUDA_ERROR_INVALID_VALUE;
        } else if (fk_overlaps_dev((uintptr_t)e->addr, span)) {
            /* A host range running into device addresses is no host memory. */
            return CUDA_ERROR_INVALID_VALUE;
        } else if (hd[i] && !fk_hreg_pinned(e->addr, span)) {
            return CUDA_ERROR_INVALID_VALUE;
        }
    }
    return CUDA_SUCCESS;
}

static void classify(fk_op *op, int take_refs)
{
    fk_end *es[2] = { &op->src, &op->dst };
    for (int i = 0; i < 2; i++) {
        fk_end *e = es[i];
        if (e->isdev || (op->staged && e->addr == op->staged)) continue;
        fk_hreg *h = fk_hreg_pinned(e->addr, end_span(e, op->w, op->h, op->d));
        e->pinned = h != NULL;
        if (take_refs && h) {
            e->reg = h;
            h->inflight++;
        }
    }
}

static void copy_rows(char *dst, size_t dpitch, size_t dslice, const char *src, size_t spitch, size_t sslice,
                      size_t w, size_t h, size_t d)
{
    for (size_t z = 0; z < d; z++)
        for (size_t y = 0; y < h; y++)
            memmove(dst + z * dslice + y * dpitch, src + z * sslice + y * spitch, w);
}

static CUresult do_copy(const char *what, xfer *x, CUstream hs, int ptds, int async_api, int force_snapshot)
{
    FK_NEED_INIT();
    if (!fk_cur_ctx()) return CUDA_ERROR_INVALID_CONTEXT;
    if (!x->w || !x->h || !x->d) return CUDA_SUCCESS;
    pthread_mutex_lock(&fk_mu);
    fk_stream *s;
    fk_op *op = NULL;
    CUresult r = fk_resolve_stream(hs, ptds, &s);
    if (!r) r = validate(x);
    if (!r && !async_api) r = fk_unsafe_call_check();
    if (r) goto out;
    op = fk_op_new(OP_COPY, what);
    op->src = x->src;
    op->dst = x->dst;
    op->w = x->w;
    op->h = x->h;
    op->d = x->d;
    op->async_api = async_api;
    op->delay_us = __atomic_load_n(&fk_delay_us, __ATOMIC_RELAXED);
    classify(op, 0);
    r = fk_capture_gate(s, op, !async_api);
    if (r == FK_CAPTURED) { op = NULL; r = CUDA_SUCCESS; goto out; }
    if (r) goto out;
    int src_host = !op->src.isdev, dst_host = !op->dst.isdev;
    int snapshot = src_host && (!op->src.pinned || force_snapshot);
    /* Pageable sync HtoD: "a stream sync is performed before the copy is initiated". */
    if (snapshot && !async_api) fk_wait_stream_and_deps(s);
    else if (snapshot) fk_wait_hostfns_before(s);
    classify(op, 1);    /* again: state may have changed while waiting */
    snapshot = src_host && (!op->src.pinned || force_snapshot);
    if (snapshot) {
        size_t n = x->w * x->h * x->d;
        op->staged = fk_staged_alloc(n);
        if (!op->staged) { r = CUDA_ERROR_OUT_OF_MEMORY; fk_op_release_regs(op); goto out; }
        copy_rows(op->staged, x->w, x->w * x->h, op->src.addr, op->src.pitch, op->src.slice, x->w, x->h, x->d);
        if (op->src.reg) { op->src.reg->inflight--; op->src.reg = NULL; }
        op->src = (fk_end){ .isdev = 0, .addr = op->staged, .pitch = x->w, .slice = x->w * x->h };
    }
    int wait = (dst_host && !op->dst.pinned) ||
               (!async_api && (dst_host || (src_host && !snapshot)));
    if (async_api && !wait && src_host && !snapshot && fk_check_source) {
        op->src_sum = fk_checksum_end(&op->src, op->w, op->h, op->d);
        fk_ck_add(op);
    }
    fk_submit(s, op);
    uint64_t seq = op->seq;
    op = NULL;    /* owned by the stream now */
    if (wait) fk_wait_pos(s, seq);
out:
    fk_op_free(op);
    pthread_mutex_unlock(&fk_mu);
    return r;
}

/* ---- execution (worker, lock held) ---- */
static int host_end_ok(fk_op *op, fk_end *e, const char *side)
{
    if (e->isdev || (op->staged && e->addr == op->staged)) return 1;
    size_t span = end_span(e, op->w, op->h, op->d);
    if (e->pinned) {
        fk_hreg *h = fk_hreg_find(e->addr, span);
        if (!h) {
            fk_violation("DMA through the pinned path but the host range is no longer registered "
                         "(%s, %s %p+%zu)", op->what, side, (void *)e->addr, span);
            return 0;
        }
        fk_check_reg_mapped(h);
        /* A read-only registration is mapped read-only for the device: its DMA write faults
         * on a GPU, whatever the host's own protection of the pages says now. */
        if (e == &op->dst && !h->hostalloc && (h->flags & CU_MEMHOSTREGISTER_READ_ONLY)) {
            fk_violation("DMA write into a range registered CU_MEMHOSTREGISTER_READ_ONLY (%s, destination "
                         "%p+%zu, registration %p+%zu); the copy did not land", op->what, (void *)e->addr,
                         span, (void *)h->base, h->size);
            return 0;
        }
        if (!fk_range_mapped(e->addr, span)) {
            fk_violation("DMA through the pinned path but the host range is no longer mapped "
                         "(%s, %s %p+%zu)", op->what, side, (void *)e->addr, span);
            return 0;
        }
        return 1;
    }
    if (!fk_range_mapped(e->addr, span)) {
        fk_log("fakecuda: %s: pageable %s %p+%zu unmapped at execution; copy skipped",
               op->what, side, (void *)e->addr, span);
        return 0;
    }
    return 1;
}

void fk_exec_copy(fk_op *op)
{
    int ok = host_end_ok(op, &op->src, "source");
    ok &= host_end_ok(op, &op->dst, "destination");
    if (!ok) return;
    if (op->check_src && fk_checksum_end(&op->src, op->w, op->h, op->d) != op->src_sum)
        fk_violation("pinned source changed before the DMA read it (%s, source %p+%zu: an async copy "
                     "whose caller was free to reuse the buffer)", op->what, (void *)op->src.addr,
                     end_span(&op->src, op->w, op->h, op->d));
    const char *sp = op->src.isdev ? op->src.backing : op->src.addr;
    char *dp = op->dst.isdev ? op->dst.backing : op->dst.addr;
    copy_rows(dp, op->dst.pitch, op->dst.slice, sp, op->src.pitch, op->src.slice, op->w, op->h, op->d);
}

void fk_exec_memset(fk_op *op)
{
    char *p = op->dst.backing;
    if (!p || !op->w) return;
    if (op->elem == 1) { memset(p, (int)(op->val & 0xff), op->w); return; }
    for (size_t i = 0; i + op->elem <= op->w; i += op->elem) {
        if (op->elem == 2) { uint16_t v = (uint16_t)op->val; memcpy(p + i, &v, 2); }
        else memcpy(p + i, &op->val, 4);
    }
}

void fk_op_release_regs(fk_op *op)
{
    if (op->src.reg) { op->src.reg->inflight--; op->src.reg = NULL; }
    if (op->dst.reg) { op->dst.reg->inflight--; op->dst.reg = NULL; }
}

/* A graph node replayed: device memory must still exist; host sides are pinned or not as at
 * capture (a pinned node whose range is no longer registered is flagged when it runs). */
void fk_prepare_graph_op(fk_op *op)
{
    if (op->kind != OP_COPY && op->kind != OP_MEMSET) return;
    fk_end *es[2] = { &op->src, &op->dst };
    for (int i = op->kind == OP_MEMSET ? 1 : 0; i < 2; i++) {
        fk_end *e = es[i];
        size_t span = end_span(e, op->w, op->h, op->d);
        if (e->isdev) {
            if (!op->w) continue;
            if (!(e->backing = fk_dev_resolve((uintptr_t)e->addr, span, NULL))) {
                fk_violation("graph replay touches freed device memory (%s, %p+%zu)", op->what,
                             (void *)e->addr, span);
                op->kind = OP_WAIT;
                fk_op_release_regs(op);
                return;
            }
        } else if (e->pinned && !(op->staged && e->addr == op->staged)) {
            fk_hreg *h = fk_hreg_pinned(e->addr, span);
            if (h) { e->reg = h; h->inflight++; }
        }
    }
    if (op->kind == OP_COPY && !op->src.isdev && op->src.pinned && fk_check_source) {
        op->src_sum = fk_checksum_end(&op->src, op->w, op->h, op->d);
        fk_ck_add(op);
    }
}

/* ---- entry points ---- */
static CUresult pre(void)
{
    if (!atomic_load(&fk_initialized) || fk_forked_child) return CUDA_ERROR_NOT_INITIALIZED;
    if (!fk_cur_ctx()) return CUDA_ERROR_INVALID_CONTEXT;
    return CUDA_SUCCESS;
}

/* fakecuda_fail_copies_after: copies still accepted (-1: no failure set), and the error after. */
static _Atomic long fk_copies_until_failure = -1;
static _Atomic int fk_copy_failure;

FK_PUBLIC void fakecuda_fail_copies_after(unsigned n, CUresult err)
{
    atomic_store(&fk_copy_failure, (int)err);
    atomic_store(&fk_copies_until_failure, err == CUDA_SUCCESS ? -1 : (long)n);
}

static CUresult injected_failure(void)
{
    long left = atomic_load(&fk_copies_until_failure);
    while (left > 0 && !atomic_compare_exchange_weak(&fk_copies_until_failure, &left, left - 1)) {}
    return left == 0 ? (CUresult)atomic_load(&fk_copy_failure) : CUDA_SUCCESS;
}

static CUresult htod(const char *what, CUdeviceptr dst, const void *src, size_t n, CUstream s, int pt, int async)
{
    xfer x = { 0 };
    CUresult r = pre();
    if (!r) r = injected_failure();
    if (!r) r = set_dev(&x.dst, &x.dst_hostdev, dst);
    if (!r) r = set_host(&x.src, src);
    if (r) return r;
    linear(&x, n);
    return do_copy(what, &x, s, pt, async, 0);
}

static CUresult dtoh(const char *what, void *dst, CUdeviceptr src, size_t n, CUstream s, int pt, int async)
{
    xfer x = { 0 };
    CUresult r = pre();
    if (!r) r = injected_failure();
    if (!r) r = set_host(&x.dst, dst);
    if (!r) r = set_dev(&x.src, &x.src_hostdev, src);
    if (r) return r;
    linear(&x, n);
    return do_copy(what, &x, s, pt, async, 0);
}

static CUresult dtod(const char *what, CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s, int pt, int async)
{
    xfer x = { 0 };
    CUresult r = pre();
    if (!r) r = set_dev(&x.dst, &x.dst_hostdev, dst);
    if (!r) r = set_dev(&x.src, &x.src_hostdev, src);
    if (r) return r;
    linear(&x, n);
    return do_copy(what, &x, s, pt, async, 0);
}

static CUresult unified(const char *what, CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s, int pt, int async)
{
    xfer x = { 0 };
    CUresult r = pre();
    if (!r) r = set_unified(&x.dst, dst);
    if (!r) r = set_unified(&x.src, src);
    if (r) return r;
    linear(&x, n);
    return do_copy(what, &x, s, pt, async, 0);
}

static int ctx_ok(CUcontext c)
{
    for (int i = 0; i < fk_ndev; i++)
        if (c == &fk_ctxs[i]) return 1;
    return 0;
}

static CUresult peer(const char *what, CUdeviceptr dst, CUcontext dc, CUdeviceptr src, CUcontext sc, size_t n,
                     CUstream s, int pt, int async)
{
    CUresult r = pre();
    if (r) return r;
    if (!ctx_ok(dc) || !ctx_ok(sc)) return CUDA_ERROR_INVALID_CONTEXT;
    int dd = -1, sd = -1;
    pthread_mutex_lock(&fk_mu);
    if (n) {
        if (!fk_dev_resolve((uintptr_t)dst, n, &dd) || !fk_dev_resolve((uintptr_t)src, n, &sd)) r = CUDA_ERROR_INVALID_VALUE;
        else if (dd != dc->dev || sd != sc->dev) r = CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&fk_mu);
    if (r) return r;
    return dtod(what, dst, src, n, s, pt, async);
}

FK_API(cuMemcpyHtoD_v2, (CUdeviceptr d, const void *s, size_t n))
{ FK_COUNT(cuMemcpyHtoD_v2); return htod("cuMemcpyHtoD_v2", d, s, n, NULL, 0, 0); }
FK_API(cuMemcpyHtoD_v2_ptds, (CUdeviceptr d, const void *s, size_t n))
{ FK_COUNT(cuMemcpyHtoD_v2_ptds); return htod("cuMemcpyHtoD_v2_ptds", d, s, n, NULL, 1, 0); }
FK_API(cuMemcpyHtoDAsync_v2, (CUdeviceptr d, const void *s, size_t n, CUstream st))
{ FK_COUNT(cuMemcpyHtoDAsync_v2); return htod("cuMemcpyHtoDAsync_v2", d, s, n, st, 0, 1); }
FK_API(cuMemcpyHtoDAsync_v2_ptsz, (CUdeviceptr d, const void *s, size_t n, CUstream st))
{ FK_COUNT(cuMemcpyHtoDAsync_v2_ptsz); return htod("cuMemcpyHtoDAsync_v2_ptsz", d, s, n, st, 1, 1); }

FK_API(cuMemcpyDtoH_v2, (void *d, CUdeviceptr s, size_t n))
{ FK_COUNT(cuMemcpyDtoH_v2); return dtoh("cuMemcpyDtoH_v2", d, s, n, NULL, 0, 0); }
FK_API(cuMemcpyDtoH_v2_ptds, (void *d, CUdeviceptr s, size_t n))
{ FK_COUNT(cuMemcpyDtoH_v2_ptds); return dtoh("cuMemcpyDtoH_v2_ptds", d, s, n, NULL, 1, 0); }
FK_API(cuMemcpyDtoHAsync_v2, (void *d, CUdeviceptr s, size_t n, CUstream st))
{ FK_COUNT(cuMemcpyDtoHAsync_v2); return dtoh("cuMemcpyDtoHAsync_v2", d, s, n, st, 0, 1); }
FK_API(cuMemcpyDtoHAsync_v2_ptsz, (void *d, CUdeviceptr s, size_t n, CUstream st))
{ FK_COUNT(cuMemcpyDtoHAsync_v2_ptsz); return dtoh("cuMemcpyDtoHAsync_v2_ptsz", d, s, n, st, 1, 1); }

FK_API(cuMemcpyDtoD_v2, (CUdeviceptr d, CUdeviceptr s, size_t n))
{ FK_COUNT(cuMemcpyDtoD_v2); return dtod("cuMemcpyDtoD_v2", d, s, n, NULL, 0, 0); }
FK_API(cuMemcpyDtoD_v2_ptds, (CUdeviceptr d, CUdeviceptr s, size_t n))
{ FK_COUNT(cuMemcpyDtoD_v2_ptds); return dtod("cuMemcpyDtoD_v2_ptds", d, s, n, NULL, 1, 0); }
FK_API(cuMemcpyDtoDAsync_v2, (CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st))
{ FK_COUNT(cuMemcpyDtoDAsync_v2); return dtod("cuMemcpyDtoDAsync_v2", d, s, n, st, 0, 1); }
FK_API(cuMemcpyDtoDAsync_v2_ptsz, (CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st))
{ FK_COUNT(cuMemcpyDtoDAsync_v2_ptsz); return dtod("cuMemcpyDtoDAsync_v2_ptsz", d, s, n, st, 1, 1); }

FK_API(cuMemcpy, (CUdeviceptr d, CUdeviceptr s, size_t n))
{ FK_COUNT(cuMemcpy); return unified("cuMemcpy", d, s, n, NULL, 0, 0); }
FK_API(cuMemcpy_ptds, (CUdeviceptr d, CUdeviceptr s, size_t n))
{ FK_COUNT(cuMemcpy_ptds); return unified("cuMemcpy_ptds", d, s, n, NULL, 1, 0); }
FK_API(cuMemcpyAsync, (CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st))
{ FK_COUNT(cuMemcpyAsync); return unified("cuMemcpyAsync", d, s, n, st, 0, 1); }
FK_API(cuMemcpyAsync_ptsz, (CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st))
{ FK_COUNT(cuMemcpyAsync_ptsz); return unified("cuMemcpyAsync_ptsz", d, s, n, st, 1, 1); }

FK_API(cuMemcpyPeer, (CUdeviceptr d, CUcontext dc, CUdeviceptr s, CUcontext sc, size_t n))
{ FK_COUNT(cuMemcpyPeer); return peer("cuMemcpyPeer", d, dc, s, sc, n, NULL, 0, 0); }
FK_API(cuMemcpyPeer_ptds, (CUdeviceptr d, CUcontext dc, CUdeviceptr s, CUcontext sc, size_t n))
{ FK_COUNT(cuMemcpyPeer_ptds); return peer("cuMemcpyPeer_ptds", d, dc, s, sc, n, NULL, 1, 0); }
FK_API(cuMemcpyPeerAsync, (CUdeviceptr d, CUcontext dc, CUdeviceptr s, CUcontext sc, size_t n, CUstream st))
{ FK_COUNT(cuMemcpyPeerAsync); return peer("cuMemcpyPeerAsync", d, dc, s, sc, n, st, 0, 1); }
FK_API(cuMemcpyPeerAsync_ptsz, (CUdeviceptr d, CUcontext dc, CUdeviceptr s, CUcontext sc, size_t n, CUstream st))
{ FK_COUNT(cuMemcpyPeerAsync_ptsz); return peer("cuMemcpyPeerAsync_ptsz", d, dc, s, sc, n, st, 1, 1); }

/* ---- 2D / 3D ---- */
static CUresult end_desc(fk_end *e, int *hostdev, CUmemorytype t, const void *host, CUdeviceptr dev,
                         size_t x, size_t y, size_t z, size_t pitch, size_t height)
{
    CUresult r;
    switch (t) {
    case CU_MEMORYTYPE_HOST: r = set_host(e, host); break;
    case CU_MEMORYTYPE_DEVICE: r = set_dev(e, hostdev, dev); break;
    case CU_MEMORYTYPE_UNIFIED: r = set_unified(e, dev); break;
    case CU_MEMORYTYPE_ARRAY: return CUDA_ERROR_NOT_SUPPORTED;   /* arrays are not modelled */
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    if (r) return r;
    e->pitch = pitch;
    e->slice = pitch * height;
    e->addr += z * e->slice + y * pitch + x;
    return CUDA_SUCCESS;
}

static CUresult copy2d(const char *what, const CUDA_MEMCPY2D *p, CUstream s, int pt, int async)
{
    CUresult r = pre();
    if (r) return r;
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    xfer x = { 0 };
    x.w = p->WidthInBytes;
    x.h = p->Height;
    x.d = 1;
    if (!x.w || !x.h) return CUDA_SUCCESS;
    /* Rows may not overlap: a pitch below the width is rejected (cudaErrorInvalidPitchValue). */
    if (x.h > 1 && ((p->srcMemoryType != CU_MEMORYTYPE_ARRAY && p->srcPitch < x.w) ||
                    (p->dstMemoryType != CU_MEMORYTYPE_ARRAY && p->dstPitch < x.w)))
        return CUDA_ERROR_INVALID_VALUE;
    if (p->srcPitch > 0x7fffffffu || p->dstPitch > 0x7fffffffu) return CUDA_ERROR_INVALID_VALUE;
    r = end_desc(&x.src, &x.src_hostdev, p->srcMemoryType, p->srcHost, p->srcDevice, p->srcXInBytes, p->srcY, 0,
                 p->srcPitch, x.h);
    if (!r) r = end_desc(&x.dst, &x.dst_hostdev, p->dstMemoryType, p->dstHost, p->dstDevice, p->dstXInBytes,
                         p->dstY, 0, p->dstPitch, x.h);
    if (r) return r;
    return do_copy(what, &x, s, pt, async, 0);
}

static CUresult copy3d(const char *what, const CUDA_MEMCPY3D *p, CUstream s, int pt, int async)
{
    CUresult r = pre();
    if (r) return r;
    if (!p || p->reserved0 || p->reserved1 || p->srcLOD || p->dstLOD) return CUDA_ERROR_INVALID_VALUE;
    xfer x = { 0 };
    x.w = p->WidthInBytes;
    x.h = p->Height;
    x.d = p->Depth;
    if (!x.w || !x.h || !x.d) return CUDA_SUCCESS;
    if ((x.h > 1 || x.d > 1) && (p->srcPitch < x.w || p->dstPitch < x.w)) return CUDA_ERROR_INVALID_VALUE;
    if (x.d > 1 && (p->srcHeight < x.h || p->dstHeight < x.h)) return CUDA_ERROR_INVALID_VALUE;
    r = end_desc(&x.src, &x.src_hostdev, p->srcMemoryType, p->srcHost, p->srcDevice, p->srcXInBytes, p->srcY,
                 p->srcZ, p->srcPitch, p->srcHeight);
    if (!r) r = end_desc(&x.dst, &x.dst_hostdev, p->dstMemoryType, p->dstHost, p->dstDevice, p->dstXInBytes,
                         p->dstY, p->dstZ, p->dstPitch, p->dstHeight);
    if (r) return r;
    return do_copy(what, &x, s, pt, async, 0);
}

FK_API(cuMemcpy2D_v2, (const CUDA_MEMCPY2D *p))
{ FK_COUNT(cuMemcpy2D_v2); return copy2d("cuMemcpy2D_v2", p, NULL, 0, 0); }
FK_API(cuMemcpy2D_v2_ptds, (const CUDA_MEMCPY2D *p))
{ FK_COUNT(cuMemcpy2D_v2_ptds); return copy2d("cuMemcpy2D_v2_ptds", p, NULL, 1, 0); }
FK_API(cuMemcpy2DUnaligned_v2, (const CUDA_MEMCPY2D *p))
{ FK_COUNT(cuMemcpy2DUnaligned_v2); return copy2d("cuMemcpy2DUnaligned_v2", p, NULL, 0, 0); }
FK_API(cuMemcpy2DUnaligned_v2_ptds, (const CUDA_MEMCPY2D *p))
{ FK_COUNT(cuMemcpy2DUnaligned_v2_ptds); return copy2d("cuMemcpy2DUnaligned_v2_ptds", p, NULL, 1, 0); }
FK_API(cuMemcpy2DAsync_v2, (const CUDA_MEMCPY2D *p, CUstream s))
{ FK_COUNT(cuMemcpy2DAsync_v2); return copy2d("cuMemcpy2DAsync_v2", p, s, 0, 1); }
FK_API(cuMemcpy2DAsync_v2_ptsz, (const CUDA_MEMCPY2D *p, CUstream s))
{ FK_COUNT(cuMemcpy2DAsync_v2_ptsz); return copy2d("cuMemcpy2DAsync_v2_ptsz", p, s, 1, 1); }
FK_API(cuMemcpy3D_v2, (const CUDA_MEMCPY3D *p))
{ FK_COUNT(cuMemcpy3D_v2); return copy3d("cuMemcpy3D_v2", p, NULL, 0, 0); }
FK_API(cuMemcpy3D_v2_ptds, (const CUDA_MEMCPY3D *p))
{ FK_COUNT(cuMemcpy3D_v2_ptds); return copy3d("cuMemcpy3D_v2_ptds", p, NULL, 1, 0); }
FK_API(cuMemcpy3DAsync_v2, (const CUDA_MEMCPY3D *p, CUstream s))
{ FK_COUNT(cuMemcpy3DAsync_v2); return copy3d("cuMemcpy3DAsync_v2", p, s, 0, 1); }
FK_API(cuMemcpy3DAsync_v2_ptsz, (const CUDA_MEMCPY3D *p, CUstream s))
{ FK_COUNT(cuMemcpy3DAsync_v2_ptsz); return copy3d("cuMemcpy3DAsync_v2_ptsz", p, s, 1, 1); }

/* ---- batches: each copy behaves as a cuMemcpyAsync on the stream; DURING_API_CALL sources are
 * read before return.  The legacy stream is not allowed. ---- */
static CUresult batch_stream_ok(CUstream s, int pt)
{
    if (s == CU_STREAM_LEGACY || (s == NULL && !pt)) return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

static CUresult batch(const char *what, CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
                      CUmemcpyAttributes *attrs, size_t *idxs, size_t nattrs, size_t *fail, CUstream s, int pt)
{
    if (fail) *fail = SIZE_MAX;
    CUresult r = pre();
    if (r) return r;
    if (!dsts || !srcs || !sizes || !count || !attrs || !idxs || !nattrs || nattrs > count || idxs[0] != 0)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t k = 1; k < nattrs; k++)
        if (idxs[k] <= idxs[k - 1] || idxs[k] >= count) return CUDA_ERROR_INVALID_VALUE;
    if ((r = batch_stream_ok(s, pt))) return r;
    size_t k = 0;
    for (size_t i = 0; i < count; i++) {
        while (k + 1 < nattrs && idxs[k + 1] <= i) k++;
        CUmemcpySrcAccessOrder o = attrs[k].srcAccessOrder;
        if (o != CU_MEMCPY_SRC_ACCESS_ORDER_STREAM && o != CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL &&
            o != CU_MEMCPY_SRC_ACCESS_ORDER_ANY)
            r = CUDA_ERROR_INVALID_VALUE;
        xfer x = { 0 };
        if (!r) r = set_unified(&x.dst, dsts[i]);
        if (!r) r = set_unified(&x.src, srcs[i]);
        if (!r) {
            linear(&x, sizes[i]);
            r = do_copy(what, &x, s, pt, 1, o == CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL);
        }
        if (r) {
            if (fail) *fail = i;
            return r;
        }
    }
    return CUDA_SUCCESS;
}

FK_API(cuMemcpyBatchAsync, (CUdeviceptr *d, CUdeviceptr *s, size_t *n, size_t count, CUmemcpyAttributes *a,
                            size_t *ai, size_t na, size_t *fail, CUstream st))
{ FK_COUNT(cuMemcpyBatchAsync); return batch("cuMemcpyBatchAsync", d, s, n, count, a, ai, na, fail, st, 0); }
FK_API(cuMemcpyBatchAsync_ptsz, (CUdeviceptr *d, CUdeviceptr *s, size_t *n, size_t count, CUmemcpyAttributes *a,
                                 size_t *ai, size_t na, size_t *fail, CUstream st))
{ FK_COUNT(cuMemcpyBatchAsync_ptsz); return batch("cuMemcpyBatchAsync_ptsz", d, s, n, count, a, ai, na, fail, st, 1); }
FK_API(cuMemcpyBatchAsync_v2, (CUdeviceptr *d, CUdeviceptr *s, size_t *n, size_t count, CUmemcpyAttributes *a,
                               size_t *ai, size_t na, CUstream st))
{ FK_COUNT(cuMemcpyBatchAsync_v2); return batch("cuMemcpyBatchAsync_v2", d, s, n, count, a, ai, na, NULL, st, 0); }
FK_API(cuMemcpyBatchAsync_v2_ptsz, (CUdeviceptr *d, CUdeviceptr *s, size_t *n, size_t count, CUmemcpyAttributes *a,
                                    size_t *ai, size_t na, CUstream st))
{ FK_COUNT(cuMemcpyBatchAsync_v2_ptsz); return batch("cuMemcpyBatchAsync_v2_ptsz", d, s, n, count, a, ai, na, NULL, st, 1); }

static CUresult batch3d(const char *what, size_t n, CUDA_MEMCPY3D_BATCH_OP *ops, unsigned long long flags,
                        CUstream s, int pt)
{
    CUresult r = pre();
    if (r) return r;
    if (!n || !ops || flags) return CUDA_ERROR_INVALID_VALUE;
    if ((r = batch_stream_ok(s, pt))) return r;
    for (size_t i = 0; i < n; i++) {
        CUDA_MEMCPY3D_BATCH_OP *o = &ops[i];
        if (o->src.type == CU_MEMCPY_OPERAND_TYPE_ARRAY || o->dst.type == CU_MEMCPY_OPERAND_TYPE_ARRAY)
            return CUDA_ERROR_NOT_SUPPORTED;
        if (o->src.type != CU_MEMCPY_OPERAND_TYPE_POINTER || o->dst.type != CU_MEMCPY_OPERAND_TYPE_POINTER)
            return CUDA_ERROR_INVALID_VALUE;
        if (!o->extent.width || !o->extent.height || !o->extent.depth) return CUDA_ERROR_INVALID_VALUE;
        if (o->srcAccessOrder != CU_MEMCPY_SRC_ACCESS_ORDER_STREAM &&
            o->srcAccessOrder != CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL &&
            o->srcAccessOrder != CU_MEMCPY_SRC_ACCESS_ORDER_ANY)
            return CUDA_ERROR_INVALID_VALUE;
        xfer x = { 0 };
        x.w = o->extent.width;
        x.h = o->extent.height;
        x.d = o->extent.depth;
        size_t sr = o->src.op.ptr.rowLength ? o->src.op.ptr.rowLength : x.w;
        size_t sh = o->src.op.ptr.layerHeight ? o->src.op.ptr.layerHeight : x.h;
        size_t dr = o->dst.op.ptr.rowLength ? o->dst.op.ptr.rowLength : x.w;
        size_t dh = o->dst.op.ptr.layerHeight ? o->dst.op.ptr.layerHeight : x.h;
        if (sr < x.w || dr < x.w || sh < x.h || dh < x.h) return CUDA_ERROR_INVALID_VALUE;
        r = set_unified(&x.src, o->src.op.ptr.ptr);
        if (!r) r = set_unified(&x.dst, o->dst.op.ptr.ptr);
        if (r) return r;
        x.src.pitch = sr; x.src.slice = sr * sh;
        x.dst.pitch = dr; x.dst.slice = dr * dh;
        r = do_copy(what, &x, s, pt, 1, o->srcAccessOrder == CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL);
        if (r) return r;
    }
    return CUDA_SUCCESS;
}

FK_API(cuMemcpy3DBatchAsync_v2, (size_t n, CUDA_MEMCPY3D_BATCH_OP *ops, unsigned long long flags, CUstream s))
{ FK_COUNT(cuMemcpy3DBatchAsync_v2); return batch3d("cuMemcpy3DBatchAsync_v2", n, ops, flags, s, 0); }
FK_API(cuMemcpy3DBatchAsync_v2_ptsz, (size_t n, CUDA_MEMCPY3D_BATCH_OP *ops, unsigned long long flags, CUstream s))
{ FK_COUNT(cuMemcpy3DBatchAsync_v2_ptsz); return batch3d("cuMemcpy3DBatchAsync_v2_ptsz", n, ops, flags, s, 1); }

/* ---- memsets: asynchronous with respect to the host even in their "sync" form ---- */
static CUresult memset_impl(const char *what, CUdeviceptr dst, uint32_t val, unsigned elem, size_t count,
                            CUstream hs, int pt)
{
    CUresult r = pre();
    if (r) return r;
    if (!dst || (dst % elem)) return CUDA_ERROR_INVALID_VALUE;
    if (!count) return CUDA_SUCCESS;
    size_t n = count * elem;
    pthread_mutex_lock(&fk_mu);
    fk_stream *s;
    char *b = NULL;
    r = fk_resolve_stream(hs, pt, &s);
    if (!r && !(b = fk_dev_resolve((uintptr_t)dst, n, NULL))) r = CUDA_ERROR_INVALID_VALUE;
    if (!r) {
        fk_op *op = fk_op_new(OP_MEMSET, what);
        op->dst = (fk_end){ .isdev = 1, .addr = (char *)(uintptr_t)dst, .backing = b, .pitch = n, .slice = n };
        op->w = n;
        op->h = op->d = 1;
        op->elem = elem;
        op->val = val;
        op->delay_us = __atomic_load_n(&fk_delay_us, __ATOMIC_RELAXED);
        r = fk_capture_gate(s, op, 0);
        if (r == FK_CAPTURED) r = CUDA_SUCCESS;
        else if (r) fk_op_free(op);
        else fk_submit(s, op);
    }
    pthread_mutex_unlock(&fk_mu);
    return r;
}

FK_API(cuMemsetD8_v2, (CUdeviceptr d, unsigned char v, size_t n))
{ FK_COUNT(cuMemsetD8_v2); return memset_impl("cuMemsetD8_v2", d, v, 1, n, NULL, 0); }
FK_API(cuMemsetD8_v2_ptds, (CUdeviceptr d, unsigned char v, size_t n))
{ FK_COUNT(cuMemsetD8_v2_ptds); return memset_impl("cuMemsetD8_v2_ptds", d, v, 1, n, NULL, 1); }
FK_API(cuMemsetD16_v2, (CUdeviceptr d, unsigned short v, size_t n))
{ FK_COUNT(cuMemsetD16_v2); return memset_impl("cuMemsetD16_v2", d, v, 2, n, NULL, 0); }
FK_API(cuMemsetD16_v2_ptds, (CUdeviceptr d, unsigned short v, size_t n))
{ FK_COUNT(cuMemsetD16_v2_ptds); return memset_impl("cuMemsetD16_v2_ptds", d, v, 2, n, NULL, 1); }
FK_API(cuMemsetD32_v2, (CUdeviceptr d, unsigned int v, size_t n))
{ FK_COUNT(cuMemsetD32_v2); return memset_impl("cuMemsetD32_v2", d, v, 4, n, NULL, 0); }
FK_API(cuMemsetD32_v2_ptds, (CUdeviceptr d, unsigned int v, size_t n))
{ FK_COUNT(cuMemsetD32_v2_ptds); return memset_impl("cuMemsetD32_v2_ptds", d, v, 4, n, NULL, 1); }
FK_API(cuMemsetD8Async, (CUdeviceptr d, unsigned char v, size_t n, CUstream s))
{ FK_COUNT(cuMemsetD8Async); return memset_impl("cuMemsetD8Async", d, v, 1, n, s, 0); }
FK_API(cuMemsetD8Async_ptsz, (CUdeviceptr d, unsigned char v, size_t n, CUstream s))
{ FK_COUNT(cuMemsetD8Async_ptsz); return memset_impl("cuMemsetD8Async_ptsz", d, v, 1, n, s, 1); }
FK_API(cuMemsetD16Async, (CUdeviceptr d, unsigned short v, size_t n, CUstream s))
{ FK_COUNT(cuMemsetD16Async); return memset_impl("cuMemsetD16Async", d, v, 2, n, s, 0); }
FK_API(cuMemsetD16Async_ptsz, (CUdeviceptr d, unsigned short v, size_t n, CUstream s))
{ FK_COUNT(cuMemsetD16Async_ptsz); return memset_impl("cuMemsetD16Async_ptsz", d, v, 2, n, s, 1); }
FK_API(cuMemsetD32Async, (CUdeviceptr d, unsigned int v, size_t n, CUstream s))
{ FK_COUNT(cuMemsetD32Async); return memset_impl("cuMemsetD32Async", d, v, 4, n, s, 0); }
FK_API(cuMemsetD32Async_ptsz, (CUdeviceptr d, unsigned int v, size_t n, CUstream s))
{ FK_COUNT(cuMemsetD32Async_ptsz); return memset_impl("cuMemsetD32Async_ptsz", d, v, 4, n, s, 1); }
