/* The C library's memcpy, memmove and memset, once known (real_libc_resolve sets them); plain copies of
 * the library's own before that. */
#ifndef PINSHIM_BASE_LIBC_STRING_H
#define PINSHIM_BASE_LIBC_STRING_H

#include <stddef.h>

extern void *(*shim_next_memcpy)(void *, const void *, size_t);
extern void *(*shim_next_memmove)(void *, const void *, size_t);
extern void *(*shim_next_memset)(void *, int, size_t);

#endif
