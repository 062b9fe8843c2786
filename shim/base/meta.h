/* The shim's own small records (call sites, per-thread stream sets, hash buckets), from pages of
 * the raw-OS layer, never from the C library: the shim runs inside malloc, mmap and the copy
 * path, where a signal handler of the program may call malloc, so holding a lock of the C
 * library's allocator there could deadlock a program that would run fine without the shim. */
#ifndef PINSHIM_BASE_META_H
#define PINSHIM_BASE_META_H

#include <stddef.h>

/* Zero-filled; NULL when out of memory. */
void *meta_alloc(size_t n);
/* n: the size given to meta_alloc. */
void meta_free(void *p, size_t n);
/* Fork: the lists stay consistent in the child (pthread_atfork, from init). */
void meta_before_fork(void);
void meta_after_fork_parent(void);
void meta_after_fork_child(void);

/* uthash, wherever the shim uses it, takes its buckets from here. */
#define uthash_malloc(sz) meta_alloc(sz)
#define uthash_free(ptr, sz) meta_free(ptr, sz)

#endif
