/* The exported memcpy, memmove, memset and their fortified forms.  The first test sends every
 * call below PINSHIM_BOUNCE_MIN (and every call before start-up, or with bounce copies off) to
 * the C library at the cost of one compare; the rest go to copy/bounce.c.  This file is compiled
 * without base/libc_calls.h: its memcpy is the program's. */
#include <stddef.h>
#include "base/libc_string.h"
#include "base/real.h"
#include "base/shim.h"
#include "copy/bounce.h"

static inline void *copy(void *dst, const void *src, size_t n)
{
    if (SHIM_UNLIKELY(n >= __atomic_load_n(&bounce_threshold, __ATOMIC_RELAXED)))
        return bounce_memcpy(dst, src, n);
    return shim_next_memcpy(dst, src, n);
}

static inline void *move(void *dst, const void *src, size_t n)
{
    if (SHIM_UNLIKELY(n >= __atomic_load_n(&bounce_threshold, __ATOMIC_RELAXED)))
        return bounce_memmove(dst, src, n);
    return shim_next_memmove(dst, src, n);
}

static inline void *set(void *dst, int c, size_t n)
{
    if (SHIM_UNLIKELY(n >= __atomic_load_n(&bounce_threshold, __ATOMIC_RELAXED)))
        return bounce_memset(dst, c, n);
    return shim_next_memset(dst, c, n);
}

SHIM_EXPORT void *memcpy(void *dst, const void *src, size_t n)
{
    return copy(dst, src, n);
}

SHIM_EXPORT void *memmove(void *dst, const void *src, size_t n)
{
    return move(dst, src, n);
}

SHIM_EXPORT void *memset(void *dst, int c, size_t n)
{
    return set(dst, c, n);
}

/* Fortified builds call these with the destination's size: an overflow is the C library's to
 * report (it aborts), exactly as without the shim. */
SHIM_EXPORT void *__memcpy_chk(void *dst, const void *src, size_t n, size_t dst_len)
{
    if (SHIM_UNLIKELY(n > dst_len) && libc.memcpy_chk)
        return libc.memcpy_chk(dst, src, n, dst_len);
    return copy(dst, src, n);
}

SHIM_EXPORT void *__memmove_chk(void *dst, const void *src, size_t n, size_t dst_len)
{
    if (SHIM_UNLIKELY(n > dst_len) && libc.memmove_chk)
        return libc.memmove_chk(dst, src, n, dst_len);
    return move(dst, src, n);
}

SHIM_EXPORT void *__memset_chk(void *dst, int c, size_t n, size_t dst_len)
{
    if (SHIM_UNLIKELY(n > dst_len) && libc.memset_chk)
        return libc.memset_chk(dst, c, n, dst_len);
    return set(dst, c, n);
}
