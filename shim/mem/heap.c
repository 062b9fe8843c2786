/* Large allocations and the program's mappings (see heap.h). */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "base/config.h"
#include "base/os.h"
#include "mem/heap.h"
#include "mem/policy.h"
#include "base/real.h"
#include "base/shim.h"
#include "stats/stats.h"
#include "mem/table.h"

size_t heap_track_min = SIZE_MAX;

/* Freed pageable blocks are kept mapped for reuse, as the real allocator keeps freed memory:
 * without this, a loop that allocates and frees a large buffer would pay a fresh mapping and
 * its page faults every time.  Plain blocks are bounded like glibc's own mmap threshold.
 * "Warm" blocks, which carried a transfer of most of their bytes (a batch or tensor that a
 * framework allocates afresh every step), are kept whatever their size, within a quarter of the
 * budget: the next allocation of that size gets resident pages, which the copy path can promote
 * at the lowest cost on its first copy, and from then on the pinned cache serves it. */
#define RETAIN_MAX_BLOCK (32ul << 20)
#define RETAIN_MAX_TOTAL (64ul << 20)
#define RETAIN_SLOTS 64

struct retained { uintptr_t map; size_t len; int warm; };
static struct retained retained[RETAIN_SLOTS];
static size_t retained_count, retained_bytes, warm_bytes;
static pthread_mutex_t retained_mutex = PTHREAD_MUTEX_INITIALIZER;

static int retain(uintptr_t map, size_t len, int warm)
{
    int kept = 0;
    size_t warm_limit = (size_t)(shim_cfg.budget / 4);
    if (warm ? len > warm_limit : len > RETAIN_MAX_BLOCK)
        return 0;
    pthread_mutex_lock(&retained_mutex);
    if (retained_count < RETAIN_SLOTS &&
        (warm ? warm_bytes + len <= warm_limit : retained_bytes - warm_bytes + len <= RETAIN_MAX_TOTAL)) {
        retained[retained_count++] = (struct retained){map, len, warm};
        retained_bytes += len;
        if (warm)
            warm_bytes += len;
        kept = 1;
    }
    pthread_mutex_unlock(&retained_mutex);
    return kept;
}

/* A retained mapping of at least len bytes and not wastefully larger, or 0. */
static uintptr_t reuse_retained(size_t len, size_t *got_len)
{
    uintptr_t map = 0;
    if (!__atomic_load_n(&retained_count, __ATOMIC_RELAXED))
        return 0;
    pthread_mutex_lock(&retained_mutex);
    size_t best = RETAIN_SLOTS;
    for (size_t i = 0; i < retained_count; i++)
        if (retained[i].len >= len && retained[i].len / 2 <= len &&
            (best == RETAIN_SLOTS || retained[i].len < retained[best].len))
            best = i;
    if (best != RETAIN_SLOTS) {
        map = retained[best].map;
        *got_len = retained[best].len;
        retained_bytes -= retained[best].len;
        if (retained[best].warm)
            warm_bytes -= retained[best].len;
        retained[best] = retained[--retained_count];
    }
    pthread_mutex_unlock(&retained_mutex);
    return map;
}

void heap_before_fork(void)
{
    pthread_mutex_lock(&retained_mutex);
}

void heap_after_fork_parent(void)
{
    pthread_mutex_unlock(&retained_mutex);
}

void heap_after_fork_child(void)
{
    pthread_mutex_init(&retained_mutex, NULL);
}

void *heap_alloc(size_t n, size_t align, int zero)
{
    if (align < 16)
        align = 16;
    struct block *b = policy_cache_take(n, align);
    if (b) {
        stats_add(STAT_CACHE_HITS, 1);
        if (zero)
            memset((void *)b->base, 0, n);
        return (void *)b->base;
    }
    if (n > SIZE_MAX - align - SHIM_PAGE_SIZE) {
        errno = ENOMEM;
        return NULL;
    }
    size_t map_len = page_up(n + (align > SHIM_PAGE_SIZE ? align : 0));
    size_t reused_len = 0;
    void *map = (void *)reuse_retained(map_len, &reused_len);
    if (map) {
        map_len = reused_len;
        if (zero)
            memset(map, 0, map_len);
    } else if (!(map = os_map(map_len))) {
        errno = ENOMEM;
        return NULL;
    }
    uintptr_t base = ((uintptr_t)map + align - 1) & ~(uintptr_t)(align - 1);
    table_lock();
    b = block_new();
    if (!b) {
        table_unlock();
        os_unmap(map, map_len);
        errno = ENOMEM;
        return NULL;
    }
    b->base = base;
    b->size = n;
    b->map_base = (uintptr_t)map;
    b->map_len = map_len;
    b->origin = ORIGIN_HEAP;
    b->state = BLOCK_PAGEABLE;
    b->prot = PROT_READ | PROT_WRITE;
    if (table_insert(b) != 0) {
        /* An untracked heap block could not be freed later: fail this allocation instead. */
        block_delete(b);
        table_unlock();
        os_unmap(map, map_len);
        errno = ENOMEM;
        return NULL;
    }
    table_unlock();
    /* Fresh anonymous pages are already zero. */
    return (void *)base;
}

int heap_free(void *p)
{
    table_lock();
    struct block *b = table_find_base((uintptr_t)p);
    if (!b || b->origin != ORIGIN_HEAP || b->state == BLOCK_CACHED) {
        table_unlock();
        return 0;
    }
    table_wait_reg_settled(b);
    /* free() never calls the driver: it may run where CUDA calls are not allowed (inside a host
     * callback), and reg_changing would stall until the device is idle. */
    if (b->state == BLOCK_PROMOTED) {
        if (shim_forked_child) {
            /* The child owns no registration (the parent's driver state did the pinning):
             * free the mapping and never touch the driver (semantics rule 8). */
            stats_add(STAT_FORK_CHILD_FREES, 1);
        } else {
            /* Keep it pinned for the next large allocation that fits: reg_changing here
             * would stall until the device is idle. */
            policy_cache_put(b);
            table_unlock();
            return 1;
        }
    }
    uintptr_t map = b->map_base;
    size_t len = b->map_len;
    int warm = !shim_forked_child && policy_worth_keeping_warm(b);
    table_remove(b);
    block_delete(b);
    table_unlock();
    if (!retain(map, len, warm))
        os_unmap((void *)map, len);
    return 1;
}

size_t heap_usable_size(void *p)
{
    size_t usable = (size_t)-1;
    table_lock();
    struct block *b = table_find_base((uintptr_t)p);
    if (b && b->origin == ORIGIN_HEAP && b->state != BLOCK_CACHED)
        usable = b->map_base + b->map_len - b->base;
    table_unlock();
    return usable;
}

void *heap_realloc(void *p, size_t n, int *handled)
{
    table_lock();
    struct block *b = table_find_base((uintptr_t)p);
    if (!b || b->origin != ORIGIN_HEAP || b->state == BLOCK_CACHED) {
        table_unlock();
        *handled = 0;
        return NULL;
    }
    *handled = 1;
    table_wait_reg_settled(b);
    size_t usable = b->map_base + b->map_len - b->base;
    size_t old = b->size;
    if (n <= usable && n >= heap_track_min) {
        /* In place: the mapping (and any registration of it) already covers n bytes. */
        b->size = n;
        table_unlock();
        return p;
    }
    table_unlock();
    /* Move: a new block (perhaps from the cache, perhaps a small one from the real allocator),
     * then the old one goes the way of free(), so a registration is never handed back to the
     * allocator or shrunk under the program. */
    void *q = n >= heap_track_min ? heap_alloc(n, 16, 0) : libc.malloc(n);
    if (!q)
        return NULL;
    memcpy(q, p, old < n ? old : n);
    heap_free(p);
    return q;
}

void heap_track_mapping(void *p, size_t len, int prot, int flags)
{
    if (len < heap_track_min || !(prot & PROT_READ))
        return;
    table_lock();
    if (table_find_containing((uintptr_t)p)) {
        table_unlock();
        return;
    }
    struct block *b = block_new();
    if (b) {
        b->base = b->map_base = (uintptr_t)p;
        b->size = b->map_len = page_up(len);
        b->origin = ORIGIN_MMAP;
        b->state = BLOCK_PAGEABLE;
        b->prot = prot;
        if (table_insert(b) != 0)
            block_delete(b); /* the program's mapping then simply stays untracked */
    }
    table_unlock();
}

void heap_before_unmap(void *p, size_t len, int drop)
{
    if (!table_count())
        return;
    policy_release_range((uintptr_t)p, len, drop);
}
