/* Contract rule 4: a registration never outlives its memory, and memory that changes hands
 * carries its own content.
 *   - a promoted block freed, a new block of the same size (perhaps the same address, served
 *     from the shim's pinned cache): its own content goes through H2D and back, async too;
 *   - realloc grow, shrink, shrink below the tracking size, in-place: content kept; an old range
 *     the program no longer owns is either unregistered or still mapped (kept by the shim's
 *     cache: never given back while registered);
 *   - munmap of a promoted mapping: unregistered right after; MAP_FIXED at that address with new
 *     content copies right; MAP_FIXED straight over a promoted mapping; a partial munmap;
 *   - madvise(MADV_DONTNEED) over a promoted mapping and over a promoted heap block: unregistered,
 *     pages read zero as without the shim, later copies correct; MADV_FREE: unregistered;
 *   - mremap grow with MREMAP_MAYMOVE (forced to move) and shrink: content kept, old or dropped
 *     range unregistered;
 *   - the alloc-copy-free loop: the cache serves it (no unregister per step, few registers);
 *     malloc_usable_size >= request; calloc from the cache returns zeroed memory; aligned
 *     allocations from the cache keep their alignment. */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <stdint.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include "drvtest.h"
#include "fakecuda.h"

static unsigned long h2d, d2h, d2d;
static CUdeviceptr dev;
static unsigned char *check;          /* pinned read-back */
static const size_t MAXN = 8u << 20;

#define HTOD(d, s, len) do { CU(cuMemcpyHtoD(d, s, len)); h2d++; } while (0)
#define DTOH(d, s, len) do { CU(cuMemcpyDtoH(d, s, len)); d2h++; } while (0)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int mapped(const void *p, size_t len)
{
    uintptr_t a = (uintptr_t)p & ~(uintptr_t)4095;
    return !(msync((void *)a, (uintptr_t)p + len - a, MS_ASYNC) != 0 && errno == ENOMEM);
}

static int all_equal(const unsigned char *p, size_t len, unsigned char v)
{
    for (size_t i = 0; i < len; i++)
        if (p[i] != v)
            return 0;
    return 1;
}

/* Copy p to the device a few times (hot: promoted under pin/full). */
static void promote(void *p, size_t len)
{
    for (int i = 0; i < 4; i++)
        HTOD(dev, p, len);
    drvtest_wait_registered(p, len);
}

/* p's content `seed` goes to the device and back (pinned read-back and into p itself). */
static int roundtrip(unsigned char *p, size_t len, unsigned seed)
{
    fill_pattern(p, len, seed);
    HTOD(dev, p, len);
    memset(check, 0, len);
    DTOH(check, dev, len);
    int ok = check_pattern(check, len, seed);
    memset(p, 0, len);
    DTOH(p, dev, len);
    return ok && check_pattern(p, len, seed);
}

/* An old range the program gave up: no registration, unless still mapped (the shim's cache). */
static int no_stale_registration(uintptr_t old, size_t len, const void *live)
{
    if (old == (uintptr_t)live)
        return 1;
    return !fakecuda_registered((const void *)old, len) || mapped((const void *)old, len);
}

static void section_free_reuse(void)
{
    const size_t n = 4u << 20;
    unsigned char *a = malloc(n);
    fill_pattern(a, n, 1);
    promote(a, n);
    printf("info: promoted block registered=%d\n", fakecuda_registered(a, n));
    uintptr_t old_a = (uintptr_t)a;
    free(a);
    unsigned char *b = malloc(n);
    printf("info: re-malloc %s address\n", (uintptr_t)b == old_a ? "same" : "another");
    CHECKF(no_stale_registration(old_a, n, b), "freed promoted block: no registration on memory the shim gave back");
    CHECKF(roundtrip(b, n, 2), "new block of the same size carries its own content");
    CHECKF(malloc_usable_size(b) >= n, "malloc_usable_size of the new block >= request");

    /* async from the (maybe cache-served, promoted) block keeps pageable semantics */
    CUstream s;
    CU(cuStreamCreate(&s, 0));
    CUdeviceptr scratch;
    CU(cuMemAlloc(&scratch, 4096));
    fill_pattern(b, n, 3);
    CU(fakecuda_launch_write(s, scratch, 1, 4096, 20000));
    CU(cuMemcpyHtoDAsync(dev, b, n, s));
    h2d++;
    if (!drvtest_trust_async())
        fill_pattern(b, n, 4);
    CU(cuStreamSynchronize(s));
    memset(check, 0, n);
    DTOH(check, dev, n);
    CHECKF(check_pattern(check, n, 3), "re-used block: async H2D then overwrite, the device has the old data");
    CU(cuStreamDestroy(s));
    CU(cuMemFree(scratch));
    free(b);

    /* several blocks freed and re-allocated in another order */
    unsigned char *blk[4];
    for (int i = 0; i < 4; i++) {
        blk[i] = malloc(n - (size_t)i * 4096);
        fill_pattern(blk[i], n - (size_t)i * 4096, 10 + (unsigned)i);
        promote(blk[i], n - (size_t)i * 4096);
    }
    for (int i = 0; i < 4; i++)
        free(blk[i]);
    int ok = 1;
    for (int i = 3; i >= 0; i--) {
        blk[i] = malloc(n - (size_t)i * 4096);
        ok &= roundtrip(blk[i], n - (size_t)i * 4096, 20 + (unsigned)i);
    }
    for (int i = 0; i < 4; i++)
        ok &= check_pattern(blk[i], n - (size_t)i * 4096, 20 + (unsigned)i);
    CHECKF(ok, "4 promoted blocks freed and re-allocated: each carries its own content");
    for (int i = 0; i < 4; i++)
        free(blk[i]);
}

static void section_realloc(void)
{
    const size_t n = 4u << 20;
    unsigned char *p = malloc(n);
    fill_pattern(p, n, 30);
    promote(p, n);

    /* grow past the block: moves */
    uintptr_t old_p = (uintptr_t)p;
    unsigned char *q = realloc(p, 6u << 20);
    CHECK(q != NULL);
    CHECKF(check_pattern(q, n, 30), "realloc grow of a promoted block keeps the content");
    CHECKF(no_stale_registration(old_p, n, q), "realloc grow: no stale registration on the old range");
    CHECKF(roundtrip(q, 6u << 20, 31), "realloc grow: the new block copies right");
    promote(q, 6u << 20);

    /* shrink, still large */
    fill_pattern(q, 6u << 20, 32);
    uintptr_t old_q = (uintptr_t)q;
    unsigned char *r = realloc(q, 1u << 20);
    CHECK(r != NULL);
    CHECKF(check_pattern(r, 1u << 20, 32), "realloc shrink of a promoted block keeps the content");
    CHECKF(no_stale_registration(old_q, 6u << 20, r), "realloc shrink: no stale registration on the old range");
    CHECKF(roundtrip(r, 1u << 20, 33), "realloc shrink: the block copies right");
    promote(r, 1u << 20);

    /* shrink below the tracking size: moves to the ordinary allocator */
    fill_pattern(r, 1u << 20, 34);
    uintptr_t old_r = (uintptr_t)r;
    unsigned char *t = realloc(r, 16u << 10);
    CHECK(t != NULL);
    CHECKF(check_pattern(t, 16u << 10, 34), "realloc to a small size keeps the content");
    CHECKF(no_stale_registration(old_r, 1u << 20, t), "realloc to a small size: no stale registration on the old range");
    CHECKF(roundtrip(t, 16u << 10, 35), "realloc to a small size: the block copies right");

    /* grow a small block into a large one, then promote and grow in place */
    unsigned char *u = realloc(t, (4u << 20) - (256u << 10));
    CHECK(u != NULL);
    CHECKF(check_pattern(u, 16u << 10, 35), "realloc small -> large keeps the content");
    fill_pattern(u, (4u << 20) - (256u << 10), 36);
    promote(u, (4u << 20) - (256u << 10));
    uintptr_t old_u = (uintptr_t)u;
    unsigned char *v = realloc(u, (4u << 20) - (128u << 10));
    CHECK(v != NULL);
    CHECKF(check_pattern(v, (4u << 20) - (256u << 10), 36), "realloc grow (maybe in place) keeps the content");
    CHECKF(no_stale_registration(old_u, (4u << 20) - (256u << 10), v), "realloc grow: no stale registration");
    CHECKF(roundtrip(v, (4u << 20) - (128u << 10), 37), "realloc grow (maybe in place): copies right");
    free(v);

    /* realloc to the same size, and reallocarray */
    unsigned char *w = malloc(n);
    fill_pattern(w, n, 38);
    promote(w, n);
    uintptr_t old_w = (uintptr_t)w;
    unsigned char *x = realloc(w, n);
    CHECKF(x && check_pattern(x, n, 38), "realloc to the same size keeps the content");
    CHECKF(no_stale_registration(old_w, n, x), "realloc same size: no stale registration");
    uintptr_t old_x = (uintptr_t)x;
    unsigned char *y = reallocarray(x, 2, n);
    CHECKF(y && check_pattern(y, n, 38), "reallocarray grow keeps the content");
    CHECKF(no_stale_registration(old_x, n, y), "reallocarray: no stale registration");
    CHECKF(roundtrip(y, 2 * n, 39), "reallocarray: the new block copies right");
    free(y);
}

static void section_munmap(void)
{
    const size_t n = 4u << 20;
    const int prot = PROT_READ | PROT_WRITE;
    const int fl = MAP_PRIVATE | MAP_ANONYMOUS;
    unsigned char *m = mmap(NULL, n, prot, fl, -1, 0);
    CHECK(m != MAP_FAILED);
    fill_pattern(m, n, 50);
    promote(m, n);
    printf("info: promoted mapping registered=%d\n", fakecuda_registered(m, n));
    CHECK(munmap(m, n) == 0);
    CHECKF(!fakecuda_registered(m, n), "munmap of a promoted mapping: unregistered right after");

    unsigned char *m2 = mmap(m, n, prot, fl | MAP_FIXED, -1, 0);
    CHECK(m2 == m);
    CHECKF(all_equal(m2, n, 0), "MAP_FIXED at the old address: fresh zero pages");
    CHECKF(roundtrip(m2, n, 51), "MAP_FIXED at the old address with new content copies right");
    promote(m2, n);
    CHECKF(roundtrip(m2, n, 52), "MAP_FIXED mapping copies right after it is hot");

    /* MAP_FIXED straight over a promoted mapping replaces it */
    unsigned char *m3 = mmap(m2, n, prot, fl | MAP_FIXED, -1, 0);
    CHECK(m3 == m2);
    CHECKF(!fakecuda_registered(m3, n), "MAP_FIXED over a promoted mapping: the old registration is gone");
    CHECKF(all_equal(m3, n, 0), "MAP_FIXED over a promoted mapping: fresh zero pages");
    HTOD(dev, m3, n);
    memset(check, 0xFF, n);
    DTOH(check, dev, n);
    CHECKF(all_equal(check, n, 0), "the replacing mapping's zeros reach the device");
    CHECKF(roundtrip(m3, n, 53), "the replacing mapping copies right");

    /* partial munmap of a promoted mapping */
    promote(m3, n);
    CHECK(munmap(m3 + n / 2, n / 2) == 0);
    CHECKF(!fakecuda_registered(m3 + n / 2, n / 2), "partial munmap: the unmapped half is not registered");
    CHECKF(roundtrip(m3, n / 2, 54), "partial munmap: the remaining half copies right");
    CHECK(munmap(m3, n / 2) == 0);
    CHECKF(!fakecuda_registered(m3, n), "munmap of the rest: nothing registered");
}

static void section_madvise(void)
{
    const size_t n = 4u << 20;
    unsigned char *d = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(d != MAP_FAILED);
    fill_pattern(d, n, 60);
    promote(d, n);
    CHECK(madvise(d, n, MADV_DONTNEED) == 0);
    CHECKF(!fakecuda_registered(d, n), "MADV_DONTNEED over a promoted mapping: unregistered after");
    CHECKF(all_equal(d, n, 0), "MADV_DONTNEED: the pages read zero, as without the shim");
    HTOD(dev, d, n);
    memset(check, 0xFF, n);
    DTOH(check, dev, n);
    CHECKF(all_equal(check, n, 0), "MADV_DONTNEED: the zero pages reach the device");
    CHECKF(roundtrip(d, n, 61), "MADV_DONTNEED: later copies correct");
    promote(d, n);
    CHECKF(roundtrip(d, n, 62), "MADV_DONTNEED: later copies correct once hot again");

    /* a middle part only */
    fill_pattern(d, n, 63);
    promote(d, n);
    CHECK(madvise(d + (1u << 20), 1u << 20, MADV_DONTNEED) == 0);
    CHECKF(!fakecuda_registered(d + (1u << 20), 1u << 20), "partial MADV_DONTNEED: the discarded range is not registered");
    unsigned char *ref = malloc(n);
    fill_pattern(ref, n, 63);
    CHECKF(check_pattern(d, 1u << 20, 63) && all_equal(d + (1u << 20), 1u << 20, 0) &&
               memcmp(d + (2u << 20), ref + (2u << 20), n - (2u << 20)) == 0,
           "partial MADV_DONTNEED: zero in the middle, the rest intact");
    HTOD(dev, d, n);
    memset(check, 0xFF, n);
    DTOH(check, dev, n);
    CHECKF(check_pattern(check, 1u << 20, 63) && all_equal(check + (1u << 20), 1u << 20, 0) &&
               memcmp(check + (2u << 20), ref + (2u << 20), n - (2u << 20)) == 0,
           "partial MADV_DONTNEED: the device gets what the program sees");
    free(ref);
    CHECKF(roundtrip(d, n, 64), "partial MADV_DONTNEED: later copies correct");

#ifdef MADV_FREE
    promote(d, n);
    CHECK(madvise(d, n, MADV_FREE) == 0);
    CHECKF(!fakecuda_registered(d, n), "MADV_FREE over a promoted mapping: unregistered after");
    CHECKF(roundtrip(d, n, 65), "MADV_FREE: later copies correct");
#endif
    CHECK(munmap(d, n) == 0);

    /* a promoted heap block: the page-aligned interior */
    unsigned char *h = malloc(n);
    fill_pattern(h, n, 66);
    promote(h, n);
    unsigned char *lo = (unsigned char *)(((uintptr_t)h + 4095) & ~(uintptr_t)4095);
    unsigned char *hi = (unsigned char *)(((uintptr_t)h + n) & ~(uintptr_t)4095);
    CHECK(madvise(lo, (size_t)(hi - lo), MADV_DONTNEED) == 0);
    CHECKF(!fakecuda_registered(lo, (size_t)(hi - lo)), "MADV_DONTNEED over a promoted heap block: unregistered after");
    CHECKF(all_equal(lo, (size_t)(hi - lo), 0), "MADV_DONTNEED over a heap block: zero pages");
    CHECKF(roundtrip(h, n, 67), "MADV_DONTNEED over a heap block: later copies correct");
    promote(h, n);
    CHECKF(roundtrip(h, n, 68), "MADV_DONTNEED over a heap block: correct once hot again");
    free(h);
}

static void section_mremap(void)
{
    const size_t n = 4u << 20;
    unsigned char *r = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(r != MAP_FAILED);
    /* a guard page right after it, so that growing has to move */
    void *guard = mmap(r + n, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    fill_pattern(r, n, 70);
    promote(r, n);
    unsigned char *r2 = mremap(r, n, 2 * n, MREMAP_MAYMOVE);
    CHECK(r2 != MAP_FAILED);
    printf("info: mremap %s\n", r2 == r ? "grew in place" : "moved");
    CHECKF(check_pattern(r2, n, 70), "mremap grow of a promoted mapping keeps the content");
    if (r2 != r)
        CHECKF(!fakecuda_registered(r, n), "mremap moved: the old range is not registered");
    CHECKF(roundtrip(r2, 2 * n, 71), "mremap grow: the new mapping copies right");

    /* shrink in place: the dropped tail must not stay registered */
    fill_pattern(r2, 2 * n, 72);
    promote(r2, 2 * n);
    unsigned char *r3 = mremap(r2, 2 * n, n / 2, 0);
    CHECK(r3 == r2);
    CHECKF(!fakecuda_registered(r3 + n / 2, 2 * n - n / 2), "mremap shrink: the dropped tail is not registered");
    CHECKF(check_pattern(r3, n / 2, 72), "mremap shrink keeps the content");
    CHECKF(roundtrip(r3, n / 2, 73), "mremap shrink: copies right");
    CHECK(munmap(r3, n / 2) == 0);
    if (guard != MAP_FAILED)
        munmap(guard, 4096);
}

static void section_loop(void)
{
    const size_t n = 4u << 20;
    unsigned long reg0 = fakecuda_calls("cuMemHostRegister_v2") + fakecuda_calls("cuMemHostRegister");
    unsigned long unreg0 = fakecuda_calls("cuMemHostUnregister");
    unsigned long regs, unregs;
    int ok = 1, usable_ok = 1;
    for (unsigned i = 0; i < 64; i++) {
        unsigned char *p = malloc(n);
        if (!p) {
            ok = 0;
            break;
        }
        usable_ok &= malloc_usable_size(p) >= n;
        fill_pattern(p, n, 100 + i);
        HTOD(dev, p, n);
        HTOD(dev, p, n);
        memset(p, 0, n);
        DTOH(p, dev, n);
        ok &= check_pattern(p, n, 100 + i);
        free(p);
    }
    regs = fakecuda_calls("cuMemHostRegister_v2") + fakecuda_calls("cuMemHostRegister") - reg0;
    unregs = fakecuda_calls("cuMemHostUnregister") - unreg0;
    printf("info: alloc-copy-free loop: %lu registers, %lu unregisters\n", regs, unregs);
    CHECKF(ok, "alloc-copy-free loop: every step carries its own content");
    CHECKF(usable_ok, "alloc-copy-free loop: malloc_usable_size >= request");
    if (drvtest_expect_promotion(n)) {
        CHECKF(unregs <= 2, "alloc-copy-free loop: no unregister per step (%lu in 64 steps)", unregs);
        CHECKF(regs <= 4, "alloc-copy-free loop: no register per step (%lu in 64 steps)", regs);
    }

    /* One copy per step: a buffer allocated, filled, copied once and freed every step (a batch
     * a program makes afresh).  After a few steps its blocks are registered on their way out
     * and the cache serves the steps after: few registrations, none per step, no unregister.
     * (A size no earlier section used: the cache holds nothing of it yet.) */
    const size_t n1 = 5u << 20;
    reg0 = fakecuda_calls("cuMemHostRegister_v2") + fakecuda_calls("cuMemHostRegister");
    unreg0 = fakecuda_calls("cuMemHostUnregister");
    ok = 1;
    for (unsigned i = 0; i < 64; i++) {
        unsigned char *p = malloc(n1);
        if (!p) {
            ok = 0;
            break;
        }
        fill_pattern(p, n1, 300 + i);
        HTOD(dev, p, n1);
        memset(check, 0, n1);
        DTOH(check, dev, n1);
        ok &= check_pattern(check, n1, 300 + i);
        free(p);
    }
    regs = fakecuda_calls("cuMemHostRegister_v2") + fakecuda_calls("cuMemHostRegister") - reg0;
    unregs = fakecuda_calls("cuMemHostUnregister") - unreg0;
    printf("info: one-copy-per-step loop: %lu registers, %lu unregisters\n", regs, unregs);
    CHECKF(ok, "one-copy-per-step loop: every step carries its own content");
    if (drvtest_expect_promotion(n1)) {
        CHECKF(unregs <= 2, "one-copy-per-step loop: no unregister per step (%lu in 64 steps)", unregs);
        CHECKF(regs >= 1 && regs <= 8, "one-copy-per-step loop: registered on the way out, not per step (%lu in 64 steps)", regs);
    }

    /* calloc of sizes the cache can serve: zeroed */
    unsigned char *c = calloc(1, n);
    CHECKF(c && all_equal(c, n, 0), "calloc of a cacheable size returns zeroed memory");
    CHECKF(malloc_usable_size(c) >= n, "calloc: malloc_usable_size >= request");
    fill_pattern(c, n, 200);
    promote(c, n);
    free(c);
    c = calloc(3, n / 4);
    CHECKF(c && all_equal(c, 3 * (n / 4), 0), "calloc of a smaller cacheable size returns zeroed memory");
    CHECKF(roundtrip(c, 3 * (n / 4), 201), "calloc'ed block copies right");
    free(c);

    /* aligned allocations served from the cache keep their alignment */
    void *a = aligned_alloc(64u << 10, n);
    CHECK(a != NULL && ((uintptr_t)a & ((64u << 10) - 1)) == 0);
    fill_pattern(a, n, 202);
    promote(a, n);
    free(a);
    void *b = NULL;
    CHECK(posix_memalign(&b, 2u << 20, n) == 0);
    CHECKF(b && ((uintptr_t)b & ((2u << 20) - 1)) == 0, "posix_memalign(2 MiB) after a free of a promoted block is aligned");
    CHECKF(roundtrip(b, n, 203), "posix_memalign block copies right");
    free(b);
    void *v = memalign(1u << 20, n);
    CHECKF(v && ((uintptr_t)v & ((1u << 20) - 1)) == 0, "memalign(1 MiB) is aligned");
    CHECKF(roundtrip(v, n, 204), "memalign block copies right");
    free(v);
}

int main(void)
{
    drvtest_init();
    printf("mode=%s\n", drvtest_mode());
    CU(cuMemAlloc(&dev, MAXN));
    CU(cuMemHostAlloc((void **)&check, MAXN, 0));

    section_free_reuse(); printf("info: t=%.2f after free_reuse\n", now_s());
    section_realloc(); printf("info: t=%.2f after realloc\n", now_s());
    section_munmap(); printf("info: t=%.2f after munmap\n", now_s());
    section_madvise(); printf("info: t=%.2f after madvise\n", now_s());
    section_mremap(); printf("info: t=%.2f after mremap\n", now_s());
    section_loop(); printf("info: t=%.2f after loop\n", now_s());

    CU(cuCtxSynchronize());
    CU(cuMemFreeHost(check));
    CU(cuMemFree(dev));
    CHECKF(fakecuda_violations() == 0, "no violations (%lu)", fakecuda_violations());
    printf("EXPECTED_COPIES h2d=%lu d2h=%lu d2d=%lu\n", h2d, d2h, d2d);
    return TEST_SUMMARY();
}
