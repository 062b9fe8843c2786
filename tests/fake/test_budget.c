/* Contract rule 7: the budget is a hard ceiling on the bytes the shim keeps registered, at every
 * instant, under concurrent load.  8 threads each run 200 steps: malloc a random size in
 * 64 KiB..4 MiB, fill, copy H2D 1-3 times (sync legacy or async on the thread's own stream),
 * D2H and check, sometimes realloc (content kept, copied again), free.  A sampler thread reads the
 * registered bytes every 100 us.  With PINSHIM_BUDGET set in bytes, the sampled maximum and the
 * driver's peak stay within it (percentages and an unset budget: no ceiling to check).  Data
 * always correct, no violations.  The seed is printed; TEST_SEED=N repeats a run. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>
#include "drvtest.h"
#include "fakecuda.h"

#define THREADS 8
#define STEPS 200
#define MIN_SZ (64u << 10)
#define MAX_SZ (4u << 20)

static CUcontext ctx;
static unsigned base_seed;
static int trust;
static volatile int stop_sampler;
static size_t sampled_max;
static unsigned long samples;
static unsigned long h2d_total, d2h_total;

struct worker {
    int id;
    int data_ok;
    int calls_ok;
};

/* Contents: a 64-bit tag every 512 bytes (and at the very end), derived from a per-step key:
 * wrong, stale or misplaced data shows at 512-byte granularity while the test itself moves few
 * bytes (the fake driver already copies every byte twice or three times). */
#define TAG_STRIDE 512u

static uint64_t tag_at(uint64_t key, size_t off)
{
    uint64_t h = key ^ (off * 0x9E3779B97F4A7C15ull);
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9ull;
    return h ^ (h >> 29);
}

static size_t tag_len(size_t sz, size_t off)
{
    return sz - off < 8 ? sz - off : 8;
}

static void tag_fill(unsigned char *p, size_t sz, uint64_t key)
{
    for (size_t off = 0; off < sz; off += TAG_STRIDE) {
        uint64_t t = tag_at(key, off);
        memcpy(p + off, &t, tag_len(sz, off));
    }
    uint64_t t = tag_at(key, sz);
    size_t l = sz < 8 ? sz : 8;
    memcpy(p + sz - l, &t, l);
}

static int tag_check(const unsigned char *p, size_t sz, uint64_t key)
{
    uint64_t t = tag_at(key, sz);
    size_t l = sz < 8 ? sz : 8;
    if (memcmp(p + sz - l, &t, l) != 0)
        return 0;
    for (size_t off = 0; off + 8 < sz - l; off += TAG_STRIDE) {
        t = tag_at(key, off);
        if (memcmp(p + off, &t, 8) != 0)
            return 0;
    }
    return 1;
}

static void tag_clear(unsigned char *p, size_t sz)
{
    for (size_t off = 0; off < sz; off += TAG_STRIDE)
        memset(p + off, 0, tag_len(sz, off));
    size_t l = sz < 8 ? sz : 8;
    memset(p + sz - l, 0, l);
}

static size_t random_size(unsigned *seed)
{
    /* about log-uniform over 64 KiB..4 MiB, not page multiples */
    unsigned shift = (unsigned)(rand_r(seed) % 7);          /* 2^16 .. 2^22 */
    size_t sz = (size_t)MIN_SZ << shift;
    sz += (size_t)rand_r(seed) % (sz / 2);
    sz -= (size_t)rand_r(seed) % 4096;
    if (sz > MAX_SZ)
        sz = MAX_SZ;
    if (sz < MIN_SZ)
        sz = MIN_SZ;
    return sz;
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    unsigned seed = base_seed * 7919u + (unsigned)w->id;
    unsigned long hc = 0, dc = 0;
    w->data_ok = w->calls_ok = 1;
    if (cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
        w->calls_ok = 0;
        return NULL;
    }
    CUdeviceptr dev;
    CUstream s;
    if (cuMemAlloc(&dev, MAX_SZ) != CUDA_SUCCESS || cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
        w->calls_ok = 0;
        return NULL;
    }
    for (unsigned step = 0; step < STEPS; step++) {
        size_t sz = random_size(&seed);
        uint64_t key = ((uint64_t)base_seed << 32) ^ ((uint64_t)w->id << 20) ^ step;
        unsigned char *p = malloc(sz);
        if (!p) {
            w->data_ok = 0;
            break;
        }
        tag_fill(p, sz, key);
        int copies = 1 + rand_r(&seed) % 3;
        int use_async = rand_r(&seed) % 2;
        CUresult r = CUDA_SUCCESS;
        for (int c = 0; c < copies && r == CUDA_SUCCESS; c++) {
            r = use_async ? cuMemcpyHtoDAsync(dev, p, sz, s) : cuMemcpyHtoD(dev, p, sz);
            hc++;
        }
        /* PINSHIM_TRUST_ASYNC=1 is documented unsafe for programs that reuse a buffer before
         * syncing: a program running under it syncs first. */
        if (r == CUDA_SUCCESS && use_async && trust)
            r = cuStreamSynchronize(s);
        tag_clear(p, sz);
        if (r == CUDA_SUCCESS) {
            r = use_async ? cuMemcpyDtoHAsync(p, dev, sz, s) : cuMemcpyDtoH(p, dev, sz);
            dc++;
        }
        if (r == CUDA_SUCCESS && use_async)
            r = cuStreamSynchronize(s);
        if (r != CUDA_SUCCESS)
            w->calls_ok = 0;
        if (!tag_check(p, sz, key))
            w->data_ok = 0;
        if (rand_r(&seed) % 6 == 0) {
            size_t nsz = random_size(&seed);
            unsigned char *q = realloc(p, nsz);
            if (!q) {
                w->data_ok = 0;
            } else {
                p = q;
                size_t keep = sz < nsz ? sz : nsz;
                /* the kept prefix: every tag that lies wholly inside it */
                for (size_t off = 0; off + 8 <= keep && off + 8 < sz - (sz < 8 ? sz : 8); off += TAG_STRIDE) {
                    uint64_t t = tag_at(key, off);
                    if (memcmp(p + off, &t, 8) != 0)
                        w->data_ok = 0;
                }
                key ^= 0x5555555555555555ull;
                tag_fill(p, nsz, key);
                if (cuMemcpyHtoD(dev, p, nsz) != CUDA_SUCCESS)
                    w->calls_ok = 0;
                hc++;
                tag_clear(p, nsz);
                if (cuMemcpyDtoH(p, dev, nsz) != CUDA_SUCCESS)
                    w->calls_ok = 0;
                dc++;
                if (!tag_check(p, nsz, key))
                    w->data_ok = 0;
            }
        }
        free(p);
    }
    cuStreamDestroy(s);
    cuMemFree(dev);
    __atomic_add_fetch(&h2d_total, hc, __ATOMIC_RELAXED);
    __atomic_add_fetch(&d2h_total, dc, __ATOMIC_RELAXED);
    return NULL;
}

static void *sampler_main(void *arg)
{
    (void)arg;
    while (!__atomic_load_n(&stop_sampler, __ATOMIC_ACQUIRE)) {
        size_t v = fakecuda_registered_bytes();
        if (v > sampled_max)
            sampled_max = v;
        samples++;
        usleep(100);
    }
    return NULL;
}

int main(void)
{
    ctx = drvtest_init();
    const char *seed_env = getenv("TEST_SEED");
    base_seed = seed_env ? (unsigned)strtoul(seed_env, NULL, 10) : (unsigned)time(NULL);
    trust = drvtest_trust_async();
    size_t budget = drvtest_shim_loaded() ? drvtest_budget() : 0;
    printf("mode=%s seed=%u budget=%zu%s\n", drvtest_mode(), base_seed, budget,
           budget ? "" : " (no byte ceiling to check)");
    fakecuda_reset_registered_peak();

    pthread_t sampler, th[THREADS];
    struct worker w[THREADS];
    pthread_create(&sampler, NULL, sampler_main, NULL);
    for (int i = 0; i < THREADS; i++) {
        w[i].id = i;
        pthread_create(&th[i], NULL, worker_main, &w[i]);
    }
    int data_ok = 1, calls_ok = 1;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(th[i], NULL);
        data_ok &= w[i].data_ok;
        calls_ok &= w[i].calls_ok;
    }
    __atomic_store_n(&stop_sampler, 1, __ATOMIC_RELEASE);
    pthread_join(sampler, NULL);

    size_t peak = fakecuda_registered_bytes_peak();
    printf("info: %lu samples, sampled max %zu, driver peak %zu, now %zu\n", samples, sampled_max, peak,
           fakecuda_registered_bytes());
    CHECKF(calls_ok, "every driver call succeeded");
    CHECKF(data_ok, "every copy and realloc kept the data (seed %u)", base_seed);
    if (budget) {
        CHECKF(sampled_max <= budget, "sampled registered bytes %zu <= budget %zu", sampled_max, budget);
        CHECKF(peak <= budget, "driver's registered-bytes peak %zu <= budget %zu", peak, budget);
    }
    if (!drvtest_promotes())
        CHECKF(peak == 0, "nothing registered without a promoting shim (peak %zu)", peak);
    CHECKF(fakecuda_violations() == 0, "no violations (%lu)", fakecuda_violations());
    printf("EXPECTED_COPIES h2d=%lu d2h=%lu d2d=0\n", h2d_total, d2h_total);
    return TEST_SUMMARY();
}
