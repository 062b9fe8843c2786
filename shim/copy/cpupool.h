/* The shim's CPU copy threads: one memory copy split into slices over a pool of threads, the
 * calling thread taking a share.  One thread's memcpy runs at about 10 GB/s on the hosts the
 * shim was measured on, a fifth of a PCIe Gen5 link, and faulting in never-touched pages is
 * slower still; both scale with threads.  Used by the staging pipeline (copies between pageable
 * memory and pinned staging buffers) and by bounce copies (the program's own large memcpy into
 * or out of pinned memory). */
#ifndef PINSHIM_COPY_CPUPOOL_H
#define PINSHIM_COPY_CPUPOOL_H

#include <stddef.h>

enum cpupool_flags {
    CPUPOOL_STREAM = 1,        /* non-temporal stores: the destination is not read by this CPU
                                * soon (a staging buffer the device reads, a large result) */
    CPUPOOL_FAULT_DST = 2,     /* the destination may be pages never touched: each thread
                                * faults in its slice in one call first (MADV_POPULATE_WRITE) */
    CPUPOOL_FAULT_SRC = 4,     /* the source may be file or shared pages not yet mapped here
                                * (MADV_POPULATE_READ) */
    CPUPOOL_TRY = 8,           /* give up (return 0, nothing copied) rather than queue behind
                                * other jobs */
    CPUPOOL_FLUSH_SRC = 16,    /* once copied, push the source's lines out of every CPU cache
                                * (see cpupool_flushes) */
};

/* Copy `rows` rows of `width` bytes, rows `spitch` / `dpitch` apart.  Returns 1 when copied, 0
 * only with CPUPOOL_TRY when the pool is busy.  The threads start on first use, unless
 * cpupool_start started them before. */
int cpupool_copy(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows,
                 unsigned flags);

/* The same, posted to the threads and waited for later: a pipeline posts its next piece's copy
 * before it waits for the current one, so that the threads go on from one piece to the next
 * while the pipeline's caller issues the finished piece's DMA, and a piece's slowest slice does
 * not leave the others idle.  CPUPOOL_TRY does not apply.  Every posted copy must be waited for
 * (cpupool_wait), by the thread that posted it, before its memory is reused or returned. */
struct cpupool_pending {
    void *slot;
};
void cpupool_copy_post(struct cpupool_pending *h, void *dst, size_t dpitch, const void *src,
                       size_t spitch, size_t width, size_t rows, unsigned flags);
void cpupool_wait(struct cpupool_pending *h);

/* The same, without threads (memcpy, or streaming stores): for slices of the caller's own. */
void cpupool_copy_here(void *dst, const void *src, size_t n, unsigned flags);

/* Set the n bytes at dst to c, split over the threads as a copy is (CPUPOOL_FAULT_DST, CPUPOOL_TRY
 * apply).  Returns 1 when done, 0 only with CPUPOOL_TRY when the pool is busy. */
int cpupool_set(void *dst, int c, size_t n, unsigned flags);

/* 1 when CPUPOOL_FLUSH_SRC flushes on this CPU (x86-64: CLFLUSHOPT, else CLFLUSH), 0 when it
 * does nothing.  Why flush: once a block is registered, the copy engine reads it over PCIe, and
 * on the H200's host a line left in one of many cores' caches by the copy threads is read
 * slower than one in memory (copies of 2-32 MiB ran at 65-85% of pinned speed until a D2H copy
 * or a flush cleared the lines; bench/gpu_block_layout.cu). */
int cpupool_flushes(void);

/* Push every line of [p, p+n) (mapped and readable) out of the CPU caches, over the threads
 * when they are started and idle, else on the calling thread; nothing where cpupool_flushes()
 * is 0.  For a block just registered: the copy engine then reads it from memory. */
void cpupool_flush(const void *p, size_t n);

/* Fault in the pages of [p, p+n) for writing, over the threads, each taking whole huge pages
 * (2 MiB): where transparent huge pages back the range, threads that share one wait while one
 * of them clears it, which slices of a few hundred KiB (a copy's) make them do.  For a copy's
 * never-touched destination, while the DMAs that will fill the staging buffers run.  Does
 * nothing when the first page is resident or the kernel cannot populate (before Linux 5.14).
 * Returns the bytes it faulted in (0: nothing done). */
size_t cpupool_prefault(void *p, size_t n);

/* Start the threads now (once; later calls return at once).  Creating them takes about a
 * millisecond: staging's builder does it off the first copy's path. */
void cpupool_start(void);

/* Threads the pool runs besides the caller (0 before the first copy). */
int cpupool_workers(void);

/* Jobs posted and not yet waited for, over every thread (0 whenever no copy is under way). */
int cpupool_jobs_open(void);

/* Ask the pool to place its threads on the CPUs nearest this device (a PCI bus id as the driver
 * gives it, e.g. "0000:0a:00.0"), before its first copy; ignored after. */
void cpupool_prefer_device(const char *pci_bus_id);

/* Stop the threads (exit), or forget them (a fork child, where they do not exist). */
void cpupool_shutdown(void);

#endif
