/* The event trace (PINSHIM_TRACE): one line per thing the shim did that takes time worth
 * placing on a timeline, so that a slow transfer can be taken apart without a profiler:
 * copies of 1 MiB and more (their path), large memcpy/memmove calls (shared or why not), the
 * heap's own mappings of large blocks, the shim's registrations and the program's own pinning
 * calls.  Off (one predictable branch) unless the setting names a file.
 *
 * A line: `<end s> <duration us> <pid> <tid> <event> key=value ...`, end times on the
 * process's monotonic clock, written whole by one write(2) (lines of threads and processes
 * sharing the file do not interleave). */
#ifndef PINSHIM_STATS_TRACE_H
#define PINSHIM_STATS_TRACE_H

#include <stdint.h>
#include "base/shim.h"

extern int trace_fd;   /* -1: off */

static inline int trace_on(void)
{
    return SHIM_UNLIKELY(__atomic_load_n(&trace_fd, __ATOMIC_RELAXED) >= 0);
}

/* Opens the file PINSHIM_TRACE names (%p, %r expanded), through symbolic links and into FIFOs
 * or devices as they are; warns once if it cannot. */
void trace_open(void);
/* An event that took `dur_ns` and ends now; `fmt` gives its fields. */
/* On the shim's own threads the line is queued, and written by the program's next traced
 * call on one of its threads, or by trace_flush. */
void trace_event(uint64_t dur_ns, const char *event, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Write the lines the shim's own threads queued (on a program's thread: at exit). */
void trace_flush(void);

#endif
