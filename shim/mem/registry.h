/* The registry: the only owner of what the shim knows about host memory.
 *
 * It alone holds the records of tracked blocks (heap blocks, the program's own mappings), their
 * registrations and every change of one, the budget, the pinned block cache, and the ranges the
 * program pinned itself.  Everyone else asks with a verb; nobody takes its lock or writes a
 * record.  The rules it keeps are docs/contract.md's: a registration never outlives its memory
 * (rule 4), the program's own pinning always works (rule 5), the budget is a hard ceiling
 * (rule 7), a forked child never reaches the driver (rule 8).
 *
 * Blocks of the arena get a record lazily, the first time a copy touches them: allocating and
 * freeing a block nobody copies never takes the registry's lock. */
#ifndef PINSHIM_MEM_REGISTRY_H
#define PINSHIM_MEM_REGISTRY_H

#include <stddef.h>
#include <stdint.h>
#include <cuda.h>
#include "mem/arena.h"
#include "stats/stats.h"

/* ---- the copy path ---- */

enum copy_flags {
    COPY_MAY_PROMOTE = 1,   /* the copy may register its block (mode pin or full, no capture) */
    COPY_CAPTURING = 2,     /* a stream capture is recording this copy */
    COPY_STAGEABLE = 4,     /* the staging pipeline would take this copy if it stays pageable */
};

/* Held from copy_begin to copy_end: a promoted block's registration stays while held. */
struct copy_hold {
    struct block *b;
    /* A block the copy uses as pageable memory: no registration of it starts until the copy
     * is done, or the driver could find the memory pinned halfway through the call. */
    struct block *pageable;
    /* MEM_PAGEABLE only because the block's registration is being made in the background: the
     * driver may see it pinned any moment, so only staging is right for this copy (if staging
     * declines, ask again without COPY_STAGEABLE: that waits for the registration). */
    int unsettled;
    /* Why the copy gets this kind of memory, one word for the event trace: the cost model's
     * reason where it was asked, else what decided (program_pinned, not_tracked,
     * registered_before, ...). */
    const char *why;
    /* MEM_PROMOTED by a registration this call made of a heap block (anonymous pages, readable):
     * the registered range, whose lines the CPU caches may still hold (written by the program,
     * or read by the copy threads when it was staged), else 0. */
    uintptr_t fresh_base;
    size_t fresh_len;
};

/* What the host range [p, p+n) of a copy in direction dir is: MEM_PINNED (the program's own),
 * MEM_PROMOTED (registered by the shim: held until registry_copy_end), or MEM_PAGEABLE.  The
 * copy counts towards the block's hotness; with COPY_MAY_PROMOTE the cost model may register it
 * now. */
enum mem_kind registry_copy_begin(uintptr_t p, size_t n, enum copy_dir dir, unsigned flags,
                                  struct copy_hold *hold);
/* async_pending: a trusted async copy may still use the registration (PINSHIM_TRUST_ASYNC). */
void registry_copy_end(struct copy_hold *hold, int async_pending);

/* A copy of `bytes` with a host side begins (1) or ends (0), whatever path it takes: the
 * registrar holds freed blocks' registrations off while the program copies (registry.c,
 * bg_main). */
void registry_copy_activity(int begin, size_t bytes);

/* 1 when p is host memory the shim knows (a tracked block or a program-pinned range). */
int registry_known_host(uintptr_t p);
/* 1 when all of [p, p+n) lies in one tracked block or one program-pinned range. */
int registry_host_range(uintptr_t p, size_t n);
/* 1 when all of [p, p+n) lies in one range the shim knows is mapped with (at least) protection
 * prot: a block of its heap, a mapping it tracks, memory the program pinned.  *pinned: the range
 * is driver-pinned (the program's pinned memory, or registered by the shim). */
int registry_copyable(uintptr_t p, size_t n, int prot, int *pinned);
/* 0 when no block the registry knows can hold p: lock-free, may answer 1 for memory that is not
 * the shim's. */
int registry_may_hold(uintptr_t p);
/* 1 when p lies in a block the shim registered. */
int registry_promoted_at(uintptr_t p);
/* 1 when [p, p+n) lies in one range the program pinned itself. */
int registry_program_pinned(uintptr_t p, size_t n);

/* ---- the heap ---- */

/* A heap block with a mapping of its own (too large or too aligned for the arena).  warm: its
 * pages are those of a freed block that carried transfers (see heap.c). */
int registry_track_huge(uintptr_t base, size_t size, uintptr_t map, size_t map_len, int warm);

enum registry_free_result {
    REG_FREE_NOT_MINE,     /* no record: not a block the registry knows */
    REG_FREE_DONE,         /* handled: kept in the pinned cache, or given back to the arena */
    REG_FREE_UNMAP,        /* a huge block: *map, *map_len are the caller's to reuse or unmap */
};
/* free() of a tracked arena block (slot) or of a huge block (slot NULL) at p.  *warm: it carried
 * a transfer of most of its bytes, or the program's copies filled most of it (see heap.c). */
enum registry_free_result registry_free(uintptr_t p, struct arena_slot *slot, uintptr_t *map,
                                        size_t *map_len, int *warm);
/* An allocation of n bytes, aligned to align: a block from the pinned cache, registered and
 * resident, or else a freed one still waiting to be registered for it (resident; the registrar
 * then skips it), now the program's; NULL when none fits. */
void *registry_cache_take(size_t n, size_t align);
/* The program's memcpy/memmove wrote [p, p+n): a huge block mostly filled so is kept resident
 * once freed, for the next allocation of its size (see heap.c). */
void registry_note_filled(uintptr_t p, size_t n);
/* 1 when [p, p+n) lies in a pageable huge block that carries transfers: its pages came from a
 * warm block, or copies or the program's large memcpy/memmove moved most of its bytes. */
int registry_transfer_block(uintptr_t p, size_t n);
/* Usable bytes of the huge block at p, or (size_t)-1 when p is not one. */
size_t registry_huge_usable(uintptr_t p);
/* realloc of the huge block at p to n bytes in place: 1 done, 0 it must move (*old_size set),
 * -1 p is not one. */
int registry_huge_resize(uintptr_t p, size_t n, size_t *old_size);

/* ---- the program's mappings ---- */

void registry_track_mapping(uintptr_t p, size_t len, int prot);
/* Before [p, p+n) is unmapped, replaced, remapped (drop: forget the blocks there) or discarded
 * (madvise: keep tracking, unregistered).  Returns how many registrations were let go. */
int registry_release_range(uintptr_t p, size_t n, int drop);
/* After mprotect(p, n, prot) succeeded: a registration whose flags no longer fit the pages is
 * let go. */
void registry_protect(uintptr_t p, size_t n, int prot);

/* ---- the program's own pinning (rule 5) ---- */

/* The program registers [p, p+n): the shim gives up its own registrations there first, then
 * calls reg (the driver's entry point the program called). */
CUresult registry_program_register(void *p, size_t n, unsigned flags,
                                   CUresult (*reg)(void *, size_t, unsigned));
/* The program unregisters p: never the shim's registration (the program gets the error it
 * would get without the shim). */
CUresult registry_program_unregister(void *p, CUresult (*unreg)(void *));
/* cuMemHostAlloc / cuMemAllocHost memory, and its cuMemFreeHost. */
void registry_program_allocated(uintptr_t p, size_t n);
void registry_program_freed(uintptr_t p);

/* ---- the shim's own registrations (staging buffers) ---- */

/* Stop the background registration thread (exit): a registration in progress finishes first. */
void registry_shutdown(void);

/* Take bytes of the budget (evicting colder registrations if needed); 1 on success. */
int registry_reserve(size_t bytes);
void registry_unreserve(size_t bytes);
uint64_t registry_registered_bytes(void);
/* Whether promotion is possible (mode, device, budget); decided once a context exists. */
int registry_promotion_enabled(void);

/* ---- counts, for tests and the report ---- */
struct registry_usage {
    uint64_t tracked_mappings;   /* the program's own mappings the registry tracks */
    uint64_t huge_blocks;
    uint64_t arena_records;      /* arena blocks with a record */
    uint64_t cached_blocks;
    uint64_t program_ranges;
};
void registry_usage(struct registry_usage *u);

/* ---- fork ---- */
void registry_before_fork(void);
void registry_after_fork_parent(void);
/* The child: every registration and registration in progress forgotten (the threads that made
 * them do not exist here, and nothing in the child will ever call the driver). */
void registry_after_fork_child(void);

#endif
