/* The pinned cache on free beside a program that keeps copying.
 *
 * A checkpoint's CPU tensors, freed together, are queued to be registered and cached for the
 * next round.  Registering holds off the program's driver calls while it runs, so a burst of
 * those registrations waits for a pause in the program's copies (a twentieth of the time at
 * most while the copies go on; a few waiting blocks are registered at once), and an allocation
 * that comes before a queued block's turn gets that block back, unregistered but resident,
 * rather than fresh pages.
 *
 * Part 1: a slow registrar (each registration 40 ms): a round of blocks beyond what the cache
 * holds is freed, then a round of the same size allocated at once: the allocations get the freed
 * blocks back (same addresses; all but the four freed first), unregistered; their copies land;
 * freed again, they are queued again and registered once the program pauses.
 * Part 2: a thread copies without pause while a round of freed blocks waits: few of them are
 * registered while it copies (each registration here takes 4 ms: at most one per 80 ms), all of
 * them once it stops.
 * Part 3: beside the same copies, a buffer allocated, copied once and freed every step: the few
 * blocks waiting at a time are registered at once, and later steps get registered buffers. */
#include <pthread.h>
#include "drvtest.h"
#include "fakecuda.h"

#define BLOCKS 16
#define BLOCK_BYTES (512u << 10)

static CUdeviceptr dev[BLOCKS];
static long d2h;
static int ok = 1;

/* BLOCKS destinations allocated and filled from the device, as a checkpoint round does; the
 * number of them registered when allocated. */
static int fill(unsigned char **out)
{
    int registered = 0, allocated = 1;
    for (int i = 0; i < BLOCKS; i++) {
        out[i] = malloc(BLOCK_BYTES);
        if (!out[i]) {
            allocated = 0;
            break;
        }
        registered += fakecuda_registered(out[i], BLOCK_BYTES);
        CU(cuMemcpyDtoH(out[i], dev[i], BLOCK_BYTES));
        ok &= check_pattern(out[i], BLOCK_BYTES, (unsigned)i);
        d2h++;
    }
    CHECKF(allocated, "a round's allocations succeed");
    return registered;
}

static void release(unsigned char **p)
{
    for (int i = 0; i < BLOCKS; i++)
        free(p[i]);
}

static int count_registered(unsigned char **p)
{
    int n = 0;
    for (int i = 0; i < BLOCKS; i++)
        n += fakecuda_registered(p[i], BLOCK_BYTES);
    return n;
}

static int copier_stop;   /* atomic */

static void *copier(void *arg)
{
    CUcontext ctx = arg;
    CU(cuCtxSetCurrent(ctx));
    size_t n = 1u << 20;
    unsigned char *src = malloc(n);
    CUdeviceptr d;
    CU(cuMemAlloc(&d, n));
    memset(src, 7, n);
    long copies = 0;
    while (!__atomic_load_n(&copier_stop, __ATOMIC_RELAXED)) {
        CU(cuMemcpyHtoD(d, src, n));
        copies++;
    }
    CU(cuMemFree(d));
    free(src);
    return (void *)copies;
}

int main(void)
{
    CUcontext ctx = drvtest_init();
    unsigned char *seed = malloc(BLOCK_BYTES);
    CHECK(seed != NULL);
    for (int i = 0; i < BLOCKS; i++) {
        fill_pattern(seed, BLOCK_BYTES, (unsigned)i);
        CU(cuMemAlloc(&dev[i], BLOCK_BYTES));
        CU(cuMemcpyHtoD(dev[i], seed, BLOCK_BYTES));
    }
    free(seed);
    int expect = drvtest_expect_promotion(BLOCK_BYTES);
    unsigned char *x[BLOCKS], *y[BLOCKS], *z[BLOCKS];

    /* Rounds that show the demand: after them, this size is cached on free. */
    for (int r = 0; r < 3; r++) {
        drvtest_wait_registrations_settled();
        fill(x);
        release(x);
    }
    drvtest_wait_registrations_settled();

    /* ---- part 1: allocations before the registrar's turn ---- */
    fakecuda_set_register_delay_us(40000);
    fill(x);      /* held: the cache's blocks */
    fill(y);      /* beyond what the cache held: unregistered */
    int y_registered = count_registered(y);
    release(y);   /* queued behind a registrar that takes 40 ms a block */
    int reg = fill(z);
    int same = 0;
    for (int i = 0; i < BLOCKS; i++)
        for (int j = 0; j < BLOCKS; j++)
            same += z[i] == y[j];
    printf("info: part 1: %d of %d allocations got a queued block back, %d registered when allocated\n",
           same, BLOCKS, reg);
    if (expect) {
        CHECKF(y_registered == 0, "a round beyond the cache's blocks gets unregistered ones (%d)", y_registered);
        /* All but the four freed first, which are left to the registrar (so that a buffer freed
         * every step still ends up cached), and one it may have begun. */
        CHECKF(same >= BLOCKS - 5, "allocations before the registrar's turn get those blocks back (%d of %d)",
               same, BLOCKS);
        CHECKF(reg <= 2, "unregistered (%d of %d registered)", reg, BLOCKS);
    }
    release(z);   /* freed again: queued again */
    release(x);
    fakecuda_set_register_delay_us(0);
    drvtest_wait_registrations_settled();
    int z_after = count_registered(z);
    printf("info: part 1: %d of %d blocks handed back then freed again are registered once the program pauses\n",
           z_after, BLOCKS);
    if (expect)
        CHECKF(z_after == BLOCKS, "blocks handed back and freed again are registered and cached (%d of %d)",
               z_after, BLOCKS);

    /* ---- part 2: a program that copies without pause ---- */
    fakecuda_set_register_delay_us(4000);
    fill(x);      /* the cache's blocks */
    fill(z);
    fill(y);      /* beyond them: unregistered (but for one the cache may still have had) */
    int before = count_registered(y);
    __atomic_store_n(&copier_stop, 0, __ATOMIC_RELAXED);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, copier, ctx) == 0);
    drvtest_sleep_ms(20);
    release(y);
    drvtest_sleep_ms(400);
    int during = count_registered(y) - before;
    __atomic_store_n(&copier_stop, 1, __ATOMIC_RELAXED);
    void *copies;
    pthread_join(t, &copies);
    drvtest_wait_registrations_settled();
    int after = count_registered(y);
    printf("info: part 2: %d of %d freed blocks registered beside 400 ms of the program's copies (%ld "
           "copies, %d registered before), %d once it stopped\n", during, BLOCKS - before, (long)copies,
           before, after);
    if (expect) {
        /* One 4 ms registration per 80 ms while the copies go on (and one more where the copying
         * thread's own hiccups looked like a pause): well under all of them. */
        CHECKF(during <= BLOCKS / 2, "the registrar holds freed blocks off while the program copies (%d of %d)",
               during, BLOCKS);
        CHECKF(after == BLOCKS, "and registers them all once it stops (%d of %d)", after, BLOCKS);
    }
    release(x);
    release(z);
    fakecuda_set_register_delay_us(0);
    drvtest_wait_registrations_settled();

    /* ---- part 3: a buffer allocated, copied once and freed every step, beside copies that
     * never pause: a block or two wait at a time, registered at once, and the steps after find
     * them cached ---- */
    fakecuda_set_register_delay_us(1000);
    __atomic_store_n(&copier_stop, 0, __ATOMIC_RELAXED);
    CHECK(pthread_create(&t, NULL, copier, ctx) == 0);
    const size_t n3 = 768u << 10;   /* a size no part above used */
    int steps = 48, cached_steps = 0, step_ok = 1;
    for (int i = 0; i < steps; i++) {
        unsigned char *p = malloc(n3);
        if (!p) {
            step_ok = 0;
            break;
        }
        cached_steps += i >= steps / 2 && fakecuda_registered(p, n3);
        fill_pattern(p, n3, 500u + (unsigned)i);
        CU(cuMemcpyHtoD(dev[0], p, BLOCK_BYTES));   /* dev[0] is not read again */
        free(p);
    }
    __atomic_store_n(&copier_stop, 1, __ATOMIC_RELAXED);
    void *copies3;
    pthread_join(t, &copies3);
    fakecuda_set_register_delay_us(0);
    drvtest_wait_registrations_settled();
    printf("info: part 3: %d of the last %d steps' buffers came registered\n", cached_steps, steps / 2);
    CHECKF(step_ok, "every step's allocation succeeds");
    if (drvtest_expect_promotion(BLOCK_BYTES))
        CHECKF(cached_steps >= steps / 4, "a buffer freed every step is cached beside copies that never pause "
               "(%d of the last %d steps)", cached_steps, steps / 2);
    CHECKF(ok, "every round's copies carry the device's bytes");
    CHECKF(fakecuda_violations() == 0, "the fake saw no violations (%lu)", fakecuda_violations());
    for (int i = 0; i < BLOCKS; i++)
        CU(cuMemFree(dev[i]));
    printf("EXPECTED_COPIES h2d=%ld d2h=%ld d2d=0\n", BLOCKS + (long)copies + (long)copies3 + steps, d2h);
    return TEST_SUMMARY();
}
