/* fk_races.c: device memory races between streams, found by happens-before, not by timing.
 *
 * Every op gets a vector clock at submission (fk_submit): for each stream, the last position
 * of it that happens before the op, through stream order, the legacy stream's implicit
 * dependencies, cuStreamWaitEvent, and what the host had seen complete when it submitted the
 * op.  The host's knowledge is one clock for the whole process (every host thread), grown
 * whenever a call sees work complete: were it per thread, a program that hands results from
 * one thread to another in ways the driver cannot see would be reported falsely.
 *
 * When an op runs, each device range it reads or writes is checked against the accesses
 * recorded before it: one by another stream, overlapping, one of the two a write, whose
 * position the running op's clock does not cover, is a race, whichever of the two the timing
 * made run first (the second one to run sees the first's record).  Each racing pair of ops is
 * reported once, so counts are the same on every run.  A record is dropped once every op
 * queued now and every op submitted later is ordered after it.  Host memory is not checked
 * here: the source checksums cover it. */
#include "fk_internal.h"
#include <string.h>

int fk_check_races = 1;

/* ---- vector clocks: (stream id, position) pairs sorted by id; ids are never reused ---- */
static void vc_reserve(fk_vc *v, uint32_t n)
{
    if (n <= v->cap) return;
    uint32_t nc = v->cap ? v->cap : 4;
    while (nc < n) nc *= 2;
    fk_vc_ent *ne = fk_realloc(v->e, nc * sizeof *ne);
    if (!ne) fk_fatal("out of memory");
    v->e = ne;
    v->cap = nc;
}

uint64_t fk_vc_get(const fk_vc *v, uint64_t stream)
{
    uint32_t lo = 0, hi = v->n;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (v->e[mid].stream < stream) lo = mid + 1; else hi = mid;
    }
    return lo < v->n && v->e[lo].stream == stream ? v->e[lo].seq : 0;
}

void fk_vc_set(fk_vc *v, uint64_t stream, uint64_t seq)
{
    uint32_t i = 0;
    while (i < v->n && v->e[i].stream < stream) i++;
    if (i < v->n && v->e[i].stream == stream) {
        if (v->e[i].seq < seq) v->e[i].seq = seq;
        return;
    }
    vc_reserve(v, v->n + 1);
    memmove(&v->e[i + 1], &v->e[i], (v->n - i) * sizeof *v->e);
    v->e[i] = (fk_vc_ent){ stream, seq };
    v->n++;
}

void fk_vc_join(fk_vc *dst, const fk_vc *src)
{
    if (!src->n || dst == src) return;
    /* Merge from the back, in place, into room for both. */
    uint32_t extra = 0;
    for (uint32_t i = 0, j = 0; j < src->n;) {
        if (i < dst->n && dst->e[i].stream < src->e[j].stream) i++;
        else if (i < dst->n && dst->e[i].stream == src->e[j].stream) { i++; j++; }
        else { extra++; j++; }
    }
    vc_reserve(dst, dst->n + extra);
    uint32_t i = dst->n, j = src->n, k = dst->n + extra;
    while (j > 0) {
        if (i > 0 && dst->e[i - 1].stream > src->e[j - 1].stream) dst->e[--k] = dst->e[--i];
        else if (i > 0 && dst->e[i - 1].stream == src->e[j - 1].stream) {
            fk_vc_ent a = dst->e[--i], b = src->e[--j];
            dst->e[--k] = (fk_vc_ent){ a.stream, a.seq > b.seq ? a.seq : b.seq };
        } else {
            dst->e[--k] = src->e[--j];
        }
    }
    dst->n += extra;
}

void fk_vc_assign(fk_vc *dst, const fk_vc *src)
{
    if (dst == src) return;
    vc_reserve(dst, src->n);
    if (src->n) memcpy(dst->e, src->e, src->n * sizeof *src->e);
    dst->n = src->n;
}

void fk_vc_free(fk_vc *v)
{
    fk_free(v->e);
    *v = (fk_vc){ 0 };
}

/* Keep in a only what b also has, at the smaller position: a stays covered by both. */
static void vc_meet(fk_vc *a, const fk_vc *b)
{
    uint32_t k = 0;
    for (uint32_t i = 0; i < a->n; i++) {
        uint64_t s = fk_vc_get(b, a->e[i].stream);
        if (!s) continue;
        a->e[k++] = (fk_vc_ent){ a->e[i].stream, a->e[i].seq < s ? a->e[i].seq : s };
    }
    a->n = k;
}

/* ---- what the host has seen complete ---- */
static fk_vc host_vc;

void fk_host_observe(const fk_vc *seen) { fk_vc_join(&host_vc, seen); }
void fk_vc_join_host(fk_vc *v) { fk_vc_join(v, &host_vc); }

/* ---- device ranges: rows of w bytes, h rows pitch apart, d slices slice apart ---- */
typedef struct { uintptr_t a; size_t w, h, d, pitch, slice; } region;

static region region_of(const fk_end *e, size_t w, size_t h, size_t d)
{
    region r = { (uintptr_t)e->addr, w, h, d, e->pitch, e->slice };
    /* Rows or slices that follow each other without a gap are one range. */
    if (r.h > 1 && r.pitch == r.w) { r.w *= r.h; r.h = 1; }
    if (r.h == 1 && r.d > 1 && r.slice == r.w) { r.w *= r.d; r.d = 1; }
    if (r.h == 1) r.pitch = r.w;
    if (r.d == 1) r.slice = r.pitch * r.h;
    return r;
}

static size_t region_span(const region *r)
{
    return (r->d - 1) * r->slice + (r->h - 1) * r->pitch + r->w;
}

/* Does [x, x+n) meet a row of r?  Per slice, the first row ending after x is the only
 * candidate (rows are at least w apart). */
static int range_meets(uintptr_t x, size_t n, const region *r)
{
    for (size_t z = 0; z < r->d; z++) {
        uintptr_t base = r->a + z * r->slice;
        if (base >= x + n) break;
        size_t y = x < base + r->w ? 0 : (x - base - r->w) / r->pitch + 1;
        if (y < r->h && base + y * r->pitch < x + n) return 1;
    }
    return 0;
}

static int regions_meet(const region *a, const region *b)
{
    if (a->a >= b->a + region_span(b) || b->a >= a->a + region_span(a)) return 0;
    if (a->h == 1 && a->d == 1) return range_meets(a->a, a->w, b);
    if (b->h == 1 && b->d == 1) return range_meets(b->a, b->w, a);
    for (size_t z = 0; z < a->d; z++)
        for (size_t y = 0; y < a->h; y++)
            if (range_meets(a->a + z * a->slice + y * a->pitch, a->w, b)) return 1;
    return 0;
}

/* ---- recorded accesses ---- */
typedef struct {
    region r;
    int write;
    uint64_t stream, seq;        /* the op: its stream's id and position */
    const char *what;            /* its entry point */
    const char *stream_kind;
} access_rec;

#define FK_RACE_MAX_RECORDS ((size_t)1 << 20)
static access_rec *recs;
static size_t nrecs, caprecs, prune_at = 1024;

static const char *stream_kind(const fk_stream *s)
{
    switch (s->kind) {
    case FK_S_LEGACY: return "legacy stream";
    case FK_S_PTDS: return "per-thread stream";
    default: return (s->flags & CU_STREAM_NON_BLOCKING) ? "non-blocking stream" : "blocking stream";
    }
}

/* Drop the records every op queued now, and (through the host's clock) every op submitted
 * later, is ordered after: none of them can race with such an access any more. */
static void prune(void)
{
    fk_vc floor = { 0 };
    fk_vc_assign(&floor, &host_vc);
    for (int d = 0; d < fk_ndev && floor.n; d++)
        for (fk_stream *s = fk_ctxs[d].streams; s && floor.n; s = s->ctx_next)
            for (fk_op *op = s->head; op && floor.n; op = op->next) vc_meet(&floor, &op->vc);
    size_t k = 0;
    for (size_t i = 0; i < nrecs; i++)
        if (recs[i].seq > fk_vc_get(&floor, recs[i].stream)) recs[k++] = recs[i];
    nrecs = k;
    fk_vc_free(&floor);
    prune_at = nrecs * 2 > 1024 ? nrecs * 2 : 1024;
}

static void record(const fk_op *op, const region *r, int write)
{
    if (nrecs >= prune_at) prune();
    if (nrecs >= FK_RACE_MAX_RECORDS)
        fk_fatal("over a million device memory accesses not yet ordered before later work "
                 "(FAKECUDA_CHECK_DEVICE_RACES): the race checker's records would grow without bound");
    if (nrecs == caprecs) {
        size_t nc = caprecs ? caprecs * 2 : 256;
        access_rec *nr = fk_realloc(recs, nc * sizeof *nr);
        if (!nr) fk_fatal("out of memory");
        recs = nr;
        caprecs = nc;
    }
    recs[nrecs++] = (access_rec){ *r, write, op->s->id, op->seq, op->what, stream_kind(op->s) };
}

typedef struct { uint64_t stream, seq; } op_key;

/* Check one device range of the running op against the records; each other op is reported at
 * most once per run of this op (seen: those already reported). */
static void check(const fk_op *op, const region *r, int write, op_key *seen, int *nseen, int maxseen)
{
    for (size_t i = 0; i < nrecs; i++) {
        const access_rec *a = &recs[i];
        if (a->stream == op->s->id || (!a->write && !write)) continue;
        if (a->seq <= fk_vc_get(&op->vc, a->stream) || !regions_meet(&a->r, r)) continue;
        int dup = 0;
        for (int k = 0; k < *nseen && !dup; k++) dup = seen[k].stream == a->stream && seen[k].seq == a->seq;
        if (dup) continue;
        if (*nseen < maxseen) seen[(*nseen)++] = (op_key){ a->stream, a->seq };
        fk_violation("device memory race: %s (%s %llu, op %llu) %s device %#lx+%zu and %s (%s %llu, op %llu) "
                     "%s device %#lx+%zu, and nothing orders either before the other (no stream order, "
                     "event wait or synchronization seen by the host between them)",
                     op->what, stream_kind(op->s), (unsigned long long)op->s->id, (unsigned long long)op->seq,
                     write ? "writes" : "reads", (unsigned long)r->a, region_span(r), a->what, a->stream_kind,
                     (unsigned long long)a->stream, (unsigned long long)a->seq, a->write ? "writes" : "reads",
                     (unsigned long)a->r.a, region_span(&a->r));
    }
}

void fk_race_exec(const fk_op *op)
{
    if (!fk_check_races || !op->w || !op->h || !op->d) return;
    region rs[2];
    int ws[2], n = 0;
    if (op->kind == OP_COPY && op->src.isdev) { rs[n] = region_of(&op->src, op->w, op->h, op->d); ws[n++] = 0; }
    if ((op->kind == OP_COPY || op->kind == OP_MEMSET) && op->dst.isdev) {
        rs[n] = region_of(&op->dst, op->w, op->h, op->d);
        ws[n++] = 1;
    }
    op_key seen[64];
    int nseen = 0;
    for (int i = 0; i < n; i++) check(op, &rs[i], ws[i], seen, &nseen, 64);
    for (int i = 0; i < n; i++) record(op, &rs[i], ws[i]);
}

/* Freed device memory: its addresses are never handed out again. */
void fk_race_forget(uintptr_t base, size_t size)
{
    size_t k = 0;
    for (size_t i = 0; i < nrecs; i++) {
        const region *r = &recs[i].r;
        if (r->a >= base + size || base >= r->a + region_span(r)) recs[k++] = recs[i];
    }
    nrecs = k;
}
