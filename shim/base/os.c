/* Raw pages (see os.h). */
#define _GNU_SOURCE
#include <errno.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "base/os.h"
#include "base/shim.h"

static void *raw_mmap(void *addr, size_t len, int prot, int flags, int fd)
{
    long r = syscall(SYS_mmap, addr, len, prot, flags, fd, (off_t)0);
    return (void *)r == MAP_FAILED ? NULL : (void *)r;
}

void *os_map(size_t len)
{
    return raw_mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1);
}

void *os_map_aligned(size_t len, size_t align, uintptr_t hint)
{
    if (align <= SHIM_PAGE_SIZE)
        return os_map(len);
    if (hint && !(hint & (align - 1))) {
        /* Without MAP_FIXED the kernel takes the hint only where nothing is mapped. */
        char *p = raw_mmap((void *)hint, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1);
        if (p && (uintptr_t)p == hint)
            return p;
        if (p)
            os_unmap(p, len);
    }
    if (len > SIZE_MAX - align) {
        errno = ENOMEM;
        return NULL;
    }
    char *p = raw_mmap(NULL, len + align, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1);
    if (!p)
        return NULL;
    uintptr_t start = ((uintptr_t)p + align - 1) & ~(uintptr_t)(align - 1);
    size_t head = start - (uintptr_t)p, tail = align - head;
    if (head)
        os_unmap(p, head);
    if (tail)
        os_unmap((char *)start + len, tail);
    return (void *)start;
}

void *os_map_shared(size_t len, int fd)
{
    return raw_mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd);
}

int os_unmap(void *p, size_t len)
{
    return (int)syscall(SYS_munmap, p, len);
}

int os_madvise(void *p, size_t len, int advice)
{
    return (int)syscall(SYS_madvise, p, len, advice);
}

int os_populate(void *p, size_t len, int advice)
{
    uintptr_t a = page_down((uintptr_t)p), end = page_up((uintptr_t)p + len);
    while (a < end) {
        /* Pieces end on piece boundaries, so that a huge page is faulted by one call. */
        uintptr_t next = (a & ~(uintptr_t)(OS_POPULATE_PIECE - 1)) + OS_POPULATE_PIECE;
        if (next > end)
            next = end;
        if (syscall(SYS_madvise, (void *)a, next - a, advice) != 0)
            return -1;
        a = next;
    }
    return 0;
}

int os_mprotect(void *p, size_t len, int prot)
{
    return (int)syscall(SYS_mprotect, p, len, prot);
}

int os_range_mapped(uintptr_t p, size_t n)
{
    if (!n)
        return 1;
    uintptr_t start = page_down(p), end = page_up(p + n);
    if (end <= start)
        return 0;
    /* msync walks the mappings, not the pages; MS_ASYNC writes nothing back. ENOMEM: a hole. */
    return syscall(SYS_msync, (void *)start, end - start, MS_ASYNC) == 0 || errno != ENOMEM;
}

size_t os_resident_bytes(uintptr_t p, size_t n)
{
    unsigned char vec[4096];
    uintptr_t start = page_down(p), end = page_up(p + n);
    size_t resident = 0;
    for (uintptr_t a = start; a < end; a += sizeof vec * SHIM_PAGE_SIZE) {
        size_t len = end - a < sizeof vec * SHIM_PAGE_SIZE ? end - a : sizeof vec * SHIM_PAGE_SIZE;
        if (syscall(SYS_mincore, (void *)a, len, vec) != 0)
            return n;
        for (size_t i = 0; i < len / SHIM_PAGE_SIZE; i++)
            resident += (vec[i] & 1) * SHIM_PAGE_SIZE;
    }
    return resident < n ? resident : n;
}

int os_write_all(int fd, const void *p, size_t len)
{
    int saved_errno = errno, err = 0;
    const char *c = p;
    while (len) {
        ssize_t n = write(fd, c, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            err = n < 0 ? errno : EIO;
            break;
        }
        c += n;
        len -= (size_t)n;
    }
    errno = saved_errno;
    return err;
}
