/* Promotion: which host memory the shim registers, and that every copy stays correct.
 *   - a hot 8 MiB malloc buffer copied H2D several times is promoted (pin/full, default budget),
 *     never without the shim or in off/observe, never when the budget is smaller than the block;
 *   - a 2 MiB buffer copied twice is registered by its second copy (a quick registration is
 *     made on the copy's path), which flushes its lines from the CPU caches first;
 *   - part of a big buffer copied back to back by two threads at once is registered within a few
 *     copies (copies that stage do not keep its background registration waiting for a gap);
 *   - a fresh, untouched D2H destination copied once is not (registering would fault every page);
 *   - blocks smaller than PINSHIM_MIN_SIZE never are;
 *   - cuMemHostAlloc / cuMemAllocHost memory is the program's: never registered by the shim, and
 *     copying from it does not grow the registered bytes;
 *   - memory the driver mallocs or maps for itself is never promoted (the shim leaves it alone);
 *   - read-only mappings (a file mapped PROT_READ, an anonymous mapping made read-only with
 *     mprotect) work as H2D sources. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>
#include "drvtest.h"
#include "fakecuda.h"

static unsigned long h2d, d2h, d2d;
static CUcontext drvtest_ctx;

#define HTOD(d, s, n) do { CU(cuMemcpyHtoD(d, s, n)); h2d++; } while (0)
#define DTOH(d, s, n) do { CU(cuMemcpyDtoH(d, s, n)); d2h++; } while (0)

/* RING_COPIES H2D copies of the first n bytes of a buffer, then one read back and checked. */
#define RING_COPIES 150
static unsigned long ring_copies;
struct ring_job { unsigned char *src; size_t n; CUdeviceptr dev; int ok; };

static void *ring_copier(void *arg)
{
    struct ring_job *j = arg;
    CU(cuCtxSetCurrent(drvtest_ctx));
    for (int i = 0; i < RING_COPIES; i++) {
        CU(cuMemcpyHtoD(j->dev, j->src, j->n));
        __atomic_add_fetch(&ring_copies, 1, __ATOMIC_RELAXED);
    }
    unsigned char *back = malloc(j->n);
    if (back) {
        CU(cuMemcpyDtoH(back, j->dev, j->n));
        j->ok = check_pattern(back, j->n, 40);
        free(back);
    }
    return NULL;
}

/* `times` rounds of: fill src with a fresh pattern, H2D, read back into check; 1 when every
 * round read back its own pattern.  Enough rounds to make a promotable source hot. */
static int hot_round_trips(CUdeviceptr dev, unsigned char *src, unsigned char *check, size_t n,
                           unsigned times, unsigned first_seed)
{
    int ok = 1;
    for (unsigned i = 0; i < times; i++) {
        fill_pattern(src, n, first_seed + i);
        HTOD(dev, src, n);
        memset(check, 0, n);
        DTOH(check, dev, n);
        ok &= check_pattern(check, n, first_seed + i);
    }
    return ok;
}

int main(void)
{
    drvtest_ctx = drvtest_init();
    const size_t n = 8u << 20;
    const size_t budget = drvtest_budget();
    printf("mode=%s min_size=%zu budget=%zu\n", drvtest_mode(), drvtest_min_size(), budget);

    CUdeviceptr dev;
    CU(cuMemAlloc(&dev, n));
    unsigned char *check;   /* program-pinned read-back buffer: never the shim's */
    CU(cuMemHostAlloc((void **)&check, n, 0));

    /* ---- a hot H2D source ---- */
    unsigned char *hot = malloc(n);
    CHECK(hot != NULL);
    int data_ok = hot_round_trips(dev, hot, check, n, 6, 10);
    CHECKF(data_ok, "hot H2D source: every copy carries its own content");
    int reg = fakecuda_registered(hot, n);
    printf("info: hot buffer registered=%d\n", reg);
    if (drvtest_expect_promotion(n))
        CHECKF(reg == 1, "hot 8 MiB H2D source is promoted (mode %s)", drvtest_mode());
    if (!drvtest_promotes())
        CHECKF(reg == 0, "no promotion without a promoting shim (mode %s)", drvtest_mode());
    if (budget && budget < n)
        CHECKF(reg == 0, "a block larger than the budget (%zu) is never registered", budget);

    /* ---- a small buffer copied again: registered on the copy's path ----
     * Its registration (about 0.1 ms) is quicker than waking the registrar thread may be, so
     * it is done by the copy that finds the block reused: registered when that copy returns. */
    {
        const size_t small_n = 2u << 20;
        unsigned char *small = malloc(small_n);
        CHECK(small != NULL);
        CUdeviceptr dev_small;
        CU(cuMemAlloc(&dev_small, small_n));
        fill_pattern(small, small_n, 50);
        /* Registrations slowed (20 ms): one handed to the registrar is still under way when
         * the copy returns. */
        fakecuda_set_register_delay_us(20000);
        HTOD(dev_small, small, small_n);
        HTOD(dev_small, small, small_n);
        int at_once = fakecuda_registered(small, small_n);
        fakecuda_set_register_delay_us(0);
        printf("info: 2 MiB buffer registered after its second copy=%d\n", at_once);
        if (drvtest_expect_promotion(small_n))
            CHECKF(at_once == 1, "a 2 MiB buffer copied again is registered by that copy, not later (mode %s)",
                   drvtest_mode());
        if (!drvtest_promotes())
            CHECKF(at_once == 0, "no promotion without a promoting shim (mode %s)", drvtest_mode());
#if defined(__x86_64__)
        /* That copy reads the block from memory: it pushed the block's lines out of the caches
         * first (run_all.sh checks the count). */
        printf("EXPECTED_FLUSHED min=%zu\n", drvtest_expect_promotion(small_n) && at_once ? small_n : (size_t)0);
#endif
        memset(check, 0, small_n);
        DTOH(check, dev_small, small_n);
        CHECKF(check_pattern(check, small_n, 50), "2 MiB buffer: the device holds its content");
        cuMemFree(dev_small);
        free(small);
    }

    /* ---- a fresh D2H destination, copied once: its pages were never touched ---- */
    unsigned char *fresh = malloc(n);
    CHECK(fresh != NULL);
    DTOH(fresh, dev, n);
    CHECKF(check_pattern(fresh, n, 15), "fresh D2H destination receives the data");
    CHECKF(!fakecuda_registered(fresh, n), "a fresh untouched D2H destination copied once is not promoted");

    /* ---- part of a big buffer copied back to back by two threads (a ring's first slot) ---- */
    {
        const size_t ring_n = 64u << 20;
        unsigned char *ring = malloc(ring_n);
        CHECK(ring != NULL);
        fill_pattern(ring, ring_n, 40);
        struct ring_job jobs[2] = { { ring, n, 0, 0 }, { ring, n, 0, 0 } };
        pthread_t t[2];
        for (int k = 0; k < 2; k++) {
            CU(cuMemAlloc(&jobs[k].dev, n));
            CHECK(pthread_create(&t[k], NULL, ring_copier, &jobs[k]) == 0);
        }
        /* The copies of the two threads overlap: a copy that stages must not hold the block's
         * background registration off, or it waits for a gap that never comes. */
        unsigned long after = 0;
        while (!after && __atomic_load_n(&ring_copies, __ATOMIC_RELAXED) < 2 * RING_COPIES) {
            if (fakecuda_registered(ring, n))
                after = __atomic_load_n(&ring_copies, __ATOMIC_RELAXED);
            usleep(200);
        }
        for (int k = 0; k < 2; k++) {
            pthread_join(t[k], NULL);
            CHECKF(jobs[k].ok, "thread %d: the first 8 MiB of a 64 MiB buffer, copied back to back: data right", k);
            cuMemFree(jobs[k].dev);
        }
        h2d += 2 * RING_COPIES;
        d2h += 2;
        printf("info: 8 MiB of a 64 MiB buffer copied back to back by 2 threads: registered after %lu copies\n", after);
        if (drvtest_expect_promotion(ring_n))
            CHECKF(after >= 1 && after <= 50,
                   "copied again and again, the buffer is registered within 50 copies (after %lu)", after);
        if (!drvtest_promotes() || (budget && budget < ring_n))
            CHECKF(after == 0, "not registered where the shim may not promote it (after %lu)", after);
        free(ring);
    }

    /* ---- small blocks ---- */
    size_t small_n = drvtest_min_size() / 2;
    if (small_n > (32u << 10))
        small_n = 32u << 10;
    unsigned char *small = malloc(small_n);
    CHECK(small != NULL);
    data_ok = 1;
    for (unsigned i = 0; i < 20; i++) {
        fill_pattern(small, small_n, 40 + i);
        HTOD(dev, small, small_n);
        memset(small, 0, small_n);
        DTOH(small, dev, small_n);
        data_ok &= check_pattern(small, small_n, 40 + i);
    }
    CHECKF(data_ok, "small block (%zu bytes) round trips", small_n);
    CHECKF(!fakecuda_registered(small, small_n), "a block below PINSHIM_MIN_SIZE is never registered");

    /* ---- program-pinned memory ---- */
    unsigned char *ha, *ah;
    CU(cuMemHostAlloc((void **)&ha, n, CU_MEMHOSTALLOC_PORTABLE));
    CU(cuMemAllocHost((void **)&ah, n));
    size_t before = fakecuda_registered_bytes();
    CUstream s;
    CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    data_ok = 1;
    for (unsigned i = 0; i < 5; i++) {
        fill_pattern(ha, n, 60 + i);
        HTOD(dev, ha, n);
        DTOH(ah, dev, n);
        data_ok &= check_pattern(ah, n, 60 + i);
        fill_pattern(ah, n, 70 + i);
        CU(cuMemcpyHtoDAsync(dev, ah, n, s)); h2d++;
        CU(cuMemcpyDtoHAsync(ha, dev, n, s)); d2h++;
        CU(cuStreamSynchronize(s));
        data_ok &= check_pattern(ha, n, 70 + i);
    }
    CHECKF(data_ok, "copies with cuMemHostAlloc / cuMemAllocHost memory are correct");
    CHECKF(!fakecuda_registered(ha, n) && !fakecuda_registered(ah, n),
           "host-alloc memory is never registered by the shim");
    CHECKF(fakecuda_registered_bytes() <= before,
           "copying with program-pinned memory does not grow the registered bytes (%zu -> %zu)",
           before, fakecuda_registered_bytes());

    /* ---- memory the driver allocated for itself: left to the real allocator, never promoted,
     * though the same copies promote the program's own buffer above ---- */
    unsigned char *own = fakecuda_driver_malloc(n);
    CHECK(own != NULL);
    CHECKF(hot_round_trips(dev, own, check, n, 6, 80), "copies from the driver's own memory are correct");
    CHECKF(!fakecuda_registered(own, n), "the driver's own allocation is never promoted");
    fakecuda_driver_free(own);
    unsigned char *own_map = fakecuda_driver_mmap(n);
    CHECK(own_map != NULL);
    CHECKF(hot_round_trips(dev, own_map, check, n, 6, 86), "copies from the driver's own mapping are correct");
    CHECKF(!fakecuda_registered(own_map, n), "the driver's own mapping is never promoted");
    munmap(own_map, n);

    /* ---- read-only H2D sources ---- */
    const size_t ro_n = 4u << 20;
    char path[] = "/tmp/pinshim_ro_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    unlink(path);
    unsigned char *tmp = malloc(ro_n);
    fill_pattern(tmp, ro_n, 90);
    CHECK(write(fd, tmp, ro_n) == (ssize_t)ro_n);
    free(tmp);
    unsigned char *ro = mmap(NULL, ro_n, PROT_READ, MAP_PRIVATE, fd, 0);
    CHECK(ro != MAP_FAILED);
    data_ok = 1;
    for (unsigned i = 0; i < 5; i++) {
        CU(cuMemsetD8(dev, 0, ro_n));
        HTOD(dev, ro, ro_n);
        memset(check, 0, ro_n);
        DTOH(check, dev, ro_n);
        data_ok &= check_pattern(check, ro_n, 90);
    }
    CHECKF(data_ok, "a PROT_READ file mapping copies correctly as an H2D source");
    if (budget && budget < ro_n)
        CHECK(!fakecuda_registered(ro, ro_n));
    munmap(ro, ro_n);
    close(fd);
    CHECKF(!fakecuda_registered(ro, ro_n), "unmapped read-only mapping: no registration left");

    unsigned char *rw = mmap(NULL, ro_n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(rw != MAP_FAILED);
    fill_pattern(rw, ro_n, 91);
    CHECK(mprotect(rw, ro_n, PROT_READ) == 0);
    data_ok = 1;
    for (unsigned i = 0; i < 5; i++) {
        CU(cuMemsetD8(dev, 0, ro_n));
        HTOD(dev, rw, ro_n);
        memset(check, 0, ro_n);
        DTOH(check, dev, ro_n);
        data_ok &= check_pattern(check, ro_n, 91);
    }
    CHECKF(data_ok, "an anonymous mapping made read-only with mprotect copies correctly");
    munmap(rw, ro_n);
    CHECKF(!fakecuda_registered(rw, ro_n), "unmapped mprotect'ed mapping: no registration left");

    /* ---- the hot buffer still works after all that, and goes away cleanly ---- */
    fill_pattern(hot, n, 99);
    HTOD(dev, hot, n);
    memset(fresh, 0, n);
    DTOH(fresh, dev, n);
    CHECKF(check_pattern(fresh, n, 99), "hot buffer still correct at the end");

    free(hot);
    free(fresh);
    free(small);
    CU(cuStreamDestroy(s));
    CU(cuMemFreeHost(ha));
    CU(cuMemFreeHost(ah));
    CU(cuMemFreeHost(check));
    CU(cuMemFree(dev));
    CHECKF(fakecuda_violations() == 0, "no violations (%lu)", fakecuda_violations());
    printf("EXPECTED_COPIES h2d=%lu d2h=%lu d2d=%lu\n", h2d, d2h, d2d);
    return TEST_SUMMARY();
}
