/* The C library's memcpy, memmove and memset for the library's own use (see libc_calls.h), and
 * for the program's calls its exports pass on.  Until the C library's are known (the first calls
 * come from the loader's constructors, before the shim's start-up), plain loops of their own. */
#include <stddef.h>
#include <stdint.h>
#include "base/libc_string.h"

/* Byte loops the compiler cannot turn back into memcpy calls (that would be this function). */
#if defined(__x86_64__)
static void *copy_forward(void *dst, const void *src, size_t n)
{
    void *d = dst;
    __asm__ volatile("rep movsb" : "+D"(d), "+S"(src), "+c"(n) : : "memory");
    return dst;
}

static void *bootstrap_memset(void *dst, int c, size_t n)
{
    void *d = dst;
    __asm__ volatile("rep stosb" : "+D"(d), "+c"(n) : "a"(c) : "memory");
    return dst;
}
#else
static void *copy_forward(void *dst, const void *src, size_t n)
{
    volatile unsigned char *d = dst;
    const volatile unsigned char *s = src;
    for (size_t i = 0; i < n; i++)
        d[i] = s[i];
    return dst;
}

static void *bootstrap_memset(void *dst, int c, size_t n)
{
    volatile unsigned char *d = dst;
    for (size_t i = 0; i < n; i++)
        d[i] = (unsigned char)c;
    return dst;
}
#endif

static void *bootstrap_memmove(void *dst, const void *src, size_t n)
{
    if ((uintptr_t)dst - (uintptr_t)src >= n)
        return copy_forward(dst, src, n);   /* no overlap, or dst below src */
    volatile unsigned char *d = dst;
    const volatile unsigned char *s = src;
    for (size_t i = n; i-- > 0;)
        d[i] = s[i];
    return dst;
}

void *(*shim_next_memcpy)(void *, const void *, size_t) = copy_forward;
void *(*shim_next_memmove)(void *, const void *, size_t) = bootstrap_memmove;
void *(*shim_next_memset)(void *, int, size_t) = bootstrap_memset;

__attribute__((visibility("hidden"))) void *shim_libc_memcpy(void *dst, const void *src, size_t n)
{
    return shim_next_memcpy(dst, src, n);
}

__attribute__((visibility("hidden"))) void *shim_libc_memmove(void *dst, const void *src, size_t n)
{
    return shim_next_memmove(dst, src, n);
}

__attribute__((visibility("hidden"))) void *shim_libc_memset(void *dst, int c, size_t n)
{
    return shim_next_memset(dst, c, n);
}
