/* cpu_memcpy_overhead: the cost of one small memcpy/memmove/memset, to see what an interposed
 * memcpy adds to the calls every program makes by the million.  CPU only.
 *
 * The compiler turns a memcpy of a small constant size into a few moves, which no library can
 * interpose; so each call here is a real call into whatever memcpy the dynamic linker bound:
 *   memcpy_ptr / memmove_ptr / memset_ptr     a constant --size (64) through a volatile
 *                                             function pointer
 *   memcpy_call / memmove_call / memset_call  a direct call whose size the compiler cannot see
 *                                             (read from a volatile variable)
 * The median over --batches (21) of the ns per call of --calls (2000000) calls.  RESULT lines
 * on stdout (bench=memcpy_overhead, read by bench/run_malloc_bench.sh like the other CPU
 * benchmarks), a table on stderr.  It asserts nothing about timings. */
/* A fortified build would call __memcpy_chk, which the C library resolves internally. */
#undef _FORTIFY_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"

#define MAX_BATCHES 1001

typedef void *(*copy_fn)(void *, const void *, size_t);

static copy_fn volatile memcpy_ptr = memcpy;
static copy_fn volatile memmove_ptr = memmove;
static void *(*volatile memset_ptr)(void *, int, size_t) = memset;
static volatile size_t hidden_size;

static unsigned char src_buf[4096] __attribute__((aligned(64)));
static unsigned char dst_buf[4096] __attribute__((aligned(64)));

enum variant { VIA_MEMCPY_PTR, VIA_MEMMOVE_PTR, VIA_MEMCPY_CALL, VIA_MEMMOVE_CALL, VIA_MEMSET_PTR, VIA_MEMSET_CALL };

static double per_call_ns(enum variant v, size_t n, long calls)
{
    double t0 = bu_now();
    switch (v) {
    case VIA_MEMCPY_PTR:
        for (long i = 0; i < calls; i++)
            memcpy_ptr(dst_buf, src_buf, n);
        break;
    case VIA_MEMMOVE_PTR:
        for (long i = 0; i < calls; i++)
            memmove_ptr(dst_buf, src_buf, n);
        break;
    case VIA_MEMCPY_CALL:
        for (long i = 0; i < calls; i++)
            memcpy(dst_buf, src_buf, hidden_size);
        break;
    case VIA_MEMMOVE_CALL:
        for (long i = 0; i < calls; i++)
            memmove(dst_buf, src_buf, hidden_size);
        break;
    case VIA_MEMSET_PTR:
        for (long i = 0; i < calls; i++)
            memset_ptr(dst_buf, 0x5a, n);
        break;
    case VIA_MEMSET_CALL:
        for (long i = 0; i < calls; i++)
            memset(dst_buf, 0x5a, hidden_size);
        break;
    }
    return (bu_now() - t0) * 1e9 / (double)calls;
}

static void run(const char *test, enum variant v, size_t n, int batches, long calls)
{
    double ns[MAX_BATCHES];
    hidden_size = n;
    per_call_ns(v, n, calls / 10 + 1); /* warm-up */
    for (int b = 0; b < batches; b++)
        ns[b] = per_call_ns(v, n, calls);
    int set = v == VIA_MEMSET_PTR || v == VIA_MEMSET_CALL, bad = 0;
    for (size_t i = 0; i < n; i++)
        bad |= dst_buf[i] != (set ? 0x5a : src_buf[i]);
    if (bad) {
        fprintf(stderr, "cpu_memcpy_overhead: %s wrote the wrong bytes\n", test);
        exit(1);
    }
    double lo = bu_min(ns, batches), hi = bu_max(ns, batches), med = bu_median(ns, batches);
    fprintf(stderr, "%-14s %6zu %10.2f %10.2f %10.2f\n", test, n, med, lo, hi);
    printf("RESULT bench=memcpy_overhead test=%s size=%zu ns_median=%.3f ns_min=%.3f ns_max=%.3f "
           "batches=%d\n", test, n, med, lo, hi, batches);
}

int main(int argc, char **argv)
{
    int batches = 21;
    long calls = 2000000;
    size_t size = 64;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) {
            batches = 5;
            calls = 200000;
        } else if (!strcmp(argv[i], "--batches") && i + 1 < argc) {
            batches = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--calls") && i + 1 < argc) {
            calls = atol(argv[++i]);
        } else if (!strcmp(argv[i], "--size") && i + 1 < argc) {
            if (bu_parse_size(argv[++i], &size))
                size = 0;
        } else {
            fprintf(stderr, "usage: cpu_memcpy_overhead [--batches N] [--calls N] [--size N] [--quick]\n");
            return 2;
        }
    }
    if (batches < 1 || batches > MAX_BATCHES || calls < 1 || size == 0 || size > sizeof src_buf) {
        fprintf(stderr, "cpu_memcpy_overhead: bad arguments\n");
        return 2;
    }
    for (size_t i = 0; i < sizeof src_buf; i++)
        src_buf[i] = (unsigned char)(i * 7 + 1);
    fprintf(stderr, "%-14s %6s %10s %10s %10s\n", "test", "size", "median ns", "min", "max");
    run("memcpy_ptr", VIA_MEMCPY_PTR, size, batches, calls);
    run("memmove_ptr", VIA_MEMMOVE_PTR, size, batches, calls);
    run("memcpy_call", VIA_MEMCPY_CALL, size, batches, calls);
    run("memmove_call", VIA_MEMMOVE_CALL, size, batches, calls);
    run("memset_ptr", VIA_MEMSET_PTR, size, batches, calls);
    run("memset_call", VIA_MEMSET_CALL, size, batches, calls);
    return 0;
}
