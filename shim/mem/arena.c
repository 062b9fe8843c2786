/* The large-block arena (see arena.h).
 *
 * Size classes: whole pages; 1-4 pages, then four steps per power of two (5, 6, 7, 8, 10, 12,
 * 14, 16, 20, ... pages), up to ARENA_MAX_BLOCK.  A request gets the smallest class that holds
 * it, so at most a quarter of a block's pages lie beyond what was asked for; those pages are
 * never touched by the program, so they cost address space, not memory.
 *
 * Locks: each home (below) has one, taken only to refill or flush a thread's cache; segments
 * are made under a global one.  The segment map (one pointer per possible segment, 16 MiB of
 * address space touched only where segments are) and slot arrays are read without locks: a
 * segment is never unmapped, so a reader may see a slot change state, never a slot disappear. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include "base/config.h"
#include "base/meta.h"
#include "base/os.h"
#include "base/shim.h"
#include "mem/arena.h"

#define ADDR_BITS 47
#define SEGMAP_ENTRIES (1ul << (ADDR_BITS - ARENA_SEG_SHIFT))
/* A thread keeps up to TC_SLOTS blocks of a class, and no more than TC_CLASS_BYTES of it
 * (at least one block): enough that a loop of allocations and frees of one size never leaves
 * the thread. */
#define TC_SLOTS 8
#define TC_CLASS_BYTES (32ul << 20)
#define TC_TOTAL_BYTES (128ul << 20)
/* Freed blocks whose pages stay resident in the central lists, in all: a 64th of the machine's
 * memory, within [256 MiB, 4 GiB]; beyond it freed blocks give their pages back.  (The C
 * library never gives back freed memory below the top of its heap.) */
#define CENTRAL_RESIDENT_MIN (256ul << 20)
#define CENTRAL_RESIDENT_CAP (4ul << 30)

/* Every malloc and free of a segment's blocks reads its first line, from whichever thread:
 * what is written later (fresh, the slots) lies on lines of its own.  Cache-line aligned (see
 * seg_new). */
struct arena_seg {
    uintptr_t data;            /* == the segment's address */
    size_t bsize;              /* class size */
    uint32_t nblocks;
    unsigned cls;
    unsigned home;             /* whose central lists its freed blocks go back to */
    /* blocks [0, fresh) have been handed out at least once */
    uint32_t fresh __attribute__((aligned(ARENA_LINE)));
    struct arena_slot slots[];
};

/* Freed blocks beyond the resident bound give their pages back in batches, a class at a time:
 * sorted by address, neighbours in one madvise call.  A program that frees many blocks it
 * allocated one after another (a working set let go) pays a system call per run of them, not
 * per block (140,000 blocks of 64-72 KiB: 2.1 us a free with a call each, against 0.5 us for
 * the C library).  A batch holds up to PURGE_BATCH blocks and PURGE_BATCH_BYTES (at least one
 * block): the most a class keeps resident beyond the bound (about 100 MiB over the classes below
 * 4 MiB, at worst; larger blocks are given back at once, as before). */
#define PURGE_BATCH 64
#define PURGE_BATCH_BYTES (4ul << 20)

/* Homes: each thread takes its blocks from one home's lists and segments, and a freed block goes
 * back to the home of its segment, whichever thread frees it (as the C library's per-thread
 * arenas do).  With one set of lists, threads allocating at once took fresh blocks a few at a
 * time from one segment, and each thread's blocks came to lie spread over the span of all
 * theirs (16 threads of 256 blocks of 72 KiB: a thread's 18 MiB over 320 MiB), each page touch
 * walking page tables that no cache held.  A thread takes the home with the fewest threads
 * (the first such), so that a thread started after another ended reuses its home's blocks. */
#define ARENA_HOMES 16

/* A class's lists in one home, on lines of their own. */
struct central {
    struct arena_slot *resident;   /* freed, pages kept: reused first (no faults) */
    struct arena_slot *purged;     /* freed, pages given back: zero */
    struct arena_seg *cur;         /* the segment fresh blocks come from */
    unsigned npending;             /* freed beyond the bound, pages not given back yet */
    struct arena_slot *pending[PURGE_BATCH];
} __attribute__((aligned(ARENA_LINE)));

/* Written on every malloc and free of its thread: on lines no other record shares. */
struct tcache {
    uint8_t count[ARENA_CLASSES];
    unsigned home;
    size_t bytes;
    void *raw;                 /* what meta_alloc gave (the cache lies aligned within it) */
    struct arena_slot *slots[ARENA_CLASSES][TC_SLOTS];
} __attribute__((aligned(ARENA_LINE)));

static size_t class_bytes[ARENA_CLASSES];
static unsigned class_keep[ARENA_CLASSES];   /* thread-cache depth per class */
static struct central central[ARENA_HOMES][ARENA_CLASSES];
/* A lock per home, as the C library has one per arena: threads of a home meet on it only when
 * their caches refill or flush, threads of different homes never.  (A lock per class of each
 * home made 768 locks for fork to take.) */
static struct {
    pthread_mutex_t mu;
} __attribute__((aligned(ARENA_LINE))) home_lock[ARENA_HOMES];
static unsigned home_threads[ARENA_HOMES];   /* threads with a cache there */
static struct arena_seg **segmap;
static pthread_mutex_t seg_mu = PTHREAD_MUTEX_INITIALIZER;
/* Written as blocks pass through the central lists, from any thread: a line apart from the
 * segment map and span, which every malloc and free reads. */
static struct {
    uint64_t seg_count, resident_free_bytes, purged_blocks;
} __attribute__((aligned(ARENA_LINE))) counts;
static size_t central_resident_max = CENTRAL_RESIDENT_MIN;
static uintptr_t last_seg;
uintptr_t arena_span_lo = UINTPTR_MAX, arena_span_hi;

static __thread struct tcache *my_cache;
static pthread_key_t cache_key;
static pthread_once_t cache_key_once = PTHREAD_ONCE_INIT;
static int cache_key_ok;

/* ---- classes ---- */

static unsigned class_of_pages(size_t pages)
{
    if (pages <= 4)
        return pages ? (unsigned)pages - 1 : 0;
    size_t x = pages - 1;
    unsigned lg = 63u - (unsigned)__builtin_clzll(x);
    unsigned shift = lg - 2;
    return 4 + (lg - 2) * 4 + (unsigned)((x >> shift) & 3);
}

static size_t pages_of_class(unsigned c)
{
    if (c < 4)
        return c + 1;
    unsigned group = (c - 4) / 4, step = (c - 4) % 4;
    unsigned shift = group;
    return ((size_t)(4 + step) + 1) << shift;
}

void arena_init(void)
{
    for (unsigned c = 0; c < ARENA_CLASSES; c++) {
        class_bytes[c] = pages_of_class(c) * SHIM_PAGE_SIZE;
        size_t keep = TC_CLASS_BYTES / class_bytes[c];
        class_keep[c] = keep < 1 ? 1 : keep > TC_SLOTS ? TC_SLOTS : (unsigned)keep;
    }
    for (unsigned h = 0; h < ARENA_HOMES; h++)
        pthread_mutex_init(&home_lock[h].mu, NULL);
    uint64_t ram = config_physical_memory() / 64;
    central_resident_max = ram < CENTRAL_RESIDENT_MIN ? CENTRAL_RESIDENT_MIN
                         : ram > CENTRAL_RESIDENT_CAP ? CENTRAL_RESIDENT_CAP : (size_t)ram;
}

static inline unsigned class_of(size_t n)
{
    return class_of_pages((n + SHIM_PAGE_SIZE - 1) / SHIM_PAGE_SIZE);
}

static inline int colored(size_t n, size_t align)
{
    (void)n;
    return align < SHIM_PAGE_SIZE;
}

unsigned arena_class_for(size_t n, size_t align)
{
    return class_of(colored(n, align) ? n + SHIM_PAGE_SIZE : n);
}

unsigned arena_class_of_block(size_t block_len)
{
    return class_of(block_len);
}

/* A zeroed record of n bytes from meta_alloc, which aligns to 16 bytes only, on a cache line;
 * *raw (if asked) is what meta_free takes, with meta_line_size(n). */
static inline size_t meta_line_size(size_t n)
{
    return n + ARENA_LINE - 1;
}

static void *meta_alloc_line(size_t n, void **raw)
{
    void *p = meta_alloc(meta_line_size(n));
    if (raw)
        *raw = p;
    return p ? (void *)(((uintptr_t)p + ARENA_LINE - 1) & ~(uintptr_t)(ARENA_LINE - 1)) : NULL;
}

/* ---- segments ---- */

static inline struct arena_seg *seg_of(uintptr_t p)
{
    uintptr_t i = p >> ARENA_SEG_SHIFT;
    struct arena_seg **map = __atomic_load_n(&segmap, __ATOMIC_ACQUIRE);
    if (!map || i >= SEGMAP_ENTRIES)
        return NULL;
    return __atomic_load_n(&map[i], __ATOMIC_ACQUIRE);
}

int arena_contains(uintptr_t p)
{
    return arena_may_contain(p) && seg_of(p) != NULL;
}

/* A new segment of class c for home h; the home's lock is held by the caller. */
static struct arena_seg *seg_new(unsigned h, unsigned c)
{
    size_t bsize = class_bytes[c];
    uint32_t n = (uint32_t)(ARENA_SEG_SIZE / bsize);
    size_t hdr = sizeof(struct arena_seg) + n * sizeof(struct arena_slot);
    pthread_mutex_lock(&seg_mu);
    if (!segmap) {
        struct arena_seg **map = os_map(SEGMAP_ENTRIES * sizeof *map);
        if (!map) {
            pthread_mutex_unlock(&seg_mu);
            return NULL;
        }
        __atomic_store_n(&segmap, map, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&seg_mu);
    /* Right below the last segment, where the kernel's top-down placement leaves room: the
     * segments then form one mapping. */
    uintptr_t last = __atomic_load_n(&last_seg, __ATOMIC_RELAXED);
    void *mem = os_map_aligned(ARENA_SEG_SIZE, ARENA_SEG_SIZE, last > ARENA_SEG_SIZE ? last - ARENA_SEG_SIZE : 0);
    if (!mem)
        return NULL;
    if (((uintptr_t)mem >> ARENA_SEG_SHIFT) >= SEGMAP_ENTRIES) {
        os_unmap(mem, ARENA_SEG_SIZE);   /* beyond the map's reach: the C library serves it */
        return NULL;
    }
    /* Never freed: the segment stays for the process's life. */
    struct arena_seg *s = meta_alloc_line(hdr, NULL);
    if (!s) {
        os_unmap(mem, ARENA_SEG_SIZE);
        return NULL;
    }
    /* Blocks of 2 MiB and more in huge pages where the system allows them: one fault (and one
     * TLB entry) per 2 MiB, which is what makes a fresh large block fast to fill. */
    if (bsize >= SHIM_HUGE_PAGE)
        os_madvise(mem, ARENA_SEG_SIZE, MADV_HUGEPAGE);
    s->data = (uintptr_t)mem;
    s->bsize = bsize;
    s->nblocks = n;
    s->fresh = 0;
    s->cls = c;
    s->home = h;
    /* Slots are filled in as their blocks are first handed out: the header's pages are touched
     * only as far as the segment is used. */
    __atomic_store_n(&segmap[(uintptr_t)mem >> ARENA_SEG_SHIFT], s, __ATOMIC_RELEASE);
    __atomic_store_n(&last_seg, (uintptr_t)mem, __ATOMIC_RELAXED);
    /* The span only grows (segments are never unmapped); seg_mu is not held here, so by CAS. */
    uintptr_t lo = __atomic_load_n(&arena_span_lo, __ATOMIC_RELAXED);
    while ((uintptr_t)mem < lo && !__atomic_compare_exchange_n(&arena_span_lo, &lo, (uintptr_t)mem, 1,
                                                               __ATOMIC_RELEASE, __ATOMIC_RELAXED))
        ;
    uintptr_t hi = __atomic_load_n(&arena_span_hi, __ATOMIC_RELAXED), end = (uintptr_t)mem + ARENA_SEG_SIZE;
    while (end > hi && !__atomic_compare_exchange_n(&arena_span_hi, &hi, end, 1, __ATOMIC_RELEASE,
                                                    __ATOMIC_RELAXED))
        ;
    __atomic_add_fetch(&counts.seg_count, 1, __ATOMIC_RELAXED);
    return s;
}

static inline struct arena_slot *slot_at(struct arena_seg *s, uintptr_t p)
{
    uint32_t i = (uint32_t)(p - s->data) / (uint32_t)s->bsize;
    return i < s->nblocks ? &s->slots[i] : NULL;
}

struct arena_slot *arena_slot_of(uintptr_t p)
{
    struct arena_seg *s = arena_may_contain(p) ? seg_of(p) : NULL;
    if (!s)
        return NULL;
    struct arena_slot *sl = slot_at(s, p);
    return sl && sl->addr && sl->addr + sl->color == p ? sl : NULL;
}

int arena_find(uintptr_t p, struct arena_block *out)
{
    struct arena_seg *s = arena_may_contain(p) ? seg_of(p) : NULL;
    if (!s)
        return 0;
    struct arena_slot *sl = slot_at(s, p);
    if (!sl || __atomic_load_n(&sl->state, __ATOMIC_ACQUIRE) == SLOT_FREE)
        return 0;
    out->slot = sl;
    out->base = sl->addr + sl->color;
    out->usable = s->bsize - sl->color;
    out->block = sl->addr;
    out->block_len = s->bsize;
    return 1;
}

void arena_for_each_in_range(uintptr_t p, size_t n, void (*fn)(struct arena_slot *, void *), void *arg)
{
    if (!n || !__atomic_load_n(&segmap, __ATOMIC_ACQUIRE))
        return;
    uintptr_t end = p + n < p ? UINTPTR_MAX : p + n;
    for (uintptr_t segp = p & ~(ARENA_SEG_SIZE - 1); segp < end; segp += ARENA_SEG_SIZE) {
        struct arena_seg *s = seg_of(segp);
        if (s) {
            uintptr_t lo = p > s->data ? p : s->data;
            uint32_t first = (uint32_t)((lo - s->data) / s->bsize);
            for (uint32_t i = first; i < s->nblocks && s->data + (uintptr_t)i * s->bsize < end; i++)
                if (__atomic_load_n(&s->slots[i].state, __ATOMIC_ACQUIRE) != SLOT_FREE)
                    fn(&s->slots[i], arg);
        }
        if (segp + ARENA_SEG_SIZE < segp)
            break;
    }
}

/* ---- central lists ---- */

/* Give back the pages of the class's pending blocks, neighbours in one call, and list them as
 * purged.  The home's lock held. */
static void purge_pending(struct central *cl, size_t bsize)
{
    unsigned n = cl->npending;
    struct arena_slot **v = cl->pending;
    for (unsigned i = 1; i < n; i++) {   /* insertion sort by address: a few dozen at most */
        struct arena_slot *x = v[i];
        unsigned j = i;
        for (; j > 0 && v[j - 1]->addr > x->addr; j--)
            v[j] = v[j - 1];
        v[j] = x;
    }
    for (unsigned i = 0; i < n;) {
        unsigned j = i + 1;
        while (j < n && v[j]->addr == v[j - 1]->addr + bsize)
            j++;
        os_madvise((void *)v[i]->addr, (size_t)(j - i) * bsize, MADV_DONTNEED);
        i = j;
    }
    for (unsigned i = 0; i < n; i++) {
        v[i]->zero = 1;
        v[i]->next = cl->purged;
        cl->purged = v[i];
    }
    __atomic_add_fetch(&counts.purged_blocks, n, __ATOMIC_RELAXED);
    cl->npending = 0;
}

/* Put a freed block on its central list; pages beyond the resident bound are given back (in
 * batches).  The home's lock held. */
static void central_put(struct central *cl, struct arena_slot *sl, size_t bsize)
{
    if (!sl->zero && __atomic_load_n(&counts.resident_free_bytes, __ATOMIC_RELAXED) + bsize > central_resident_max) {
        size_t cap = PURGE_BATCH_BYTES / bsize;
        cl->pending[cl->npending++] = sl;
        if (cl->npending >= PURGE_BATCH || cl->npending >= cap)
            purge_pending(cl, bsize);
        return;
    }
    if (sl->zero) {
        sl->next = cl->purged;
        cl->purged = sl;
    } else {
        sl->next = cl->resident;
        cl->resident = sl;
        __atomic_add_fetch(&counts.resident_free_bytes, bsize, __ATOMIC_RELAXED);
    }
}

/* Up to `want` free blocks of class c from home h into out[]; returns how many. */
static unsigned central_take(unsigned h, unsigned c, struct arena_slot **out, unsigned want)
{
    struct central *cl = &central[h][c];
    unsigned got = 0;
    pthread_mutex_lock(&home_lock[h].mu);
    while (got < want && cl->resident) {
        struct arena_slot *sl = cl->resident;
        cl->resident = sl->next;
        __atomic_sub_fetch(&counts.resident_free_bytes, class_bytes[c], __ATOMIC_RELAXED);
        out[got++] = sl;
    }
    while (got < want && cl->npending)   /* still resident: no faults */
        out[got++] = cl->pending[--cl->npending];
    while (got < want && cl->purged) {
        out[got++] = cl->purged;
        cl->purged = cl->purged->next;
    }
    while (got < want) {
        struct arena_seg *s = cl->cur;
        if (!s || s->fresh == s->nblocks) {
            if (!(s = seg_new(h, c)))
                break;
            cl->cur = s;
        }
        struct arena_slot *sl = &s->slots[s->fresh];
        sl->addr = s->data + (uintptr_t)s->fresh * s->bsize;
        sl->zero = 1;
        s->fresh++;
        out[got++] = sl;
    }
    pthread_mutex_unlock(&home_lock[h].mu);
    return got;
}

/* Freed blocks of class c back to their homes: one lock per run of blocks of one home. */
static void central_put_many(unsigned c, struct arena_slot **in, unsigned n)
{
    for (unsigned i = 0; i < n;) {
        unsigned h = seg_of(in[i]->addr)->home;
        struct central *cl = &central[h][c];
        pthread_mutex_lock(&home_lock[h].mu);
        for (; i < n && seg_of(in[i]->addr)->home == h; i++)
            central_put(cl, in[i], class_bytes[c]);
        pthread_mutex_unlock(&home_lock[h].mu);
    }
}

/* ---- thread caches ---- */

static void flush_cache(struct tcache *tc)
{
    for (unsigned c = 0; c < ARENA_CLASSES; c++) {
        if (tc->count[c])
            central_put_many(c, tc->slots[c], tc->count[c]);
        tc->count[c] = 0;
    }
    tc->bytes = 0;
}

static void cache_destroy(void *arg)
{
    struct tcache *tc = arg;
    if (!tc)
        return;
    flush_cache(tc);
    __atomic_sub_fetch(&home_threads[tc->home], 1, __ATOMIC_RELAXED);
    if (my_cache == tc)
        my_cache = NULL;
    meta_free(tc->raw, meta_line_size(sizeof *tc));
}

static void make_cache_key(void)
{
    cache_key_ok = pthread_key_create(&cache_key, cache_destroy) == 0;
}

/* The calling thread's cache, made on first use; NULL when none can be had (the central lists
 * then serve every call). */
static struct tcache *thread_cache(void)
{
    struct tcache *tc = my_cache;
    if (SHIM_LIKELY(tc != NULL))
        return tc;
    pthread_once(&cache_key_once, make_cache_key);
    void *raw;
    if (!cache_key_ok || !(tc = meta_alloc_line(sizeof *tc, &raw)))
        return NULL;
    tc->raw = raw;
    tc->home = 0;
    for (unsigned h = 1; h < ARENA_HOMES; h++)
        if (__atomic_load_n(&home_threads[h], __ATOMIC_RELAXED) <
            __atomic_load_n(&home_threads[tc->home], __ATOMIC_RELAXED))
            tc->home = h;
    __atomic_add_fetch(&home_threads[tc->home], 1, __ATOMIC_RELAXED);
    if (pthread_setspecific(cache_key, tc) != 0) {
        meta_free(raw, meta_line_size(sizeof *tc));
        return NULL;
    }
    my_cache = tc;
    return tc;
}

void arena_flush_thread_cache(void)
{
    if (my_cache)
        flush_cache(my_cache);
}

/* ---- allocation ---- */

void *arena_alloc(size_t n, size_t align, int zero)
{
    int color = colored(n, align);
    unsigned c = class_of(color ? n + SHIM_PAGE_SIZE : n);
    size_t bsize = class_bytes[c];
    struct tcache *tc = thread_cache();
    struct arena_slot *sl = NULL;
    if (tc && tc->count[c]) {
        sl = tc->slots[c][--tc->count[c]];
        tc->bytes -= bsize;
    } else if (tc) {
        /* Refill half the cache at once: one lock for several allocations. */
        unsigned want = class_keep[c] > 1 ? class_keep[c] / 2 + 1 : 1;
        struct arena_slot *got[TC_SLOTS];
        unsigned k = central_take(tc->home, c, got, want);
        if (k) {
            sl = got[--k];
            for (unsigned i = 0; i < k; i++)
                tc->slots[c][tc->count[c]++] = got[i];
            tc->bytes += (size_t)k * bsize;
        }
    } else {
        central_take(0, c, &sl, 1);   /* no cache of its own: the first home */
    }
    if (!sl) {
        errno = ENOMEM;
        return NULL;
    }
    sl->size = n;
    sl->rec = NULL;
    sl->color = 0;
    if (color) {
        /* Neighbouring blocks a step (64 bytes, or the alignment) apart in the cache: the
         * block's index picks the line.  Never the page's first line: the shim's own
         * page-aligned records (thread cache, segment header) lie there, and a block whose
         * every page's first line is touched would evict them on every call (measured: 72 KiB
         * churn 1.4x slower on such blocks). */
        struct arena_seg *s = seg_of(sl->addr);
        size_t index = (sl->addr - s->data) / bsize;
        size_t step = align > 64 ? align : 64;
        sl->color = (uint16_t)(step * (1 + index % (SHIM_PAGE_SIZE / step - 1)));
    }
    void *p = (void *)(sl->addr + sl->color);
    if (zero && !sl->zero)
        memset(p, 0, n);
    sl->zero = 0;
    __atomic_store_n(&sl->state, SLOT_LIVE, __ATOMIC_RELEASE);
    return p;
}

/* A block that is the arena's again goes to this thread's cache, or its central list. */
static void put_free(struct arena_seg *s, struct arena_slot *sl)
{
    unsigned c = s->cls;
    size_t bsize = s->bsize;
    struct tcache *tc = thread_cache();
    if (tc && tc->count[c] < class_keep[c] && tc->bytes + bsize <= TC_TOTAL_BYTES) {
        tc->slots[c][tc->count[c]++] = sl;
        tc->bytes += bsize;
        return;
    }
    if (tc && tc->count[c] >= class_keep[c]) {
        /* Full: half of it to the central list, then keep this one. */
        unsigned move = (tc->count[c] + 1) / 2;
        central_put_many(c, &tc->slots[c][tc->count[c] - move], move);
        tc->count[c] -= move;
        tc->bytes -= (size_t)move * bsize;
        if (tc->bytes + bsize <= TC_TOTAL_BYTES) {
            tc->slots[c][tc->count[c]++] = sl;
            tc->bytes += bsize;
            return;
        }
    }
    central_put_many(c, &sl, 1);
}

int arena_free(uintptr_t p, struct arena_slot **tracked)
{
    struct arena_seg *s = arena_may_contain(p) ? seg_of(p) : NULL;
    if (!s)
        return -1;
    struct arena_slot *sl = slot_at(s, p);
    if (!sl || !sl->addr || sl->addr + sl->color != p)
        return -1;
    uint32_t expect = SLOT_LIVE;
    if (!__atomic_compare_exchange_n(&sl->state, &expect, SLOT_FREE, 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE))
    {
        if (expect != SLOT_TRACKED)
            return -1;   /* a double free stays the program's bug */
        *tracked = sl;
        return 1;
    }
    put_free(s, sl);
    return 0;
}

int arena_track(struct arena_slot *s, void *rec)
{
    uint32_t expect = SLOT_LIVE;
    s->rec = rec;
    if (__atomic_compare_exchange_n(&s->state, &expect, SLOT_TRACKED, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE))
        return 0;
    s->rec = NULL;
    return -1;
}

void arena_release(struct arena_slot *s)
{
    s->rec = NULL;
    __atomic_store_n(&s->state, SLOT_FREE, __ATOMIC_RELEASE);
    put_free(seg_of(s->addr), s);
}

void arena_untrack(struct arena_slot *s)
{
    s->rec = NULL;
    __atomic_store_n(&s->state, SLOT_LIVE, __ATOMIC_RELEASE);
}

void arena_usage(struct arena_usage *u)
{
    u->segments = __atomic_load_n(&counts.seg_count, __ATOMIC_RELAXED);
    u->live_bytes = 0;
    struct arena_seg **map = __atomic_load_n(&segmap, __ATOMIC_ACQUIRE);
    /* A walk over the segment map: for tests and the report, never on a hot path. */
    for (size_t i = 0; map && i < SEGMAP_ENTRIES; i++) {
        struct arena_seg *s = __atomic_load_n(&map[i], __ATOMIC_ACQUIRE);
        for (uint32_t k = 0; s && k < s->fresh; k++)
            if (__atomic_load_n(&s->slots[k].state, __ATOMIC_RELAXED) != SLOT_FREE)
                u->live_bytes += s->bsize;
    }
    u->free_resident = __atomic_load_n(&counts.resident_free_bytes, __ATOMIC_RELAXED);
    u->purged = __atomic_load_n(&counts.purged_blocks, __ATOMIC_RELAXED);
}

/* ---- fork ---- */

/* In the order the allocation path takes them: a home's lock, then (in seg_new) seg_mu.  No
 * path holds two homes' locks at once, so their own order is free. */
void arena_before_fork(void)
{
    for (unsigned h = 0; h < ARENA_HOMES; h++)
        pthread_mutex_lock(&home_lock[h].mu);
    pthread_mutex_lock(&seg_mu);
}

void arena_after_fork_parent(void)
{
    pthread_mutex_unlock(&seg_mu);
    for (unsigned h = ARENA_HOMES; h-- > 0;)
        pthread_mutex_unlock(&home_lock[h].mu);
}

void arena_after_fork_child(void)
{
    /* Only the forking thread exists here; its cache is still its own.  Blocks in the other
     * threads' caches are lost to the child, as their threads are. */
    for (unsigned h = 0; h < ARENA_HOMES; h++)
        pthread_mutex_init(&home_lock[h].mu, NULL);
    pthread_mutex_init(&seg_mu, NULL);
    for (unsigned h = 0; h < ARENA_HOMES; h++)
        home_threads[h] = 0;
    if (my_cache)
        home_threads[my_cache->home] = 1;
}
