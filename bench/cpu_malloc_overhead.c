/* cpu_malloc_overhead: what the shim's allocation hooks add to malloc/free.  CPU only.
 *
 * Measures, as the median over repeated batches (clock_gettime around each batch):
 *   pair         ns per malloc(size)+free() pair of small blocks, size 16..1024 B
 *   malloc_large ns per malloc() of a large block that is never copied (so the shim never
 *                promotes it) and
 *   free_large   ns per free() of such a block.  The default sizes are 32 KiB (below the
 *                shim's default PINSHIM_MIN_SIZE of 64 KiB: an untracked large pointer, whose
 *                free() only costs the shim a lookup), 256 KiB and 4 MiB (tracked blocks).
 * Large blocks come from the heap, not from mmap (M_MMAP_THRESHOLD is raised), so that the
 * figure is the allocator plus the hooks and not the kernel's munmap.
 *
 * The readable table goes to stderr, RESULT lines to stdout.
 * Run it plain and under LD_PRELOAD=libpinshim.so (bench/run_malloc_bench.sh does both and
 * prints the difference).  It asserts nothing about timings.
 *   --batches N (21)  --pairs N (200000)  --large SIZE[,SIZE...] (32K,256K,4M)  --blocks N (32)
 *   --quick           few iterations (CI smoke run)
 *   --no-mallopt      leave glibc's mmap threshold alone */
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"

#define MAX_BATCHES 1001
#define MAX_BLOCKS 4096
#define MAX_LARGE 16

static void *volatile sink; /* stores through it keep malloc/free pairs from being optimized out */

static void report(const char *test, size_t size, double *ns, int n)
{
    double med = bu_median(ns, n);
    fprintf(stderr, "%-13s %9zu %12.1f %12.1f %12.1f\n", test, size, med, bu_min(ns, n), bu_max(ns, n));
    printf("RESULT bench=malloc_overhead test=%s size=%zu ns_median=%.2f ns_min=%.2f ns_max=%.2f "
           "batches=%d\n",
           test, size, med, bu_min(ns, n), bu_max(ns, n), n);
}

static void usage(void)
{
    fprintf(stderr, "usage: cpu_malloc_overhead [--batches N] [--pairs N] [--large SIZE[,SIZE..]]\n"
                    "                           [--blocks N] [--quick] [--no-mallopt]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    int batches = 21, blocks = 32, use_mallopt = 1;
    long pairs = 200000;
    size_t large[MAX_LARGE] = { 32u << 10, 256u << 10, 4u << 20 };
    int nlarge = 3;

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) {
            batches = 5;
            pairs = 20000;
            blocks = 8;
        } else if (!strcmp(argv[i], "--no-mallopt")) {
            use_mallopt = 0;
        } else if (!strcmp(argv[i], "--batches") && i + 1 < argc) {
            batches = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--pairs") && i + 1 < argc) {
            pairs = atol(argv[++i]);
        } else if (!strcmp(argv[i], "--blocks") && i + 1 < argc) {
            blocks = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--large") && i + 1 < argc) {
            char buf[256];
            snprintf(buf, sizeof buf, "%s", argv[++i]);
            nlarge = 0;
            for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok != NULL;
                 tok = strtok_r(NULL, ",", &save)) {
                if (nlarge == MAX_LARGE || bu_parse_size(tok, &large[nlarge]) || large[nlarge] == 0)
                    usage();
                nlarge++;
            }
        } else {
            usage();
        }
    }
    if (batches < 1 || batches > MAX_BATCHES || pairs < 1 || blocks < 1 || blocks > MAX_BLOCKS)
        usage();

    if (use_mallopt) {
        mallopt(M_MMAP_THRESHOLD, 512 << 20);
        mallopt(M_TRIM_THRESHOLD, 1 << 30);
    }

    static double ns[MAX_BATCHES];
    static void *blk[MAX_BLOCKS];
    static const size_t small_sizes[] = { 16, 32, 64, 128, 256, 512, 1024 };

    fprintf(stderr, "%-13s %9s %12s %12s %12s\n", "test", "size", "median_ns", "min_ns", "max_ns");

    for (size_t k = 0; k < sizeof small_sizes / sizeof small_sizes[0]; k++) {
        size_t sz = small_sizes[k];
        for (long i = 0; i < pairs / 10; i++) { /* warm-up */
            void *p = malloc(sz);
            sink = p;
            free(p);
        }
        for (int b = 0; b < batches; b++) {
            double t0 = bu_now();
            for (long i = 0; i < pairs; i++) {
                void *p = malloc(sz);
                sink = p;
                free(p);
            }
            ns[b] = (bu_now() - t0) * 1e9 / (double)pairs;
        }
        report("pair", sz, ns, batches);
    }

    for (int k = 0; k < nlarge; k++) {
        size_t sz = large[k];
        static double ns_free[MAX_BATCHES];
        for (int b = -1; b < batches; b++) { /* b == -1: warm-up */
            double t0 = bu_now();
            for (int i = 0; i < blocks; i++) {
                blk[i] = malloc(sz);
                if (blk[i] == NULL) {
                    fprintf(stderr, "cpu_malloc_overhead: out of memory\n");
                    return 1;
                }
            }
            double t1 = bu_now();
            for (int i = 0; i < blocks; i++) /* touch one byte per block */
                ((volatile char *)blk[i])[0] = (char)i;
            double t2 = bu_now();
            for (int i = 0; i < blocks; i++)
                free(blk[i]);
            double t3 = bu_now();
            if (b >= 0) {
                ns[b] = (t1 - t0) * 1e9 / blocks;
                ns_free[b] = (t3 - t2) * 1e9 / blocks;
            }
        }
        report("malloc_large", sz, ns, batches);
        report("free_large", sz, ns_free, batches);
    }
    return 0;
}
