/* A device array read back the way XLA's GPU client does it (jax's np.asarray): the device copies
 * a piece at a time into one pinned staging buffer, and a host function queued behind each piece
 * copies it with memcpy into a result array that was just allocated (malloc, never touched); the
 * previous result array is freed after the new one is filled.
 *   - every result array holds the device's bytes, in every mode;
 *   - in mode full (PINSHIM_BOUNCE not off) the memcpy calls made on the driver's callback thread
 *     are shared among the copy threads (EXPECTED_BOUNCE, checked by run_all.sh);
 *   - there, with the default budget, a result array after the first two gets the resident pages
 *     of one freed before (mincore): the copy into it faults nothing and its free unmaps nothing.
 *     Its size is above what the heap keeps of freed blocks that no copy filled, so that only the
 *     copies into it can have kept the pages. */
#define _GNU_SOURCE
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>
#include "drvtest.h"
#include "fakecuda.h"

#define M (1ul << 20)
#define N (272 * M)     /* above the 256 MiB the heap keeps of blocks no copy filled */
#define PIECE (N / 4)
#define ROUNDS 4

struct piece { unsigned char *dst; const unsigned char *src; size_t n; };

static void CUDA_CB copy_piece(void *arg)
{
    struct piece *p = arg;
    memcpy(p->dst, p->src, p->n);
}

/* Resident pages of [p, p+n) in percent (whole pages inside the range). */
static int resident_pct(const void *p, size_t n)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = ((uintptr_t)p + pg - 1) & ~(pg - 1), hi = ((uintptr_t)p + n) & ~(pg - 1);
    size_t pages = (hi - lo) / pg, in = 0;
    unsigned char *v = malloc(pages);
    if (!v || mincore((void *)lo, hi - lo, v) != 0) {
        free(v);
        return -1;
    }
    for (size_t i = 0; i < pages; i++)
        in += v[i] & 1;
    free(v);
    return (int)(in * 100 / pages);
}

int main(void)
{
    drvtest_init();
    printf("mode=%s\n", drvtest_mode());
    const char *bounce = getenv("PINSHIM_BOUNCE");
    int shares = strcmp(drvtest_mode(), "full") == 0 && !(bounce && strcmp(bounce, "off") == 0);
    printf("EXPECTED_BOUNCE shared=%d\n", shares);
    /* The heap keeps filled blocks within a quarter of the budget, by default a quarter of RAM. */
    long ram_pages = sysconf(_SC_PHYS_PAGES), pg = sysconf(_SC_PAGESIZE);
    int expect_resident = shares && !getenv("PINSHIM_BUDGET") && ram_pages > 0 &&
                          (uint64_t)ram_pages * (uint64_t)pg / 16 >= 2 * N;

    unsigned char *ref = malloc(N), *stage;
    fill_pattern(ref, N, 7);
    CUdeviceptr dev;
    CUstream s;
    CU(cuMemAlloc(&dev, N));
    CU(cuMemcpyHtoD(dev, ref, N));
    /* A pageable cuMemcpyHtoD may return before its DMA lands, and s does not wait for the
     * legacy stream (non-blocking, as XLA's are): finish the upload before reading it back. */
    CU(cuCtxSynchronize());
    CU(cuMemHostAlloc((void **)&stage, PIECE, 0));
    CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));

    unsigned char *prev = NULL;
    int all_same = 1, resident_ok = 1;
    for (int r = 0; r < ROUNDS; r++) {
        unsigned char *out = malloc(N);
        if (!out) {
            printf("FAIL malloc of %lu bytes\n", N);
            return 1;
        }
        int pct = resident_pct(out, N);
        printf("round %d: result array %d%% resident before the copy\n", r, pct);
        if (expect_resident && r >= 2 && pct != 100)
            resident_ok = 0;
        struct piece pieces[N / PIECE];
        for (size_t k = 0; k < N / PIECE; k++) {
            pieces[k] = (struct piece){ out + k * PIECE, stage, PIECE };
            CU(cuMemcpyDtoHAsync(stage, dev + k * PIECE, PIECE, s));
            CU(cuLaunchHostFunc(s, copy_piece, &pieces[k]));
        }
        CU(cuStreamSynchronize(s));
        if (memcmp(out, ref, N) != 0)
            all_same = 0;
        free(prev);   /* the previous result, released once the new one is made */
        prev = out;
    }
    free(prev);
    CHECKF(all_same, "every result array holds the device's bytes (%d rounds of %lu MiB in %lu pieces)", ROUNDS,
           N / M, N / PIECE);
    if (expect_resident)
        CHECKF(resident_ok, "a result array after the first two gets the resident pages of a freed one");
    else
        printf("(residency not checked: mode %s, PINSHIM_BOUNCE %s, PINSHIM_BUDGET %s)\n", drvtest_mode(),
               bounce ? bounce : "unset", getenv("PINSHIM_BUDGET") ? getenv("PINSHIM_BUDGET") : "unset");
    CHECKF(fakecuda_violations() == 0, "no violations (%lu)", fakecuda_violations());
    cuStreamDestroy(s);
    cuMemFreeHost(stage);
    cuMemFree(dev);
    free(ref);
    return TEST_SUMMARY();
}
