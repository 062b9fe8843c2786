/* cpu_heap: what the shim's allocation hooks do to programs that never copy to a GPU.  CPU only.
 *
 * Tests (each prints RESULT lines on stdout, bench=heap; a readable table on stderr):
 *   churn        one live block at a time per thread: malloc(size), write one byte in every page,
 *                free; ns per pair and page faults per pair
 *   working_set  --live blocks (256) per thread, each pair frees a random one and mallocs and
 *                touches its replacement (the working set is capped at --ws-bytes, 32M, per thread)
 *   many_blocks  one thread mallocs --blocks (140000) blocks of --block-min..--block-max bytes
 *                (64 KiB..72 KiB), writes one byte in each and counts the lines of /proc/self/maps
 *                at the peak: allocators that map each block on its own run out of mappings
 *                (vm.max_map_count) long before that
 * churn and working_set run at every --sizes (64K..32M, powers of two, and 72K) and every
 * --threads (1,4,16, whatever the machine's core count: the figure is per thread).  A cell's
 * threads start together; ns_per_pair is the cell's wall time over the pairs each thread made, the
 * median over --batches (5); faults are the process's minor faults (getrusage) over the
 * batch, per pair.  Two untimed batches of --touch bytes (64M) worth of pairs per thread (at
 * least --min-pairs, 1) come first: one to warm the allocator up (its first mappings and page
 * faults, which would make a cell look slower than it runs and give it too few pairs), then at
 * least one (see run_cell) that sets the pairs of the timed ones: enough for --batch-ms (10 ms) each, at most
 * --max-pairs (100000) and --touch-max bytes (4G) per thread, so that short cells are not lost
 * in the timer's and the scheduler's noise and long ones stay short; a cell whose batches
 * would take more than --cell-ms (250 ms) in all makes fewer of them, 3 at least.
 *
 * Run plain and under LD_PRELOAD=libpinshim.so (bench/run_malloc_bench.sh does both; bench/
 * summarize.py compares them).  It asserts nothing about timings.
 *   --quick  fewer pairs and blocks (CI smoke run)
 *   --tests churn,working_set,many_blocks */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "bench_util.h"

#define MAX_SIZES 32
#define MAX_THREAD_COUNTS 8
#define MAX_BATCHES 101

struct opts {
    size_t sizes[MAX_SIZES];
    int nsizes;
    int threads[MAX_THREAD_COUNTS];
    int nthreads;
    int batches, min_pairs, max_pairs, live;
    double batch_ms, cell_ms;
    size_t touch, touch_max, ws_bytes, block_min, block_max;
    long blocks;
    int churn, working_set, many_blocks;
};

static struct opts o;
static size_t page_size;

struct cell {
    size_t size;
    int live;        /* 0: churn (one block at a time) */
    long pairs;      /* per thread per batch */
    int stop;        /* set by the main thread before the last start barrier */
    int threads;
    pthread_barrier_t start, done;
};

struct worker {
    pthread_t tid;
    struct cell *c;
    uint64_t rng;
    int failed;
    double t_start, t_end; /* this batch's, read by the main thread after the done barrier */
};

static long minor_faults(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_minflt;
}

static uint64_t next_rand(uint64_t *s)
{
    uint64_t x = *s; /* xorshift64 */
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *s = x;
    return x;
}

/* Writes one byte in every page of the block, and its last byte: what a program filling it
 * would fault in, at a fraction of the cost of filling it. */
static void touch(char *p, size_t n)
{
    volatile char *v = p;
    for (size_t off = 0; off < n; off += page_size)
        v[off] = (char)off;
    v[n - 1] = 1;
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct cell *c = w->c;
    void **slot = NULL;
    if (c->live > 0) {
        slot = calloc((size_t)c->live, sizeof *slot);
        for (int i = 0; slot != NULL && i < c->live; i++) {
            slot[i] = malloc(c->size);
            if (slot[i] == NULL) {
                w->failed = 1;
                break;
            }
            touch(slot[i], c->size);
        }
        if (slot == NULL)
            w->failed = 1;
    }
    for (;;) { /* a calibrating batch, then the timed ones, until the main thread says stop */
        pthread_barrier_wait(&c->start);
        if (c->stop)
            break;
        w->t_start = bu_now();
        for (long i = 0; i < c->pairs && !w->failed; i++) {
            if (c->live == 0) {
                char *p = malloc(c->size);
                if (p == NULL) {
                    w->failed = 1;
                    break;
                }
                touch(p, c->size);
                free(p);
            } else {
                int k = (int)(next_rand(&w->rng) % (uint64_t)c->live);
                free(slot[k]);
                slot[k] = malloc(c->size);
                if (slot[k] == NULL) {
                    w->failed = 1;
                    break;
                }
                touch(slot[k], c->size);
            }
        }
        w->t_end = bu_now();
        pthread_barrier_wait(&c->done);
    }
    if (slot != NULL) {
        for (int i = 0; i < c->live; i++)
            free(slot[i]);
        free(slot);
    }
    return NULL;
}

static int run_cell(const char *test, size_t size, int threads, int live)
{
    struct cell c;
    memset(&c, 0, sizeof c);
    c.size = size;
    c.threads = threads;
    c.live = live;
    c.pairs = (long)(o.touch / size);
    if (c.pairs < o.min_pairs)
        c.pairs = o.min_pairs;
    if (c.pairs > o.max_pairs)
        c.pairs = o.max_pairs;
    pthread_barrier_init(&c.start, NULL, (unsigned)threads + 1);
    pthread_barrier_init(&c.done, NULL, (unsigned)threads + 1);
    struct worker *w = calloc((size_t)threads, sizeof *w);
    if (w == NULL)
        return 1;
    double cell_t0 = bu_now();
    for (int t = 0; t < threads; t++) {
        w[t].c = &c;
        w[t].rng = 0x9E3779B97F4A7C15ull * (uint64_t)(t + 1) + size;
        if (pthread_create(&w[t].tid, NULL, worker_main, &w[t]) != 0) {
            fprintf(stderr, "cpu_heap: pthread_create failed\n");
            exit(1);
        }
    }
    double ns[MAX_BATCHES], faults[MAX_BATCHES];
    int batches = o.batches;
    /* Batch -2 warms the cell up (the allocator's first mappings and faults), batch -1, warm,
     * sets the pairs of the timed ones.  An allocator may still be changing its ways in the first
     * batch -1 (the C library moves its mmap threshold up as blocks are freed, then faults its
     * heap in): pairs set from that slow run can be a hundredth of what the cell needs, and the
     * timed batches would then be too short to time.  So batch -1 runs at least twice, and again
     * (CALIBRATIONS in all, at most) while the pairs it set run in under half of --batch-ms. */
    enum { CALIBRATIONS = 4 };
    int calibrations = 0;
    for (int b = -2; b < batches; b++) {
        /* The workers wait at a barrier whenever this thread reads the fault count.  The cell's
         * time is the workers' own, from the first start to the last end: this thread may be
         * scheduled out when the start barrier opens. */
        long f0 = minor_faults();
        pthread_barrier_wait(&c.start);
        pthread_barrier_wait(&c.done);
        long f1 = minor_faults();
        double t0 = w[0].t_start, t1 = w[0].t_end;
        for (int t = 1; t < threads; t++) {
            t0 = w[t].t_start < t0 ? w[t].t_start : t0;
            t1 = w[t].t_end > t1 ? w[t].t_end : t1;
        }
        if (b == -2)
            continue;
        if (b == -1) {
            /* The workers read c.pairs only after the next start barrier. */
            double want = o.batch_ms * 1e-3, took = t1 - t0;
            long cap = (long)(o.touch_max / size);
            long next = c.pairs;
            if (took < want) {
                double more = took > 0 ? want / took : 1e6;
                next = more * (double)c.pairs > (double)o.max_pairs ? o.max_pairs : (long)(more * (double)c.pairs + 1);
            }
            if (next > cap)
                next = cap > o.min_pairs ? cap : o.min_pairs;
            double batch_s = took * (double)next / (double)c.pairs;
            calibrations++;
            int again = calibrations < CALIBRATIONS && (calibrations == 1 || (took < want / 2 && next > c.pairs));
            c.pairs = next;
            if (again) {
                b--;
                continue;
            }
            /* Long cells (faulting in large blocks on many threads) make fewer batches, 3 at
             * least. */
            if (batch_s * batches > o.cell_ms * 1e-3) {
                int fit = (int)(o.cell_ms * 1e-3 / (batch_s > 0 ? batch_s : 1));
                batches = fit < 3 ? 3 : fit;
            }
            continue;
        }
        ns[b] = (t1 - t0) * 1e9 / (double)c.pairs;
        faults[b] = (double)(f1 - f0) / ((double)c.pairs * threads);
    }
    c.stop = 1;
    pthread_barrier_wait(&c.start);
    int failed = 0;
    for (int t = 0; t < threads; t++) {
        pthread_join(w[t].tid, NULL);
        failed |= w[t].failed;
    }
    free(w);
    pthread_barrier_destroy(&c.start);
    pthread_barrier_destroy(&c.done);
    double lo = bu_min(ns, batches), hi = bu_max(ns, batches);
    double med = bu_median(ns, batches);
    double fmed = bu_median(faults, batches);
    fprintf(stderr, "%-12s %9zu %7d %5d %7ld %12.0f %12.0f %10.2f %7.2f%s\n", test, size, threads,
            live, c.pairs, med, lo, fmed, bu_now() - cell_t0, failed ? "  (malloc failed)" : "");
    printf("RESULT bench=heap test=%s size=%zu threads=%d live=%d pairs=%ld batches=%d "
           "ns_per_pair=%.1f ns_min=%.1f ns_max=%.1f faults_per_pair=%.3f ok=%d\n",
           test, size, threads, live, c.pairs, batches, med, lo, hi, fmed, !failed);
    fflush(stdout);
    return failed;
}

static long count_mappings(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    if (f == NULL)
        return -1;
    long n = 0;
    int ch;
    while ((ch = getc(f)) != EOF)
        n += ch == '\n';
    fclose(f);
    return n;
}

static int many_blocks(void)
{
    void **blk = malloc((size_t)o.blocks * sizeof *blk);
    if (blk == NULL)
        return 1;
    uint64_t rng = 12345;
    size_t span = o.block_max - o.block_min;
    long before = count_mappings();
    long made = 0;
    size_t bytes = 0;
    double t0 = bu_now();
    for (; made < o.blocks; made++) {
        size_t n = o.block_min + (span ? (size_t)(next_rand(&rng) % (span + 1)) : 0);
        blk[made] = malloc(n);
        if (blk[made] == NULL)
            break;
        ((volatile char *)blk[made])[0] = 1;
        bytes += n;
    }
    double t1 = bu_now();
    long peak = count_mappings();
    for (long i = 0; i < made; i++)
        free(blk[i]);
    double t2 = bu_now();
    long after = count_mappings();
    free(blk);
    int ok = made == o.blocks;
    double per_malloc = made ? (t1 - t0) * 1e9 / (double)made : 0.0;
    double per_free = made ? (t2 - t1) * 1e9 / (double)made : 0.0;
    fprintf(stderr, "many_blocks: %ld of %ld blocks (%.2f GiB) of %zu..%zu bytes; mappings %ld before, "
                    "%ld at the peak (+%ld), %ld after the frees; %.0f ns per malloc, %.0f ns per free%s\n",
            made, o.blocks, (double)bytes / (1 << 30), o.block_min, o.block_max, before, peak,
            peak - before, after, per_malloc, per_free, ok ? "" : "  (malloc FAILED)");
    printf("RESULT bench=heap test=many_blocks blocks=%ld made=%ld size_min=%zu size_max=%zu "
           "bytes=%zu maps_before=%ld maps_peak=%ld maps_added=%ld maps_after=%ld "
           "ns_per_malloc=%.1f ns_per_free=%.1f ok=%d\n",
           o.blocks, made, o.block_min, o.block_max, bytes, before, peak, peak - before, after,
           per_malloc, per_free, ok);
    return !ok;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: cpu_heap [--sizes S,S..] [--threads N,N..] [--batches N] [--batch-ms MS]\n"
            "                [--cell-ms MS]\n"
            "                [--touch SIZE] [--touch-max SIZE] [--min-pairs N] [--max-pairs N]\n"
            "                [--live N] [--ws-bytes SIZE]\n"
            "                [--blocks N] [--block-min SIZE] [--block-max SIZE]\n"
            "                [--tests churn,working_set,many_blocks] [--quick]\n");
    exit(2);
}

static size_t need_size(const char *s)
{
    size_t v;
    if (bu_parse_size(s, &v) || v == 0)
        usage();
    return v;
}

int main(int argc, char **argv)
{
    static const size_t default_sizes[] = { 64u << 10, 72u << 10, 128u << 10, 256u << 10,
                                            512u << 10, 1u << 20, 2u << 20, 4u << 20,
                                            8u << 20, 16u << 20, 32u << 20 };
    o.nsizes = (int)(sizeof default_sizes / sizeof default_sizes[0]);
    memcpy(o.sizes, default_sizes, sizeof default_sizes);
    o.threads[0] = 1;
    o.threads[1] = 4;
    o.threads[2] = 16;
    o.nthreads = 3;
    o.batches = 5;
    o.min_pairs = 1;
    o.max_pairs = 100000;
    o.batch_ms = 10.0;
    o.cell_ms = 250.0;
    o.live = 256;
    o.touch = 64u << 20;
    o.touch_max = 4ul << 30;
    o.ws_bytes = 32u << 20;
    o.blocks = 140000;
    o.block_min = 64u << 10;
    o.block_max = 72u << 10;
    o.churn = o.working_set = o.many_blocks = 1;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--quick")) {
            o.touch = 8u << 20;
            o.touch_max = 64u << 20;
            o.ws_bytes = 8u << 20;
            o.min_pairs = 1;
            o.batches = 3;
            o.batch_ms = 2.0;
            o.cell_ms = 50.0;
            o.blocks = 20000;
            continue;
        }
        if (i + 1 >= argc)
            usage();
        const char *v = argv[++i];
        if (!strcmp(a, "--sizes") || !strcmp(a, "--threads") || !strcmp(a, "--tests")) {
            char buf[512];
            snprintf(buf, sizeof buf, "%s", v);
            if (!strcmp(a, "--sizes"))
                o.nsizes = 0;
            else if (!strcmp(a, "--threads"))
                o.nthreads = 0;
            else
                o.churn = o.working_set = o.many_blocks = 0;
            for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok != NULL;
                 tok = strtok_r(NULL, ",", &save)) {
                if (!strcmp(a, "--sizes")) {
                    if (o.nsizes == MAX_SIZES)
                        usage();
                    o.sizes[o.nsizes++] = need_size(tok);
                } else if (!strcmp(a, "--threads")) {
                    if (o.nthreads == MAX_THREAD_COUNTS || atoi(tok) < 1 || atoi(tok) > 1024)
                        usage();
                    o.threads[o.nthreads++] = atoi(tok);
                } else if (!strcmp(tok, "churn")) {
                    o.churn = 1;
                } else if (!strcmp(tok, "working_set")) {
                    o.working_set = 1;
                } else if (!strcmp(tok, "many_blocks")) {
                    o.many_blocks = 1;
                } else {
                    usage();
                }
            }
        } else if (!strcmp(a, "--batches")) {
            o.batches = atoi(v);
        } else if (!strcmp(a, "--touch")) {
            o.touch = need_size(v);
        } else if (!strcmp(a, "--touch-max")) {
            o.touch_max = need_size(v);
        } else if (!strcmp(a, "--batch-ms")) {
            o.batch_ms = atof(v);
        } else if (!strcmp(a, "--cell-ms")) {
            o.cell_ms = atof(v);
        } else if (!strcmp(a, "--min-pairs")) {
            o.min_pairs = atoi(v);
        } else if (!strcmp(a, "--max-pairs")) {
            o.max_pairs = atoi(v);
        } else if (!strcmp(a, "--live")) {
            o.live = atoi(v);
        } else if (!strcmp(a, "--ws-bytes")) {
            o.ws_bytes = need_size(v);
        } else if (!strcmp(a, "--blocks")) {
            o.blocks = atol(v);
        } else if (!strcmp(a, "--block-min")) {
            o.block_min = need_size(v);
        } else if (!strcmp(a, "--block-max")) {
            o.block_max = need_size(v);
        } else {
            usage();
        }
    }
    if (o.batches < 1 || o.batches > MAX_BATCHES || o.min_pairs < 1 || o.max_pairs < o.min_pairs ||
        o.live < 1 || o.blocks < 1 || o.batch_ms < 0 || o.touch_max == 0 || o.block_max < o.block_min || o.nsizes == 0 || o.nthreads == 0)
        usage();
    page_size = (size_t)sysconf(_SC_PAGESIZE);

    int failed = 0;
    fprintf(stderr, "%-12s %9s %7s %5s %7s %12s %12s %10s %7s\n", "test", "size", "threads", "live",
            "pairs", "ns/pair", "min ns", "faults/pair", "cell s");
    for (int pass = 0; pass < 2; pass++) {
        if ((pass == 0 && !o.churn) || (pass == 1 && !o.working_set))
            continue;
        for (int t = 0; t < o.nthreads; t++) {
            for (int s = 0; s < o.nsizes; s++) {
                int live = 0;
                if (pass == 1) {
                    /* The working set stays within --ws-bytes per thread, at least two blocks. */
                    size_t cap = o.ws_bytes / o.sizes[s];
                    live = o.live;
                    if ((size_t)live > cap)
                        live = cap < 2 ? 2 : (int)cap;
                }
                failed |= run_cell(pass == 0 ? "churn" : "working_set", o.sizes[s], o.threads[t], live);
            }
        }
    }
    if (o.many_blocks)
        failed |= many_blocks();
    return failed;
}
