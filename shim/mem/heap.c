/* The heap front (see heap.h). */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include "base/config.h"
#include "base/os.h"
#include "base/real.h"
#include "base/shim.h"
#include "mem/arena.h"
#include "mem/heap.h"
#include "mem/registry.h"
#include "stats/trace.h"

size_t heap_track_min = SIZE_MAX;

void heap_init(void)
{
    arena_init();
}

/* ---- huge blocks: a mapping each ----
 * Freed huge mappings are kept for reuse, as the C library keeps freed memory, within bounds:
 * "warm" ones, which carried a transfer of most of their bytes (a batch or tensor that a
 * framework allocates afresh every step) or were mostly filled by the program's large memcpy
 * out of pinned memory (a result array a library allocates afresh for every copy), within a
 * quarter of the budget, so that the next allocation of that size gets resident pages: the copy
 * path can promote them at the lowest cost, a copy into them faults nothing, and their free
 * costs no munmap; others up to RETAIN_MAX_TOTAL in all. */
#define RETAIN_MAX_TOTAL (256ul << 20)
#define RETAIN_SLOTS 16

struct retained { uintptr_t map; size_t len; int warm; };
static struct retained retained[RETAIN_SLOTS];
static size_t retained_count, retained_bytes, warm_bytes;
static pthread_mutex_t retained_mu = PTHREAD_MUTEX_INITIALIZER;

static int retain(uintptr_t map, size_t len, int warm)
{
    int kept = 0;
    size_t warm_limit = (size_t)(shim_cfg.budget / 4);
    if (warm && len > warm_limit)
        return 0;
    pthread_mutex_lock(&retained_mu);
    if (retained_count < RETAIN_SLOTS &&
        (warm ? warm_bytes + len <= warm_limit : retained_bytes - warm_bytes + len <= RETAIN_MAX_TOTAL)) {
        retained[retained_count++] = (struct retained){map, len, warm};
        retained_bytes += len;
        if (warm)
            warm_bytes += len;
        kept = 1;
    }
    pthread_mutex_unlock(&retained_mu);
    return kept;
}

/* A retained mapping of at least len bytes and not wastefully larger, or 0.  *warm: it was a
 * warm one. */
static uintptr_t reuse_retained(size_t len, size_t *got_len, int *warm)
{
    uintptr_t map = 0;
    if (!__atomic_load_n(&retained_count, __ATOMIC_RELAXED))
        return 0;
    pthread_mutex_lock(&retained_mu);
    size_t best = RETAIN_SLOTS;
    for (size_t i = 0; i < retained_count; i++)
        if (retained[i].len >= len && retained[i].len / 2 <= len &&
            (best == RETAIN_SLOTS || retained[i].len < retained[best].len))
            best = i;
    if (best != RETAIN_SLOTS) {
        map = retained[best].map;
        *got_len = retained[best].len;
        *warm = retained[best].warm;
        retained_bytes -= retained[best].len;
        if (retained[best].warm)
            warm_bytes -= retained[best].len;
        retained[best] = retained[--retained_count];
    }
    pthread_mutex_unlock(&retained_mu);
    return map;
}

static void *huge_alloc(size_t n, size_t align, int zero)
{
    if (n > SIZE_MAX - align - SHIM_PAGE_SIZE) {
        errno = ENOMEM;
        return NULL;
    }
    uint64_t t0 = trace_on() ? shim_ticks() : 0;
    size_t map_len = page_up(n + (align > SHIM_PAGE_SIZE ? align : 0));
    size_t reused_len = 0;
    int warm = 0;
    void *map = (void *)reuse_retained(map_len, &reused_len, &warm);
    if (map) {
        map_len = reused_len;
        if (zero)
            memset(map, 0, map_len);
    } else if (!(map = os_map_aligned(map_len, SHIM_HUGE_PAGE, 0))) {   /* fresh pages are zero */
        errno = ENOMEM;
        return NULL;
    } else {
        /* In huge pages where the system allows them (see arena.c). */
        os_madvise(map, map_len, MADV_HUGEPAGE);
    }
    uintptr_t base = ((uintptr_t)map + align - 1) & ~(uintptr_t)(align - 1);
    if (registry_track_huge(base, n, (uintptr_t)map, map_len, warm) != 0) {
        /* An untracked heap block could not be freed later: fail this allocation instead. */
        os_unmap(map, map_len);
        errno = ENOMEM;
        return NULL;
    }
    if (t0)
        trace_event(shim_ns_since(t0), "heap_alloc", "addr=%#lx bytes=%zu mapping=%zu reused=%d zeroed=%d",
                    (unsigned long)base, n, map_len, reused_len != 0, zero);
    return (void *)base;
}

/* ---- frees set aside by a signal handler ---- */

#define DEFERRED_SLOTS 256
static uintptr_t deferred[DEFERRED_SLOTS];
static int deferred_count;

int heap_free_deferred(void *p)
{
    uintptr_t a = (uintptr_t)p;
    struct arena_slot *slot = arena_slot_of(a);
    if (slot ? __atomic_load_n(&slot->state, __ATOMIC_ACQUIRE) == SLOT_FREE : !registry_may_hold(a))
        return 0;
    for (unsigned i = 0; i < DEFERRED_SLOTS; i++) {
        uintptr_t expect = 0;
        if (__atomic_compare_exchange_n(&deferred[i], &expect, a, 0, __ATOMIC_RELEASE, __ATOMIC_RELAXED)) {
            __atomic_add_fetch(&deferred_count, 1, __ATOMIC_RELEASE);
            return 1;
        }
    }
    return 1;   /* full: the block is lost, which is better than a deadlock */
}

static int free_now(uintptr_t a);

static void drain_deferred(void)
{
    for (unsigned i = 0; i < DEFERRED_SLOTS && __atomic_load_n(&deferred_count, __ATOMIC_ACQUIRE); i++) {
        uintptr_t a = __atomic_exchange_n(&deferred[i], 0, __ATOMIC_ACQ_REL);
        if (a) {
            __atomic_sub_fetch(&deferred_count, 1, __ATOMIC_RELEASE);
            if (!free_now(a))
                libc.free((void *)a);
        }
    }
}

/* ---- the malloc family ---- */

/* Neither the arena nor a mapping of its own could be had (an address-space limit, strict
 * overcommit, the map count: a segment is 64 MiB of address space): the C library may still
 * have room, as it would have without the shim.  Its blocks are not the shim's: free, realloc
 * and the copies find them in no segment and no record, and treat them as the C library's. */
static void *libc_block(size_t n, size_t align, int zero)
{
    if (align <= 16)
        return zero ? libc.calloc(1, n) : libc.malloc(n);
    void *p = libc.memalign(align, n);
    if (p && zero)
        memset(p, 0, n);
    return p;
}

void *heap_alloc(size_t n, size_t align, int zero)
{
    if (SHIM_UNLIKELY(__atomic_load_n(&deferred_count, __ATOMIC_RELAXED)))
        drain_deferred();
    if (align < 16)
        align = 16;
    void *p = registry_cache_take(n, align);
    if (p) {
        if (zero)
            memset(p, 0, n);
        return p;
    }
    p = arena_serves(n, align) ? arena_alloc(n, align, zero) : huge_alloc(n, align, zero);
    return p ? p : libc_block(n, align, zero);
}

static int free_now(uintptr_t a)
{
    struct arena_slot *slot = NULL;
    int r = arena_free(a, &slot);
    if (r == 0)
        return 1;
    uintptr_t map = 0;
    size_t map_len = 0;
    int warm = 0;
    if (r == 1) {
        registry_free(a, slot, &map, &map_len, &warm);
        return 1;
    }
    if (arena_contains(a))
        return 1;   /* not a live block's start: the program's double or stray free; ignored */
    uint64_t t0 = trace_on() ? shim_ticks() : 0;
    enum registry_free_result res = registry_free(a, NULL, &map, &map_len, &warm);
    if (res != REG_FREE_UNMAP) {
        if (t0 && res == REG_FREE_DONE)
            trace_event(shim_ns_since(t0), "heap_free", "addr=%#lx kept=cache", (unsigned long)a);
        return res == REG_FREE_DONE;
    }
    int kept = retain(map, map_len, warm);
    if (!kept)
        os_unmap((void *)map, map_len);
    if (t0)
        trace_event(shim_ns_since(t0), "heap_free", "addr=%#lx mapping=%zu kept=%s", (unsigned long)a, map_len,
                    kept ? (warm ? "warm" : "retained") : "unmapped");
    return 1;
}

int heap_free(void *p)
{
    if (SHIM_UNLIKELY(__atomic_load_n(&deferred_count, __ATOMIC_RELAXED)))
        drain_deferred();
    return free_now((uintptr_t)p);
}

size_t heap_usable_size(void *p)
{
    struct arena_block ab;
    uintptr_t a = (uintptr_t)p;
    if (arena_find(a, &ab))
        return ab.base == a ? ab.usable : (size_t)-1;
    return registry_huge_usable(a);
}

void *heap_realloc(void *p, size_t n, int *handled)
{
    uintptr_t a = (uintptr_t)p;
    size_t old;
    struct arena_slot *slot = arena_slot_of(a);
    *handled = 1;
    if (slot) {
        uint32_t st = __atomic_load_n(&slot->state, __ATOMIC_ACQUIRE);
        if (st == SLOT_FREE) {
            *handled = 0;
            return NULL;
        }
        old = slot->size;
        struct arena_block ab;
        if (n >= heap_track_min && arena_serves(n, 16) && arena_find(a, &ab) && n <= ab.usable &&
            arena_class_for(n, 16) == arena_class_of_block(ab.block_len) && (n <= old || st == SLOT_LIVE)) {
            /* In place: the block has room, and a registration of it (which covers the pages the
             * program asked for) covers n bytes, or there is none to grow. */
            slot->size = n;
            return p;
        }
    } else {
        int r = registry_huge_resize(a, n, &old);
        if (r < 0) {
            *handled = 0;
            return NULL;
        }
        if (r == 1)
            return p;
    }
    /* Move: a new block (perhaps from the cache, perhaps a small one from the C library), then
     * the old one goes the way of free(), so a registration is never handed back to the
     * allocator or shrunk under the program. */
    void *q = n >= heap_track_min ? heap_alloc(n, 16, 0) : libc.malloc(n);
    if (!q)
        return NULL;
    memcpy(q, p, old < n ? old : n);
    heap_free(p);
    return q;
}

void heap_track_mapping(void *p, size_t len, int prot)
{
    if (len < heap_track_min || !(prot & PROT_READ))
        return;
    registry_track_mapping((uintptr_t)p, len, prot);
}

void heap_before_unmap(void *p, size_t len, int drop)
{
    registry_release_range((uintptr_t)p, len, drop);
}

void heap_after_protect(void *p, size_t len, int prot)
{
    registry_protect((uintptr_t)p, len, prot);
}

void heap_before_fork(void)
{
    pthread_mutex_lock(&retained_mu);
    arena_before_fork();
}

void heap_after_fork_parent(void)
{
    arena_after_fork_parent();
    pthread_mutex_unlock(&retained_mu);
}

void heap_after_fork_child(void)
{
    arena_after_fork_child();
    pthread_mutex_init(&retained_mu, NULL);
}
