/* Large blocks from arenas: page-granular blocks carved from big segments, so that a block the
 * registry registers pins only its own pages, while allocating and freeing stay as cheap as the
 * C library's (no system call, no fresh zeroed pages for a block that is freed and allocated
 * again, no mapping per block).
 *
 * A segment is ARENA_SEG_SIZE bytes, aligned to its size, and holds blocks of one size class
 * (quarter-power-of-two steps, whole pages, up to ARENA_MAX_BLOCK).  Each block has a slot in the
 * segment's header (kept apart from the segment, in the shim's own records): its state, the size
 * the program asked for, and the registry's record of it, if any.  Freed blocks go to the
 * calling thread's cache (no lock), then to their class's central list; pages of blocks that
 * stay free beyond a bound are given back with MADV_DONTNEED.
 *
 * The arena knows nothing of registration.  A block the registry tracks (SLOT_TRACKED) is never
 * put back by arena_free: free() must ask the registry first (heap.c). */
#ifndef PINSHIM_MEM_ARENA_H
#define PINSHIM_MEM_ARENA_H

#include <stddef.h>
#include <stdint.h>

#define ARENA_SEG_SHIFT 26
#define ARENA_SEG_SIZE (1ul << ARENA_SEG_SHIFT)
#define ARENA_MAX_BLOCK (32ul << 20)
#define ARENA_CLASSES 48
#define ARENA_LINE 64          /* a cache line */

enum slot_state {
    SLOT_FREE,      /* in a cache or a free list: the arena's */
    SLOT_LIVE,      /* the program's; no record */
    SLOT_TRACKED,   /* the program's or the registry's pinned cache; the registry has a record */
};

/* A cache line per slot: a block's owner writes its slot on every malloc and free, and the
 * neighbouring blocks are often other threads' (packed slots made threads that share nothing
 * take turns at a line on every call). */
struct arena_slot {
    uint32_t state;            /* enum slot_state, atomic */
    uint16_t zero;             /* its pages are known to read zero (fresh or given back) */
    uint16_t color;            /* the program's pointer is addr + color (see arena_alloc) */
    uint64_t size;             /* bytes the program asked for */
    void *rec;                 /* the registry's record while SLOT_TRACKED */
    uintptr_t addr;            /* the block's first byte (page-aligned) */
    struct arena_slot *next;   /* in a free list */
} __attribute__((aligned(ARENA_LINE)));

/* What a block of the arena is: for lookups by any address inside it. */
struct arena_block {
    struct arena_slot *slot;
    uintptr_t base;            /* the program's pointer: slot->addr + slot->color */
    size_t usable;             /* bytes from base to the block's end: all the program's */
    uintptr_t block;           /* the block's pages, as a registration covers them */
    size_t block_len;          /* its class size */
};

/* Set up the class table (start-up, before the first allocation the arena serves). */
void arena_init(void);

/* A block of at least n bytes (n <= ARENA_MAX_BLOCK) aligned to align (at most a page),
 * SLOT_LIVE; zeroed when `zero`.  NULL when out of memory (errno ENOMEM).
 * Unless a page alignment is asked for, a block gets a page more and the program's pointer
 * lies a block-dependent multiple of 64 bytes (64 at least) into it: blocks that all began on a
 * page boundary would put the same bytes of every block in the same cache sets, and a working
 * set of many blocks would miss the caches (measured: 2.9x slower for 64 KiB blocks touched a
 * byte a page).  The extra page is address space only: a registration covers the pages asked
 * for. */
void *arena_alloc(size_t n, size_t align, int zero);

/* The smallest and largest requests the arena serves: n <= ARENA_MAX_BLOCK, alignment up to a
 * page. */
static inline int arena_serves(size_t n, size_t align)
{
    return align <= 4096 && n <= ARENA_MAX_BLOCK - (align < 4096 ? 4096 : 0);
}

/* The lowest and highest address of any segment, for a quick "not the arena's" test. */
extern uintptr_t arena_span_lo, arena_span_hi;
static inline int arena_may_contain(uintptr_t p)
{
    return p >= __atomic_load_n(&arena_span_lo, __ATOMIC_RELAXED) &&
           p < __atomic_load_n(&arena_span_hi, __ATOMIC_RELAXED);
}

/* The slot of the block starting exactly at p, or NULL when p is not the start of an arena block
 * (any state).  Lock-free. */
struct arena_slot *arena_slot_of(uintptr_t p);

/* Whether p lies in a segment of the arena at all.  Lock-free, one load. */
int arena_contains(uintptr_t p);

/* The block holding address p (live or tracked), or 0 when p is in no such block. */
int arena_find(uintptr_t p, struct arena_block *out);

/* free() of a block that is SLOT_LIVE: back to the arena.  Returns 0 when done; 1 when the
 * block is SLOT_TRACKED (*tracked is its slot: the caller goes to the registry, which hands it
 * back through arena_release once it lets go); -1 when p is not the start of a live block of
 * the arena. */
int arena_free(uintptr_t p, struct arena_slot **tracked);

/* The registry's side of SLOT_TRACKED: claim a live block (LIVE -> TRACKED with rec; 0 on
 * success, -1 when it is no longer live), and give a tracked block back to the arena as free
 * (its pages unchanged), or as live again (the registry dropped its record: the program still
 * owns the block). */
int arena_track(struct arena_slot *s, void *rec);
void arena_release(struct arena_slot *s);
void arena_untrack(struct arena_slot *s);

/* Call fn for every live or tracked block overlapping [p, p+n).  Lock-free walk of the slots
 * (a block may change state meanwhile: fn must look again under its own lock). */
void arena_for_each_in_range(uintptr_t p, size_t n, void (*fn)(struct arena_slot *, void *), void *arg);

/* The class of a request of n bytes aligned to align (with its color page), and the class
 * whose blocks are exactly `block_len` bytes. */
unsigned arena_class_for(size_t n, size_t align);
unsigned arena_class_of_block(size_t block_len);

/* Drop what the calling thread's cache holds back to the central lists (thread exit, tests). */
void arena_flush_thread_cache(void);

/* Counters for tests and the report. */
struct arena_usage {
    uint64_t segments;         /* mappings the arena made */
    uint64_t live_bytes;       /* usable bytes of live and tracked blocks */
    uint64_t free_resident;    /* bytes of freed blocks whose pages are kept */
    uint64_t purged;           /* blocks whose pages were given back */
};
void arena_usage(struct arena_usage *u);

/* Fork: the central lists stay consistent in the child. */
void arena_before_fork(void);
void arena_after_fork_parent(void);
void arena_after_fork_child(void);

#endif
