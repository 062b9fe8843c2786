/* fk_streams.c: streams, ordering, workers, events, host functions, stream capture and graphs.
 *
 * Ordering model: every stream counts operations enqueued (enq_seq) and completed (done_seq);
 * a position is a seq number.  An op carries dependencies (stream, position) fixed at enqueue:
 *  - legacy stream op: every blocking stream of the context (user streams without
 *    CU_STREAM_NON_BLOCKING and the per-thread default streams) at its current position;
 *  - blocking stream op: the legacy stream at its current position;
 *  - non-blocking stream op: nothing beyond its own stream order;
 *  - cuStreamWaitEvent: a wait op depending on the event's recorded position.
 * One worker thread per stream with pending work executes ops in order, each after its delay.
 * The same edges, and what the host saw complete, give each op its vector clock (fk_races.c). */
#include "fk_internal.h"
#include "fakecuda.h"
#include <stdlib.h>
#include <string.h>

static fk_stream *live_streams;      /* user stream handles */
static fk_event *live_events;
static fk_event *dead_events;
static struct CUgraph_st *live_graphs;
static struct CUgraphExec_st *live_execs;
fk_capture *fk_captures;
static uint64_t next_stream_id = 3;   /* 0..2 read as the special handles */
static uint64_t next_capture_id = 1;

/* ---- ops ---- */
fk_op *fk_op_new(int kind, const char *what)
{
    fk_op *op = fk_calloc(1, sizeof *op);
    if (!op) fk_fatal("out of memory");
    op->kind = kind;
    op->what = what;
    return op;
}

void fk_op_free(fk_op *op)
{
    if (!op) return;
    fk_free(op->deps);
    fk_vc_free(&op->vc);
    fk_staged_free(op->staged);
    fk_free(op);
}

static fk_op *op_clone(const fk_op *t)
{
    fk_op *op = fk_op_new(t->kind, t->what);
    *op = *t;
    op->next = NULL;
    op->deps = NULL;
    op->ndeps = op->capdeps = 0;
    op->vc = (fk_vc){ 0 };
    op->staged = NULL;
    op->check_src = 0;
    op->ck_prev = op->ck_next = NULL;
    op->src.reg = op->dst.reg = NULL;
    if (t->staged) {
        size_t n = t->w * t->h * t->d;
        op->staged = fk_staged_alloc(n ? n : 1);
        if (!op->staged) fk_fatal("out of memory");
        memcpy(op->staged, t->staged, n);
        op->src.addr = op->staged;
    }
    return op;
}

static void op_add_dep(fk_op *op, fk_stream *s, uint64_t seq)
{
    if (s->done_seq >= seq) return;
    if (op->ndeps == op->capdeps) {
        int nc = op->capdeps ? op->capdeps * 2 : 4;
        fk_dep *nd = fk_realloc(op->deps, (size_t)nc * sizeof *nd);
        if (!nd) fk_fatal("out of memory");
        op->deps = nd;
        op->capdeps = nc;
    }
    op->deps[op->ndeps++] = (fk_dep){ s, seq };
}

static int is_blocking(const fk_stream *s)
{
    return s->kind != FK_S_LEGACY && !(s->flags & CU_STREAM_NON_BLOCKING);
}

/* The implicit legacy-stream dependencies of new work on s; vc (if not NULL) joins the clocks
 * of those positions, completed ones too: the order holds whether or not they are done. */
static void collect_deps(fk_stream *s, fk_op *op, fk_vc *vc)
{
    if (s->kind == FK_S_LEGACY) {
        for (fk_stream *o = s->ctx->streams; o; o = o->ctx_next)
            if (is_blocking(o)) {
                op_add_dep(op, o, o->enq_seq);
                if (vc) fk_vc_join(vc, &o->tail_vc);
            }
    } else if (is_blocking(s) && s->ctx->legacy) {
        op_add_dep(op, s->ctx->legacy, s->ctx->legacy->enq_seq);
        if (vc) fk_vc_join(vc, &s->ctx->legacy->tail_vc);
    }
}

static int deps_done(const fk_op *op)
{
    for (int i = 0; i < op->ndeps; i++)
        if (op->deps[i].s->done_seq < op->deps[i].seq) return 0;
    return 1;
}

/* ---- pending source checksums (violation 3) ---- */
static fk_op *ck_head;

void fk_ck_add(fk_op *op)
{
    op->check_src = 1;
    op->ck_prev = NULL;
    op->ck_next = ck_head;
    if (ck_head) ck_head->ck_prev = op;
    ck_head = op;
}

void fk_ck_remove(fk_op *op)
{
    if (!op->check_src) return;
    if (op->ck_prev) op->ck_prev->ck_next = op->ck_next; else ck_head = op->ck_next;
    if (op->ck_next) op->ck_next->ck_prev = op->ck_prev;
    op->check_src = 0;
}

/* Stream-ordered writes to host memory (a DMA, a host function) legitimately change the source
 * of later pending copies: take a fresh checksum so only other writes are flagged. */
static void ck_refresh(uintptr_t a, size_t n, int all)
{
    for (fk_op *o = ck_head; o; o = o->ck_next) {
        uintptr_t sa = (uintptr_t)o->src.addr;
        size_t span = (o->d - 1) * o->src.slice + (o->h - 1) * o->src.pitch + o->w;
        if (all || (sa < a + n && a < sa + span))
            o->src_sum = fk_checksum_end(&o->src, o->w, o->h, o->d);
    }
}

/* ---- workers ---- */
static void exec_op(fk_op *op)
{
    switch (op->kind) {
    case OP_COPY:
        fk_race_exec(op);
        fk_exec_copy(op);
        if (!op->dst.isdev) {
            size_t span = (op->d - 1) * op->dst.slice + (op->h - 1) * op->dst.pitch + op->w;
            ck_refresh((uintptr_t)op->dst.addr, span, 0);
        }
        break;
    case OP_MEMSET:
        fk_race_exec(op);
        fk_exec_memset(op);
        break;
    case OP_HOSTFN:
        /* Host code runs now, after everything ordered before this op: whatever it (or a
         * thread it wakes) submits is ordered after that work. */
        fk_host_observe(&op->vc);
        op->s->hostfn_running = 1;
        pthread_mutex_unlock(&fk_mu);
        op->fn(op->ud);
        pthread_mutex_lock(&fk_mu);
        op->s->hostfn_running = 0;
        ck_refresh(0, 0, 1);
        break;
    case OP_EVENT:
        if (op->ev->gen == op->ev_gen) {
            op->ev->time_ns = fk_now_ns();
            op->ev->timed = 1;
        }
        break;
    default:
        break;
    }
}

static void *worker_main(void *arg)
{
    fk_stream *s = arg;
    pthread_mutex_lock(&fk_mu);
    fk_op *op;
    while ((op = s->head)) {
        while (!deps_done(op)) pthread_cond_wait(&fk_cv, &fk_mu);
        if (op->delay_us) {
            pthread_mutex_unlock(&fk_mu);
            fk_sleep_us(op->delay_us);
            pthread_mutex_lock(&fk_mu);
        }
        exec_op(op);
        s->head = op->next;
        if (!s->head) s->tail = NULL;
        s->done_seq = op->seq;
        fk_ck_remove(op);
        fk_op_release_regs(op);
        fk_op_free(op);
        pthread_cond_broadcast(&fk_cv);
    }
    s->worker = 0;
    pthread_mutex_unlock(&fk_mu);
    return NULL;
}

CUresult fk_submit(fk_stream *s, fk_op *op)
{
    collect_deps(s, op, &op->vc);
    op->s = s;
    op->seq = ++s->enq_seq;
    /* Its clock: what it already holds (an event it waits for), the implicit dependencies, the
     * stream's previous op, what the host has seen complete, and itself. */
    fk_vc_join(&op->vc, &s->tail_vc);
    fk_vc_join_host(&op->vc);
    fk_vc_set(&op->vc, s->id, op->seq);
    fk_vc_assign(&s->tail_vc, &op->vc);
    op->next = NULL;
    if (s->tail) s->tail->next = op; else s->head = op;
    s->tail = op;
    if (!s->worker) {
        pthread_attr_t at;
        pthread_t th;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&th, &at, worker_main, s)) fk_fatal("cannot start a stream worker");
        pthread_attr_destroy(&at);
        s->worker = 1;
    }
    return CUDA_SUCCESS;
}

/* The clock of position seq of s, while it is the last enqueued or still queued. */
static void position_vc(fk_stream *s, uint64_t seq, fk_vc *out)
{
    if (seq == s->enq_seq) { fk_vc_assign(out, &s->tail_vc); return; }
    for (fk_op *op = s->head; op; op = op->next)
        if (op->seq == seq) { fk_vc_assign(out, &op->vc); return; }
}

/* The host sees position seq complete: it learns that position's clock (a caller waiting for a
 * position already completed and no longer the last, an event's, joins the clock it knows). */
void fk_wait_pos(fk_stream *s, uint64_t seq)
{
    fk_vc seen = { 0 };
    position_vc(s, seq, &seen);
    while (s->done_seq < seq) pthread_cond_wait(&fk_cv, &fk_mu);
    fk_host_observe(&seen);
    fk_vc_free(&seen);
}

void fk_wait_stream_and_deps(fk_stream *s)
{
    fk_op tmp;
    memset(&tmp, 0, sizeof tmp);
    fk_vc seen = { 0 };
    collect_deps(s, &tmp, &seen);
    fk_vc_join(&seen, &s->tail_vc);
    op_add_dep(&tmp, s, s->enq_seq);
    for (int i = 0; i < tmp.ndeps; i++) fk_wait_pos(tmp.deps[i].s, tmp.deps[i].seq);
    fk_free(tmp.deps);
    fk_host_observe(&seen);
    fk_vc_free(&seen);
}

/* A pageable source is snapshot under the lock, so no host function can start during the
 * snapshot; one already running (it runs unlocked) could still be rewriting the source and
 * leave a mix of old and new bytes.  The real driver either stages at the call (all old) or
 * waits for the stream first (all new): wait for it to finish. */
void fk_wait_hostfns_before(fk_stream *s)
{
    for (;;) {
        fk_op tmp;
        memset(&tmp, 0, sizeof tmp);
        collect_deps(s, &tmp, NULL);
        int busy = s->hostfn_running;
        for (int i = 0; !busy && i < tmp.ndeps; i++) busy = tmp.deps[i].s->hostfn_running;
        fk_free(tmp.deps);
        if (!busy) return;
        pthread_cond_wait(&fk_cv, &fk_mu);
    }
}

static int stream_and_deps_done(fk_stream *s)
{
    if (s->done_seq < s->enq_seq) return 0;
    if (s->kind == FK_S_LEGACY) {
        for (fk_stream *o = s->ctx->streams; o; o = o->ctx_next)
            if (is_blocking(o) && o->done_seq < o->enq_seq) return 0;
    }
    /* Other streams' pending ops already carry their legacy dependency: an idle stream is idle. */
    return 1;
}

void fk_wait_ctx_idle(fk_ctx *c)
{
    for (fk_stream *o = c->streams; o; o = o->ctx_next) fk_wait_pos(o, o->enq_seq);
}

void fk_wait_all_idle(void)
{
    for (int i = 0; i < fk_ndev; i++) fk_wait_ctx_idle(&fk_ctxs[i]);
}

/* ---- streams ---- */
fk_stream *fk_stream_new(fk_ctx *c, int kind, unsigned flags, int prio)
{
    fk_stream *s = fk_calloc(1, sizeof *s);
    if (!s) return NULL;
    s->ctx = c;
    s->kind = kind;
    s->flags = flags;
    s->prio = prio;
    s->id = next_stream_id++;
    s->ctx_next = c->streams;
    c->streams = s;
    s->self = s;
    if (kind == FK_S_USER) HASH_ADD(hh, live_streams, self, sizeof(void *), s);
    return s;
}

CUresult fk_resolve_stream(CUstream h, int ptds, fk_stream **out)
{
    if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
        fk_ctx *c = fk_cur_ctx();
        if (!c) return CUDA_ERROR_INVALID_CONTEXT;
        if (h == CU_STREAM_PER_THREAD || (h == NULL && ptds)) {
            fk_tls_t *t = fk_tls();
            if (!t->ptds[c->dev]) {
                t->ptds[c->dev] = fk_stream_new(c, FK_S_PTDS, 0, 0);
                if (!t->ptds[c->dev]) return CUDA_ERROR_OUT_OF_MEMORY;
            }
            *out = t->ptds[c->dev];
        } else {
            *out = c->legacy;
        }
        return CUDA_SUCCESS;
    }
    fk_stream *s = NULL;
    HASH_FIND(hh, live_streams, &h, sizeof h, s);
    if (!s) return CUDA_ERROR_INVALID_HANDLE;
    *out = s;
    return CUDA_SUCCESS;
}

/* ---- capture rules ---- */
static void invalidate(fk_capture *c)
{
    if (c && !c->invalidated) c->invalidated = 1;
}

static void graph_append(struct CUgraph_st *g, fk_op *op)
{
    if (g->n == g->cap) {
        size_t nc = g->cap ? g->cap * 2 : 8;
        fk_op **nn = fk_realloc(g->nodes, nc * sizeof *nn);
        if (!nn) fk_fatal("out of memory");
        g->nodes = nn;
        g->cap = nc;
    }
    g->nodes[g->n++] = op;
}

CUresult fk_capture_gate(fk_stream *s, fk_op *op, int sync_api)
{
    if (s->cap) {
        if (s->cap->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
        if (sync_api || !op) {
            invalidate(s->cap);
            return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        }
        graph_append(s->cap->graph, op);
        return FK_CAPTURED;
    }
    if (s->kind == FK_S_LEGACY) {
        /* Legacy work would have to wait for a capturing blocking stream: not capturable. */
        CUresult r = CUDA_SUCCESS;
        for (fk_stream *o = s->ctx->streams; o; o = o->ctx_next)
            if (is_blocking(o) && o->cap && !o->cap->invalidated) {
                invalidate(o->cap);
                r = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
            }
        return r;
    }
    return CUDA_SUCCESS;
}

/* "Potentially unsafe" calls (sync copies, syncs, queries, pinning, allocation) during capture.
 * A thread in RELAXED mode may always make them; a thread in GLOBAL mode is stopped by any
 * GLOBAL capture in the process; any non-relaxed thread is stopped by its own captures. */
CUresult fk_unsafe_call_check(void)
{
    fk_tls_t *t = fk_tls();
    if (t->capmode == CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_SUCCESS;
    CUresult r = CUDA_SUCCESS;
    for (fk_capture *c = fk_captures; c; c = c->next) {
        if (c->invalidated || c->mode == CU_STREAM_CAPTURE_MODE_RELAXED) continue;
        if ((c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL && t->capmode == CU_STREAM_CAPTURE_MODE_GLOBAL) ||
            c->thread == (void *)t) {
            invalidate(c);
            r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        }
    }
    return r;
}

/* ---- stream API ---- */
static CUresult stream_create(CUstream *ps, unsigned flags, int prio)
{
    FK_NEED_INIT();
    fk_ctx *c = fk_cur_ctx();
    if (!c) return CUDA_ERROR_INVALID_CONTEXT;
    if (!ps || (flags & ~(unsigned)CU_STREAM_NON_BLOCKING)) return CUDA_ERROR_INVALID_VALUE;
    if (prio < -5) prio = -5;     /* range reported by H100-class devices: [-5, 0] */
    if (prio > 0) prio = 0;
    pthread_mutex_lock(&fk_mu);
    fk_stream *s = fk_stream_new(c, FK_S_USER, flags, prio);
    pthread_mutex_unlock(&fk_mu);
    if (!s) return CUDA_ERROR_OUT_OF_MEMORY;
    *ps = s;
    return CUDA_SUCCESS;
}

FK_API(cuStreamCreate, (CUstream *ps, unsigned int flags))
{
    FK_COUNT(cuStreamCreate);
    return stream_create(ps, flags, 0);
}

FK_API(cuStreamCreateWithPriority, (CUstream *ps, unsigned int flags, int prio))
{
    FK_COUNT(cuStreamCreateWithPriority);
    return stream_create(ps, flags, prio);
}

FK_API(cuStreamDestroy_v2, (CUstream h))
{
    FK_COUNT(cuStreamDestroy_v2);
    FK_NEED_INIT();
    pthread_mutex_lock(&fk_mu);
    fk_stream *s = NULL;
    HASH_FIND(hh, live_streams, &h, sizeof h, s);
    CUresult r = CUDA_ERROR_INVALID_HANDLE;
    if (s) {
        /* Queued work still completes; the object stays (unreachable) so that positions held by
         * events and dependencies remain valid. */
        HASH_DELETE(hh, live_streams, s);
        if (s->cap) invalidate(s->cap);
        s->destroyed = 1;
        r = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&fk_mu);
    return r;
}

static CUresult stream_sync(CUstream h, int ptds)
{
    FK_NEED_INIT();
    pthread_mutex_lock(&fk_mu);
    fk_stream *s;
    CUresult r = fk_resolve_stream(h, ptds, &s);
    if (!r && s->cap) {
        invalidate(s->cap);
        r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    if (!r) r = fk_unsafe_call_check();
    if (!r) {
        if (s->kind == FK_S_LEGACY) fk_wait_stream_and_deps(s);
        else fk_wait_pos(s, s->enq_seq);
    }
    pthread_mutex_unlock(&fk_mu);
    return r;
}

FK_API(cuStreamSynchronize, (CUstream h)) { FK_COUNT(cuStreamSynchronize); return stream_sync(h, 0); }
FK_API(cuStreamSynchronize_ptsz, (CUstream h)) { FK_COUNT(cuStreamSynchronize_ptsz); return stream_sync(h, 1); }

static CUresult stream_query(CUstream h, int ptds)
{
    FK_NEED_INIT();
    pthread_mutex_lock(&fk_mu);
    fk_stream *s;
    CUresult r = fk_resolve_stream(h, ptds, &s);
    if (!r && s->cap) {
        invalidate(s->cap);
        r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    if (!r) r = fk_unsafe_call_check();
    if (!r && !stream_and_deps_done(s)) r = CUDA_ERROR_NOT_READY;
    if (!r) {
        /* Complete, as the host now knows: the stream's work and, for the legacy stream, the
         * blocking streams' work (what stream_and_deps_done looked at). */
        fk_host_observe(&s->tail_vc);
        if (s->kind == FK_S_LEGACY)
            for (fk_stream *o = s->ctx->streams; o; o = o->ctx_next)
                if (is_blocking(o)) fk_host_observe(&o->tail_vc);
    }
    pthread_mutex_unlock(&fk_mu);
    return r;
}

FK_API(cuStreamQuery, (CUstream h)) { FK_COUNT(cuStreamQuery); return stream_query(h, 0); }
FK_API(cuStreamQuery_ptsz, (CUstream h)) { FK_COUNT(cuStreamQuery_ptsz); return stream_query(h, 1); }

static CUresult stream_get(CUstream h, int ptds, fk_stream **s)
{
    FK_NEED_INIT();
    pthread_mutex_lock(&fk_mu);
    CUresult r = fk_resolve_stream(h, ptds, s);
    pthread_mutex_unlock(&fk_mu);
    return r;
}

FK_API(cuStreamGetFlags, (CUstream h, unsigned int *f))
{
    FK_COUNT(cuStreamGetFlags);
    fk_stream *s;
    if (!f) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = stream_get(h, 0, &s);
    if (!r) *f = s->flags;
    return r;
}

FK_API(cuStreamGetFlags_ptsz, (CUstream h, unsigned int *f))
{
    FK_COUNT(cuStreamGetFlags_ptsz);
    fk_stream *s;
    if (!f) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = stream_get(h, 1, &s);
    if (!r) *f = s->flags;
    return r;
}

FK_API(cuStreamGetPriority, (CUstream h, int *p))
{
    FK_COUNT(cuStreamGetPriority);
    fk_stream *s;
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = stream_get(h, 0, &s);
    if (!r) *p = s->prio;
    return r;
}

FK_API(cuStreamGetPriority_ptsz, (CUstream h, int *p))
{
    FK_COUNT(cuStreamGetPriority_ptsz);
    fk_stream *s;
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = stream_get(h, 1, &s);
    if (!r) *p = s->prio;
    return r;
}

FK_API(cuStreamGetCtx, (CUstream h, CUcontext *pc))
{
    FK_COUNT(cuStreamGetCtx);
    fk_stream *s;
    if (!pc) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = stream_get(h, 0, &s);
    if (!r) *pc = s->ctx;
    return r;
}

FK_API(cuStreamGetCtx_ptsz, (CUstream h, CUcontext *pc))
{
    FK_COUNT(cuStreamGetCtx_ptsz);
    fk_stream *s;
    if (!pc) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = stream_get(h, 1, &s);
    if (!r) *pc = s->ctx;
    return r;
}

/* ---- events ---- */
static fk_event *event_find(CUevent h)
{
    fk_event *e = NULL;
    if (h) HASH_FIND(hh, live_events, &h, sizeof h, e);
    return e;
}

FK_API(cuEventCreate, (CUevent *pe, unsigned int flags))
{
    FK_COUNT(cuEventCreate);
    FK_NEED_INIT();
    fk_ctx *c = fk_cur_ctx();
    if (!c) return CUDA_ERROR_INVALID_CONTEXT;
    unsigned ok = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
    if (!pe || (flags & ~ok)) return CUDA_ERROR_INVALID_VALUE;
    if ((flags & CU_EVENT_INTERPROCESS) && !(flags & CU_EVENT_DISABLE_TIMING)) return CUDA_ERROR_INVALID_VALUE;
    fk_event *e = fk_calloc(1, sizeof *e);
    if (!e) return CUDA_ERROR_OUT_OF_MEMORY;
    e->ctx = c;
    e->flags = flags;
    e->self = e;
    pthread_mutex_lock(&fk_mu);
    HASH_ADD(hh, live_events, self, sizeof(void *), e);
    pthread_mutex_unlock(&fk_mu);
    *pe = e;
    return CUDA_SUCCESS;
}

FK_API(cuEventDestroy_v2, (CUevent h))
{
    FK_COUNT(cuEventDestroy_v2);
    FK_NEED_INIT();
    pthread_mutex_lock(&fk_mu);
    fk_event *e = event_find(h);
    /* Kept allocated: queued record ops and graphs may still point at it. */
    if (e) {
        HASH_DELETE(hh, live_events, e);
        e->dead_next = dead_events;
        dead_events = e;
    }
    pthread_mutex_unlock(&fk_mu);
    return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

/* Submit an event-record op (lock held): the event now names this position of s. */
static void event_submit(fk_event *e, fk_stream *s, fk_op *op)
{
    op->ev = e;
    op->ev_gen = ++e->gen;
    fk_submit(s, op);
    e->s = s;
    e->seq = op->seq;
    fk_vc_assign(&e->vc, &op->vc);
    e->recorded = 1;
    e->timed = 0;
    e->cap = NULL;
}

static CUresult event_record(CUevent h, CUstream hs, int ptds)
{
    FK_NEED_INIT();
    pthread_mutex_lock(&fk_mu);
    fk_stream *s;
    fk_event *e = event_find(h);
    CUresult r = e ? fk_resolve_stream(hs, ptds, &s) : CUDA_ERROR_INVALID_HANDLE;
    if (r) goto out;
    fk_op *op = fk_op_new(OP_EVENT, "cuEventRecord");
    op->ev = e;
    r = fk_capture_gate(s, op, 0);
    if (r == FK_CAPTURED) {
        /* Recorded inside the capture: a later cuStreamWaitEvent joins the capture. */
        e->cap = s->cap;
        r = CUDA_SUCCESS;
        goto out;
    }
    if (r) { fk_op_free(op); goto out; }
    event_submit(e, s, op);
out:
    pthread_mutex_unlock(&fk_mu);
    return r;
}

FK_API(cuEventRecord, (CUevent h, CUstream s)) { FK_COUNT(cuEventRecord); return event_record(h, s, 0); }
FK_API(cuEventRecord_ptsz, (CUevent h, CUstream s)) { FK_COUNT(cuEventRecord_ptsz); return event_record(h, s, 1); }
FK_API(cuEventRecordWithFlags, (CUevent h, CUstream s, unsigned int flags))
{
    FK_COUNT(cuEventRecordWithFlags);
    if (flags & ~(unsigned)CU_EVENT_RECORD_EXTERNAL) return CUDA_ERROR_INVALID_VALUE;
    return event_record(h, s, 0);
}
FK_API(cuEventRecordWithFlags_ptsz, (CUevent h, CUstream s, unsigned int flags))
{
    FK_COUNT(cuEventRecordWithFlags_ptsz);
    if (flags & ~(unsigned)CU_EVENT_RECORD_EXTERNAL) return CUDA_ERROR_INVALID_VALUE;
    return event_record(h, s, 1);
}

FK_API(cuEventQuery, (CUevent h))
{
    FK_COUNT(cuEventQuery);
    FK_NEED_INIT();
    pthread_mutex_lock(&fk_mu);
    fk_event *e = event_find(h);
    CUresult r = e ? fk_unsafe_call_check() : CUDA_ERROR_INVALID_HANDLE;
    if (!r && e->cap) r = CUDA_ERROR_CAPTURED_EVENT;
    if (!r && e->recorded && e->s->done_seq < e->seq) r = CUDA_ERROR_NOT_READY;
    if (!r && e->recorded) fk_host_observe(&e->vc);
    pthread_mutex_unlock(&fk_mu);
    return r;
}

FK_API(cuEventSynchronize, (CUevent h))
{
    FK_COUNT(cuEventSynchronize);
    FK_NEED_INIT();
    pthread_mutex_lock(&fk_mu);
    fk_event *e = event_find(h);
    CUresult r = e ? fk_unsafe_call_check() : CUDA_ERROR_INVALID_HANDLE;
    if (!r && e->cap) r = CUDA_ERROR_CAPTURED_EVENT;
    if (!r && e->recorded) {
        /* The clock of the record waited for: another thread may record the event again while
         * this one waits. */
        fk_vc seen = { 0 };
        fk_vc_assign(&seen, &e->vc);
        fk_wait_pos(e->s, e->seq);
        fk_host_observe(&seen);
        fk_vc_free(&seen);
    }
    pthread_mutex_unlock(&fk_mu);
    return r;
}

static CUresult elapsed(float *ms, CUevent a, CUevent b)
{
    FK_NEED_INIT();
    if (!ms) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk_mu);
    fk_event *s = event_find(a), *e = event_find(b);
    CUresult r = CUDA_SUCCESS;
    if (!s || !e) r = CUDA_ERROR_INVALID_HANDLE;
    else if ((s->flags | e->flags) & CU_EVENT_DISABLE_TIMING) r = CUDA_ERROR_INVALID_HANDLE;
    else if (!s->recorded || !e->recorded) r = CUDA_ERROR_INVALID_HANDLE;
    else if (s->s->done_seq < s->seq || e->s->done_seq < e->seq || !s->timed || !e->timed) r = CUDA_ERROR_NOT_READY;
    else {
        *ms = (float)((double)((int64_t)(e->time_ns - s->time_ns)) / 1e6);
        fk_host_observe(&s->vc);     /* both recorded positions are known complete */
        fk_host_observe(&e->vc);
    }
    pthread_mutex_unlock(&fk_mu);
    return r;
}

FK_API(cuEventElapsedTime, (float *ms, CUevent a, CUevent b)) { FK_COUNT(cuEventElapsedTime); return elapsed(ms, a, b); }
FK_API(cuEventElapsedTime_v2, (float *ms, CUevent a, CUevent b)) { FK_COUNT(cuEventElapsedTime_v2); return elapsed(ms, a, b); }

static CUresult stream_wait_event(CUstream hs, CUevent h, unsigned flags, int ptds)
{
    FK_NEED_INIT();
    if (flags & ~(unsigned)CU_EVENT_WAIT_EXTERNAL) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk_mu);
    fk_stream *s;
    fk_event *e = event_find(h);
    CUresult r = e ? fk_resolve_stream(hs, ptds, &s) : CUDA_ERROR_INVALID_HANDLE;
    if (r) goto out;
    if (e->cap) {
        /* Event from a capture: this stream joins that capture (fork). */
        if (e->cap->invalidated) r = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
        else if (s->cap && s->cap != e->cap) { invalidate(s->cap); r = CUDA_ERROR_STREAM_CAPTURE_MERGE; }
        else if (s->kind == FK_S_LEGACY) { invalidate(e->cap); r = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT; }
        else s->cap = e->cap;
        goto out;
    }
    if (s->cap) {
        /* Captured work cannot depend on uncaptured work. */
        if (!e->recorded) goto out;
        invalidate(s->cap);
        r = CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
        goto out;
    }
    if (!e->recorded) goto out;
    fk_op *op = fk_op_new(OP_WAIT, "cuStreamWaitEvent");
    r = fk_capture_gate(s, op, 0);
    if (r) { fk_op_free(op); goto out; }
    op_add_dep(op, e->s, e->seq);
    fk_vc_join(&op->vc, &e->vc);
    fk_submit(s, op);
out:
    pthread_mutex_unlock(&fk_mu);
    return r;
}

FK_API(cuStreamWaitEvent, (CUstream s, CUevent e, unsigned int f)) { FK_COUNT(cuStreamWaitEvent); return stream_wait_event(s, e, f, 0); }
FK_API(cuStreamWaitEvent_ptsz, (CUstream s, CUevent e, unsigned int f)) { FK_COUNT(cuStreamWaitEvent_ptsz); return stream_wait_event(s, e, f, 1); }

/* ---- host functions and the test "kernel" ---- */
static CUresult launch_host_func(CUstream hs, CUhostFn fn, void *ud, int ptds)
{
    FK_NEED_INIT();
    if (!fn) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk_mu);
    fk_stream *s;
    CUresult r = fk_resolve_stream(hs, ptds, &s);
    if (!r) {
        fk_op *op = fk_op_new(OP_HOSTFN, "cuLaunchHostFunc");
        op->fn = fn;
        op->ud = ud;
        op->delay_us = __atomic_load_n(&fk_delay_us, __ATOMIC_RELAXED);
        r = fk_capture_gate(s, op, 0);
        if (r == FK_CAPTURED) r = CUDA_SUCCESS;
        else if (r) fk_op_free(op);
        else fk_submit(s, op);
    }
    pthread_mutex_unlock(&fk_mu);
    return r;
}

FK_API(cuLaunchHostFunc, (CUstream s, CUhostFn fn, void *ud)) { FK_COUNT(cuLaunchHostFunc); return launch_host_func(s, fn, ud, 0); }
FK_API(cuLaunchHostFunc_ptsz, (CUstream s, CUhostFn fn, void *ud)) { FK_COUNT(cuLaunchHostFunc_ptsz); return launch_host_func(s, fn, ud, 1); }

static CUresult launch_write(CUstream hs, CUdeviceptr dst, int value, size_t n, unsigned delay_us, int ptds)
{
    FK_NEED_INIT();
    pthread_mutex_lock(&fk_mu);
    fk_stream *s;
    CUresult r = fk_resolve_stream(hs, ptds, &s);
    if (r) goto out;
    char *b = NULL;
    if (n && !(b = fk_dev_resolve((uintptr_t)dst, n, NULL))) { r = CUDA_ERROR_INVALID_VALUE; goto out; }
    fk_op *op = fk_op_new(OP_MEMSET, "fakecuda_launch_write");
    op->dst = (fk_end){ .isdev = 1, .addr = (char *)(uintptr_t)dst, .backing = b, .pitch = n, .slice = n };
    op->w = n;
    op->h = op->d = 1;
    op->elem = 1;
    op->val = (uint32_t)(value & 0xff);
    op->delay_us = delay_us;
    r = fk_capture_gate(s, op, 0);
    if (r == FK_CAPTURED) r = CUDA_SUCCESS;
    else if (r) fk_op_free(op);
    else fk_submit(s, op);
out:
    pthread_mutex_unlock(&fk_mu);
    return r;
}

FK_PUBLIC CUresult fakecuda_launch_write(CUstream s, CUdeviceptr dst, int value, size_t n, unsigned delay_us)
{
    return launch_write(s, dst, value, n, delay_us, 0);
}

FK_PUBLIC CUresult fakecuda_launch_write_ptsz(CUstream s, CUdeviceptr dst, int value, size_t n, unsigned delay_us)
{
    return launch_write(s, dst, value, n, delay_us, 1);
}

/* ---- capture API ---- */
static CUresult begin_capture(CUstream hs, CUstreamCaptureMode mode, int ptds)
{
    FK_NEED_INIT();
    if (mode != CU_STREAM_CAPTURE_MODE_GLOBAL && mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
        mode != CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk_mu);
    fk_stream *s;
    CUresult r = fk_resolve_stream(hs, ptds, &s);
    if (r) goto out;
    if (s->kind == FK_S_LEGACY) { r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; goto out; }
    if (s->cap) { r = CUDA_ERROR_ILLEGAL_STATE; goto out; }
    fk_capture *c = fk_calloc(1, sizeof *c);
    struct CUgraph_st *g = fk_calloc(1, sizeof *g);
    if (!c || !g) { fk_free(c); fk_free(g); r = CUDA_ERROR_OUT_OF_MEMORY; goto out; }
    c->id = next_capture_id++;
    c->mode = mode;
    c->thread = fk_tls();
    c->origin = s;
    c->graph = g;
    c->next = fk_captures;
    fk_captures = c;
    s->cap = c;
out:
    pthread_mutex_unlock(&fk_mu);
    return r;
}

FK_API(cuStreamBeginCapture, (CUstream s)) { FK_COUNT(cuStreamBeginCapture); return begin_capture(s, CU_STREAM_CAPTURE_MODE_GLOBAL, 0); }
FK_API(cuStreamBeginCapture_ptsz, (CUstream s)) { FK_COUNT(cuStreamBeginCapture_ptsz); return begin_capture(s, CU_STREAM_CAPTURE_MODE_GLOBAL, 1); }
FK_API(cuStreamBeginCapture_v2, (CUstream s, CUstreamCaptureMode m)) { FK_COUNT(cuStreamBeginCapture_v2); return begin_capture(s, m, 0); }
FK_API(cuStreamBeginCapture_v2_ptsz, (CUstream s, CUstreamCaptureMode m)) { FK_COUNT(cuStreamBeginCapture_v2_ptsz); return begin_capture(s, m, 1); }

static void graph_free_nodes(fk_op **nodes, size_t n)
{
    for (size_t i = 0; i < n; i++) fk_op_free(nodes[i]);
    fk_free(nodes);
}

static CUresult end_capture(CUstream hs, CUgraph *pg, int ptds)
{
    FK_NEED_INIT();
    if (!pg) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk_mu);
    fk_stream *s;
    CUresult r = fk_resolve_stream(hs, ptds, &s);
    if (r) goto out;
    fk_capture *c = s->cap;
    if (!c) { r = CUDA_ERROR_ILLEGAL_STATE; goto out; }
    if (c->origin != s) { invalidate(c); r = CUDA_ERROR_STREAM_CAPTURE_UNMATCHED; goto out; }
    if (c->mode != CU_STREAM_CAPTURE_MODE_RELAXED && c->thread != (void *)fk_tls()) {
        r = CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
        goto out;
    }
    /* Every stream that joined the capture leaves it. */
    for (int d = 0; d < fk_ndev; d++)
        for (fk_stream *o = fk_ctxs[d].streams; o; o = o->ctx_next)
            if (o->cap == c) o->cap = NULL;
    for (fk_event *e = live_events; e; e = e->hh.next)
        if (e->cap == c) e->cap = NULL;
    fk_capture **pp = &fk_captures;
    while (*pp != c) pp = &(*pp)->next;
    *pp = c->next;
    struct CUgraph_st *g = c->graph;
    if (c->invalidated) {
        graph_free_nodes(g->nodes, g->n);
        fk_free(g);
        *pg = NULL;
        r = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    } else {
        g->self = g;
        HASH_ADD(hh, live_graphs, self, sizeof(void *), g);
        *pg = g;
    }
    fk_free(c);
out:
    pthread_mutex_unlock(&fk_mu);
    return r;
}

FK_API(cuStreamEndCapture, (CUstream s, CUgraph *g)) { FK_COUNT(cuStreamEndCapture); return end_capture(s, g, 0); }
FK_API(cuStreamEndCapture_ptsz, (CUstream s, CUgraph *g)) { FK_COUNT(cuStreamEndCapture_ptsz); return end_capture(s, g, 1); }

static CUresult capture_info(CUstream hs, int ptds, CUstreamCaptureStatus *st, cuuint64_t *id, CUgraph *g,
                             const CUgraphNode **deps, const CUgraphEdgeData **edges, size_t *ndeps)
{
    FK_NEED_INIT();
    if (!st) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk_mu);
    fk_stream *s;
    CUresult r = fk_resolve_stream(hs, ptds, &s);
    if (r) goto out;
    if (s->kind == FK_S_LEGACY) {
        for (fk_stream *o = s->ctx->streams; o; o = o->ctx_next)
            if (is_blocking(o) && o->cap) { r = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT; goto out; }
    }
    fk_capture *c = s->cap;
    *st = !c ? CU_STREAM_CAPTURE_STATUS_NONE
             : c->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    if (c) {
        if (id) *id = c->id;
        if (g) *g = c->graph;
        if (deps) *deps = NULL;     /* node dependencies are not modelled */
        if (edges) *edges = NULL;
        if (ndeps) *ndeps = 0;
    }
out:
    pthread_mutex_unlock(&fk_mu);
    return r;
}

FK_API(cuStreamIsCapturing, (CUstream s, CUstreamCaptureStatus *st))
{ FK_COUNT(cuStreamIsCapturing); return capture_info(s, 0, st, NULL, NULL, NULL, NULL, NULL); }
FK_API(cuStreamIsCapturing_ptsz, (CUstream s, CUstreamCaptureStatus *st))
{ FK_COUNT(cuStreamIsCapturing_ptsz); return capture_info(s, 1, st, NULL, NULL, NULL, NULL, NULL); }
FK_API(cuStreamGetCaptureInfo, (CUstream s, CUstreamCaptureStatus *st, cuuint64_t *id))
{ FK_COUNT(cuStreamGetCaptureInfo); return capture_info(s, 0, st, id, NULL, NULL, NULL, NULL); }
FK_API(cuStreamGetCaptureInfo_ptsz, (CUstream s, CUstreamCaptureStatus *st, cuuint64_t *id))
{ FK_COUNT(cuStreamGetCaptureInfo_ptsz); return capture_info(s, 1, st, id, NULL, NULL, NULL, NULL); }
FK_API(cuStreamGetCaptureInfo_v2, (CUstream s, CUstreamCaptureStatus *st, cuuint64_t *id, CUgraph *g,
                                   const CUgraphNode **deps, size_t *n))
{ FK_COUNT(cuStreamGetCaptureInfo_v2); return capture_info(s, 0, st, id, g, deps, NULL, n); }
FK_API(cuStreamGetCaptureInfo_v2_ptsz, (CUstream s, CUstreamCaptureStatus *st, cuuint64_t *id, CUgraph *g,
                                        const CUgraphNode **deps, size_t *n))
{ FK_COUNT(cuStreamGetCaptureInfo_v2_ptsz); return capture_info(s, 1, st, id, g, deps, NULL, n); }
FK_API(cuStreamGetCaptureInfo_v3, (CUstream s, CUstreamCaptureStatus *st, cuuint64_t *id, CUgraph *g,
                                   const CUgraphNode **deps, const CUgraphEdgeData **ed, size_t *n))
{ FK_COUNT(cuStreamGetCaptureInfo_v3); return capture_info(s, 0, st, id, g, deps, ed, n); }
FK_API(cuStreamGetCaptureInfo_v3_ptsz, (CUstream s, CUstreamCaptureStatus *st, cuuint64_t *id, CUgraph *g,
                                        const CUgraphNode **deps, const CUgraphEdgeData **ed, size_t *n))
{ FK_COUNT(cuStreamGetCaptureInfo_v3_ptsz); return capture_info(s, 1, st, id, g, deps, ed, n); }

FK_API(cuThreadExchangeStreamCaptureMode, (CUstreamCaptureMode *mode))
{
    FK_COUNT(cuThreadExchangeStreamCaptureMode);
    FK_NEED_INIT();
    if (!mode) return CUDA_ERROR_INVALID_VALUE;
    CUstreamCaptureMode m = *mode;
    if (m != CU_STREAM_CAPTURE_MODE_GLOBAL && m != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
        m != CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    fk_tls_t *t = fk_tls();
    *mode = t->capmode;
    t->capmode = m;
    return CUDA_SUCCESS;
}

/* ---- graphs: a captured graph is its nodes in capture order (a valid topological order);
 * a launch replays them in that order on the launch stream. ---- */
FK_API(cuGraphInstantiateWithFlags, (CUgraphExec *pe, CUgraph hg, unsigned long long flags))
{
    FK_COUNT(cuGraphInstantiateWithFlags);
    FK_NEED_INIT();
    if (!pe) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk_mu);
    struct CUgraph_st *g = NULL;
    CUresult r = CUDA_SUCCESS;
    if (hg) HASH_FIND(hh, live_graphs, &hg, sizeof hg, g);
    if (!g) { r = CUDA_ERROR_INVALID_VALUE; goto out; }
    struct CUgraphExec_st *x = fk_calloc(1, sizeof *x);
    if (!x) { r = CUDA_ERROR_OUT_OF_MEMORY; goto out; }
    x->nodes = fk_calloc(g->n ? g->n : 1, sizeof *x->nodes);
    if (!x->nodes) { fk_free(x); r = CUDA_ERROR_OUT_OF_MEMORY; goto out; }
    for (size_t i = 0; i < g->n; i++) x->nodes[i] = op_clone(g->nodes[i]);
    x->n = g->n;
    x->self = x;
    HASH_ADD(hh, live_execs, self, sizeof(void *), x);
    *pe = x;
out:
    pthread_mutex_unlock(&fk_mu);
    return r;
}

static CUresult graph_launch(CUgraphExec hx, CUstream hs, int ptds)
{
    FK_NEED_INIT();
    pthread_mutex_lock(&fk_mu);
    struct CUgraphExec_st *x = NULL;
    fk_stream *s;
    if (hx) HASH_FIND(hh, live_execs, &hx, sizeof hx, x);
    CUresult r = x ? fk_resolve_stream(hs, ptds, &s) : CUDA_ERROR_INVALID_VALUE;
    if (r) goto out;
    if (s->cap) { r = CUDA_ERROR_NOT_SUPPORTED; goto out; }   /* graph-in-capture: not modelled */
    r = fk_capture_gate(s, NULL, 0);
    if (r) goto out;
    for (size_t i = 0; i < x->n; i++) {
        fk_op *op = op_clone(x->nodes[i]);
        if (op->kind == OP_EVENT) { event_submit(op->ev, s, op); continue; }
        fk_prepare_graph_op(op);
        fk_submit(s, op);
    }
out:
    pthread_mutex_unlock(&fk_mu);
    return r;
}

FK_API(cuGraphLaunch, (CUgraphExec x, CUstream s)) { FK_COUNT(cuGraphLaunch); return graph_launch(x, s, 0); }
FK_API(cuGraphLaunch_ptsz, (CUgraphExec x, CUstream s)) { FK_COUNT(cuGraphLaunch_ptsz); return graph_launch(x, s, 1); }

FK_API(cuGraphDestroy, (CUgraph hg))
{
    FK_COUNT(cuGraphDestroy);
    FK_NEED_INIT();
    pthread_mutex_lock(&fk_mu);
    struct CUgraph_st *g = NULL;
    if (hg) HASH_FIND(hh, live_graphs, &hg, sizeof hg, g);
    if (g) {
        HASH_DELETE(hh, live_graphs, g);
        graph_free_nodes(g->nodes, g->n);
        fk_free(g);
    }
    pthread_mutex_unlock(&fk_mu);
    return g ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

FK_API(cuGraphExecDestroy, (CUgraphExec hx))
{
    FK_COUNT(cuGraphExecDestroy);
    FK_NEED_INIT();
    pthread_mutex_lock(&fk_mu);
    struct CUgraphExec_st *x = NULL;
    if (hx) HASH_FIND(hh, live_execs, &hx, sizeof hx, x);
    if (x) {
        /* Launched work holds its own clones, so the exec can go at once. */
        HASH_DELETE(hh, live_execs, x);
        graph_free_nodes(x->nodes, x->n);
        fk_free(x);
    }
    pthread_mutex_unlock(&fk_mu);
    return x ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
