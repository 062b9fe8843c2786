/* Tracked blocks: a uthash table keyed by base address for free(), and an array sorted by
 * mapping start for interior-pointer lookups (copies are rare next to mallocs, so a binary
 * search under one lock is enough). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "base/real.h"
#include "base/os.h"
#include "base/shim.h"
#include "mem/table.h"

/* A hash table that cannot grow has lost track of blocks it must free: never run on. */
#undef uthash_fatal
#define uthash_fatal(msg) abort()

static pthread_mutex_t table_mutex = PTHREAD_MUTEX_INITIALIZER;
struct block *table_head;
static struct block **sorted;
static size_t sorted_len, sorted_cap;

void table_lock(void) { pthread_mutex_lock(&table_mutex); }
void table_unlock(void) { pthread_mutex_unlock(&table_mutex); }

/* Private memory for records and the sorted index, from the raw-OS layer. */
static void *raw_alloc(size_t n)
{
    return os_map(n);
}

static struct block *free_records;

struct block *block_new(void)
{
    if (!free_records) {
        size_t n = 65536 / sizeof(struct block);
        struct block *chunk = raw_alloc(n * sizeof(struct block));
        if (!chunk)
            return NULL;
        for (size_t i = 0; i < n; i++) {
            chunk[i].hh.next = free_records;
            free_records = &chunk[i];
        }
    }
    struct block *b = free_records;
    free_records = b->hh.next;
    memset(b, 0, sizeof *b);
    return b;
}

void block_delete(struct block *b)
{
    b->hh.next = free_records;
    free_records = b;
}

static size_t lower_bound(uintptr_t addr)
{
    size_t lo = 0, hi = sorted_len;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (sorted[mid]->map_base < addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static int sorted_reserve(void)
{
    if (sorted_len < sorted_cap)
        return 0;
    size_t cap = sorted_cap ? sorted_cap * 2 : 4096;
    struct block **grown = raw_alloc(cap * sizeof *grown);
    if (!grown)
        return -1;
    if (sorted) {
        memcpy(grown, sorted, sorted_len * sizeof *grown);
        os_unmap(sorted, sorted_cap * sizeof *sorted);
    }
    sorted = grown;
    sorted_cap = cap;
    return 0;
}

/* The span from the lowest tracked mapping to the end of the highest, readable without the lock:
 * most pageable copies (the stack, small malloc blocks) lie outside it.  Mappings never overlap,
 * so the first and last in address order bound it.  A reader may see lo and hi from different
 * updates; a block in the table through both updates is inside either bound. */
static uintptr_t span_lo = UINTPTR_MAX, span_hi;

static void span_update(void)
{
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    if (sorted_len) {
        lo = sorted[0]->map_base;
        hi = sorted[sorted_len - 1]->map_base + sorted[sorted_len - 1]->map_len;
    }
    __atomic_store_n(&span_lo, lo, __ATOMIC_RELAXED);
    __atomic_store_n(&span_hi, hi, __ATOMIC_RELAXED);
}

int table_may_contain(uintptr_t p)
{
    return p >= __atomic_load_n(&span_lo, __ATOMIC_RELAXED) &&
           p < __atomic_load_n(&span_hi, __ATOMIC_RELAXED);
}

int table_insert(struct block *b)
{
    if (sorted_reserve() != 0)
        return -1;
    size_t i = lower_bound(b->map_base);
    memmove(&sorted[i + 1], &sorted[i], (sorted_len - i) * sizeof *sorted);
    sorted[i] = b;
    sorted_len++;
    span_update();
    HASH_ADD(hh, table_head, base, sizeof(uintptr_t), b);
    return 0;
}

void table_remove(struct block *b)
{
    size_t i = lower_bound(b->map_base);
    while (i < sorted_len && sorted[i] != b)
        i++;
    if (i < sorted_len) {
        memmove(&sorted[i], &sorted[i + 1], (sorted_len - i - 1) * sizeof *sorted);
        sorted_len--;
        span_update();
    }
    HASH_DELETE(hh, table_head, b);
}

struct block *table_find_base(uintptr_t base)
{
    struct block *b = NULL;
    HASH_FIND(hh, table_head, &base, sizeof(uintptr_t), b);
    return b;
}

struct block *table_find_containing(uintptr_t p)
{
    size_t i = lower_bound(p + 1);
    if (i == 0)
        return NULL;
    struct block *b = sorted[i - 1];
    return p < b->map_base + b->map_len ? b : NULL;
}

size_t table_find_overlapping(uintptr_t start, size_t len, struct block **out, size_t max)
{
    size_t found = 0;
    uintptr_t end = start + len;
    size_t i = lower_bound(start + 1);
    if (i > 0)
        i--;
    for (; i < sorted_len && found < max; i++) {
        struct block *b = sorted[i];
        if (b->map_base >= end)
            break;
        if (b->map_base + b->map_len > start)
            out[found++] = b;
    }
    return found;
}

void table_wait_reg_settled(struct block *b)
{
    /* Evictions are rare and take milliseconds (reg_changing waits for the device). */
    while (b->reg_changing) {
        table_unlock();
        usleep(100);
        table_lock();
    }
}

struct block *table_find_containing_settled(uintptr_t p)
{
    struct block *b = table_find_containing(p);
    while (b && b->reg_changing) {
        table_wait_reg_settled(b);
        b = table_find_containing(p);
    }
    return b;
}

size_t table_count(void)
{
    return sorted_len;
}

/* Program-pinned ranges: few, so a small array. */
struct pinned_range { uintptr_t start; size_t len; int host_alloc; };
static struct pinned_range *pinned;
static size_t pinned_len, pinned_cap;
/* Bumped on every change; a thread's last hit stays valid while it is unchanged, so the copy
 * path of a program that copies from its own pinned buffers takes no lock. */
static unsigned long pinned_generation;
static __thread struct { unsigned long generation; uintptr_t start; size_t len; } pinned_last_hit;
static pthread_mutex_t pinned_mutex = PTHREAD_MUTEX_INITIALIZER;

void pinned_add(uintptr_t start, size_t len, int host_alloc)
{
    pthread_mutex_lock(&pinned_mutex);
    if (pinned_len == pinned_cap) {
        size_t cap = pinned_cap ? pinned_cap * 2 : 256;
        struct pinned_range *grown = raw_alloc(cap * sizeof *grown);
        if (!grown) {
            pthread_mutex_unlock(&pinned_mutex);
            return;
        }
        if (pinned) {
            memcpy(grown, pinned, pinned_len * sizeof *grown);
            os_unmap(pinned, pinned_cap * sizeof *pinned);
        }
        pinned = grown;
        pinned_cap = cap;
    }
    pinned[pinned_len++] = (struct pinned_range){start, len, host_alloc};
    __atomic_add_fetch(&pinned_generation, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&pinned_mutex);
}

int pinned_remove(uintptr_t start)
{
    int found = 0;
    pthread_mutex_lock(&pinned_mutex);
    for (size_t i = 0; i < pinned_len; i++) {
        if (pinned[i].start == start) {
            pinned[i] = pinned[--pinned_len];
            __atomic_add_fetch(&pinned_generation, 1, __ATOMIC_RELEASE);
            found = 1;
            break;
        }
    }
    pthread_mutex_unlock(&pinned_mutex);
    return found;
}

int pinned_contains(uintptr_t p, size_t len)
{
    int found = 0;
    if (!__atomic_load_n(&pinned_len, __ATOMIC_RELAXED))
        return 0;
    unsigned long generation = __atomic_load_n(&pinned_generation, __ATOMIC_ACQUIRE);
    if (pinned_last_hit.generation == generation && p >= pinned_last_hit.start &&
        p + len <= pinned_last_hit.start + pinned_last_hit.len)
        return 1;
    pthread_mutex_lock(&pinned_mutex);
    for (size_t i = 0; i < pinned_len; i++) {
        if (p >= pinned[i].start && p + len <= pinned[i].start + pinned[i].len) {
            found = 1;
            pinned_last_hit.generation = __atomic_load_n(&pinned_generation, __ATOMIC_RELAXED);
            pinned_last_hit.start = pinned[i].start;
            pinned_last_hit.len = pinned[i].len;
            break;
        }
    }
    pthread_mutex_unlock(&pinned_mutex);
    return found;
}

void table_after_fork_child(void)
{
    pthread_mutex_init(&table_mutex, NULL);
    pthread_mutex_init(&pinned_mutex, NULL);
}
