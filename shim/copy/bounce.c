/* Bounce copies (see bounce.h).
 *
 * A call is shared among the copy threads only where doing so cannot change what the program
 * sees:
 *   - not inside the shim's own work on this thread (a signal handler that interrupted it, or
 *     the shim's own copies), nor in a fork child (no threads may start there), nor while the
 *     threads are busy with other copies (the call would wait behind them);
 *   - the two ranges do not overlap (memmove's order would matter);
 *   - both lie in memory the shim knows is mapped with the protection the copy needs (a block
 *     of its heap, a mapping of the program's it tracks, memory the program pinned), so that a
 *     copy that would fault faults in the calling thread, by the C library, as without the shim;
 *   - PINSHIM_BOUNCE=pinned: one side is driver-pinned (the program's pinned memory or a block
 *     the shim registered); all: any such pair.
 * A memset is shared on the same terms, its destination driver-pinned or, since a framework
 * clears its result arrays before it copies into them, a heap block that carries transfers. */
#define _GNU_SOURCE
#include <stdint.h>
#include <sys/mman.h>
#include "base/config.h"
#include "base/libc_string.h"
#include "base/shim.h"
#include "copy/bounce.h"
#include "copy/cpupool.h"
#include "mem/registry.h"
#include "stats/stats.h"
#include "stats/trace.h"

size_t bounce_threshold = SIZE_MAX;

void bounce_init(void)
{
    size_t t = SIZE_MAX;
    /* Mode full only, like staging: observe changes nothing (an A/B against it must see the C
     * library's copies), pin only registers. */
    if (shim_cfg.mode == MODE_FULL && shim_cfg.bounce != BOUNCE_OFF)
        t = (size_t)shim_cfg.bounce_min;
    __atomic_store_n(&bounce_threshold, t, __ATOMIC_RELEASE);
}

static int overlap(uintptr_t a, uintptr_t b, size_t n)
{
    return a < b ? b - a < n : a - b < n;
}

/* NULL when the threads copied it; else why not (for the trace). */
static const char *share(void *dst, const void *src, size_t n)
{
    uintptr_t d = (uintptr_t)dst, s = (uintptr_t)src;
    if (shim_busy || shim_forked_child)
        return shim_busy ? "inside_shim" : "fork_child";
    if (overlap(d, s, n))
        return "overlap";
    shim_enter();
    const char *why = NULL;
    int src_pinned = 0, dst_pinned = 0;
    if (!registry_copyable(s, n, PROT_READ, &src_pinned) || !registry_copyable(d, n, PROT_WRITE, &dst_pinned)) {
        why = "not_known";
    } else if (shim_cfg.bounce != BOUNCE_ALL && !src_pinned && !dst_pinned) {
        why = "not_pinned";
    } else {
        /* A result array filled here is kept resident when freed, for the next one. */
        if (!dst_pinned)
            registry_note_filled(d, n);
        /* A never-touched destination (a fresh result array) is faulted in by the threads. */
        unsigned flags = CPUPOOL_TRY | CPUPOOL_FAULT_DST | CPUPOOL_FAULT_SRC |
                         (shim_cfg.streaming_stores ? CPUPOOL_STREAM : 0);
        uint64_t t0 = shim_ticks();
        if (cpupool_copy(dst, n, src, n, n, 1, flags)) {
            stats_add(STAT_BOUNCE_COPIES, 1);
            stats_add(STAT_BOUNCE_BYTES, n);
            stats_add(STAT_BOUNCE_NS, shim_ns_since(t0));
            stats_add(dst_pinned ? STAT_BOUNCE_TO_PINNED : STAT_BOUNCE_FROM_PINNED, 1);
        } else {
            why = "threads_busy";
        }
    }
    shim_leave();
    return why;
}

/* NULL when the threads set it; else why not. */
static const char *share_set(void *dst, int c, size_t n)
{
    uintptr_t d = (uintptr_t)dst;
    if (shim_busy || shim_forked_child)
        return shim_busy ? "inside_shim" : "fork_child";
    shim_enter();
    const char *why = NULL;
    int pinned = 0;
    if (!registry_copyable(d, n, PROT_WRITE, &pinned)) {
        why = "not_known";
    } else if (shim_cfg.bounce != BOUNCE_ALL && !pinned && !registry_transfer_block(d, n)) {
        why = "not_pinned";
    } else {
        unsigned flags = CPUPOOL_TRY | CPUPOOL_FAULT_DST;
        uint64_t t0 = shim_ticks();
        if (cpupool_set(dst, c, n, flags)) {
            stats_add(STAT_BOUNCE_SETS, 1);
            stats_add(STAT_BOUNCE_SET_BYTES, n);
            stats_add(STAT_BOUNCE_SET_NS, shim_ns_since(t0));
        } else {
            why = "threads_busy";
        }
    }
    shim_leave();
    return why;
}

static void trace_copy(const char *call, uint64_t t0, void *dst, const void *src, size_t n, const char *why)
{
    trace_event(shim_ns_since(t0), call, "dst=%p src=%p bytes=%zu shared=%d%s%s", dst, src, n, why == NULL,
                why ? " why=" : "", why ? why : "");
}

void *bounce_memcpy(void *dst, const void *src, size_t n)
{
    uint64_t t0 = trace_on() ? shim_ticks() : 0;
    const char *why = share(dst, src, n);
    if (why)
        shim_next_memcpy(dst, src, n);
    if (t0)
        trace_copy("memcpy", t0, dst, src, n, why);
    return dst;
}

void *bounce_memmove(void *dst, const void *src, size_t n)
{
    uint64_t t0 = trace_on() ? shim_ticks() : 0;
    const char *why = share(dst, src, n);
    if (why)
        shim_next_memmove(dst, src, n);
    if (t0)
        trace_copy("memmove", t0, dst, src, n, why);
    return dst;
}

void *bounce_memset(void *dst, int c, size_t n)
{
    uint64_t t0 = trace_on() ? shim_ticks() : 0;
    const char *why = share_set(dst, c, n);
    if (why)
        shim_next_memset(dst, c, n);
    if (t0)
        trace_event(shim_ns_since(t0), "memset", "dst=%p bytes=%zu shared=%d%s%s", dst, n, why == NULL,
                    why ? " why=" : "", why ? why : "");
    return dst;
}
