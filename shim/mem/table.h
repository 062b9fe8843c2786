/* Tracked host blocks: address -> block, interior pointers, registration state. */
#ifndef PINSHIM_TABLE_H
#define PINSHIM_TABLE_H

#include <stddef.h>
#include <stdint.h>
#include <cuda.h>
#include "base/meta.h"
#include <uthash.h>

enum block_origin {
    ORIGIN_HEAP,    /* a large malloc-family block the shim serves from its own mapping */
    ORIGIN_MMAP,    /* the program's own mmap */
};

enum block_state {
    BLOCK_PAGEABLE,   /* tracked, not registered */
    BLOCK_PROMOTED,   /* registered by the shim, owned by the program */
    BLOCK_CACHED,     /* freed by the program, kept registered in the shim's pinned cache */
};

struct block {
    uintptr_t base;           /* the address the program sees (hash key) */
    size_t size;              /* bytes the program asked for */
    uintptr_t map_base;       /* the mapping behind the block (heap blocks: the shim's mmap) */
    size_t map_len;
    enum block_origin origin;
    enum block_state state;
    int prot;                 /* mmap blocks: PROT_* at map time */
    /* registration, when promoted or cached: the whole mapping, page-rounded */
    uintptr_t reg_base;
    size_t reg_len;
    CUcontext reg_ctx;
    /* hotness, for the policy */
    uint64_t copies;
    uint64_t bytes_moved;
    uint64_t last_use_ns;
    unsigned inflight;        /* copies running through this block's registration now */
    int async_pending;        /* trusted async copies may still read or write it */
    int no_promote;           /* registration failed for a reason that will not change */
    int reg_changing;         /* its registration is being made or removed right now (outside
                               * the table lock): its memory must not go away, nor the program
                               * register it, until that is done */
    int captured;             /* a captured graph copies through this registration: a replay
                               * after reg_changing would DMA into unpinned memory, so it is
                               * never evicted while the program owns it */
    struct block *cache_next; /* cached blocks, most recently freed first */
    struct block *cache_prev;
    UT_hash_handle hh;
};

/* One lock guards the table and every block's state. Never held across a driver call that
 * can wait for the device, except where the caller says why. */
void table_lock(void);
void table_unlock(void);

/* 0 on success, -1 when the index cannot grow (the block is then not tracked). */
int table_insert(struct block *b);
void table_remove(struct block *b);
struct block *table_find_base(uintptr_t base);
/* The block whose mapping holds address p, or NULL. */
struct block *table_find_containing(uintptr_t p);
/* Up to max blocks whose mappings overlap [start, start+len); returns the count found. */
size_t table_find_overlapping(uintptr_t start, size_t len, struct block **out, size_t max);
size_t table_count(void);
/* Without the lock: 0 when no tracked mapping can hold p (a quick test before the lookup). */
int table_may_contain(uintptr_t p);
/* Iterate all blocks (under the lock). */
#define TABLE_FOREACH(b, tmp) HASH_ITER(hh, table_head, b, tmp)
extern struct block *table_head;

/* Block records come from a private free list so that the table never calls malloc.
 * Both run under the table lock. */
struct block *block_new(void);
void block_delete(struct block *b);

/* Ranges the program pinned itself (cuMemHostRegister / cuMemHostAlloc): never the shim's. */
void pinned_add(uintptr_t start, size_t len, int host_alloc);
int pinned_remove(uintptr_t start);          /* 1 if it was there */
int pinned_contains(uintptr_t p, size_t len); /* 1 if [p, p+len) lies inside one range */

/* Table lock held: wait (lock dropped meanwhile) until b's registration is not changing. */
void table_wait_reg_settled(struct block *b);
/* Table lock held: the block holding p once no registration of it is being made or removed
 * (the lock is dropped while waiting, so the block is looked up again), or NULL. */
struct block *table_find_containing_settled(uintptr_t p);

/* After fork the child re-creates the locks. */
void table_after_fork_child(void);

#endif
