/* Things every shim module shares: the recursion guard, the clock, visibility. */
#ifndef PINSHIM_SHIM_H
#define PINSHIM_SHIM_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include <time.h>

#define SHIM_EXPORT __attribute__((visibility("default")))
#define SHIM_LIKELY(x) __builtin_expect(!!(x), 1)
#define SHIM_UNLIKELY(x) __builtin_expect(!!(x), 0)

/* Non-zero while this thread runs the shim's own code: the allocation hooks then go straight
 * to the real allocator and the driver doors straight to the driver, so the shim never sees
 * its own work (initial-exec TLS: no allocation on first access, safe inside malloc). */
extern __thread int shim_busy;

static inline void shim_enter(void) { shim_busy++; }
static inline void shim_leave(void) { shim_busy--; }

/* Set on the threads the shim starts (registrar, copy threads, staging builder): the program
 * may close or reuse a descriptor between their check of it and their write, so their trace
 * lines wait for one of the program's threads (stats/trace.c). */
extern __thread int shim_own_thread;

/* Set in a forked child: it must not call into the driver (contract rule 8). */
extern volatile int shim_forked_child;

static inline uint64_t shim_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The copy path's cheap clock (clock.c): CPU ticks where the TSC is invariant, else
 * nanoseconds.  Differences of ticks become nanoseconds through shim_ticks_to_ns(). */
extern int shim_tsc_ok;
uint64_t shim_ticks_to_ns(uint64_t ticks);
#if defined(__x86_64__)
#include <x86intrin.h>
static inline uint64_t shim_ticks(void) { return shim_tsc_ok ? __rdtsc() : shim_now_ns(); }
#else
static inline uint64_t shim_ticks(void) { return shim_now_ns(); }
#endif
/* Nanoseconds since `t0` (a shim_ticks() value); 0 if the clock went backwards (another CPU). */
static inline uint64_t shim_ns_since(uint64_t t0)
{
    uint64_t t = shim_ticks();
    return t > t0 ? shim_ticks_to_ns(t - t0) : 0;
}

#define SHIM_PAGE_SIZE 4096ul
#define SHIM_HUGE_PAGE (2ul << 20)   /* a transparent huge page on x86-64 */
static inline uintptr_t page_down(uintptr_t a) { return a & ~(SHIM_PAGE_SIZE - 1); }
static inline uintptr_t page_up(uintptr_t a) { return (a + SHIM_PAGE_SIZE - 1) & ~(SHIM_PAGE_SIZE - 1); }

/* Start-up and shut-down, in init.c: settings, logger, exit report. */
void shim_init(void);

#endif
