/* The copy path's clock.  A copy is timed twice (start, end); through the vDSO each read costs
 * 20-40 ns on a virtual machine, a visible share of a 4 KiB copy's overhead.  Where the CPU has an
 * invariant TSC the copy path reads it instead (a few ns) and converts ticks to nanoseconds with a
 * rate measured against CLOCK_MONOTONIC over at least CAL_SPAN_NS. */
#include "base/shim.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <x86intrin.h>
#endif

#define CAL_SPAN_NS 10000000ull   /* 10 ms: read skew of ~100 ns gives a rate error of 1e-5 */

int shim_tsc_ok;
static uint64_t base_ticks, base_ns;
static double ns_per_tick;   /* 0 until measured over CAL_SPAN_NS */

/* Decide once, before any copy can be timed. */
__attribute__((constructor(101))) static void clock_setup(void)
{
#if defined(__x86_64__)
    unsigned a, b, c, d;
    /* CPUID 0x80000007 EDX bit 8: the TSC runs at a constant rate in every P-, C- and T-state. */
    if (__get_cpuid(0x80000000, &a, &b, &c, &d) && a >= 0x80000007 &&
        __get_cpuid(0x80000007, &a, &b, &c, &d) && (d & (1u << 8))) {
        base_ns = shim_now_ns();
        base_ticks = __rdtsc();
        shim_tsc_ok = 1;
    }
#endif
}

uint64_t shim_ticks_to_ns(uint64_t ticks)
{
    if (!shim_tsc_ok)
        return ticks;
    double rate;
    __atomic_load(&ns_per_tick, &rate, __ATOMIC_RELAXED);
    if (rate == 0) {
        uint64_t ns = shim_now_ns(), t = __rdtsc();
        if (t <= base_ticks || ns <= base_ns)
            return 0;
        rate = (double)(ns - base_ns) / (double)(t - base_ticks);
        if (ns - base_ns >= CAL_SPAN_NS)   /* any thread's measurement is as good as another's */
            __atomic_store(&ns_per_tick, &rate, __ATOMIC_RELAXED);
    }
    return (uint64_t)((double)ticks * rate);
}
