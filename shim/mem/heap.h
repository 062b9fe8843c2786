/* Large allocations: blocks of at least PINSHIM_MIN_SIZE get their own page-aligned mapping, so a
 * registration never shares a page with another allocation and can be kept (cached) after
 * free.  Also the tracking of the program's own mappings. */
#ifndef PINSHIM_HEAP_H
#define PINSHIM_HEAP_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Smallest size served here; SIZE_MAX while the shim is not tracking (before start-up, off). */
extern size_t heap_track_min;

void *heap_alloc(size_t n, size_t align, int zero);
/* 1 when p was a heap block (now freed or cached), 0 when it is not the shim's. */
int heap_free(void *p);
/* Usable bytes of a heap block, or (size_t)-1 when p is not one. */
size_t heap_usable_size(void *p);
/* realloc for a heap block p; *handled = 0 when p is not one. */
void *heap_realloc(void *p, size_t n, int *handled);

/* The program's own mappings. */
void heap_track_mapping(void *p, size_t len, int prot, int flags);
/* Before [p, p+len) is unmapped, replaced, remapped or discarded: let go of registrations and
 * (drop != 0) stop tracking blocks there. */
void heap_before_unmap(void *p, size_t len, int drop);

/* Fork: the retained list must be consistent in the child. */
void heap_before_fork(void);
void heap_after_fork_parent(void);
void heap_after_fork_child(void);

#endif
