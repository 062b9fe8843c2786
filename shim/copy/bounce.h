/* Bounce copies: the program's own large memcpy/memmove calls into or out of pinned memory
 * (frameworks that stage through their own pinned buffers copy with one CPU thread there, at a
 * fifth of the link's speed) shared among the copy threads (PINSHIM_BOUNCE). */
#ifndef PINSHIM_COPY_BOUNCE_H
#define PINSHIM_COPY_BOUNCE_H

#include <stddef.h>

/* The smallest call the slow path looks at: SIZE_MAX until start-up has read the settings
 * (and while PINSHIM_BOUNCE=off or the mode is off), so that the exports' first test sends
 * every other call straight to the C library. */
extern size_t bounce_threshold;
void bounce_init(void);

/* A call of at least bounce_threshold bytes: copied by the threads where that cannot change
 * what the program sees, else by the C library in the calling thread.  Returns dst. */
void *bounce_memcpy(void *dst, const void *src, size_t n);
void *bounce_memmove(void *dst, const void *src, size_t n);

/* A memset of at least bounce_threshold bytes: shared by the threads on the same terms, where
 * the destination is driver-pinned or a heap block with a mapping of its own that carries
 * transfers (registry_transfer_block: a framework clears each result array before copying into
 * it; JAX sets every 512 MiB NumPy array it returns to zero first, 55 ms of one thread);
 * PINSHIM_BOUNCE=all: any memory the shim knows. */
void *bounce_memset(void *dst, int c, size_t n);

#endif
