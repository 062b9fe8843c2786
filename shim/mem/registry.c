/* The registry (see registry.h).
 *
 * Locks, always taken in this order:
 *   change_mu   one registration or eviction at a time: registering takes milliseconds and the
 *               budget must hold at every instant, so room is made and used under it;
 *   mu          the records, the index, the cache; held briefly, never across a driver call
 *               that can wait for the device.  A record whose registration is being made or
 *               removed outside mu is marked `changing`; whoever needs its registration or its
 *               memory waits on `settled` until the mark is gone;
 *   pinned_mu   the program-pinned ranges (read by the copy path without mu).
 *
 * Records: arena blocks get one lazily (lookup, on the first copy), reached through their slot;
 * huge heap blocks and the program's mappings get one when they appear, in `index`, an array
 * sorted by mapping start (copies are rare next to allocations: a binary search is enough). */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>
#include <cudaTypedefs.h>
#include "base/config.h"
#include "base/log.h"
#include "base/meta.h"
#include "base/nvtx.h"
#include "base/os.h"
#include "base/real.h"
#include "base/shim.h"
#include "mem/costmodel.h"
#include "mem/nodebudget.h"
#include "mem/registry.h"
#include "stats/stats.h"
#include "stats/trace.h"

enum block_origin {
    ORIGIN_ARENA,   /* a heap block of the arena */
    ORIGIN_HUGE,    /* a heap block with its own mapping */
    ORIGIN_MMAP,    /* the program's own mapping */
};

enum block_state {
    BLOCK_PAGEABLE,   /* tracked, not registered */
    BLOCK_PROMOTED,   /* registered by the shim, the program's */
    BLOCK_CACHED,     /* freed by the program, kept registered in the pinned cache */
};

struct block {
    uintptr_t base;           /* the address the program sees */
    size_t size;              /* bytes the program asked for */
    uintptr_t map_base;       /* the pages behind it */
    size_t map_len;
    enum block_origin origin;
    enum block_state state;
    int prot;                 /* PROT_* of its pages as the program set them */
    struct arena_slot *slot;  /* ORIGIN_ARENA */
    /* the registration, while PROMOTED or CACHED: arena blocks, the pages the program asked for
     * (not the rest of the block's class); other blocks, their whole mapping */
    uintptr_t reg_base;
    size_t reg_len;
    CUcontext reg_ctx;
    unsigned reg_flags;
    /* hotness, for the cost model */
    uint64_t copies;
    uint64_t bytes_moved;
    uint64_t bytes_filled;    /* written by the program's large memcpy/memmove (a result array) */
    int warm_reuse;           /* its pages were a warm block's (heap.c): a transfer buffer again */
    uintptr_t copied_lo, copied_hi;   /* the addresses its copies touched, lowest to highest */
    uint64_t last_use_ns;
    unsigned inflight;        /* copies holding its registration now */
    unsigned pageable_users;  /* copies using it as pageable while it is queued for registration */
    int async_pending;        /* trusted async copies may still read or write it */
    int no_promote;           /* registration failed for a reason that will not change */
    int changing;             /* its registration is being made or removed outside mu */
    int captured;             /* a captured graph copies through its registration: a replay
                               * after an unregister would DMA into unpinned memory, so it is
                               * never evicted while the program owns it */
    int dead;                 /* its memory is gone; the last copy_end deletes the record */
    int bg_queued;            /* waiting for, or in, a background registration (holds inflight) */
    int bg_registering;       /* `changing` is that registration: copies may stage meanwhile */
    int freed_pending;        /* freed by the program during it: its end decides the memory's fate */
    int bg_cancel;            /* its pages were discarded or given to the program's own
                               * registration while it waited: the registrar skips it */
    int caching_on_free;      /* freed and queued to be registered, then cached (counted in
                               * caching_in_list until the registrar is done with it) */
    int taken_back;           /* queued so, then handed to an allocation before its turn came
                               * (bg_cancel set for it): freed again, it is queued again */
    CUcontext bg_ctx;         /* the context to register it in */
    CUcontext copy_ctx;       /* the context of its first copy the cost model judged */
    struct block *lru_prev, *lru_next;     /* cached: all, least recently freed last;
                                            * promoted: all promoted blocks */
    struct block *fit_prev, *fit_next;     /* cached: by arena class (huge: one list) */
    struct block *all_prev, *all_next;     /* every record (the fork child resets them) */
};

#define IDLE_EVICT_NS 1000000000ull   /* a promoted block idle this long may go for any newcomer */
#define HUGE_FIT ARENA_CLASSES        /* the cache list of huge blocks */

static pthread_mutex_t change_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t settled = PTHREAD_COND_INITIALIZER;

static struct block **index_;
static size_t index_len, index_cap;
static uintptr_t span_lo = UINTPTR_MAX, span_hi;   /* bounds of the index, read without mu */

static struct block *promoted_head;                 /* promoted blocks (eviction candidates) */
static struct block *cache_head, *cache_tail;       /* cached blocks, most recently freed first */
static struct block *cache_fit[ARENA_CLASSES + 1];
static uint64_t cache_count;                        /* read without mu: a quick "empty" test */
static uint32_t cached_in_list[ARENA_CLASSES + 1];  /* blocks in each cache list */
/* Per cache list (arena class, or huge): blocks freed after carrying a transfer of most of
 * their bytes.  Where this keeps happening (a buffer allocated afresh, copied and freed every
 * step), the next such block is registered on its way out and cached, so that the allocation of
 * the step after gets a registered block. */
static uint32_t copied_frees[ARENA_CLASSES + 1];
#define CACHE_ON_FREE_AFTER 2
/* How many blocks a list keeps cached on free: CACHE_ON_FREE_MIN, and one more for every
 * allocation of its size that found it empty since a heap block of that size was first copied,
 * within a quarter of the budget.
 * A program that allocates a whole set of transfer buffers afresh every round (a checkpoint's
 * CPU tensors, a batch of result arrays) thus finds a registered block for each of them from
 * the round after the one that showed the demand; a list whose allocations the cache serves
 * keeps what it has.  A miss raises the count only: blocks are cached only when they carried a
 * transfer. */
#define CACHE_ON_FREE_MIN 4
/* While the program copies, freed blocks are registered for the cache at once as long as no more
 * than this many wait (a buffer freed every step); a burst beyond it (a checkpoint's tensors)
 * waits for a pause in the copies (bg_main). */
#define COLD_AT_ONCE 4
static uint32_t caching_in_list[ARENA_CLASSES + 1]; /* queued to be registered and cached */
static uint64_t caching_count;                      /* their sum, read without mu */
static uint8_t cache_active[ARENA_CLASSES + 1];     /* atomic: a block of its size was copied */
static uint8_t any_cache_active;                    /* atomic: one of them is (a heap that never
                                                     * copies pays one load per allocation) */
static uint32_t cache_missed[ARENA_CLASSES + 1];    /* atomic: allocations that found it empty */
static uint64_t arena_records;

static uint64_t registered_bytes;
static int promotion_state;   /* 0 undecided, 1 on, -1 off */
static int read_only_supported;

/* ---------------------------------------------------------------- records */

static struct block *all_records;

/* mu held. */
static struct block *record_new(void)
{
    struct block *b = meta_alloc(sizeof(struct block));
    if (b) {
        b->all_next = all_records;
        if (all_records)
            all_records->all_prev = b;
        all_records = b;
    }
    return b;
}

static void record_delete(struct block *b)
{
    if (b->origin == ORIGIN_ARENA)
        __atomic_sub_fetch(&arena_records, 1, __ATOMIC_RELAXED);
    if (b->all_prev)
        b->all_prev->all_next = b->all_next;
    else
        all_records = b->all_next;
    if (b->all_next)
        b->all_next->all_prev = b->all_prev;
    meta_free(b, sizeof *b);
}

static void lru_insert(struct block **head, struct block *b)
{
    b->lru_prev = NULL;
    b->lru_next = *head;
    if (*head)
        (*head)->lru_prev = b;
    *head = b;
}

static void lru_unlink(struct block **head, struct block *b)
{
    if (b->lru_prev)
        b->lru_prev->lru_next = b->lru_next;
    else if (*head == b)
        *head = b->lru_next;
    if (b->lru_next)
        b->lru_next->lru_prev = b->lru_prev;
    b->lru_prev = b->lru_next = NULL;
}

/* ---------------------------------------------------------------- the index */

static size_t lower_bound(uintptr_t addr)
{
    size_t lo = 0, hi = index_len;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (index_[mid]->map_base < addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static void span_update(void)
{
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    if (index_len) {
        lo = index_[0]->map_base;
        hi = index_[index_len - 1]->map_base + index_[index_len - 1]->map_len;
    }
    __atomic_store_n(&span_lo, lo, __ATOMIC_RELAXED);
    __atomic_store_n(&span_hi, hi, __ATOMIC_RELAXED);
}

/* Without mu: 0 when no indexed mapping can hold p.  A reader may see the two bounds from
 * different updates; a block indexed through both is inside either. */
static inline int index_may_contain(uintptr_t p)
{
    return p >= __atomic_load_n(&span_lo, __ATOMIC_RELAXED) &&
           p < __atomic_load_n(&span_hi, __ATOMIC_RELAXED);
}

static int index_insert(struct block *b)
{
    if (index_len == index_cap) {
        size_t cap = index_cap ? index_cap * 2 : 4096;
        struct block **grown = os_map(cap * sizeof *grown);
        if (!grown)
            return -1;
        if (index_) {
            memcpy(grown, index_, index_len * sizeof *grown);
            os_unmap(index_, index_cap * sizeof *index_);
        }
        index_ = grown;
        index_cap = cap;
    }
    size_t i = lower_bound(b->map_base);
    memmove(&index_[i + 1], &index_[i], (index_len - i) * sizeof *index_);
    index_[i] = b;
    index_len++;
    span_update();
    return 0;
}

static void index_remove(struct block *b)
{
    size_t i = lower_bound(b->map_base);
    while (i < index_len && index_[i] != b)
        i++;
    if (i < index_len) {
        memmove(&index_[i], &index_[i + 1], (index_len - i - 1) * sizeof *index_);
        index_len--;
        span_update();
    }
}

static struct block *index_find(uintptr_t p)
{
    if (!index_may_contain(p))
        return NULL;
    size_t i = lower_bound(p + 1);
    if (i == 0)
        return NULL;
    struct block *b = index_[i - 1];
    return p < b->map_base + b->map_len ? b : NULL;
}

/* ---------------------------------------------------------------- lookups (mu held) */

/* The record of the block holding p; an arena block without one gets one when `make`. */
static struct block *lookup(uintptr_t p, int make)
{
    struct arena_block ab;
    if (arena_find(p, &ab)) {
        struct arena_slot *s = ab.slot;
        uint32_t st = __atomic_load_n(&s->state, __ATOMIC_ACQUIRE);
        if (st == SLOT_TRACKED)
            return s->rec;
        if (st != SLOT_LIVE || !make)
            return NULL;
        struct block *b = record_new();
        if (!b)
            return NULL;
        b->base = ab.base;
        b->size = s->size;
        b->map_base = ab.block;
        b->map_len = ab.block_len;
        b->origin = ORIGIN_ARENA;
        b->state = BLOCK_PAGEABLE;
        b->prot = PROT_READ | PROT_WRITE;
        b->slot = s;
        __atomic_add_fetch(&arena_records, 1, __ATOMIC_RELAXED);
        if (arena_track(s, b) != 0) {   /* freed meanwhile */
            record_delete(b);
            return NULL;
        }
        return b;
    }
    return index_find(p);
}

static void wait_settled(struct block *b)
{
    while (b->changing)
        pthread_cond_wait(&settled, &mu);
}

/* The block holding p once no registration of it is being made or removed. */
static struct block *lookup_settled(uintptr_t p, int make)
{
    struct block *b = lookup(p, make);
    while (b && b->changing) {
        wait_settled(b);
        b = lookup(p, make);
    }
    return b;
}

/* Forget a record whose memory is going away or going back to the arena (mu held, not
 * registered, not changing).  Arena blocks: back to the arena as free, or still the program's. */
static void forget(struct block *b, int block_freed)
{
    if (b->origin == ORIGIN_ARENA) {
        if (block_freed)
            arena_release(b->slot);
        else
            arena_untrack(b->slot);
    } else {
        index_remove(b);
    }
    if (b->inflight || b->pageable_users) {
        b->dead = 1;   /* a copy still holds it: registry_copy_end deletes it */
        b->slot = NULL;
        return;
    }
    record_delete(b);
}

/* ---------------------------------------------------------------- program-pinned ranges */

struct pinned_range { uintptr_t start; size_t len; unsigned flags; };
static struct pinned_range *pinned;
static size_t pinned_len, pinned_cap;
/* Bumped on every change; a thread's last hit stays good while it is unchanged, so a program
 * that copies from its own pinned buffers takes no lock. */
static unsigned long pinned_generation;
static __thread struct { unsigned long generation; uintptr_t start; size_t len; unsigned flags; } pinned_last_hit;
static pthread_mutex_t pinned_mu = PTHREAD_MUTEX_INITIALIZER;

static void pinned_add(uintptr_t start, size_t len, unsigned flags)
{
    pthread_mutex_lock(&pinned_mu);
    if (pinned_len == pinned_cap) {
        size_t cap = pinned_cap ? pinned_cap * 2 : 256;
        struct pinned_range *grown = os_map(cap * sizeof *grown);
        if (!grown) {
            pthread_mutex_unlock(&pinned_mu);
            return;
        }
        if (pinned) {
            memcpy(grown, pinned, pinned_len * sizeof *grown);
            os_unmap(pinned, pinned_cap * sizeof *pinned);
        }
        pinned = grown;
        pinned_cap = cap;
    }
    pinned[pinned_len++] = (struct pinned_range){start, len, flags};
    __atomic_add_fetch(&pinned_generation, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&pinned_mu);
}

static void pinned_remove(uintptr_t start)
{
    pthread_mutex_lock(&pinned_mu);
    for (size_t i = 0; i < pinned_len; i++) {
        if (pinned[i].start == start) {
            pinned[i] = pinned[--pinned_len];
            __atomic_add_fetch(&pinned_generation, 1, __ATOMIC_RELEASE);
            break;
        }
    }
    pthread_mutex_unlock(&pinned_mu);
}

/* 1 when [p, p+n) lies in one program-pinned range (*flags: its registration flags). */
static int pinned_find(uintptr_t p, size_t n, unsigned *flags)
{
    int found = 0;
    if (!__atomic_load_n(&pinned_len, __ATOMIC_RELAXED))
        return 0;
    unsigned long generation = __atomic_load_n(&pinned_generation, __ATOMIC_ACQUIRE);
    if (pinned_last_hit.generation == generation && p >= pinned_last_hit.start &&
        p + n <= pinned_last_hit.start + pinned_last_hit.len) {
        *flags = pinned_last_hit.flags;
        return 1;
    }
    pthread_mutex_lock(&pinned_mu);
    for (size_t i = 0; i < pinned_len; i++) {
        if (p >= pinned[i].start && p + n <= pinned[i].start + pinned[i].len) {
            found = 1;
            *flags = pinned[i].flags;
            pinned_last_hit.generation = __atomic_load_n(&pinned_generation, __ATOMIC_RELAXED);
            pinned_last_hit.start = pinned[i].start;
            pinned_last_hit.len = pinned[i].len;
            pinned_last_hit.flags = pinned[i].flags;
            break;
        }
    }
    pthread_mutex_unlock(&pinned_mu);
    return found;
}

int registry_program_pinned(uintptr_t p, size_t n)
{
    unsigned flags;
    return pinned_find(p, n, &flags);
}

void registry_program_allocated(uintptr_t p, size_t n)
{
    pinned_add(p, n, 0);
}

void registry_program_freed(uintptr_t p)
{
    pinned_remove(p);
}

/* ---------------------------------------------------------------- the driver */

static void update_registered(int64_t delta)
{
    uint64_t now = __atomic_add_fetch(&registered_bytes, (uint64_t)delta, __ATOMIC_RELAXED);
    stats_registered_bytes(now);
}

uint64_t registry_registered_bytes(void)
{
    return __atomic_load_n(&registered_bytes, __ATOMIC_RELAXED);
}

static CUresult register_range(uintptr_t base, size_t len, unsigned flags)
{
    return ((PFN_cuMemHostRegister_v6050)real_hook[HOOK_cuMemHostRegister_v2])((void *)base, len, flags);
}

/* An unregister runs inside the program's free, munmap or realloc, where without the shim no
 * driver code runs.  The driver takes the C library's locks inside its calls (allocating), so a
 * signal handler of the program that allocates (as sampling profilers do) and lands there would
 * wait for them forever: the thread's asynchronous signals wait until the call is over
 * (contract rule 10; the stress run's signal thread hung this way on the fake driver).  Signals
 * a fault raises stay deliverable. */
static void block_async_signals(sigset_t *old)
{
    sigset_t set;
    sigfillset(&set);
    static const int synchronous[] = { SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS };
    for (unsigned i = 0; i < sizeof synchronous / sizeof synchronous[0]; i++)
        sigdelset(&set, synchronous[i]);
    pthread_sigmask(SIG_BLOCK, &set, old);
}

/* Unregister a registration no copy can see any more.  Pushes the registering context: a free()
 * may come from a thread that never used CUDA. */
static void unregister_range(uintptr_t base, size_t len, CUcontext ctx, int async_pending)
{
    if (shim_forked_child || !real_hook[HOOK_cuMemHostUnregister])
        return;
    uint64_t t0 = shim_now_ns();
    nvtx_push("pinshim unregister");
    sigset_t signals;
    block_async_signals(&signals);
    CUstreamCaptureMode saved_mode = drv_relax_capture();
    int pushed = ctx && drv.cuCtxPushCurrent_v2(ctx) == CUDA_SUCCESS;
    if (async_pending && drv.cuCtxSynchronize)
        drv.cuCtxSynchronize();   /* trusted async copies may still use it */
    CUresult r = ((PFN_cuMemHostUnregister_v4000)real_hook[HOOK_cuMemHostUnregister])((void *)base);
    if (pushed) {
        CUcontext ignored;
        drv.cuCtxPopCurrent_v2(&ignored);
    }
    drv_restore_capture(saved_mode);
    pthread_sigmask(SIG_SETMASK, &signals, NULL);
    nvtx_pop();
    if (r != CUDA_SUCCESS)
        shim_log_once(LOG_INFO, "unregister of a promoted block failed (error %d)", (int)r);
    uint64_t took = shim_now_ns() - t0;
    stats_add(STAT_UNREGISTER_NS, took);
    if (trace_on())
        trace_event(took, "unregister", "addr=%#lx bytes=%zu ok=%d", (unsigned long)base, len, r == CUDA_SUCCESS);
    update_registered(-(int64_t)len);
    nodebudget_release(len);
}

/* What an unregister needs, taken from a record under mu (the record may be gone by the time
 * the driver is called). */
struct unreg {
    uintptr_t base;
    size_t len;
    CUcontext ctx;
    int pending;
};

static void cache_unlink(struct block *b);

/* The pages a registration of b covers. */
static void reg_range(const struct block *b, uintptr_t *base, size_t *len)
{
    if (b->origin == ORIGIN_ARENA) {
        *base = page_down(b->base);
        *len = page_up(b->base + (b->size ? b->size : 1)) - *base;
    } else {
        *base = b->map_base;
        *len = b->map_len;
    }
}

/* b stops being registered in the records (mu held); the caller unregisters `u` outside mu. */
static struct unreg take_registration(struct block *b)
{
    struct unreg u = { b->reg_base, b->reg_len, b->reg_ctx, b->async_pending };
    if (b->state == BLOCK_CACHED)
        cache_unlink(b);
    else if (b->state == BLOCK_PROMOTED)
        lru_unlink(&promoted_head, b);
    b->state = BLOCK_PAGEABLE;
    b->reg_base = 0;
    b->reg_len = 0;
    b->reg_ctx = NULL;
    b->reg_flags = 0;
    b->async_pending = 0;
    return u;
}


/* ---------------------------------------------------------------- the pinned cache */

/* Arena blocks wait in their class's list (any request of that class fits exactly), huge ones
 * in one list of their own. */
static unsigned cache_list_of(const struct block *b)
{
    return b->origin == ORIGIN_ARENA ? arena_class_of_block(b->map_len) : HUGE_FIT;
}

/* The list an allocation of n bytes aligned to align would be served from: the request's side of
 * cache_list_of. */
static unsigned cache_list_for(size_t n, size_t align)
{
    return arena_serves(n, align) ? arena_class_for(n, align) : HUGE_FIT;
}

static void cache_put(struct block *b)
{
    lru_unlink(&promoted_head, b);
    b->state = BLOCK_CACHED;
    b->captured = 0;
    b->size = 0;
    b->copies = 0;
    b->bytes_moved = 0;
    b->copied_lo = b->copied_hi = 0;
    b->last_use_ns = shim_now_ns();
    lru_insert(&cache_head, b);
    if (!cache_tail)
        cache_tail = b;
    unsigned list = cache_list_of(b);
    b->fit_prev = NULL;
    b->fit_next = cache_fit[list];
    if (cache_fit[list])
        cache_fit[list]->fit_prev = b;
    cache_fit[list] = b;
    cached_in_list[list]++;
    __atomic_add_fetch(&cache_count, 1, __ATOMIC_RELAXED);
}

static void cache_unlink(struct block *b)
{
    if (cache_tail == b)
        cache_tail = b->lru_prev;
    lru_unlink(&cache_head, b);
    unsigned list = cache_list_of(b);
    if (b->fit_prev)
        b->fit_prev->fit_next = b->fit_next;
    else
        cache_fit[list] = b->fit_next;
    if (b->fit_next)
        b->fit_next->fit_prev = b->fit_prev;
    b->fit_prev = b->fit_next = NULL;
    cached_in_list[list]--;
    __atomic_sub_fetch(&cache_count, 1, __ATOMIC_RELAXED);
}

/* The memory of a cached block the registry lets go (registration already gone, mu held). */
static void cache_drop_memory(struct block *b, uintptr_t *unmap, size_t *unmap_len)
{
    *unmap = 0;
    *unmap_len = 0;
    if (b->origin == ORIGIN_ARENA) {
        arena_release(b->slot);
    } else {
        index_remove(b);
        *unmap = b->map_base;
        *unmap_len = b->map_len;
    }
    record_delete(b);
}

/* Demand past this many blocks of one size is not the cache's to meet (a quarter of the budget
 * bounds it sooner); once there, a malloc loop of the size only reads the counter, whose line
 * then stays shared among its threads rather than moving between them on every allocation. */
#define CACHE_MISSED_MAX 4096u

/* A block of list `list` queued to be registered and cached on free (+1), or no longer (-1). */
static void caching_note(unsigned list, int delta)
{
    caching_in_list[list] += (uint32_t)delta;
    __atomic_add_fetch(&caching_count, (uint64_t)(int64_t)delta, __ATOMIC_RELAXED);
}

/* An allocation of a list that caches on free found no block there: its demand. */
static void cache_note_miss(unsigned list)
{
    if (__atomic_load_n(&cache_active[list], __ATOMIC_RELAXED) &&
        __atomic_load_n(&cache_missed[list], __ATOMIC_RELAXED) < CACHE_MISSED_MAX)
        __atomic_add_fetch(&cache_missed[list], 1, __ATOMIC_RELAXED);
}

/* The background registrar's queue (its thread: see "background registration" below), which
 * take_back also walks.  A checkpoint frees its hundred or so large tensors in one burst,
 * faster than they register: the queue holds such a burst whole (a power of two: the indexes
 * wrap). */
#define BG_QUEUE 256

static pthread_mutex_t bg_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t bg_cv = PTHREAD_COND_INITIALIZER;
static struct block *bg_queue[BG_QUEUE];
static unsigned bg_head, bg_tail;   /* guarded by mu (the records) and bg_mu (the wake-up) */
static int bg_started, bg_stop, bg_busy;
static pthread_t bg_thread;

/* A freed block of list `list` still waiting for its registration (the pinned cache on free),
 * handed back to an allocation of n bytes aligned to align, or NULL (mu held).  Its pages are
 * resident, where a block the arena gave instead might be fresh ones to fault in; the
 * registrar skips it.  This is what an allocation gets when a burst of frees waits for a pause
 * in the program's copies (bg_main); the COLD_AT_ONCE oldest of the list are left to the
 * registrar, so a buffer freed every step still ends up cached. */
static void *take_back(size_t n, size_t align, unsigned list)
{
    if (caching_in_list[list] <= COLD_AT_ONCE)
        return NULL;   /* registered soon (bg_main): the step after finds it cached */
    for (unsigned i = bg_tail - bg_head; i-- > 0;) {   /* the most recently freed first */
        struct block *b = bg_queue[(bg_head + i) % BG_QUEUE];
        if (!b->caching_on_free || b->changing || b->dead || b->bg_cancel || b->state != BLOCK_PAGEABLE ||
            cache_list_of(b) != list || (b->base & (align - 1)))
            continue;
        size_t usable = b->map_base + b->map_len - b->base;
        if (usable < n || (list == HUGE_FIT && usable / 2 > n))
            continue;
        b->caching_on_free = 0;
        caching_note(list, -1);
        b->freed_pending = 0;
        b->bg_cancel = 1;
        b->taken_back = 1;
        b->size = n;
        b->copies = 0;   /* a new allocation: its own copies judge it, as a cached block's do */
        b->bytes_moved = 0;
        b->copied_lo = b->copied_hi = 0;
        b->last_use_ns = shim_now_ns();
        if (b->slot)
            b->slot->size = n;
        stats_add(STAT_CACHE_TAKEN_BACK, 1);
        return (void *)b->base;
    }
    return NULL;
}

void *registry_cache_take(size_t n, size_t align)
{
    if (!__atomic_load_n(&cache_count, __ATOMIC_RELAXED) && !__atomic_load_n(&caching_count, __ATOMIC_RELAXED)) {
        if (__atomic_load_n(&any_cache_active, __ATOMIC_RELAXED))
            cache_note_miss(cache_list_for(n, align));
        return NULL;
    }
    unsigned list = cache_list_for(n, align);
    int in_arena = list != HUGE_FIT;
    pthread_mutex_lock(&mu);
    struct block *best = NULL;
    if (in_arena) {
        /* The most recently freed of the class (its pages are warmest), if it is aligned as
         * asked: blocks of a class differ only in where their pointer lies. */
        best = cache_fit[list];
        if (best && ((best->base & (align - 1)) || page_up(best->base + n) > best->reg_base + best->reg_len))
            best = NULL;   /* its registration covers fewer pages than this request needs */
    } else {
        for (struct block *b = cache_fit[HUGE_FIT]; b; b = b->fit_next) {
            size_t usable = b->map_base + b->map_len - b->base;
            /* A fit: large enough, not wastefully larger, aligned as asked. */
            if (usable < n || usable / 2 > n || (b->base & (align - 1)))
                continue;
            if (!best || b->map_len < best->map_len)
                best = b;
        }
    }
    if (best) {
        cache_unlink(best);
        best->state = BLOCK_PROMOTED;
        best->size = n;
        best->last_use_ns = shim_now_ns();
        lru_insert(&promoted_head, best);
        if (best->slot)
            best->slot->size = n;
    } else {
        stats_add(STAT_CACHE_MISSES, 1);
        cache_note_miss(list);
        void *back = take_back(n, align, list);
        pthread_mutex_unlock(&mu);
        return back;
    }
    pthread_mutex_unlock(&mu);
    stats_add(STAT_CACHE_HITS, 1);
    return (void *)best->base;
}

/* The program freed b while its registration was changing (mu held, the change over): the
 * free is carried out now, as registry_free would have.  b may be gone on return. */
static void finish_free(struct block *b)
{
    b->freed_pending = 0;
    if (b->state == BLOCK_PROMOTED) {
        cache_put(b);
        return;
    }
    uintptr_t map = b->origin == ORIGIN_HUGE ? b->map_base : 0;
    size_t len = b->map_len;
    forget(b, 1);
    if (map)
        os_unmap((void *)map, len);   /* a huge block's mapping: nobody else has it */
}

/* The end of a registration change of b (mu held): whoever waits for it may go on, and a free
 * that came meanwhile is carried out (a background registration's own end does that in
 * bg_finish).  b may be gone on return. */
static void change_done(struct block *b)
{
    b->changing = 0;
    b->bg_registering = 0;
    pthread_cond_broadcast(&settled);
    if (b->freed_pending && !b->bg_queued)
        finish_free(b);
}

/* ---------------------------------------------------------------- budget and promotion */

static void disable_promotion(const char *reason)
{
    __atomic_store_n(&promotion_state, -1, __ATOMIC_RELEASE);
    stats_promotion_disabled(reason);
    shim_log(LOG_INFO, "promotion off: %s", reason);
}

static void calibrate(void);

int registry_promotion_enabled(void)
{
    int state = __atomic_load_n(&promotion_state, __ATOMIC_ACQUIRE);
    if (state)
        return state > 0;
    pthread_mutex_lock(&change_mu);
    if (!promotion_state) {
        CUdevice dev;
        int pageable_ok = 0, register_ok = 1;
        if (shim_cfg.mode != MODE_PIN && shim_cfg.mode != MODE_FULL) {
            promotion_state = -1;
        } else if (shim_cfg.budget == 0) {
            disable_promotion("PINSHIM_BUDGET is 0");
        } else if (!drv.cuCtxGetDevice || drv.cuCtxGetDevice(&dev) != CUDA_SUCCESS) {
            /* No context yet: decide later. */
            pthread_mutex_unlock(&change_mu);
            return 0;
        } else {
            drv.cuDeviceGetAttribute(&pageable_ok,
                                     CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES, dev);
            if (drv.cuDeviceGetAttribute(&register_ok, CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED,
                                         dev) != CUDA_SUCCESS)
                register_ok = 1;
            drv.cuDeviceGetAttribute(&read_only_supported,
                                     CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED, dev);
            if (pageable_ok)
                disable_promotion("the device reads pageable memory through the host page tables: "
                                  "pinning buys little here");
            else if (!register_ok)
                disable_promotion("the device does not support host memory registration");
            else {
                if (shim_cfg.calibrate)
                    calibrate();
                __atomic_store_n(&promotion_state, 1, __ATOMIC_RELEASE);
            }
        }
    }
    int on = promotion_state > 0;
    pthread_mutex_unlock(&change_mu);
    return on;
}

/* Make room for `need` more registered bytes.  change_mu held, mu not held.  Cached blocks go
 * first (least recently freed first), then promoted blocks idle for long enough, least recently
 * used first, never `keep`. */
static int make_room(size_t need, struct block *keep)
{
    while (registry_registered_bytes() + need > shim_cfg.budget) {
        uint64_t now = shim_now_ns();
        pthread_mutex_lock(&mu);
        struct block *victim = cache_tail;
        int was_cached = victim != NULL;
        if (!victim) {
            uint64_t keep_gap = keep && keep->copies > 1 ? now - keep->last_use_ns : 0;
            for (struct block *b = promoted_head; b; b = b->lru_next) {
                if (b == keep || b->inflight || b->captured || b->changing)
                    continue;
                uint64_t idle = now - b->last_use_ns;
                if (idle < IDLE_EVICT_NS && idle <= keep_gap)
                    continue;
                if (!victim || b->last_use_ns < victim->last_use_ns)
                    victim = b;
            }
            if (!victim) {
                pthread_mutex_unlock(&mu);
                return 0;
            }
        }
        struct unreg u = take_registration(victim);
        uintptr_t unmap = 0;
        size_t unmap_len = 0;
        if (was_cached)
            cache_drop_memory(victim, &unmap, &unmap_len);   /* no copy can reach it */
        else
            victim->changing = 1;
        pthread_mutex_unlock(&mu);
        nvtx_mark("pinshim evict");
        unregister_range(u.base, u.len, u.ctx, u.pending);
        stats_add(STAT_EVICTIONS, 1);
        stats_add(STAT_EVICTED_BYTES, u.len);
        if (was_cached) {
            if (unmap)
                os_unmap((void *)unmap, unmap_len);
            stats_add(STAT_CACHE_RELEASED, 1);
        } else {
            pthread_mutex_lock(&mu);
            change_done(victim);
            pthread_mutex_unlock(&mu);
        }
    }
    return 1;
}

int registry_reserve(size_t bytes)
{
    int ok = 0;
    pthread_mutex_lock(&change_mu);
    if (make_room(bytes, NULL) && nodebudget_reserve(bytes)) {
        update_registered((int64_t)bytes);
        ok = 1;
    }
    pthread_mutex_unlock(&change_mu);
    return ok;
}

void registry_unreserve(size_t bytes)
{
    update_registered(-(int64_t)bytes);
    nodebudget_release(bytes);
}

/* Register b (all its pages) under the budget, evicting colder registrations first, in the
 * current context.  mu not held; the caller holds b->inflight.  1 when b is promoted.
 * background: copies of b meanwhile may take the pageable path without waiting. */
#define PROMOTE_RETRY (-1)   /* background: a copy uses the block as pageable; try again later */

static int promote(struct block *b, int background)
{
    if (!real_hook[HOOK_cuMemHostRegister_v2] || !registry_promotion_enabled())
        return 0;
    CUcontext ctx = NULL;
    if (drv.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx)
        return 0;
    int promoted = 0;
    pthread_mutex_lock(&change_mu);
    pthread_mutex_lock(&mu);
    int state = b->dead ? -1 : (int)b->state;
    uintptr_t base;
    size_t len;
    reg_range(b, &base, &len);
    int prot = b->prot;
    pthread_mutex_unlock(&mu);
    if (state != BLOCK_PAGEABLE) {
        pthread_mutex_unlock(&change_mu);
        return state == BLOCK_PROMOTED;
    }
    if (make_room(len, b) && nodebudget_reserve(len)) {
        unsigned flags = CU_MEMHOSTREGISTER_PORTABLE;
        if (!(prot & PROT_WRITE))
            flags |= CU_MEMHOSTREGISTER_READ_ONLY;
        pthread_mutex_lock(&mu);
        if (b->changing || b->state != BLOCK_PAGEABLE || b->dead || b->no_promote || b->pageable_users ||
            (background && b->bg_cancel)) {
            /* The program's own unregister holds it, it changed while room was made, or a copy
             * is using it as pageable memory. */
            int retry = background && b->pageable_users && !b->dead && !b->changing &&
                        b->state == BLOCK_PAGEABLE && !b->no_promote && !b->bg_cancel;
            pthread_mutex_unlock(&mu);
            nodebudget_release(len);
            pthread_mutex_unlock(&change_mu);
            return retry ? PROMOTE_RETRY : 0;
        }
        b->changing = 1;
        b->bg_registering = background;
        pthread_mutex_unlock(&mu);
        uint64_t t0 = shim_now_ns();
        nvtx_push(background ? "pinshim promote (background)" : "pinshim promote");
        /* Relaxed: the program's capture on another thread must not be invalidated by it. */
        CUstreamCaptureMode saved_mode = drv_relax_capture();
        CUresult r = register_range(base, len, flags);
        drv_restore_capture(saved_mode);
        nvtx_pop();
        uint64_t took = shim_now_ns() - t0;
        stats_add(STAT_REGISTER_NS, took);
        if (trace_on())
            trace_event(took, "register", "addr=%#lx bytes=%zu background=%d ok=%d", (unsigned long)base, len,
                        background, r == CUDA_SUCCESS);
        pthread_mutex_lock(&mu);
        if (r == CUDA_SUCCESS) {
            b->state = BLOCK_PROMOTED;
            b->reg_base = base;
            b->reg_len = len;
            b->reg_ctx = ctx;
            b->reg_flags = flags;
            lru_insert(&promoted_head, b);
            promoted = 1;
        } else if (r == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED || r == CUDA_ERROR_INVALID_VALUE ||
                   r == CUDA_ERROR_NOT_PERMITTED) {
            /* Overlap with the program's own pinning, or memory the driver refuses: it stays
             * pageable and the copy takes the original path. */
            b->no_promote = 1;
        }
        change_done(b);   /* the caller's hold keeps b */
        pthread_mutex_unlock(&mu);
        if (promoted) {
            update_registered((int64_t)len);
            stats_add(STAT_PROMOTIONS, 1);
            stats_add(STAT_PROMOTED_BYTES, len);
        } else {
            nodebudget_release(len);
            stats_add(STAT_PROMOTION_FAILURES, 1);
            shim_log_once(LOG_INFO, "registering a hot block failed (error %d): left pageable", (int)r);
            if (r == CUDA_ERROR_NOT_SUPPORTED)
                disable_promotion("the driver refused host memory registration");
        }
    }
    pthread_mutex_unlock(&change_mu);
    return promoted;
}

/* The shim's registration of b is let go now (mu held on entry and on return; dropped for the
 * driver call, with b marked changing meanwhile). */
static void let_go(struct block *b)
{
    struct unreg u = take_registration(b);
    b->changing = 1;
    pthread_mutex_unlock(&mu);
    unregister_range(u.base, u.len, u.ctx, u.pending);
    pthread_mutex_lock(&mu);
    change_done(b);
}

/* ---------------------------------------------------------------- background registration
 * One thread registers blocks that proved reused, so that no copy waits for a registration
 * (45 ms/GiB of resident pages, 8 times that for untouched ones): their copies are staged until
 * it is done.  A queued block holds `inflight` (its record stays, eviction leaves it alone); a
 * free while it is being registered leaves the memory to the registrar, which caches it if the
 * registration took and gives it back otherwise. */

static void hold_release(struct block *b)
{
    b->inflight--;
    if (b->dead && !b->inflight && !b->pageable_users)
        record_delete(b);
}

static void pageable_release(struct block *b)
{
    b->pageable_users--;
    if (b->dead && !b->inflight && !b->pageable_users)
        record_delete(b);
}

/* The registration of b has ended (mu held): the program's free during it is carried out now. */
static void bg_finish(struct block *b)
{
    b->bg_queued = 0;
    b->bg_cancel = 0;
    b->taken_back = 0;
    if (b->caching_on_free) {
        b->caching_on_free = 0;
        caching_note(cache_list_of(b), -1);
    }
    if (b->freed_pending)
        finish_free(b);   /* the queue's hold keeps b until hold_release */
    hold_release(b);
}

/* ---- the program's copies, as the registrar sees them ----
 * A registration holds off the program's driver calls while it runs: on an H100 host a
 * checkpoint's copies stood still for 25 ms while the registrar registered the blocks the round
 * before had freed, and a model's move to the GPU waited out every registration made beside it
 * (0.37 ms per 16 MiB).  A block the program copies again is worth registering at once; a freed
 * one (the pinned cache on free) serves only a later allocation: a few are registered at once
 * (COLD_AT_ONCE: a buffer freed every step, whose next step then finds it cached), a burst waits
 * for a pause in the program's copies, or takes at most a COLD_SHARE-th of the time while they
 * go on. */
#define COPY_PAUSE_NS 2000000ull     /* no copy began or ended for this long: a pause */
#define COLD_SHARE 20
#define COLD_POLL_NS 500000ull       /* how often a waiting registrar looks again */
/* A copy rewrites the shared stamp only when it is older than this many ticks: 100-300 us at
 * the TSC rates of x86-64 servers, 300 us where ticks are nanoseconds; unconverted, as this runs
 * on every copy. */
#define COPY_STAMP_TICKS 300000ull
#define LONG_COPY_MIN (1u << 20)     /* a copy this large may outlast a pause alone: counted */
static int long_copies;              /* atomic: such copies under way */
static uint64_t last_copy_ticks;     /* atomic: shim_ticks() when a copy last ended */

/* On a small copy's path this costs a TSC read and a load of a line written once per
 * COPY_STAMP_TICKS at most (a 4 KiB copy takes about 8 us): a short copy is stamped as it ends, a
 * long one is counted while it runs. */
void registry_copy_activity(int begin, size_t bytes)
{
    if (bytes >= LONG_COPY_MIN) {
        if (begin)
            __atomic_add_fetch(&long_copies, 1, __ATOMIC_RELAXED);
        else
            __atomic_sub_fetch(&long_copies, 1, __ATOMIC_RELAXED);
    }
    if (begin)
        return;
    uint64_t now = shim_ticks(), last = __atomic_load_n(&last_copy_ticks, __ATOMIC_RELAXED);
    if (now - last >= COPY_STAMP_TICKS || now < last)
        __atomic_store_n(&last_copy_ticks, now, __ATOMIC_RELAXED);
}

/* Whether the program copies now (0 since the stamp: another CPU's clock, taken as copying). */
static int program_copying(void)
{
    return __atomic_load_n(&long_copies, __ATOMIC_RELAXED) > 0 ||
           shim_ns_since(__atomic_load_n(&last_copy_ticks, __ATOMIC_RELAXED)) < COPY_PAUSE_NS;
}

/* A queued block whose registration only a later allocation would use (mu held). */
static int bg_cold(const struct block *b)
{
    return b->caching_on_free && !b->dead && !b->bg_cancel && b->state == BLOCK_PAGEABLE;
}

/* The next queued block to serve, taken off the queue (mu held): the first that is not cold
 * (copied again, or to be skipped), moved to the head; a cold one only when cold_may_go.  NULL
 * when only cold ones wait and they may not go yet. */
static struct block *bg_next(int cold_may_go)
{
    unsigned head = bg_head;
    for (unsigned i = head; i != bg_tail; i++) {
        struct block *b = bg_queue[i % BG_QUEUE];
        if (cold_may_go || !bg_cold(b)) {
            bg_queue[i % BG_QUEUE] = bg_queue[head % BG_QUEUE];
            bg_queue[head % BG_QUEUE] = b;
            __atomic_store_n(&bg_head, head + 1, __ATOMIC_RELEASE);
            return b;
        }
    }
    return NULL;
}

static void *bg_main(void *arg)
{
    shim_enter();   /* this thread's allocations and driver calls are the shim's own; never left */
    shim_own_thread = 1;
    /* Named by itself (a system call): naming another thread opens a file under /proc, and the
     * shim opens no descriptor on a thread of its own (see cpupool_prefer_device). */
    pthread_setname_np(pthread_self(), "pinshim-register");
    drv_relax_capture();   /* its registrations must not touch a program's capture (base/real.h) */
    uint64_t cold_after = 0;   /* while the program copies, no cold registration before then */
    int holding_off = 0;       /* cold blocks wait for a pause now */
    pthread_mutex_lock(&bg_mu);
    for (;;) {
        while (!bg_stop && __atomic_load_n(&bg_head, __ATOMIC_ACQUIRE) == __atomic_load_n(&bg_tail, __ATOMIC_ACQUIRE))
            pthread_cond_wait(&bg_cv, &bg_mu);
        if (bg_stop)
            break;
        bg_busy = 1;
        pthread_mutex_unlock(&bg_mu);
        pthread_mutex_lock(&mu);
        uint64_t now = shim_now_ns();
        int cold_may_go = now >= cold_after || !program_copying() ||
                          __atomic_load_n(&caching_count, __ATOMIC_RELAXED) <= COLD_AT_ONCE;
        struct block *b = bg_next(cold_may_go);
        if (!b) {
            /* Only freed blocks wait, and the program is copying: look again shortly, or when a
             * block is queued. */
            pthread_mutex_unlock(&mu);
            if (!holding_off)
                stats_add(STAT_REGISTRAR_HELD_OFF, 1);
            holding_off = 1;
            struct timespec until;
            clock_gettime(CLOCK_MONOTONIC, &until);
            until.tv_nsec += (long)COLD_POLL_NS;
            until.tv_sec += until.tv_nsec / 1000000000L;
            until.tv_nsec %= 1000000000L;
            pthread_mutex_lock(&bg_mu);
            bg_busy = 0;
            pthread_cond_broadcast(&bg_cv);
            if (!bg_stop)
                pthread_cond_clockwait(&bg_cv, &bg_mu, CLOCK_MONOTONIC, &until);
            continue;
        }
        holding_off = 0;
        int cold = bg_cold(b);
        int skip = b->dead || b->state != BLOCK_PAGEABLE || b->bg_cancel;
        CUcontext ctx = b->bg_ctx;
        pthread_mutex_unlock(&mu);
        if (!skip && drv.cuCtxPushCurrent_v2(ctx) == CUDA_SUCCESS) {
            uint64_t t0 = shim_now_ns();
            /* Copies using it as pageable end within milliseconds; a block copied without
             * pause for a second is left pageable (its copies keep being staged). */
            for (int tries = 0; promote(b, 1) == PROMOTE_RETRY && tries < 10000 && !bg_stop; tries++)
                usleep(100);
            CUcontext popped;
            drv.cuCtxPopCurrent_v2(&popped);
            if (cold) {
                uint64_t t1 = shim_now_ns();
                cold_after = t1 + (t1 - t0) * (COLD_SHARE - 1);
            }
        }
        pthread_mutex_lock(&mu);
        bg_finish(b);
        pthread_mutex_unlock(&mu);
        pthread_mutex_lock(&bg_mu);
        bg_busy = 0;
        pthread_cond_broadcast(&bg_cv);
    }
    pthread_mutex_unlock(&bg_mu);
    return arg;
}

static void bg_start(void)
{
    pthread_mutex_lock(&bg_mu);
    if (!bg_started && !bg_stop) {
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setstacksize(&attr, 256 * 1024);
        /* The program's signal handlers must never run on the shim's threads. */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        if (pthread_create(&bg_thread, &attr, bg_main, NULL) == 0) {
            bg_started = 1;
        } else {
            bg_started = -1;   /* registrations then happen on the copy's path */
        }
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        pthread_attr_destroy(&attr);
    }
    pthread_mutex_unlock(&bg_mu);
}

/* Queue b for registration in the current context (mu held); 0 when it cannot be queued. */
static int bg_enqueue(struct block *b)
{
    if (b->bg_queued)
        return 1;
    if (__atomic_load_n(&bg_started, __ATOMIC_ACQUIRE) <= 0) {
        if (bg_started < 0 || bg_stop)
            return 0;
        pthread_mutex_unlock(&mu);
        bg_start();
        pthread_mutex_lock(&mu);
        if (bg_started <= 0 || b->dead || b->bg_queued || b->state != BLOCK_PAGEABLE)
            return bg_started > 0 && b->bg_queued;
    }
    /* The current context, or (a free on a thread that never used CUDA) that of its copies. */
    CUcontext ctx = NULL;
    if (drv.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx)
        ctx = b->copy_ctx;
    if (bg_tail - bg_head == BG_QUEUE || !ctx)
        return 0;
    b->bg_queued = 1;
    b->bg_ctx = ctx;
    b->inflight++;
    bg_queue[bg_tail % BG_QUEUE] = b;
    __atomic_store_n(&bg_tail, bg_tail + 1, __ATOMIC_RELEASE);
    stats_add(STAT_BACKGROUND_REGISTRATIONS, 1);
    pthread_mutex_lock(&bg_mu);
    pthread_cond_signal(&bg_cv);
    pthread_mutex_unlock(&bg_mu);
    return 1;
}

void registry_shutdown(void)
{
    pthread_mutex_lock(&bg_mu);
    bg_stop = 1;
    pthread_cond_broadcast(&bg_cv);
    int started = bg_started > 0;
    pthread_mutex_unlock(&bg_mu);
    if (started && !shim_forked_child)
        pthread_join(bg_thread, NULL);
}

/* ---------------------------------------------------------------- the copy path */

static struct cost_rates current_rates(void)
{
    return (struct cost_rates){
        .h2d_pageable_mbps = (double)shim_cfg.bw_h2d_pageable,
        .d2h_pageable_mbps = (double)shim_cfg.bw_d2h_pageable,
        .pinned_mbps = (double)shim_cfg.bw_pinned,
        .register_us_per_gib = (double)shim_cfg.reg_cost_resident,
        .register_fault_us_per_gib = (double)shim_cfg.reg_cost_fault,
    };
}

/* A copy of [p, p + n) uses b: its hotness.  mu held. */
static void note_use(struct block *b, uintptr_t p, size_t n)
{
    /* A heap block that carries transfers: from now on allocations of its size that find the
     * pinned cache empty are counted (see CACHE_ON_FREE_MIN). */
    if (b->copies == 0 && b->origin != ORIGIN_MMAP) {
        unsigned list = cache_list_of(b);
        if (!__atomic_load_n(&cache_active[list], __ATOMIC_RELAXED)) {
            __atomic_store_n(&cache_active[list], 1, __ATOMIC_RELAXED);
            __atomic_store_n(&any_cache_active, 1, __ATOMIC_RELAXED);
        }
    }
    b->copies++;
    b->bytes_moved += n;
    b->last_use_ns = shim_now_ns();
    if (b->copied_hi == b->copied_lo) {
        b->copied_lo = p;
        b->copied_hi = p + n;
    } else {
        if (p < b->copied_lo)
            b->copied_lo = p;
        if (p + n > b->copied_hi)
            b->copied_hi = p + n;
    }
}

/* A copy of n bytes in direction dir touches pageable block b: what the cost model says.
 * mu held. */
static enum cost_verdict decide(struct block *b, enum copy_dir dir, size_t n, int stageable, const char **why)
{
    if (b->no_promote || b->changing || b->state != BLOCK_PAGEABLE || b->bg_queued) {
        *why = b->no_promote ? "not_registrable" : "registration_changing";
        return stageable ? COST_STAGE : COST_LEAVE;
    }
    /* Promotion switched off for good (or not decided yet: registry_copy_begin asks first). */
    if (__atomic_load_n(&promotion_state, __ATOMIC_ACQUIRE) <= 0) {
        *why = "promotion_off";
        return stageable ? COST_STAGE : COST_LEAVE;
    }
    if (!b->copy_ctx)
        drv.cuCtxGetCurrent(&b->copy_ctx);
    struct cost_rates rates = current_rates();
    uintptr_t reg_base;
    size_t reg_len;
    reg_range(b, &reg_base, &reg_len);
    struct cost_inputs in = {
        .dir = dir, .copy_bytes = n, .block_bytes = reg_len,
        .resident_bytes = COST_RESIDENT_UNKNOWN, .copies_seen = b->copies,
        .budget = shim_cfg.budget, .bytes_moved = b->bytes_moved,
        .writable = (b->prot & PROT_WRITE) != 0, .read_only_register = read_only_supported,
        .stageable = stageable, .copied_span = b->copied_hi - b->copied_lo,
    };
    struct cost_decision d = cost_decide(&in, &rates);
    if (d.verdict == COST_NEED_RESIDENCY) {
        in.resident_bytes = os_resident_bytes(reg_base, reg_len);
        d = cost_decide(&in, &rates);
    }
    if ((d.verdict == COST_LEAVE || d.verdict == COST_STAGE) && n >= shim_cfg.min_size)
        stats_add(STAT_PROMOTIONS_DECLINED, 1);
    if (d.verdict == COST_STAGE && d.reason == COST_ONE_SHOT)
        stats_add(STAT_STAGED_ONE_SHOT, 1);
    *why = cost_reason_key(d.reason);
    return d.verdict;
}

enum mem_kind registry_copy_begin(uintptr_t p, size_t n, enum copy_dir dir, unsigned flags,
                                  struct copy_hold *hold)
{
    hold->b = NULL;
    hold->pageable = NULL;
    hold->unsettled = 0;
    hold->fresh_base = 0;
    hold->fresh_len = 0;
    hold->why = "program_pinned";
    if (registry_program_pinned(p, n))
        return MEM_PINNED;
    hold->why = "not_tracked";
    if (!arena_contains(p) && !index_may_contain(p))
        return MEM_PAGEABLE;
    /* Decided once a context exists, before mu (it takes change_mu): whether registering is
     * possible at all, which staged-only workloads would otherwise never ask (a block freed
     * after its transfer is registered on its way out only where it is). */
    if ((flags & COPY_MAY_PROMOTE) && !__atomic_load_n(&promotion_state, __ATOMIC_ACQUIRE))
        registry_promotion_enabled();
    pthread_mutex_lock(&mu);
    /* A block whose registration is being made or removed: until that is done the driver may
     * see it pinned while the records say pageable, so the driver's own path is not right yet:
     * wait, unless the copy can be staged (right either way) and the change is a background
     * registration, which may take long. */
    int make = (flags & COPY_MAY_PROMOTE) != 0;
    struct block *b = lookup(p, make);
    while (b && b->changing) {
        if (b->bg_registering && (flags & COPY_STAGEABLE)) {
            note_use(b, p, n);
            pthread_mutex_unlock(&mu);
            stats_add(STAT_STAGED_WHILE_REGISTERING, 1);
            hold->unsettled = 1;
            hold->why = "registering_in_background";
            return MEM_PAGEABLE;
        }
        wait_settled(b);
        b = lookup(p, make);
    }
    if (!b || b->state == BLOCK_CACHED || b->dead || b->freed_pending || p + n > b->map_base + b->map_len) {
        pthread_mutex_unlock(&mu);
        return MEM_PAGEABLE;
    }
    note_use(b, p, n);
    if (b->state == BLOCK_PROMOTED && dir == DIR_D2H && (b->reg_flags & CU_MEMHOSTREGISTER_READ_ONLY)) {
        /* Registered read-only, now written by the device (its pages were made writable
         * behind the shim's back): the registration cannot take this copy. */
        let_go(b);
        b->prot |= PROT_WRITE;
    }
    if (b->state == BLOCK_PROMOTED && (p < b->reg_base || p + n > b->reg_base + b->reg_len)) {
        /* Partly outside its registration: the driver's pageable path, held like one. */
        hold->why = "outside_registration";
        b->pageable_users++;
        hold->pageable = b;
        pthread_mutex_unlock(&mu);
        return MEM_PAGEABLE;
    }
    if (b->state == BLOCK_PROMOTED) {
        if (flags & COPY_CAPTURING)
            b->captured = 1;
        b->inflight++;
        pthread_mutex_unlock(&mu);
        hold->b = b;
        hold->why = "registered_before";
        return MEM_PROMOTED;
    }
    enum cost_verdict v = COST_LEAVE;
    hold->why = "not_judged";
    if (flags & COPY_MAY_PROMOTE) {
        v = decide(b, dir, n, (flags & COPY_STAGEABLE) != 0, &hold->why);
        if (v == COST_REGISTER_BACKGROUND && !bg_enqueue(b))
            v = COST_REGISTER;   /* no background thread: register on the copy's path */
    }
    if (b->bg_queued && !b->bg_cancel && (flags & COPY_STAGEABLE)) {
        /* Queued for a background registration: staging is right whether or not it lands
         * during the copy, so the copy does not hold it off (a loop of copies holding the block
         * one after the other kept the registrar waiting for a gap, the copies staged for up to
         * a second).  If staging declines, the caller asks again and waits (unsettled). */
        pthread_mutex_unlock(&mu);
        stats_add(STAT_STAGED_WHILE_REGISTERING, 1);
        hold->unsettled = 1;
        if (v != COST_REGISTER_BACKGROUND)
            hold->why = "registering_in_background";
        return MEM_PAGEABLE;
    }
    if (v != COST_REGISTER) {
        /* The call may take the driver's own path: no registration of the block may complete
         * while it runs, or the driver could find the memory pinned halfway (an async call
         * would return before reading it; a sync one would rely on a registration the shim may
         * evict under it), and another thread's copy can queue one any moment. */
        b->pageable_users++;
        hold->pageable = b;
        pthread_mutex_unlock(&mu);
        return MEM_PAGEABLE;
    }
    b->inflight++;
    pthread_mutex_unlock(&mu);
    if (promote(b, 0)) {
        hold->b = b;
        pthread_mutex_lock(&mu);
        /* Heap blocks only: their pages are anonymous and stay mapped while the block lives; a
         * program's mapping may be a file that another thread truncates under a CPU access. */
        if (b->state == BLOCK_PROMOTED && b->origin != ORIGIN_MMAP && (b->prot & PROT_READ)) {
            hold->fresh_base = b->reg_base;
            hold->fresh_len = b->reg_len;
        }
        pthread_mutex_unlock(&mu);
        return MEM_PROMOTED;
    }
    pthread_mutex_lock(&mu);
    hold_release(b);
    pthread_mutex_unlock(&mu);
    hold->why = "register_failed";
    return MEM_PAGEABLE;
}

void registry_copy_end(struct copy_hold *hold, int async_pending)
{
    struct block *b = hold->b, *pb = hold->pageable;
    if (!b && !pb)
        return;
    pthread_mutex_lock(&mu);
    if (b) {
        if (async_pending)
            b->async_pending = 1;
        hold_release(b);
    }
    if (pb)
        pageable_release(pb);
    pthread_mutex_unlock(&mu);
    hold->b = hold->pageable = NULL;
}

int registry_known_host(uintptr_t p)
{
    if (registry_program_pinned(p, 1))
        return 1;
    struct arena_block ab;
    if (arena_find(p, &ab))
        return 1;
    if (!index_may_contain(p))
        return 0;
    pthread_mutex_lock(&mu);
    int found = index_find(p) != NULL;
    pthread_mutex_unlock(&mu);
    return found;
}

int registry_host_range(uintptr_t p, size_t n)
{
    if (registry_program_pinned(p, n))
        return 1;
    struct arena_block ab;
    if (arena_find(p, &ab))
        return p + n <= ab.base + ab.usable;
    if (!index_may_contain(p))
        return 0;
    pthread_mutex_lock(&mu);
    struct block *b = index_find(p);
    int inside = b && p + n <= b->map_base + b->map_len;
    pthread_mutex_unlock(&mu);
    return inside;
}

int registry_copyable(uintptr_t p, size_t n, int prot, int *driver_pinned)
{
    unsigned flags;
    *driver_pinned = 0;
    if (pinned_find(p, n, &flags)) {
        *driver_pinned = 1;
        return !(prot & PROT_WRITE) || !(flags & CU_MEMHOSTREGISTER_READ_ONLY);
    }
    if (!arena_contains(p) && !index_may_contain(p))
        return 0;
    int ok = 0;
    pthread_mutex_lock(&mu);
    struct block *b = lookup(p, 0);
    if (b) {
        uintptr_t lo = b->origin == ORIGIN_ARENA ? b->base : b->map_base;
        ok = b->state != BLOCK_CACHED && !b->dead && p >= lo && p + n <= b->map_base + b->map_len &&
             (b->prot & prot) == prot;
        *driver_pinned = ok && b->state == BLOCK_PROMOTED && p >= b->reg_base && p + n <= b->reg_base + b->reg_len;
    } else {
        /* An arena block nobody copied or protected: the program's, read-write. */
        struct arena_block ab;
        ok = arena_find(p, &ab) && __atomic_load_n(&ab.slot->state, __ATOMIC_ACQUIRE) == SLOT_LIVE &&
             p >= ab.base && p + n <= ab.base + ab.usable;
    }
    pthread_mutex_unlock(&mu);
    return ok;
}

int registry_may_hold(uintptr_t p)
{
    return arena_contains(p) || index_may_contain(p);
}

int registry_promoted_at(uintptr_t p)
{
    if (!arena_contains(p) && !index_may_contain(p))
        return 0;
    pthread_mutex_lock(&mu);
    struct block *b = lookup(p, 0);
    int promoted = b && b->state == BLOCK_PROMOTED;
    pthread_mutex_unlock(&mu);
    return promoted;
}

/* ---------------------------------------------------------------- the heap */

int registry_track_huge(uintptr_t base, size_t size, uintptr_t map, size_t map_len, int warm)
{
    pthread_mutex_lock(&mu);
    struct block *b = record_new();
    int ok = b != NULL;
    if (b) {
        b->warm_reuse = warm;
        b->base = base;
        b->size = size;
        b->map_base = map;
        b->map_len = map_len;
        b->origin = ORIGIN_HUGE;
        b->state = BLOCK_PAGEABLE;
        b->prot = PROT_READ | PROT_WRITE;
        if (index_insert(b) != 0) {
            record_delete(b);
            ok = 0;
        }
    }
    pthread_mutex_unlock(&mu);
    return ok ? 0 : -1;
}

/* A freed pageable block that carried a transfer of most of its bytes: the pattern of a step
 * buffer or a tensor that a framework allocates afresh every step; or that the program's large
 * memcpy/memmove calls filled (registry_note_filled): a result array that a library allocates
 * afresh for every copy out of its pinned buffer. */
static int worth_keeping_warm(const struct block *b)
{
    if (b->origin != ORIGIN_HUGE || b->state != BLOCK_PAGEABLE || b->no_promote || b->map_len > shim_cfg.budget)
        return 0;
    return b->bytes_filled >= b->map_len / 2 ||
           (b->bytes_moved >= b->map_len / 2 && __atomic_load_n(&promotion_state, __ATOMIC_RELAXED) > 0);
}

int registry_transfer_block(uintptr_t p, size_t n)
{
    if (!index_may_contain(p))
        return 0;
    pthread_mutex_lock(&mu);
    struct block *b = lookup(p, 0);
    int yes = b && b->origin == ORIGIN_HUGE && !b->dead && b->state == BLOCK_PAGEABLE && p >= b->map_base &&
              p + n <= b->map_base + b->map_len &&
              (b->warm_reuse || b->bytes_filled >= b->map_len / 2 || b->bytes_moved >= b->map_len / 2);
    pthread_mutex_unlock(&mu);
    return yes;
}

void registry_note_filled(uintptr_t p, size_t n)
{
    if (!index_may_contain(p))
        return;
    pthread_mutex_lock(&mu);
    struct block *b = lookup(p, 0);
    if (b && b->origin == ORIGIN_HUGE && !b->dead)
        b->bytes_filled += n;
    pthread_mutex_unlock(&mu);
}

/* free() of pageable block b, which may have carried a transfer (mu held). */
static int worth_caching_on_free(struct block *b)
{
    uintptr_t base;
    size_t len;
    reg_range(b, &base, &len);
    if (b->origin == ORIGIN_MMAP || b->no_promote || b->bytes_moved < len / 2 || len > shim_cfg.budget ||
        __atomic_load_n(&promotion_state, __ATOMIC_RELAXED) <= 0)
        return 0;
    unsigned list = cache_list_of(b);
    uint32_t missed = __atomic_load_n(&cache_missed[list], __ATOMIC_RELAXED);
    /* Allocations that missed the cache are the evidence that this keeps happening. */
    if (copied_frees[list]++ < CACHE_ON_FREE_AFTER && !missed)
        return 0;
    uint64_t held = (uint64_t)cached_in_list[list] + caching_in_list[list];
    uint64_t cap = CACHE_ON_FREE_MIN + (uint64_t)missed;
    return held < cap && (held + 1) * len <= shim_cfg.budget / 4;
}

static struct block *huge_at(uintptr_t p)
{
    struct block *b = index_find(p);
    return b && b->base == p && b->origin == ORIGIN_HUGE ? b : NULL;
}

enum registry_free_result registry_free(uintptr_t p, struct arena_slot *slot, uintptr_t *map,
                                        size_t *map_len, int *warm)
{
    *warm = 0;
    if (!slot && !index_may_contain(p))
        return REG_FREE_NOT_MINE;
    pthread_mutex_lock(&mu);
    struct block *b = slot ? (__atomic_load_n(&slot->state, __ATOMIC_ACQUIRE) == SLOT_TRACKED ? slot->rec : NULL)
                           : huge_at(p);
    if (!b || b->state == BLOCK_CACHED || b->dead || b->freed_pending) {
        pthread_mutex_unlock(&mu);
        return REG_FREE_NOT_MINE;
    }
    /* free() never calls the driver, nor waits for a registration change: it may run where CUDA
     * calls are not allowed (inside a host callback), where an unregister in progress, which
     * waits for the device to be idle, would never end.  A free during a change (or while a
     * background registration is queued) is carried out when the change ends. */
    if (b->bg_queued || b->changing) {
        if (b->taken_back && !b->changing) {
            /* Handed to an allocation while queued to be cached, freed again before the
             * registrar's turn came: queued for the cache again. */
            b->taken_back = 0;
            b->bg_cancel = 0;
            b->caching_on_free = 1;
            caching_note(cache_list_of(b), 1);
        }
        b->freed_pending = 1;
        pthread_mutex_unlock(&mu);
        return REG_FREE_DONE;
    }
    if (b->state == BLOCK_PROMOTED && !shim_forked_child) {
        /* Kept registered for the next allocation that fits. */
        cache_put(b);
        pthread_mutex_unlock(&mu);
        return REG_FREE_DONE;
    }
    if (shim_forked_child)
        stats_add(STAT_FORK_CHILD_FREES, 1);
    if (!shim_forked_child && b->state == BLOCK_PAGEABLE && worth_caching_on_free(b) && bg_enqueue(b)) {
        b->freed_pending = 1;   /* registered, then cached, by the registrar */
        b->caching_on_free = 1;
        caching_note(cache_list_of(b), 1);
        stats_add(STAT_CACHED_ON_FREE, 1);
        pthread_mutex_unlock(&mu);
        return REG_FREE_DONE;
    }
    enum registry_free_result res = REG_FREE_DONE;
    if (b->origin == ORIGIN_HUGE) {
        *warm = !shim_forked_child && worth_keeping_warm(b);
        *map = b->map_base;
        *map_len = b->map_len;
        res = REG_FREE_UNMAP;
    }
    if (b->state != BLOCK_PAGEABLE)
        take_registration(b);   /* the fork child: the parent's registration is not its own */
    forget(b, 1);
    pthread_mutex_unlock(&mu);
    return res;
}

size_t registry_huge_usable(uintptr_t p)
{
    size_t usable = (size_t)-1;
    if (!index_may_contain(p))
        return usable;
    pthread_mutex_lock(&mu);
    struct block *b = huge_at(p);
    if (b && b->state != BLOCK_CACHED && !b->dead)
        usable = b->map_base + b->map_len - b->base;
    pthread_mutex_unlock(&mu);
    return usable;
}

int registry_huge_resize(uintptr_t p, size_t n, size_t *old_size)
{
    if (!index_may_contain(p))
        return -1;
    pthread_mutex_lock(&mu);
    struct block *b = huge_at(p);
    if (!b || b->state == BLOCK_CACHED || b->dead) {
        pthread_mutex_unlock(&mu);
        return -1;
    }
    wait_settled(b);
    size_t usable = b->map_base + b->map_len - b->base;
    *old_size = b->size;
    int in_place = n <= usable && n > ARENA_MAX_BLOCK;
    if (in_place)
        b->size = n;   /* the mapping (and any registration of it) already covers n bytes */
    pthread_mutex_unlock(&mu);
    return in_place;
}

/* ---------------------------------------------------------------- the program's mappings */

void registry_track_mapping(uintptr_t p, size_t len, int prot)
{
    pthread_mutex_lock(&mu);
    if (!index_find(p) && !arena_contains(p)) {
        struct block *b = record_new();
        if (b) {
            b->base = b->map_base = p;
            b->size = b->map_len = page_up(len);
            b->origin = ORIGIN_MMAP;
            b->state = BLOCK_PAGEABLE;
            b->prot = prot;
            if (index_insert(b) != 0)
                record_delete(b);   /* the program's mapping then simply stays untracked */
        }
    }
    pthread_mutex_unlock(&mu);
}

#define RANGE_BATCH 32

struct range_walk {
    struct block *found[RANGE_BATCH];
    size_t n;
    int more;
};

/* Arena blocks without a registration keep their records: only a free forgets them. */
static void collect_arena(struct arena_slot *s, void *arg)
{
    struct range_walk *w = arg;
    if (__atomic_load_n(&s->state, __ATOMIC_ACQUIRE) != SLOT_TRACKED)
        return;
    struct block *b = s->rec;
    if (b->state == BLOCK_PAGEABLE && !b->changing && !(b->bg_queued && !b->bg_cancel))
        return;
    if (w->n == RANGE_BATCH) {
        w->more = 1;
        return;
    }
    w->found[w->n++] = s->rec;
}

/* Records overlapping [p, p+n) that hold a registration, or (drop) any record of the index
 * there; mu held. */
static void collect_range(uintptr_t p, size_t n, int drop, struct range_walk *w)
{
    w->n = 0;
    w->more = 0;
    uintptr_t end = p + n < p ? UINTPTR_MAX : p + n;
    if (index_len && end > __atomic_load_n(&span_lo, __ATOMIC_RELAXED) &&
        p < __atomic_load_n(&span_hi, __ATOMIC_RELAXED)) {
        size_t i = lower_bound(p + 1);
        if (i > 0)
            i--;
        for (; i < index_len; i++) {
            struct block *b = index_[i];
            if (b->map_base >= end)
                break;
            if (b->map_base + b->map_len <= p ||
                (!drop && b->state == BLOCK_PAGEABLE && !b->changing && !(b->bg_queued && !b->bg_cancel)))
                continue;
            if (w->n == RANGE_BATCH) {
                w->more = 1;
                return;
            }
            w->found[w->n++] = b;
        }
    }
    arena_for_each_in_range(p, n, collect_arena, w);
}

int registry_release_range(uintptr_t p, size_t n, int drop)
{
    if (!n || (!index_len && !__atomic_load_n(&registered_bytes, __ATOMIC_RELAXED) &&
               !__atomic_load_n(&cache_count, __ATOMIC_RELAXED)))
        return 0;
    int released = 0;
    for (;;) {
        struct range_walk w;
        struct unreg todo[RANGE_BATCH];
        struct block *kept[RANGE_BATCH];
        size_t ntodo = 0, nkept = 0;
        pthread_mutex_lock(&mu);
        collect_range(p, n, drop, &w);
        struct block *busy = NULL;
        for (size_t i = 0; i < w.n && !busy; i++)
            if (w.found[i]->changing)
                busy = w.found[i];
        if (busy) {
            /* Its registration is changing: let that finish, then look again. */
            wait_settled(busy);
            pthread_mutex_unlock(&mu);
            continue;
        }
        for (size_t i = 0; i < w.n; i++) {
            struct block *b = w.found[i];
            int was_cached = b->state == BLOCK_CACHED;
            if (b->bg_queued) {
                b->bg_cancel = 1;   /* waiting for the registrar: it must not register these pages */
                b->taken_back = 0;
            }
            if (!drop && b->state == BLOCK_PAGEABLE)
                continue;
            if (b->state != BLOCK_PAGEABLE)
                todo[ntodo++] = take_registration(b);
            if (was_cached) {
                /* Freed by the program and now discarded or unmapped under the cache: no
                 * longer the shim's to hand out. */
                if (b->origin != ORIGIN_ARENA)
                    index_remove(b);
                else if (drop)
                    arena_untrack(b->slot);   /* gone under the arena: never handed out again */
                else
                    arena_release(b->slot);
                record_delete(b);
            } else if (drop && b->origin != ORIGIN_ARENA) {
                forget(b, 1);
            } else {
                b->changing = 1;
                kept[nkept++] = b;
            }
        }
        pthread_mutex_unlock(&mu);
        /* Unregister outside mu: it waits for in-flight DMA. */
        for (size_t i = 0; i < ntodo; i++) {
            unregister_range(todo[i].base, todo[i].len, todo[i].ctx, todo[i].pending);
            released++;
        }
        if (nkept) {
            pthread_mutex_lock(&mu);
            for (size_t i = 0; i < nkept; i++)
                change_done(kept[i]);
            pthread_mutex_unlock(&mu);
        }
        if (!w.more)
            break;
    }
    return released;
}

static void protect_one(struct arena_slot *s, void *arg);

struct protect_args {
    uintptr_t p, end;
    int prot;
};

/* mu held: b's pages in [p, end) now have protection prot. */
static void protect_block(struct block *b, const struct protect_args *a)
{
    if (b->changing) {
        /* A registration being made now would keep flags for the old protections: wait for it
         * (the hold keeps the record, and keeps a new registration from starting). */
        b->pageable_users++;
        wait_settled(b);
        int gone = b->dead;
        pageable_release(b);
        if (gone)
            return;
    }
    int whole = a->p <= b->map_base && a->end >= b->map_base + b->map_len;
    int prot = whole ? a->prot : (b->prot & a->prot);
    if (!whole && a->prot != b->prot)
        b->no_promote = 1;   /* mixed protections: no one registration fits them */
    b->prot = prot;
    if (b->state == BLOCK_PAGEABLE || b->changing || b->freed_pending)
        return;
    int reg_read_only = (b->reg_flags & CU_MEMHOSTREGISTER_READ_ONLY) != 0;
    int writable = (prot & PROT_WRITE) != 0;
    /* A registration made for other protections than the pages have now: the device would
     * write into pages the program made read-only, or a read-only registration would meet a
     * device write.  (A cached block keeps its pages as the shim set them.) */
    if (b->state == BLOCK_PROMOTED && (reg_read_only == writable || !(prot & PROT_READ)))
        let_go(b);
}

static void protect_one(struct arena_slot *s, void *arg)
{
    /* A block nobody copied gets a record now: its protection must be known (bounce copies
     * touch only memory whose protection fits). */
    struct block *b = __atomic_load_n(&s->state, __ATOMIC_ACQUIRE) == SLOT_TRACKED ? s->rec
                                                                               : lookup(s->addr + s->color, 1);
    if (b)
        protect_block(b, arg);
}

void registry_protect(uintptr_t p, size_t n, int prot)
{
    if (!n)
        return;
    struct protect_args a = { page_down(p), page_up(p + n), prot };
    pthread_mutex_lock(&mu);
    /* let_go drops mu: walk by address, finding the place again after each block. */
    for (uintptr_t next = a.p; next < a.end && index_len;) {
        size_t i = lower_bound(next + 1);
        if (i > 0)
            i--;
        struct block *b = NULL;
        for (; i < index_len && index_[i]->map_base < a.end; i++) {
            if (index_[i]->map_base + index_[i]->map_len > next) {
                b = index_[i];
                break;
            }
        }
        if (!b)
            break;
        next = b->map_base + b->map_len;
        protect_block(b, &a);
    }
    pthread_mutex_unlock(&mu);
    /* Arena blocks: heap memory the program protects itself (rare). */
    pthread_mutex_lock(&mu);
    arena_for_each_in_range(a.p, a.end - a.p, protect_one, &a);
    pthread_mutex_unlock(&mu);
}

/* ---------------------------------------------------------------- the program's pinning */

CUresult registry_program_register(void *p, size_t n, unsigned flags,
                                   CUresult (*reg)(void *, size_t, unsigned))
{
    if (!p || !n)
        return reg(p, n, flags);
    /* No promotion may start between giving up the shim's registrations there and the
     * program's own register (change_mu serializes every shim registration). */
    pthread_mutex_lock(&change_mu);
    int released = registry_release_range((uintptr_t)p, n, 0);
    if (released)
        stats_add(STAT_PROGRAM_REGISTER_YIELDS, (uint64_t)released);
    CUresult r = reg(p, n, flags);
    if (r == CUDA_SUCCESS)
        pinned_add((uintptr_t)p, n, flags);
    pthread_mutex_unlock(&change_mu);
    return r;
}

CUresult registry_program_unregister(void *p, CUresult (*unreg)(void *))
{
    /* Without the shim this memory is not registered at all: answer as the driver would then,
     * and never let the program's call take the shim's registration away (rules 3 and 4). */
    struct block *claimed = NULL;
    uintptr_t a = (uintptr_t)p;
    if (!registry_program_pinned(a, 1) && (arena_contains(a) || index_may_contain(a))) {
        pthread_mutex_lock(&mu);
        /* An arena block gets a record now if it had none, so that it can be held still. */
        struct block *b = lookup_settled(a, 1);
        if (b && b->state != BLOCK_PAGEABLE && a >= b->reg_base && a < b->reg_base + b->reg_len) {
            pthread_mutex_unlock(&mu);
            return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
        }
        if (b) {
            /* Hold the block still until the driver has answered: a promotion starting now
             * would be undone by the program's call. */
            b->changing = 1;
            claimed = b;
        }
        pthread_mutex_unlock(&mu);
    }
    CUresult r = unreg(p);
    if (claimed) {
        pthread_mutex_lock(&mu);
        change_done(claimed);
        pthread_mutex_unlock(&mu);
    }
    if (r == CUDA_SUCCESS)
        pinned_remove(a);
    return r;
}

/* ---------------------------------------------------------------- counts and fork */

void registry_usage(struct registry_usage *u)
{
    memset(u, 0, sizeof *u);
    pthread_mutex_lock(&mu);
    for (size_t i = 0; i < index_len; i++) {
        if (index_[i]->origin == ORIGIN_MMAP)
            u->tracked_mappings++;
        else
            u->huge_blocks++;
    }
    pthread_mutex_unlock(&mu);
    u->arena_records = __atomic_load_n(&arena_records, __ATOMIC_RELAXED);
    u->cached_blocks = __atomic_load_n(&cache_count, __ATOMIC_RELAXED);
    u->program_ranges = __atomic_load_n(&pinned_len, __ATOMIC_RELAXED);
}

/* change_mu is not taken: a registration holds it for milliseconds (seconds for gigabytes of
 * untouched pages), and nothing it guards outlives the fork in the child, which starts afresh. */
void registry_before_fork(void)
{
    pthread_mutex_lock(&mu);
    pthread_mutex_lock(&pinned_mu);
}

void registry_after_fork_parent(void)
{
    pthread_mutex_unlock(&pinned_mu);
    pthread_mutex_unlock(&mu);
}

void registry_after_fork_child(void)
{
    pthread_mutex_init(&change_mu, NULL);
    pthread_mutex_init(&mu, NULL);
    pthread_mutex_init(&pinned_mu, NULL);
    pthread_cond_init(&settled, NULL);
    /* The threads that were copying or changing a registration do not exist here, and the
     * parent's registrations are not the child's: every record becomes pageable.  Cached blocks
     * stay where they are (their memory is lost to the child, as a freed block's would be). */
    for (struct block *b = all_records; b; b = b->all_next) {
        b->changing = 0;
        b->inflight = 0;
        b->pageable_users = 0;
        b->async_pending = 0;
        b->lru_prev = b->lru_next = b->fit_prev = b->fit_next = NULL;
        if (b->state == BLOCK_CACHED)
            b->dead = 1;   /* unreachable: free() no longer finds it */
        b->state = BLOCK_PAGEABLE;
        b->reg_ctx = NULL;
        b->reg_flags = 0;
    }
    promoted_head = cache_head = cache_tail = NULL;
    memset(cache_fit, 0, sizeof cache_fit);
    memset(cached_in_list, 0, sizeof cached_in_list);
    memset(caching_in_list, 0, sizeof caching_in_list);
    caching_count = 0;
    /* The registrar does not exist here: nothing queued will be registered. */
    for (struct block *b = all_records; b; b = b->all_next) {
        b->bg_queued = b->bg_registering = b->caching_on_free = b->taken_back = 0;
        if (b->freed_pending)
            b->dead = 1;
        b->freed_pending = 0;
    }
    pthread_mutex_init(&bg_mu, NULL);
    pthread_cond_init(&bg_cv, NULL);
    bg_head = bg_tail = 0;
    bg_started = 0;
    bg_busy = 0;
    cache_count = 0;
    registered_bytes = 0;
}

/* ---------------------------------------------------------------- calibration */

/* PINSHIM_CALIBRATE=1: measure this machine's costs once, at the first promotion decision,
 * with a 64 MiB buffer, instead of the defaults measured on an H200. */
static void calibrate(void)
{
    const size_t n = 64ul << 20;
    PFN_cuMemcpyHtoD_v3020 htod = (PFN_cuMemcpyHtoD_v3020)real_hook[HOOK_cuMemcpyHtoD_v2];
    PFN_cuMemcpyDtoH_v3020 dtoh = (PFN_cuMemcpyDtoH_v3020)real_hook[HOOK_cuMemcpyDtoH_v2];
    CUdeviceptr dev;
    void *host = os_map(n);
    if (!host || !htod || !dtoh || drv.cuMemAlloc_v2(&dev, n) != CUDA_SUCCESS) {
        if (host)
            os_unmap(host, n);
        shim_log(LOG_WARN, "PINSHIM_CALIBRATE: could not set up the measurement; using the defaults");
        return;
    }
    memset(host, 1, n);
    uint64_t t0 = shim_now_ns();
    htod(dev, host, n);
    uint64_t t1 = shim_now_ns();
    dtoh(host, dev, n);
    uint64_t t2 = shim_now_ns();
    CUresult r = register_range((uintptr_t)host, n, CU_MEMHOSTREGISTER_PORTABLE);
    uint64_t t3 = shim_now_ns();
    if (r == CUDA_SUCCESS) {
        htod(dev, host, n);
        uint64_t t4 = shim_now_ns();
        ((PFN_cuMemHostUnregister_v4000)real_hook[HOOK_cuMemHostUnregister])(host);
        double mb = (double)n / 1e6;
        shim_cfg.bw_h2d_pageable = (uint64_t)(mb / ((double)(t1 - t0) / 1e9));
        shim_cfg.bw_d2h_pageable = (uint64_t)(mb / ((double)(t2 - t1) / 1e9));
        shim_cfg.bw_pinned = (uint64_t)(mb / ((double)(t4 - t3) / 1e9));
        shim_cfg.reg_cost_resident = (uint64_t)((double)(t3 - t2) / 1e3 * ((double)(1ul << 30) / (double)n));
        shim_log(LOG_INFO, "calibrated: pageable h2d %llu MB/s, d2h %llu MB/s, pinned %llu MB/s, "
                 "register %llu us/GiB",
                 (unsigned long long)shim_cfg.bw_h2d_pageable, (unsigned long long)shim_cfg.bw_d2h_pageable,
                 (unsigned long long)shim_cfg.bw_pinned, (unsigned long long)shim_cfg.reg_cost_resident);
    }
    drv.cuMemFree_v2(dev);
    os_unmap(host, n);
}
