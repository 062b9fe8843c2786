/* The heap behind the exported malloc family: blocks of at least PINSHIM_MIN_SIZE.  Blocks that
 * fit come from the arena (arena.h), larger or more aligned ones get a mapping of their own; a
 * freed block the shim registered waits in the registry's pinned cache for the next allocation
 * that fits.  The hooks stay thin: they call these and nothing else of mem/. */
#ifndef PINSHIM_MEM_HEAP_H
#define PINSHIM_MEM_HEAP_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "base/shim.h"
#include "mem/arena.h"

/* Smallest size served here; SIZE_MAX while the shim is not tracking (before start-up, off). */
extern size_t heap_track_min;

/* Whether p may be a block of the heap: in the arena's span (one test of two words), or
 * page-aligned (a block with its own mapping).  Anything else is the C library's, which keeps
 * free() of small blocks to this test. */
static inline int heap_may_own(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    return heap_track_min != SIZE_MAX && ((a & (SHIM_PAGE_SIZE - 1)) == 0 || arena_may_contain(a));
}

void heap_init(void);

void *heap_alloc(size_t n, size_t align, int zero);
/* 1 when p was a heap block (now freed or cached), 0 when it is not the shim's. */
int heap_free(void *p);
/* free() from inside the shim's own work on this thread (a signal handler of the program that
 * interrupted it): no lock may be taken, so a heap block waits for the thread's next call.
 * 1 when p is (or may be) the shim's and was set aside, 0 when it is not. */
int heap_free_deferred(void *p);
/* Usable bytes of a heap block, or (size_t)-1 when p is not one. */
size_t heap_usable_size(void *p);
/* realloc for a heap block p; *handled = 0 when p is not one. */
void *heap_realloc(void *p, size_t n, int *handled);

/* The program's own mappings. */
void heap_track_mapping(void *p, size_t len, int prot);
/* Before [p, p+len) is unmapped, replaced, remapped (drop) or discarded: let go of
 * registrations there and (drop) stop tracking blocks there. */
void heap_before_unmap(void *p, size_t len, int drop);
/* After mprotect(p, len, prot) succeeded. */
void heap_after_protect(void *p, size_t len, int prot);

/* Fork: locks and lists consistent in the child. */
void heap_before_fork(void);
void heap_after_fork_parent(void);
void heap_after_fork_child(void);

#endif
