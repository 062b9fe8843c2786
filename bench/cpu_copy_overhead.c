/* cpu_copy_overhead: what the shim adds to one small synchronous copy.  CPU only: it runs against
 * bench/null_driver (BUILD/nulldrv/libcuda.so.1), whose copies return at once, so a copy's whole
 * time is the call itself plus, under LD_PRELOAD=libpinshim.so, the shim's work on it (the
 * lookup of the host memory, the clock, the statistics).
 *
 * Tests: copy_pageable_h2d (a malloc'ed buffer), copy_pinned_h2d and copy_pinned_d2h
 * (cuMemHostAlloc memory), each at --sizes (4K,64K); the median over --batches (41) of the ns per
 * copy of a batch of --copies (20000).  RESULT lines on stdout (bench=copy_overhead), a table on
 * stderr.  bench/run_malloc_bench.sh runs it plain and under the shim with the malloc benchmark.
 * It asserts nothing about timings. */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"

#define MAX_BATCHES 1001
#define MAX_SIZES 8

static double per_copy_ns(int h2d, void *host, size_t n, long copies)
{
    double t0 = bu_now();
    for (long i = 0; i < copies; i++) {
        CUresult r = h2d ? cuMemcpyHtoD((CUdeviceptr)0x100000, host, n)
                         : cuMemcpyDtoH(host, (CUdeviceptr)0x100000, n);
        if (r != CUDA_SUCCESS) {
            fprintf(stderr, "cpu_copy_overhead: copy failed (%d)\n", (int)r);
            exit(1);
        }
    }
    return (bu_now() - t0) * 1e9 / (double)copies;
}

static void run(const char *test, int h2d, void *host, size_t n, int batches, long copies)
{
    double ns[MAX_BATCHES];
    per_copy_ns(h2d, host, n, copies / 10 + 1);   /* warm-up */
    for (int b = 0; b < batches; b++)
        ns[b] = per_copy_ns(h2d, host, n, copies);
    double med = bu_median(ns, batches);
    fprintf(stderr, "%-18s %9zu %10.1f %10.1f %10.1f\n", test, n, med, bu_min(ns, batches),
            bu_max(ns, batches));
    printf("RESULT bench=copy_overhead test=%s size=%zu ns_median=%.2f ns_min=%.2f ns_max=%.2f "
           "batches=%d\n", test, n, med, bu_min(ns, batches), bu_max(ns, batches), batches);
}

int main(int argc, char **argv)
{
    int batches = 41;
    long copies = 20000;
    size_t sizes[MAX_SIZES] = { 4u << 10, 64u << 10 };
    int nsizes = 2;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) {
            batches = 5;
            copies = 2000;
        } else if (!strcmp(argv[i], "--batches") && i + 1 < argc) {
            batches = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--copies") && i + 1 < argc) {
            copies = atol(argv[++i]);
        } else if (!strcmp(argv[i], "--sizes") && i + 1 < argc) {
            char *list = argv[++i];
            nsizes = 0;
            for (char *tok = strtok(list, ","); tok && nsizes < MAX_SIZES; tok = strtok(NULL, ","))
                if (bu_parse_size(tok, &sizes[nsizes]) == 0 && sizes[nsizes] > 0)
                    nsizes++;
        } else {
            fprintf(stderr, "usage: cpu_copy_overhead [--batches N] [--copies N] [--sizes S,S..] [--quick]\n");
            return 2;
        }
    }
    if (batches < 1 || batches > MAX_BATCHES || copies < 1 || nsizes == 0) {
        fprintf(stderr, "cpu_copy_overhead: bad arguments\n");
        return 2;
    }
    if (!dlsym(RTLD_DEFAULT, "pinshim_null_driver")) {
        fprintf(stderr, "cpu_copy_overhead: libcuda.so.1 is not bench/null_driver (a real driver "
                        "came first in the search path): nothing measured\n");
        return 1;
    }
    if (cuInit(0) != CUDA_SUCCESS)
        return 1;
    fprintf(stderr, "%-18s %9s %10s %10s %10s\n", "test", "size (B)", "median ns", "min", "max");
    for (int s = 0; s < nsizes; s++) {
        size_t n = sizes[s];
        void *pageable = malloc(n), *pinned = NULL;
        if (!pageable || cuMemHostAlloc(&pinned, n, 0) != CUDA_SUCCESS)
            return 1;
        memset(pageable, 1, n);
        memset(pinned, 1, n);
        run("copy_pageable_h2d", 1, pageable, n, batches, copies);
        run("copy_pinned_h2d", 1, pinned, n, batches, copies);
        run("copy_pinned_d2h", 0, pinned, n, batches, copies);
        free(pageable);
        cuMemFreeHost(pinned);
    }
    return 0;
}
