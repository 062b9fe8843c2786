/* The exported malloc and mmap families.  Thin: small blocks go straight to the real allocator,
 * large ones to heap.c; mapping changes tell heap.c first. */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "mem/heap.h"
#include "base/real.h"
#include "base/shim.h"

/* dlsym allocates before the real allocator is known: serve it from a static pool whose blocks
 * are never freed (free() ignores them). */
static char bootstrap_pool[64 * 1024] __attribute__((aligned(64)));
static size_t bootstrap_used;

static int in_pool(const void *p)
{
    return (const char *)p >= bootstrap_pool && (const char *)p < bootstrap_pool + sizeof bootstrap_pool;
}

static void *pool_alloc(size_t n, size_t align)
{
    if (align < 16)
        align = 16;
    size_t start, end;
    size_t used = __atomic_load_n(&bootstrap_used, __ATOMIC_RELAXED);
    do {
        start = (used + align - 1) & ~(align - 1);
        end = start + n;
        if (end > sizeof bootstrap_pool || end < start)
            return NULL;
    } while (!__atomic_compare_exchange_n(&bootstrap_used, &used, end, 0, __ATOMIC_RELAXED,
                                          __ATOMIC_RELAXED));
    return bootstrap_pool + start; /* static storage: already zero */
}

static inline int libc_ready(void)
{
    if (SHIM_LIKELY(libc.free != NULL))
        return 1;
    real_libc_resolve();
    return libc.free != NULL;
}

/* The address an exported hook returns to: whose allocation it is. */
#define CALLER __builtin_extract_return_addr(__builtin_return_address(0))

/* Large blocks only outside the shim's own work, once start-up has read the settings, and not
 * for the driver's own use (see called_from_driver). */
static inline int serve_large(size_t n, const void *caller)
{
    return n >= heap_track_min && !shim_busy && !called_from_driver(caller);
}

static void *large_alloc(size_t n, size_t align, int zero)
{
    shim_enter();
    void *p = heap_alloc(n, align, zero);
    shim_leave();
    return p;
}

static inline void *malloc_for(size_t n, const void *caller)
{
    if (SHIM_UNLIKELY(serve_large(n, caller)))
        return large_alloc(n, 16, 0);
    if (SHIM_UNLIKELY(!libc_ready()))
        return pool_alloc(n, 16);
    return libc.malloc(n);
}

SHIM_EXPORT void *malloc(size_t n)
{
    return malloc_for(n, CALLER);
}

static void free_from(void *p, const void *caller)
{
    if (SHIM_UNLIKELY(heap_may_own(p))) {
        if (!p || in_pool(p))
            return;
        if (SHIM_UNLIKELY(shim_busy)) {
            /* Inside the shim's own work on this thread: a signal handler that interrupted it,
             * or the driver freeing its own memory (which is the C library's). */
            if (!called_from_driver(caller) && heap_free_deferred(p))
                return;
        } else {
            shim_enter();
            int mine = heap_free(p);
            shim_leave();
            if (mine)
                return;
        }
    } else if (SHIM_UNLIKELY(in_pool(p))) {
        return;
    }
    if (SHIM_LIKELY(libc.free != NULL))
        libc.free(p);
}

SHIM_EXPORT void free(void *p)
{
    free_from(p, CALLER);
}

SHIM_EXPORT void *calloc(size_t nmemb, size_t size)
{
    size_t n;
    if (__builtin_mul_overflow(nmemb, size, &n)) {
        errno = ENOMEM;
        return NULL;
    }
    if (SHIM_UNLIKELY(serve_large(n, CALLER)))
        return large_alloc(n, 16, 1);
    if (SHIM_UNLIKELY(!libc_ready()))
        return pool_alloc(n, 16);
    return libc.calloc(nmemb, size);
}

static void *realloc_for(void *p, size_t n, const void *caller)
{
    if (!p)
        return malloc_for(n, caller);
    if (SHIM_UNLIKELY(in_pool(p))) {
        /* Bootstrap block: its size is unknown, but the pool is small; copy what can be. */
        void *q = malloc_for(n, caller);
        if (q) {
            size_t avail = (size_t)(bootstrap_pool + sizeof bootstrap_pool - (char *)p);
            memcpy(q, p, avail < n ? avail : n);
        }
        return q;
    }
    if (!libc_ready())
        return NULL;
    if (heap_may_own(p)) {
        if (n == 0) {
            /* glibc's realloc(p, 0) frees p and returns NULL. */
            free_from(p, caller);
            return NULL;
        }
        int handled;
        shim_enter();
        void *q = heap_realloc(p, n, &handled);
        shim_leave();
        if (handled)
            return q;
    }
    if (serve_large(n, caller)) {
        /* A small block growing into a large one moves to the shim's heap. */
        size_t old = libc.malloc_usable_size(p);
        void *q = large_alloc(n, 16, 0);
        if (!q)
            return NULL;
        memcpy(q, p, old < n ? old : n);
        libc.free(p);
        return q;
    }
    return libc.realloc(p, n);
}

SHIM_EXPORT void *realloc(void *p, size_t n)
{
    return realloc_for(p, n, CALLER);
}

SHIM_EXPORT void *reallocarray(void *p, size_t nmemb, size_t size)
{
    size_t n;
    if (__builtin_mul_overflow(nmemb, size, &n)) {
        errno = ENOMEM;
        return NULL;
    }
    return realloc_for(p, n, CALLER);
}

static int valid_alignment(size_t align)
{
    return align && (align & (align - 1)) == 0;
}

SHIM_EXPORT int posix_memalign(void **out, size_t align, size_t n)
{
    if (!valid_alignment(align) || align % sizeof(void *) != 0)
        return EINVAL;
    if (serve_large(n, CALLER)) {
        void *p = large_alloc(n, align, 0);
        if (!p)
            return ENOMEM;
        *out = p;
        return 0;
    }
    if (!libc_ready()) {
        void *p = pool_alloc(n, align);
        if (!p)
            return ENOMEM;
        *out = p;
        return 0;
    }
    return libc.posix_memalign(out, align, n);
}

SHIM_EXPORT void *aligned_alloc(size_t align, size_t n)
{
    if (!valid_alignment(align)) {
        errno = EINVAL;
        return NULL;
    }
    if (serve_large(n, CALLER))
        return large_alloc(n, align, 0);
    if (!libc_ready())
        return pool_alloc(n, align);
    return libc.aligned_alloc(align, n);
}

SHIM_EXPORT void *memalign(size_t align, size_t n)
{
    if (serve_large(n, CALLER) && valid_alignment(align))
        return large_alloc(n, align, 0);
    if (!libc_ready())
        return pool_alloc(n, valid_alignment(align) ? align : 16);
    return libc.memalign(align, n);
}

SHIM_EXPORT void *valloc(size_t n)
{
    if (serve_large(n, CALLER))
        return large_alloc(n, SHIM_PAGE_SIZE, 0);
    if (!libc_ready())
        return pool_alloc(n, SHIM_PAGE_SIZE);
    return libc.valloc(n);
}

SHIM_EXPORT void *pvalloc(size_t n)
{
    size_t rounded = page_up(n ? n : 1);
    if (rounded < n) {
        errno = ENOMEM;
        return NULL;
    }
    if (serve_large(rounded, CALLER))
        return large_alloc(rounded, SHIM_PAGE_SIZE, 0);
    if (!libc_ready())
        return pool_alloc(rounded, SHIM_PAGE_SIZE);
    return libc.pvalloc(n);
}

SHIM_EXPORT size_t malloc_usable_size(void *p)
{
    if (!p)
        return 0;
    if (in_pool(p))
        return 0;
    if (heap_may_own(p)) {
        shim_enter();
        size_t usable = heap_usable_size(p);
        shim_leave();
        if (usable != (size_t)-1)
            return usable;
    }
    return libc_ready() ? libc.malloc_usable_size(p) : 0;
}

/* The mmap family: registrations must be let go before memory leaves (contract rule 4). */

static void *map_tracked(void *addr, size_t len, int prot, int flags, int fd, off_t off, const void *caller)
{
    int track = !shim_busy && heap_track_min != SIZE_MAX;
    if (track && (flags & MAP_FIXED) && !(flags & MAP_FIXED_NOREPLACE)) {
        /* MAP_FIXED replaces whatever was there. */
        shim_enter();
        heap_before_unmap(addr, len, 1);
        shim_leave();
    }
    void *p = libc.mmap ? libc.mmap(addr, len, prot, flags, fd, off)
                        : (void *)syscall(SYS_mmap, addr, len, prot, flags, fd, off);
    if (track && p != MAP_FAILED && len >= heap_track_min && !called_from_driver(caller)) {
        shim_enter();
        heap_track_mapping(p, len, prot);
        shim_leave();
    }
    return p;
}

SHIM_EXPORT void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
    return map_tracked(addr, len, prot, flags, fd, off, CALLER);
}

/* The same call under its large-file name (the C library's alias where off_t has 64 bits):
 * Rust's memmap2 maps files through it, safetensors' checkpoints among them. */
_Static_assert(sizeof(off_t) == 8, "mmap64 is mmap where off_t has 64 bits");
SHIM_EXPORT void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
    return map_tracked(addr, len, prot, flags, fd, off, CALLER);
}

SHIM_EXPORT int munmap(void *addr, size_t len)
{
    if (!shim_busy && heap_track_min != SIZE_MAX) {
        shim_enter();
        heap_before_unmap(addr, len, 1);
        shim_leave();
    }
    return libc.munmap ? libc.munmap(addr, len) : (int)syscall(SYS_munmap, addr, len);
}

SHIM_EXPORT void *mremap(void *old, size_t old_len, size_t new_len, int flags, ...)
{
    void *new_addr = NULL;
    if (flags & MREMAP_FIXED) {
        va_list ap;
        va_start(ap, flags);
        new_addr = va_arg(ap, void *);
        va_end(ap);
    }
    int track = !shim_busy && heap_track_min != SIZE_MAX;
    int prot = PROT_READ | PROT_WRITE;
    if (track) {
        shim_enter();
        heap_before_unmap(old, old_len, 1);
        if (flags & MREMAP_FIXED)
            heap_before_unmap(new_addr, new_len, 1);
        shim_leave();
    }
    if (!libc.mremap)
        real_libc_resolve();
    void *p = libc.mremap(old, old_len, new_len, flags, new_addr);
    if (track && p != MAP_FAILED && !called_from_driver(CALLER)) {
        shim_enter();
        heap_track_mapping(p, new_len, prot);
        shim_leave();
    }
    return p;
}

static int advice_discards(int advice)
{
    switch (advice) {
    case MADV_DONTNEED:
    case MADV_FREE:
    case MADV_REMOVE:
#ifdef MADV_DONTNEED_LOCKED
    case MADV_DONTNEED_LOCKED:
#endif
        return 1;
    default:
        return 0;
    }
}

SHIM_EXPORT int madvise(void *addr, size_t len, int advice)
{
    if (advice_discards(advice) && !shim_busy && heap_track_min != SIZE_MAX) {
        /* Discarded pages come back as new pages: a registration would keep DMA on the old
         * ones.  Keep tracking the block, unregistered. */
        shim_enter();
        heap_before_unmap(addr, len, 0);
        shim_leave();
    }
    if (!libc.madvise)
        real_libc_resolve();
    return libc.madvise(addr, len, advice);
}

SHIM_EXPORT int mprotect(void *addr, size_t len, int prot)
{
    if (!libc.mprotect)
        real_libc_resolve();
    int r = libc.mprotect ? libc.mprotect(addr, len, prot) : (int)syscall(SYS_mprotect, addr, len, prot);
    if (r == 0 && !shim_busy && heap_track_min != SIZE_MAX) {
        /* A registration made for the old protections may no longer fit the pages. */
        int saved_errno = errno;
        shim_enter();
        heap_after_protect(addr, len, prot);
        shim_leave();
        errno = saved_errno;
    }
    return r;
}
