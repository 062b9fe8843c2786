/* The staging pipeline against the checking fake driver (run with LD_LIBRARY_PATH=build/fakecuda):
 * odd sizes, unaligned host pointers, 2D with pitches, round trips byte for byte, the budget,
 * declining for invalid device ranges and tiny budgets, ordering after a blocking stream, two
 * threads at once.
 *
 * `test_staging --bench [MiB]` instead times staged and plain pageable copies (for a real GPU:
 * 16 MiB chunks, 3 buffers, 8 copy threads, budget 64M). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cuda.h>
#include "base/config.h"
#include "mem/registry.h"
#include "base/real.h"
#include "base/shim.h"
#include "copy/cpupool.h"
#include "copy/staging.h"
#include "stats/stats.h"
#include "testutil.h"


#define K 1024ul
#define M (1024ul * 1024ul)

/* The driver, by exact symbol names (cuda.h's macros would rename them). */
static struct {
    CUresult (*init)(unsigned);
    CUresult (*device_get)(CUdevice *, int);
    CUresult (*primary_retain)(CUcontext *, CUdevice);
    CUresult (*ctx_set)(CUcontext);
    CUresult (*mem_alloc)(CUdeviceptr *, size_t);
    CUresult (*mem_free)(CUdeviceptr);
    CUresult (*htod)(CUdeviceptr, const void *, size_t);
    CUresult (*dtoh)(void *, CUdeviceptr, size_t);
    CUresult (*stream_create)(CUstream *, unsigned);
    CUresult (*stream_destroy)(CUstream);
    CUresult (*ctx_sync)(void);
    CUresult (*launch_host_func)(CUstream, CUhostFn, void *);
    /* the fake's test API; NULL on a real driver */
    unsigned long (*violations)(void);
    size_t (*fake_registered)(void);
    CUresult (*launch_write)(CUstream, CUdeviceptr, int, size_t, unsigned);
    CUresult (*launch_write_ptsz)(CUstream, CUdeviceptr, int, size_t, unsigned);
    void (*fail_copies_after)(unsigned, CUresult);
} d;

static CUcontext ctx;

static void *must_sym(void *h, const char *name)
{
    void *f = dlsym(h, name);
    if (!f) {
        printf("FAIL the driver lacks %s\n", name);
        exit(1);
    }
    return f;
}

#define MUST(call)                                                                         \
    do {                                                                                   \
        CUresult r_ = (call);                                                              \
        if (r_ != CUDA_SUCCESS) {                                                          \
            printf("FAIL %s returned %d at %s:%d\n", #call, (int)r_, __FILE__, __LINE__);  \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

static void open_driver(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        printf("FAIL dlopen libcuda.so.1: %s\n", dlerror());
        exit(1);
    }
    real_libc_resolve();
    if (!real_driver_resolve(h)) {
        printf("FAIL real_driver_resolve\n");
        exit(1);
    }
    *(void **)&d.init = must_sym(h, "cuInit");
    *(void **)&d.device_get = must_sym(h, "cuDeviceGet");
    *(void **)&d.primary_retain = must_sym(h, "cuDevicePrimaryCtxRetain");
    *(void **)&d.ctx_set = must_sym(h, "cuCtxSetCurrent");
    *(void **)&d.mem_alloc = must_sym(h, "cuMemAlloc_v2");
    *(void **)&d.mem_free = must_sym(h, "cuMemFree_v2");
    *(void **)&d.htod = must_sym(h, "cuMemcpyHtoD_v2");
    *(void **)&d.dtoh = must_sym(h, "cuMemcpyDtoH_v2");
    *(void **)&d.stream_create = must_sym(h, "cuStreamCreate");
    *(void **)&d.stream_destroy = must_sym(h, "cuStreamDestroy_v2");
    *(void **)&d.ctx_sync = must_sym(h, "cuCtxSynchronize");
    *(void **)&d.violations = dlsym(h, "fakecuda_violations");
    *(void **)&d.fake_registered = dlsym(h, "fakecuda_registered_bytes");
    *(void **)&d.launch_write = dlsym(h, "fakecuda_launch_write");
    *(void **)&d.launch_write_ptsz = dlsym(h, "fakecuda_launch_write_ptsz");
    *(void **)&d.fail_copies_after = dlsym(h, "fakecuda_fail_copies_after");
    *(void **)&d.launch_host_func = dlsym(h, "cuLaunchHostFunc");
    CUdevice dev;
    MUST(d.init(0));
    MUST(d.device_get(&dev, 0));
    MUST(d.primary_retain(&ctx, dev));
    MUST(d.ctx_set(ctx));
}

static const char *no_env(const char *name) { (void)name; return NULL; }

static void settings(uint64_t chunk, uint64_t nbuf, uint64_t threads, uint64_t budget)
{
    shim_cfg.mode = MODE_FULL;
    shim_cfg.budget = budget;
    shim_cfg.min_size = 4096;
    shim_cfg.staging_min = 0;
    shim_cfg.staging_chunk = chunk;
    shim_cfg.staging_buffers = nbuf;
    shim_cfg.copy_threads = threads;
    shim_cfg.nvtx = false;
}

static void fill(unsigned char *p, size_t n, unsigned seed)
{
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        p[i] = (unsigned char)(x >> 24);
    }
}

/* Whether stage() asks for the host side's lines to be flushed once copied. */
static int stage_flush;

static int stage(enum copy_dir dir, void *host, size_t host_pitch, CUdeviceptr dev,
                 size_t dev_pitch, size_t width, size_t height, CUstream s,
                 enum hook_flavour fl, CUresult *r)
{
    struct stage_req req = { dir, host, host_pitch, dev, dev_pitch, width, height, s, fl, stage_flush };
    *r = (CUresult)-1;
    return staging_copy(&req, r);
}

/* 1D round trip of n bytes: staged H2D from host+hoff to dev+doff, checked with the driver's
 * own D2H, then staged D2H into a second buffer at another offset. */
static void round_trip_1d(CUdeviceptr dbuf, size_t n, size_t hoff, size_t doff, const char *what)
{
    unsigned char *src = malloc(n + 64), *chk = malloc(n + 64), *back = malloc(n + 64);
    fill(src, n + 64, (unsigned)n);
    CUresult r;
    int staged = stage(DIR_H2D, src + hoff, 0, dbuf + doff, 0, n, 1, NULL, LEGACY, &r);
    CHECKF(staged && r == CUDA_SUCCESS, "%s: staged H2D of %zu bytes (host+%zu, dev+%zu)", what,
           n, hoff, doff);
    MUST(d.dtoh(chk, dbuf + doff, n));
    CHECKF(!memcmp(chk, src + hoff, n), "%s: device holds the source after staged H2D", what);
    memset(back, 0xA5, n + 64);
    size_t boff = (hoff + 5) % 13;
    staged = stage(DIR_D2H, back + boff, 0, dbuf + doff, 0, n, 1, NULL, LEGACY, &r);
    CHECKF(staged && r == CUDA_SUCCESS, "%s: staged D2H of %zu bytes", what, n);
    CHECKF(!memcmp(back + boff, src + hoff, n), "%s: staged D2H brings the bytes back", what);
    CHECKF(boff == 0 || back[boff - 1] == 0xA5, "%s: nothing written before", what);
    CHECKF(back[boff + n] == 0xA5, "%s: nothing written past the end", what);
    free(src);
    free(chk);
    free(back);
}

/* 2D: rows of `width` bytes, host rows hpitch apart, device rows dpitch apart.  The device gaps
 * between rows must keep their old bytes. */
static void round_trip_2d(CUdeviceptr dbuf, size_t dsize, size_t width, size_t height,
                          size_t hpitch, size_t dpitch, const char *what)
{
    size_t hsize = (height - 1) * hpitch + width, dext = (height - 1) * dpitch + width;
    unsigned char *src = malloc(hsize + 1), *dev_before = malloc(dsize), *dev_after = malloc(dsize);
    unsigned char *back = malloc(hsize + 1);
    fill(src, hsize + 1, (unsigned)(width * 7 + height));
    fill(dev_before, dsize, 99);
    MUST(d.htod(dbuf, dev_before, dsize));
    CUresult r;
    int staged = stage(DIR_H2D, src + 1, hpitch, dbuf, dpitch, width, height, NULL, LEGACY, &r);
    CHECKF(staged && r == CUDA_SUCCESS, "%s: staged 2D H2D %zux%zu (pitches %zu/%zu)", what,
           width, height, hpitch, dpitch);
    MUST(d.dtoh(dev_after, dbuf, dsize));
    int rows_ok = 1, gaps_ok = 1;
    for (size_t y = 0; y < height; y++) {
        if (memcmp(dev_after + y * dpitch, src + 1 + y * hpitch, width))
            rows_ok = 0;
        size_t gap_end = y + 1 < height ? (y + 1) * dpitch : dsize;
        if (memcmp(dev_after + y * dpitch + width, dev_before + y * dpitch + width,
                   gap_end - y * dpitch - width))
            gaps_ok = 0;
    }
    CHECKF(rows_ok, "%s: device rows hold the source rows", what);
    CHECKF(gaps_ok && dext <= dsize, "%s: device bytes between rows untouched", what);
    memset(back, 0x3C, hsize + 1);
    staged = stage(DIR_D2H, back, hpitch, dbuf, dpitch, width, height, NULL, LEGACY, &r);
    CHECKF(staged && r == CUDA_SUCCESS, "%s: staged 2D D2H", what);
    rows_ok = 1;
    gaps_ok = 1;
    for (size_t y = 0; y < height; y++) {
        if (memcmp(back + y * hpitch, src + 1 + y * hpitch, width))
            rows_ok = 0;
        for (size_t x = width; y + 1 < height && x < hpitch; x++)
            if (back[y * hpitch + x] != 0x3C)
                gaps_ok = 0;
    }
    CHECKF(rows_ok, "%s: host rows hold the device rows after 2D D2H", what);
    CHECKF(gaps_ok && back[hsize] == 0x3C, "%s: host bytes between rows untouched", what);
    free(src);
    free(dev_before);
    free(dev_after);
    free(back);
}

static void check_budget(const char *what, uint64_t at_least)
{
    uint64_t reg = registry_registered_bytes();
    CHECKF(reg >= at_least && reg <= shim_cfg.budget,
           "%s: registered bytes %llu cover the staging buffers (>= %llu) within the budget %llu",
           what, (unsigned long long)reg, (unsigned long long)at_least,
           (unsigned long long)shim_cfg.budget);
    if (d.fake_registered)
        CHECKF(d.fake_registered() == reg, "%s: the fake's registered bytes (%zu) match", what,
               d.fake_registered());
}

/* ---- one version of the source: a host function queued before the copy rewrites it ---- */
struct rewrite_arg {
    unsigned char *p;
    size_t n;
    unsigned seed;
};

static void CUDA_CB rewrite_source(void *ud)
{
    struct rewrite_arg *a = ud;
    struct timespec t = { 0, 5 * 1000 * 1000 };
    nanosleep(&t, NULL);   /* long enough that the copy has begun reading */
    fill(a->p, a->n, a->seed);
}

/* A staged H2D of rows x width (host rows hpitch apart) on a blocking stream behind a host
 * function that rewrites the source: the device gets the source as it was or as rewritten,
 * whole.  The copy must come in more pieces than the lane has buffers to be a test at all. */
static void one_version(CUdeviceptr dbuf, size_t width, size_t rows, size_t hpitch, const char *what)
{
    size_t hsize = (rows - 1) * hpitch + width;
    unsigned char *src = malloc(hsize), *old = malloc(hsize), *got = malloc(rows * width);
    fill(src, hsize, 11);
    memcpy(old, src, hsize);
    struct rewrite_arg a = { src, hsize, 12 };
    unsigned char *rewritten = malloc(hsize);
    fill(rewritten, hsize, 12);
    CUstream s;
    MUST(d.stream_create(&s, 0));
    uint64_t pieces0 = stats_get(STAT_STAGING_PIECES);
    MUST(d.launch_host_func(s, rewrite_source, &a));
    CUresult r;
    int staged = stage(DIR_H2D, src, hpitch, dbuf, width, width, rows, s, LEGACY, &r);
    MUST(d.ctx_sync());
    uint64_t pieces = stats_get(STAT_STAGING_PIECES) - pieces0;
    MUST(d.dtoh(got, dbuf, rows * width));
    int as_old = 1, as_new = 1;
    for (size_t y = 0; y < rows; y++) {
        as_old &= !memcmp(got + y * width, old + y * hpitch, width);
        as_new &= !memcmp(got + y * width, rewritten + y * hpitch, width);
    }
    CHECKF(staged && r == CUDA_SUCCESS && pieces > shim_cfg.staging_buffers,
           "%s: staged in %llu pieces, more than the %llu buffers", what, (unsigned long long)pieces,
           (unsigned long long)shim_cfg.staging_buffers);
    CHECKF(as_old || as_new, "%s: the device holds one whole version of the source (%s)", what,
           as_old ? "as it was" : as_new ? "as rewritten" : "a mix");
    d.stream_destroy(s);
    free(src);
    free(old);
    free(rewritten);
    free(got);
}

/* ---- two threads staging at once ---- */
struct worker_arg {
    CUdeviceptr dev;
    size_t n;
    enum copy_dir dir;
    int rounds, ok, staged;
};

static void *stage_thread(void *p)
{
    struct worker_arg *a = p;
    d.ctx_set(ctx);
    unsigned char *buf = malloc(a->n), *ref = malloc(a->n);
    a->ok = 1;
    for (int i = 0; i < a->rounds; i++) {
        CUresult r = CUDA_SUCCESS;
        if (a->dir == DIR_H2D) {
            fill(buf, a->n, (unsigned)i);
            if (stage(DIR_H2D, buf, 0, a->dev, 0, a->n, 1, NULL, PTDS, &r))
                a->staged++;
            else
                r = d.htod(a->dev, buf, a->n);   /* declined: the original path */
            if (r != CUDA_SUCCESS || d.dtoh(ref, a->dev, a->n) || memcmp(ref, buf, a->n))
                a->ok = 0;
        } else {
            memset(buf, 0, a->n);
            if (stage(DIR_D2H, buf, 0, a->dev, 0, a->n, 1, NULL, PTDS, &r))
                a->staged++;
            else
                r = d.dtoh(buf, a->dev, a->n);
            fill(ref, a->n, 1234);
            if (r != CUDA_SUCCESS || memcmp(ref, buf, a->n))
                a->ok = 0;
        }
    }
    free(buf);
    free(ref);
    return NULL;
}

static int bench(size_t mib);

int main(int argc, char **argv)
{
    open_driver();
    config_load(no_env);
    if (argc > 1 && !strcmp(argv[1], "--bench"))
        return bench(argc > 2 ? strtoul(argv[2], NULL, 10) : 256);

    const size_t chunk = 64 * K;
    const size_t dsize = 1 * M;
    CUdeviceptr dbuf;
    MUST(d.mem_alloc(&dbuf, dsize));
    CUresult r;
    unsigned char *host = malloc(dsize);
    fill(host, dsize, 1);

    /* ---- declines before anything moves ---- */
    settings(chunk, 2, 4, 100 * K);   /* two 64K buffers do not fit in 100K */
    CHECK(!staging_available(256 * K));
    CHECK(!stage(DIR_H2D, host, 0, dbuf, 0, 256 * K, 1, NULL, LEGACY, &r));
    CHECK(registry_registered_bytes() == 0);

    settings(chunk, 2, 4, 1ull << 30);
    CHECK(staging_available(256 * K));
    shim_cfg.staging_min = 512 * K;
    CHECK(!staging_available(256 * K));
    shim_cfg.staging_min = 0;
    shim_cfg.mode = MODE_PIN;
    CHECK(!staging_available(256 * K));
    shim_cfg.mode = MODE_FULL;

    /* The budget is taken by promotions: registry_reserve fails, staging declines. */
    shim_cfg.budget = 3 * chunk;
    CHECK(registry_reserve(2 * chunk));
    CHECK(!stage(DIR_H2D, host, 0, dbuf, 0, 256 * K, 1, NULL, LEGACY, &r));
    CHECK(registry_registered_bytes() == 2 * chunk);
    registry_unreserve(2 * chunk);
    shim_cfg.budget = 1ull << 30;

    /* Device ranges the original call would reject. */
    CHECK(!stage(DIR_H2D, host, 0, (CUdeviceptr)0x1234, 0, 256 * K, 1, NULL, LEGACY, &r));
    CHECK(!stage(DIR_H2D, host, 0, dbuf + dsize - 100 * K, 0, 256 * K, 1, NULL, LEGACY, &r));
    CHECK(!stage(DIR_D2H, host, 0, dbuf + 1, 0, dsize, 1, NULL, LEGACY, &r));
    CHECK(!stage(DIR_D2H, host, 1024, dbuf, 4096, 1024, 257, NULL, LEGACY, &r)); /* 2D past end */
    CHECK(!stage(DIR_D2H, host, 100, dbuf, 4096, 1024, 8, NULL, LEGACY, &r));    /* rows overlap */
    CHECK(!stage(DIR_H2D, NULL, 0, dbuf, 0, 256 * K, 1, NULL, LEGACY, &r));
    CHECK(stats_get(STAT_STAGED_COPIES) == 0);

    /* ---- round trips: many small chunks, the pool splitting each ---- */
    for (unsigned nbuf = 2; nbuf <= 3; nbuf++) {
        char what[64];
        settings(chunk, nbuf, 4, 1ull << 30);
        snprintf(what, sizeof what, "%u buffers, chunk+1", nbuf);
        round_trip_1d(dbuf, chunk + 1, 0, 0, what);
        check_budget(what, nbuf * chunk);
        snprintf(what, sizeof what, "%u buffers, chunk-1", nbuf);
        round_trip_1d(dbuf, chunk - 1, 3, 7, what);
        snprintf(what, sizeof what, "%u buffers, 3.5 chunks", nbuf);
        round_trip_1d(dbuf, chunk * 7 / 2, 1, 0, what);
        snprintf(what, sizeof what, "%u buffers, 11 chunks + 5, unaligned", nbuf);
        round_trip_1d(dbuf + 4096, chunk * 11 + 5, 13, 3, what);
        CHECKF(!stage(DIR_H2D, host, 0, dbuf, 0, 4095, 1, NULL, LEGACY, &r),
               "%u buffers: a copy under PINSHIM_MIN_SIZE declines", nbuf);
        snprintf(what, sizeof what, "%u buffers, whole allocation", nbuf);
        round_trip_1d(dbuf, dsize, 0, 0, what);
        check_budget(what, nbuf * chunk);
    }
    CHECKF(registry_registered_bytes() == 3 * chunk,
           "the 2-buffer lane was rebuilt with 3 buffers (registered %llu)",
           (unsigned long long)registry_registered_bytes());

    /* ---- 2D ---- */
    round_trip_2d(dbuf, dsize, 700, 300, 1000, 1024, "rows packed");
    round_trip_2d(dbuf, dsize, 1000, 301, 1000, 1536, "host rows contiguous");
    round_trip_2d(dbuf, dsize, 1536, 200, 2000, 1536, "device rows contiguous");
    round_trip_2d(dbuf, dsize, 150000, 3, 150001, 160000, "rows wider than a chunk");
    round_trip_2d(dbuf, dsize, chunk, 5, chunk + 3, chunk + 64, "rows exactly one chunk");
    round_trip_2d(dbuf, dsize, 4096, 64, 4096, 4096, "contiguous both sides");

    /* ---- flushing the host side (a block about to be registered): every byte still right,
     * and exactly the staged H2D bytes flushed (the D2H legs flush nothing) ---- */
    {
        CHECKF(stats_get(STAT_STAGING_FLUSHED_BYTES) == 0, "nothing flushed unless asked");
        stage_flush = 1;
        uint64_t before = stats_get(STAT_STAGING_FLUSHED_BYTES);
        round_trip_1d(dbuf, chunk * 7 / 2, 5, 0, "flushed, 3.5 chunks, unaligned");
        round_trip_1d(dbuf, chunk - 1, 3, 7, "flushed, chunk-1");
        round_trip_2d(dbuf, dsize, 700, 300, 1000, 1024, "flushed, rows packed");
        uint64_t want = cpupool_flushes() ? chunk * 7 / 2 + (chunk - 1) + 700 * 300 : 0;
        CHECKF(stats_get(STAT_STAGING_FLUSHED_BYTES) - before == want,
               "flushed bytes: %llu, the staged H2D bytes %llu",
               (unsigned long long)(stats_get(STAT_STAGING_FLUSHED_BYTES) - before), (unsigned long long)want);
        stage_flush = 0;
    }

    /* ---- bigger chunks (slices of a quarter MiB), pieces of one size and tapered ---- */
    {
        settings(4 * M, 3, 4, 1ull << 30);
        const size_t sizes[] = { 4 * M + 1, 9 * M + 4097, 14 * M, 23 * M + 123 };
        const size_t nsizes = sizeof sizes / sizeof sizes[0];
        uint64_t pieces[2][4];
        CUdeviceptr big;
        MUST(d.mem_alloc(&big, 24 * M + 4096));
        for (int taper = 0; taper < 2; taper++) {
            shim_cfg.staging_taper = taper;
            for (size_t i = 0; i < nsizes; i++) {
                char what[64];
                snprintf(what, sizeof what, "4M chunks, %zu bytes, %s", sizes[i],
                         taper ? "tapered" : "even pieces");
                uint64_t before = stats_get(STAT_STAGING_PIECES);
                round_trip_1d(big, sizes[i], 3, 5, what);
                pieces[taper][i] = stats_get(STAT_STAGING_PIECES) - before;   /* both ways */
            }
        }
        /* Even pieces: a quarter of the copy, 1 MiB at least, one chunk at most.  Tapered: more
         * pieces only where a piece was larger than 1 MiB (the ramp up and down: log2(4M / 1M) + 1
         * steps each side at most), and not one more where they were 1 MiB already. */
        for (size_t i = 0; i < nsizes; i++) {
            size_t q = sizes[i] / 4, piece = q < M ? M : q > 4 * M ? 4 * M : (q + 4095) & ~(size_t)4095;
            uint64_t even = 2 * ((sizes[i] + piece - 1) / piece);
            CHECKF(pieces[0][i] == even, "even pieces: %zu bytes in %llu pieces both ways (want %llu)",
                   sizes[i], (unsigned long long)pieces[0][i], (unsigned long long)even);
            if (piece > M)
                CHECKF(pieces[1][i] > pieces[0][i] && pieces[1][i] <= pieces[0][i] + 2 * 2 * 3,
                       "tapered: %zu bytes in %llu pieces both ways (even: %llu)", sizes[i],
                       (unsigned long long)pieces[1][i], (unsigned long long)pieces[0][i]);
            else
                CHECKF(pieces[1][i] <= pieces[0][i],
                       "tapered: %zu bytes in %llu pieces both ways, no more than even (%llu)", sizes[i],
                       (unsigned long long)pieces[1][i], (unsigned long long)pieces[0][i]);
        }
        shim_cfg.staging_taper = true;
        check_budget("4M chunks", 12 * M);
        /* Four buffers hold the four even pieces of a copy, and not its tapered ones; rows of
         * half a piece and a byte go one per piece, twice as many pieces as the bytes say. */
        if (d.launch_host_func) {
            settings(16 * M, 4, 4, 1ull << 30);
            /* The lane rebuilt to that shape first: unregistering the old one waits for the
             * device, host functions included, which would hide a mix. */
            round_trip_1d(big, 2 * M, 0, 0, "lane of four 16 MiB buffers");
            one_version(big, 12 * M, 1, 12 * M, "12 MiB tapered, 4 buffers");
            one_version(big, 512 * K + 1, 6, 600 * K, "6 rows of 512 KiB + 1, 4 buffers");
        }
        MUST(d.mem_free(big));
    }
    settings(chunk, 3, 4, 1ull << 30);
    /* Rebuild the lane now: unregistering the old one waits for the device to go idle, which
     * would hide a missing ordering below. */
    round_trip_1d(dbuf, chunk * 2, 0, 0, "lane rebuilt for 64K chunks");

    /* ---- ordering: a staged legacy copy waits for work on a blocking stream ---- */
    if (d.launch_write) {
        CUstream blocking;
        MUST(d.stream_create(&blocking, 0));
        size_t n = 256 * K;
        memset(host, 0, n);
        MUST(d.htod(dbuf, host, n));
        MUST(d.launch_write(blocking, dbuf, 0x5A, n, 20000));
        memset(host, 0x11, n);
        int staged = stage(DIR_D2H, host, 0, dbuf, 0, n, 1, NULL, LEGACY, &r);
        int all = 1;
        for (size_t i = 0; i < n; i++)
            all &= host[i] == 0x5A;
        CHECKF(staged && r == CUDA_SUCCESS && all,
               "staged legacy D2H sees a blocking stream's earlier write");

        /* A staged H2D on the legacy stream lands after that stream's pending write. */
        MUST(d.launch_write(blocking, dbuf, 0x77, n, 20000));
        fill(host, n, 5);
        staged = stage(DIR_H2D, host, 0, dbuf, 0, n, 1, NULL, LEGACY, &r);
        unsigned char *chk = malloc(n);
        MUST(d.dtoh(chk, dbuf, n));
        CHECKF(staged && r == CUDA_SUCCESS && !memcmp(chk, host, n),
               "staged legacy H2D lands after a blocking stream's earlier write");

        /* Per-thread default stream: ordered after the thread's own earlier work. */
        MUST(d.launch_write_ptsz(NULL, dbuf, 0x6B, n, 20000));
        memset(host, 0, n);
        staged = stage(DIR_D2H, host, 0, dbuf, 0, n, 1, NULL, PTDS, &r);
        all = 1;
        for (size_t i = 0; i < n; i++)
            all &= host[i] == 0x6B;
        CHECKF(staged && r == CUDA_SUCCESS && all,
               "staged per-thread D2H sees the per-thread stream's earlier write");

        /* A named stream. */
        MUST(d.launch_write(blocking, dbuf, 0x42, n, 20000));
        staged = stage(DIR_D2H, host, 0, dbuf, 0, n, 1, blocking, LEGACY, &r);
        all = 1;
        for (size_t i = 0; i < n; i++)
            all &= host[i] == 0x42;
        CHECKF(staged && r == CUDA_SUCCESS && all, "staged D2H on stream s sees s's earlier write");
        free(chk);
        MUST(d.ctx_sync());
        MUST(d.stream_destroy(blocking));
    }

    /* ---- two threads at once: a second lane, or a clean decline ---- */
    {
        size_t n = 5 * chunk + 17;
        CUdeviceptr a_dev, b_dev;
        MUST(d.mem_alloc(&a_dev, n));
        MUST(d.mem_alloc(&b_dev, n));
        unsigned char *pat = malloc(n);
        fill(pat, n, 1234);
        MUST(d.htod(b_dev, pat, n));
        free(pat);
        struct worker_arg wa = { a_dev, n, DIR_H2D, 20, 0, 0 };
        struct worker_arg wb = { b_dev, n, DIR_D2H, 20, 0, 0 };
        pthread_t ta, tb;
        pthread_create(&ta, NULL, stage_thread, &wa);
        pthread_create(&tb, NULL, stage_thread, &wb);
        pthread_join(ta, NULL);
        pthread_join(tb, NULL);
        CHECKF(wa.ok && wb.ok, "two threads staging at once: every byte right (staged %d + %d of 40)",
               wa.staged, wb.staged);
        CHECK(wa.staged > 0 && wb.staged > 0);
        check_budget("two lanes", 3 * chunk);
        CHECKF(registry_registered_bytes() <= 2 * 3 * chunk, "at most two lanes per context");
        MUST(d.mem_free(a_dev));
        MUST(d.mem_free(b_dev));
    }

    /* ---- a DMA failing midway (the fake's injected failure): the copy fails with the
     * driver's error; the copy threads, which work a piece ahead of the DMAs, are done with both
     * sides at the return; the lane serves the next copy ---- */
    if (d.fail_copies_after) {
        settings(chunk, 3, 4, 16 * M);
        size_t n = 12 * chunk;   /* twelve pieces */
        unsigned char *dst = malloc(n);
        unsigned char *snap = malloc(n);
        for (int dir = 0; dir < 2; dir++) {
            const char *what = dir == 0 ? "H2D" : "D2H";
            memset(dst, 0xA5, n);
            d.fail_copies_after(3, CUDA_ERROR_LAUNCH_FAILED);
            int staged = dir == 0 ? stage(DIR_H2D, host, 0, dbuf, 0, n, 1, NULL, LEGACY, &r)
                                  : stage(DIR_D2H, dst, 0, dbuf, 0, n, 1, NULL, LEGACY, &r);
            d.fail_copies_after(0, CUDA_SUCCESS);
            CHECKF(staged && r == CUDA_ERROR_LAUNCH_FAILED,
                   "%s: the fourth piece's DMA failing fails the copy with its error (staged %d, %d)",
                   what, staged, (int)r);
            CHECKF(cpupool_jobs_open() == 0, "%s: every piece posted to the copy threads was waited for (%d open)",
                   what, cpupool_jobs_open());
            if (dir == 1) {
                memcpy(snap, dst, n);
                usleep(5000);
                CHECKF(!memcmp(snap, dst, n), "D2H: nothing written into the destination after the return");
                CHECKF(!memcmp(dst, host, chunk), "D2H: the pieces that arrived before the failure are copied out");
            }
        }
        free(snap);
        free(dst);
        round_trip_1d(dbuf, n, 0, 0, "after a failed pipeline");
    }

    /* ---- stats, the pool restarting after shutdown ---- */
    CHECK(stats_get(STAT_STAGED_COPIES) > 0);
    CHECK(stats_get(STAT_STAGED_BYTES) > stats_get(STAT_STAGED_COPIES));
    CHECK(stats_get(STAT_STAGED_NS) > 0);
    staging_shutdown();
    round_trip_1d(dbuf, chunk * 3 + 1, 0, 0, "after staging_shutdown");
    staging_shutdown();

    if (d.violations)
        CHECKF(d.violations() == 0, "the fake saw no violations (%lu)", d.violations());
    MUST(d.mem_free(dbuf));
    free(host);
    return TEST_SUMMARY();
}

/* ---- timing: staged vs the driver's own pageable path ---- */
static double now_s(void) { return (double)shim_now_ns() / 1e9; }

static int bench(size_t mib)
{
    size_t n = mib * M;
    settings(16 * M, 3, 8, 64 * M);
    const char *e;
    if ((e = getenv("BENCH_THREADS")))
        shim_cfg.copy_threads = strtoul(e, NULL, 10);
    if ((e = getenv("BENCH_CHUNK_MB")))
        shim_cfg.staging_chunk = strtoul(e, NULL, 10) * M;
    if ((e = getenv("BENCH_BUFFERS")))
        shim_cfg.staging_buffers = strtoul(e, NULL, 10);
    CUdeviceptr dev;
    MUST(d.mem_alloc(&dev, n));
    unsigned char *host = malloc(n), *back = malloc(n);
    fill(host, n, 3);
    memset(back, 0, n);
    CUresult r;
    int reps = 5;
    double best[4] = { 1e9, 1e9, 1e9, 1e9 };
    for (int i = 0; i < reps; i++) {
        double t = now_s();
        MUST(d.htod(dev, host, n));
        t = now_s() - t;
        if (t < best[0]) best[0] = t;
        t = now_s();
        MUST(d.dtoh(back, dev, n));
        t = now_s() - t;
        if (t < best[1]) best[1] = t;
        t = now_s();
        if (!stage(DIR_H2D, host, 0, dev, 0, n, 1, NULL, LEGACY, &r) || r) {
            printf("FAIL staged H2D declined or failed (%d)\n", (int)r);
            return 1;
        }
        t = now_s() - t;
        if (t < best[2]) best[2] = t;
        memset(back, 0, n);
        t = now_s();
        if (!stage(DIR_D2H, back, 0, dev, 0, n, 1, NULL, LEGACY, &r) || r) {
            printf("FAIL staged D2H declined or failed (%d)\n", (int)r);
            return 1;
        }
        t = now_s() - t;
        if (t < best[3]) best[3] = t;
    }
    int same = !memcmp(host, back, n);
    printf("%zu MiB, chunk %llu MiB x %llu, copy threads %llu: driver pageable H2D %.1f GB/s "
           "D2H %.1f GB/s; staged H2D %.1f GB/s D2H %.1f GB/s; round trip %s\n",
           mib, (unsigned long long)(shim_cfg.staging_chunk / M),
           (unsigned long long)shim_cfg.staging_buffers, (unsigned long long)shim_cfg.copy_threads,
           n / best[0] / 1e9, n / best[1] / 1e9, n / best[2] / 1e9, n / best[3] / 1e9,
           same ? "exact" : "WRONG");
    return same ? 0 : 1;
}
