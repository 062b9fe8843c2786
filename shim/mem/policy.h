/* Promotion policy: hotness and the cost model, the budget, eviction, the pinned block cache. */
#ifndef PINSHIM_POLICY_H
#define PINSHIM_POLICY_H

#include <stddef.h>
#include <stdint.h>
#include "stats/stats.h"
#include "mem/table.h"

/* The cost model, pure, for unit tests: microseconds a promotion of a block of block_bytes
 * (resident_bytes of it already touched) saves over the copies expected to come, given that
 * `copies_seen` copies of `bytes` each in direction dir have happened (this one included), and
 * the alternative path runs at alt_mbps.  Positive: promote. */
double policy_promotion_gain_us(size_t block_bytes, size_t resident_bytes, enum copy_dir dir,
                                size_t bytes, uint64_t copies_seen, double alt_mbps);

/* Whether promotion is possible at all (mode, device, budget); checked once per context. */
int policy_promotion_enabled(void);

/* A copy of `bytes` in direction dir touches tracked pageable block b: update its hotness and
 * say whether to promote it now.  Table lock held. */
int policy_on_copy(struct block *b, enum copy_dir dir, size_t bytes);

/* Register b (its whole mapping) under the budget, evicting colder registrations first, in the
 * current context.  Called without the table lock, with b->inflight held by the caller.
 * Returns 1 when b is promoted (now or already), 0 when it stays pageable. */
int policy_promote(struct block *b);

/* The program frees pageable block b: did it carry transfers that make its pages worth keeping
 * for the next allocation of its size (see heap.c)?  Table lock held. */
int policy_worth_keeping_warm(const struct block *b);

/* Take registered bytes for the shim's own use (staging), evicting if needed; 1 on success. */
int policy_reserve(size_t bytes);
void policy_release(size_t bytes);
uint64_t policy_registered_bytes(void);

/* Let go of every shim registration overlapping [p, p+n): wait for DMA, unregister; cached
 * blocks in the range are freed.  For the program's own cuMemHostRegister, munmap, mremap,
 * madvise.  Called without the table lock. */
/* Returns how many registrations it let go. */
int policy_release_range(uintptr_t p, size_t n, int drop_blocks);

/* The pinned block cache. */
/* A large allocation of n bytes (alignment align): a cached block that fits, promoted again and
 * owned by the program, or NULL. */
struct block *policy_cache_take(size_t n, size_t align);
/* The program freed promoted block b (table lock held): keep it registered in the cache. */
void policy_cache_put(struct block *b);

/* Drop what the shim knows about registrations and registrations in progress (the child after
 * fork). */
void policy_forget_registrations(void);

#endif
