/* The copy threads on their own, no driver: many callers at once (more than the pool has job
 * slots, so that some copy alone), copies of every shape (one row, rows with pitches, sizes that
 * split into one slice or many), each flag, never-touched destinations; every byte checked, and
 * the bytes around each destination left alone.  Then the pool stopped and started again, and
 * cpupool_prefault checked on never-touched ranges. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "base/config.h"
#include "base/os.h"
#include "base/real.h"
#include "base/shim.h"
#include "copy/cpupool.h"
#include "testutil.h"

#define K 1024ul
#define M (1024ul * 1024ul)
#define CALLERS 24                /* above the pool's 16 job slots */
#define GUARD 256                 /* bytes checked on each side of a destination */

static const char *no_env(const char *name) { return NULL; }

/* Copies per caller, and the largest row: fewer and smaller under a sanitizer or valgrind, whose
 * checks of every byte copied and compared would take minutes. */
static int rounds = 60;
static size_t max_width = 3 * M;

static void scale_to_checker(void)
{
    int checked = 0;
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
    checked = 1;
#endif
    const char *preload = getenv("LD_PRELOAD");   /* valgrind preloads its own vgpreload_*.so */
    if (preload && strstr(preload, "vgpreload"))
        checked = 1;
    if (checked) {
        rounds = 6;
        max_width = 256 * K;
    }
}

struct caller {
    unsigned seed;
    unsigned long copies, refused, bad;
    char what[160];               /* the first bad copy */
};

static unsigned next_rand(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return *s >> 8;
}

static unsigned char pattern(unsigned seed, size_t i)
{
    return (unsigned char)(seed * 131u + i * 7u + (i >> 12));
}

/* One copy of a random shape; 1 when every byte is where it belongs. */
static int one_copy(struct caller *c)
{
    unsigned r = next_rand(&c->seed);
    int two_d = r & 1;
    size_t width = two_d ? 1 + next_rand(&c->seed) % (96 * K) : 1 + next_rand(&c->seed) % max_width;
    size_t rows = two_d ? 1 + next_rand(&c->seed) % 40 : 1;
    size_t spitch = width + (two_d ? next_rand(&c->seed) % 300 : 0);
    size_t dpitch = width + (two_d ? next_rand(&c->seed) % 300 : 0);
    size_t soff = next_rand(&c->seed) % 64, doff = next_rand(&c->seed) % 64;
    unsigned flags = 0;
    if (r & 2)
        flags |= CPUPOOL_STREAM;
    if (r & 4)
        flags |= CPUPOOL_FAULT_SRC;
    if (((r >> 3) & 3) == 3)
        flags |= CPUPOOL_TRY;   /* a quarter of the calls */
    if (r & 64)
        flags |= CPUPOOL_FLUSH_SRC;
    size_t slen = soff + (rows - 1) * spitch + width;
    size_t dlen = GUARD + doff + (rows - 1) * dpitch + width + GUARD;
    unsigned char *src = malloc(slen);
    /* Half the destinations never touched before the copy (a fresh mapping), as a fresh result. */
    int fresh = (r & 128) != 0;
    unsigned char *dst = fresh ? mmap(NULL, dlen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
                               : malloc(dlen);
    if (!src || !dst || dst == MAP_FAILED) {
        snprintf(c->what, sizeof c->what, "out of memory");
        return 0;
    }
    if (fresh)
        flags |= CPUPOOL_FAULT_DST;
    unsigned seed = next_rand(&c->seed);
    for (size_t i = 0; i < slen; i++)
        src[i] = pattern(seed, i);
    if (!fresh)
        memset(dst, 0xA5, dlen);
    unsigned char fill = fresh ? 0 : 0xA5;
    unsigned char *d0 = dst + GUARD + doff;
    int ok = 1;
    if (!cpupool_copy(d0, dpitch, src + soff, spitch, width, rows, flags)) {
        if (!(flags & CPUPOOL_TRY)) {
            snprintf(c->what, sizeof c->what, "refused without CPUPOOL_TRY");
            ok = 0;
        }
        c->refused++;
        /* Refused: nothing may have been written. */
        for (size_t i = 0; i < dlen && ok; i++)
            if (dst[i] != fill) {
                snprintf(c->what, sizeof c->what, "a refused copy wrote byte %zu", i);
                ok = 0;
            }
        goto out;
    }
    c->copies++;
    /* Every byte: the rows copied, the gaps between rows and the guards untouched. */
    for (size_t i = 0; i < dlen && ok; i++) {
        unsigned char want = fill;
        if (i >= GUARD + doff) {
            size_t rel = i - GUARD - doff, row = rel / dpitch, col = rel % dpitch;
            if (row < rows && col < width)
                want = pattern(seed, soff + row * spitch + col);
        }
        if (dst[i] != want) {
            snprintf(c->what, sizeof c->what,
                     "byte %zu of a copy of %zu rows x %zu (pitches %zu/%zu, flags %u): %u, not %u", i,
                     rows, width, spitch, dpitch, flags, dst[i], want);
            ok = 0;
        }
    }
out:
    free(src);
    if (fresh)
        munmap(dst, dlen);
    else
        free(dst);
    return ok;
}

static void *caller_main(void *arg)
{
    struct caller *c = arg;
    for (int i = 0; i < rounds; i++)
        if (!one_copy(c))
            c->bad++;
    return NULL;
}

static void run_callers(const char *label)
{
    static struct caller c[CALLERS];
    pthread_t t[CALLERS];
    for (int i = 0; i < CALLERS; i++) {
        memset(&c[i], 0, sizeof c[i]);
        c[i].seed = 7919u * (unsigned)(i + 1);
        if (pthread_create(&t[i], NULL, caller_main, &c[i]) != 0) {
            printf("FAIL pthread_create\n");
            exit(1);
        }
    }
    unsigned long copies = 0, refused = 0, bad = 0;
    const char *what = NULL;
    for (int i = 0; i < CALLERS; i++) {
        pthread_join(t[i], NULL);
        copies += c[i].copies;
        refused += c[i].refused;
        bad += c[i].bad;
        if (c[i].bad && !what)
            what = c[i].what;
    }
    CHECKF(bad == 0, "%s: %d callers at once, %lu copies and %lu refused (CPUPOOL_TRY), every byte "
                     "right%s%s", label, CALLERS, copies, refused, what ? ": " : "", what ? what : "");
    CHECKF(copies + refused == (unsigned long)CALLERS * rounds, "%s: every call answered (%lu of %lu)",
           label, copies + refused, (unsigned long)CALLERS * rounds);
}

/* cpupool_prefault: a never-touched range is resident afterwards, all of it and nothing beyond
 * it (ranges that start and end inside pages and inside huge pages, backed by huge pages or
 * not); a range whose first page is resident is left as it is; what a range holds is unchanged. */
static void check_prefault(void)
{
    const size_t len = 24 * M;
    for (int huge = 0; huge < 2; huge++) {
        for (int shape = 0; shape < 3; shape++) {
            /* Room for a range that starts 2 MiB + 5 KiB + 17 bytes in, with a page spare on each
             * side that must stay untouched. */
            unsigned char *map = mmap(NULL, len + 8 * M, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            CHECKF(map != MAP_FAILED, "mmap");
            if (map == MAP_FAILED)
                return;
            unsigned char *base = (unsigned char *)(((uintptr_t)map + 2 * M - 1) & ~(uintptr_t)(2 * M - 1));
            if (huge)
                madvise(base, len + 4 * M, MADV_HUGEPAGE);
            size_t off = shape == 0 ? 4 * K : shape == 1 ? 2 * M + 5 * K + 17 : 9 * K + 1;
            size_t n = shape == 0 ? len : shape == 1 ? len - 3 * M - 100 : 5 * M + 3;
            unsigned char *p = base + off;
            uintptr_t first = page_down((uintptr_t)p), last = page_up((uintptr_t)p + n);
            size_t got = cpupool_prefault(p, n);
            size_t resident = os_resident_bytes(first, last - first);
            CHECKF(got == last - first && resident == last - first,
                   "prefault (huge=%d shape=%d) of %zu bytes: returned %zu, %zu of %zu resident", huge, shape, n, got,
                   resident, (size_t)(last - first));
            if (!huge) {
                /* Pages of 4 KiB: the pages either side stay untouched. */
                CHECKF(os_resident_bytes(first - 4 * K, 4 * K) == 0 && os_resident_bytes(last, 4 * K) == 0,
                       "prefault (shape=%d) touched a page beyond the range", shape);
            }
            size_t zeros = 0;
            for (size_t i = 0; i < n; i += 4 * K)
                zeros += p[i] == 0;
            CHECKF(zeros == (n + 4 * K - 1) / (4 * K), "prefaulted pages read as zero");
            /* Written, then prefaulted again: resident, so nothing is done and nothing changes. */
            for (size_t i = 0; i < n; i++)
                p[i] = pattern(7, i);
            CHECKF(cpupool_prefault(p, n) == 0, "a resident range is left alone");
            size_t bad = 0;
            for (size_t i = 0; i < n; i++)
                bad += p[i] != pattern(7, i);
            CHECKF(bad == 0, "prefault changed %zu bytes", bad);
            munmap(map, len + 8 * M);
        }
    }
    CHECKF(cpupool_prefault(NULL, 0) == 0, "an empty range");
}

/* cpupool_flush: the bytes stay as they were, nothing beyond the range's pages is touched
 * (inaccessible pages either side), with the threads or without them. */
static void check_flush(const char *label)
{
    const size_t room = 8 * M;
    unsigned char *map = mmap(NULL, room + 8 * K, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECKF(map != MAP_FAILED, "mmap");
    if (map == MAP_FAILED)
        return;
    mprotect(map, 4 * K, PROT_NONE);
    mprotect(map + 4 * K + room, 4 * K, PROT_NONE);
    unsigned char *area = map + 4 * K;
    const struct { size_t off, n; } cases[] = {
        { 0, 0 }, { 0, 1 }, { 63, 2 }, { 17, 4 * K - 17 }, { 0, room }, { 5 * K + 3, 5 * M + 3 }, { room - 65, 65 },
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        unsigned char *p = area + cases[c].off;
        size_t n = cases[c].n;
        for (size_t i = 0; i < n; i++)
            p[i] = pattern((unsigned)c + 11, i);
        cpupool_flush(p, n);
        size_t bad = 0;
        for (size_t i = 0; i < n; i++)
            bad += p[i] != pattern((unsigned)c + 11, i);
        CHECKF(bad == 0, "%s: flush of %zu bytes at +%zu changed %zu bytes", label, n, cases[c].off, bad);
    }
    munmap(map, room + 8 * K);
}

int main(void)
{
    config_load(no_env);
    real_libc_resolve();
    scale_to_checker();
    shim_cfg.copy_threads = 8;   /* as many as the machine has, at most 8 */
    run_callers("first pool");
    CHECKF(cpupool_workers() >= 1 || sysconf(_SC_NPROCESSORS_ONLN) < 2,
           "the pool started workers (%d)", cpupool_workers());
    cpupool_shutdown();
    CHECKF(cpupool_workers() == 0, "no workers once stopped (%d)", cpupool_workers());
    check_flush("no threads");
    CHECKF(cpupool_workers() == 0, "a flush starts no threads (%d)", cpupool_workers());
    run_callers("pool started again");
    check_flush("with the threads");
    check_prefault();
    cpupool_shutdown();
    return TEST_SUMMARY();
}
