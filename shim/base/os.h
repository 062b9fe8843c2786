/* The one path to the kernel for the shim's own pages.  Every call is the system call itself:
 * the library exports mmap (and mmap64), munmap, mremap and madvise as hooks, so a call through
 * libc's names from inside the library would reach its own hooks (and be tracked as the
 * program's). */
#ifndef PINSHIM_BASE_OS_H
#define PINSHIM_BASE_OS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/types.h>

/* Fault in a range in one call (Linux 5.14); older headers lack the names, older kernels answer
 * EINVAL. */
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

/* Private, zero-filled, read-write pages; NULL on failure (errno set). */
void *os_map(size_t len);
/* len bytes whose start is a multiple of align (a power of two, at least a page); NULL on
 * failure.  Tried first at `hint` (aligned, or 0 for none), so that a caller that asks for the
 * place right below its last mapping gets one mapping that grows, not many; else maps
 * len + align and trims the ends. */
void *os_map_aligned(size_t len, size_t align, uintptr_t hint);
/* A shared mapping of fd (the node budget's segment); NULL on failure. */
void *os_map_shared(size_t len, int fd);
int os_unmap(void *p, size_t len);
int os_madvise(void *p, size_t len, int advice);
int os_mprotect(void *p, size_t len, int prot);
/* Fault in [p, p+len) (advice MADV_POPULATE_READ or _WRITE) a piece of OS_POPULATE_PIECE bytes
 * per call: the kernel holds the process's mapping lock for the whole of one call, so that any
 * thread's mmap, munmap or mprotect (a thread's stack, the program's malloc) waited for all 48 MiB
 * of the staging buffers (130 ms on a slow host); between pieces it gets in.  0, or -1 with
 * errno (EINVAL: a kernel before 5.14). */
#define OS_POPULATE_PIECE (2ul << 20)
int os_populate(void *p, size_t len, int advice);
/* 1 when every page of [p, p+n) is mapped (any protection). */
int os_range_mapped(uintptr_t p, size_t n);
/* Bytes of [p, p+n) whose pages are resident (mincore); n when the kernel cannot tell. */
size_t os_resident_bytes(uintptr_t p, size_t n);
/* All of [p, p+len) to fd, retrying interrupted and short writes; 0, or the errno that stopped
 * it (EIO for a write that took nothing).  errno is left as it was. */
int os_write_all(int fd, const void *p, size_t len);

#endif
