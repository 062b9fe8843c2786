/* Included before everything else in every file of the library but the two that define the
 * string functions themselves (libc_string.c, hook/bounce_hooks.c): the library exports memcpy,
 * memmove and memset for the program, so its own calls, the compiler's included, are sent to
 * the C library's under another name and never reach its own exports. */
#ifndef PINSHIM_BASE_LIBC_CALLS_H
#define PINSHIM_BASE_LIBC_CALLS_H

#include <stddef.h>

void *memcpy(void *dst, const void *src, size_t n) __asm__("shim_libc_memcpy");
void *memmove(void *dst, const void *src, size_t n) __asm__("shim_libc_memmove");
void *memset(void *dst, int c, size_t n) __asm__("shim_libc_memset");

#endif
