/* A host function queued on a stream rewrites the pageable source of a host-to-device copy
 * queued after it.  The driver stages pageable memory at the call (the device gets the bytes as
 * they were) or waits for the stream first (it gets the function's bytes); either way the device
 * holds one whole version of the buffer, never a mix of both.  A library that stages large
 * pageable copies in chunks of its own must keep that.
 * 64 and 256 MiB; async on the legacy stream, the per-thread stream and created blocking and
 * non-blocking streams; sync on the legacy stream (after a function on it or on a blocking
 * stream, which the legacy stream waits for) and on the per-thread stream.  The host function
 * starts at different moments relative to the copy (it waits a little before writing). */
#define _GNU_SOURCE
#include <stdint.h>
#include <time.h>
#include <unistd.h>
#include "drvtest.h"
#include "fakecuda.h"

#define MAXN ((size_t)256 << 20)

static unsigned char *src;    /* pageable */
static size_t cur_n;
static unsigned wait_us;

static void CUDA_CB rewrite(void *ud)
{
    if (wait_us) usleep(wait_us);
    fill_pattern(src, cur_n, (unsigned)(uintptr_t)ud);
}

enum { A_LEGACY, A_PTDS, A_BLOCKING, A_NONBLOCKING, S_LEGACY, S_BLOCKING_THEN_LEGACY, S_PTDS, NWAY };
static const char *const wname[NWAY] = {
    "async, legacy stream", "async, per-thread stream", "async, created blocking stream",
    "async, created non-blocking stream", "sync, legacy stream", "sync, function on a blocking stream",
    "sync, per-thread stream",
};

int main(void)
{
    drvtest_init();
    printf("mode=%s\n", drvtest_mode());
    CUdeviceptr dev;
    CU(cuMemAlloc(&dev, MAXN));
    unsigned char *back;
    CU(cuMemHostAlloc((void **)&back, MAXN, 0));
    src = malloc(MAXN);
    CUstream blk, nb;
    CU(cuStreamCreate(&blk, CU_STREAM_DEFAULT));
    CU(cuStreamCreate(&nb, CU_STREAM_NON_BLOCKING));
    static const size_t sizes[] = { (size_t)64 << 20, MAXN };
    static const unsigned waits[] = { 0, 2000, 20000 };
    unsigned seed = 1;
    for (int k = 0; k < 2; k++) {
        size_t n = sizes[k];
        for (int w = 0; w < NWAY; w++) {
            int olds = 0, news = 0, mixed = 0;
            int reps = k ? 2 : 3;
            for (int rep = 0; rep < reps; rep++) {
                unsigned old_seed = seed++, new_seed = seed++;
                cur_n = n;
                wait_us = waits[rep];
                fill_pattern(src, n, old_seed);
                CU(cuMemsetD8(dev, 0, n));
                CU(cuCtxSynchronize());
                void *ud = (void *)(uintptr_t)new_seed;
                switch (w) {
                case A_LEGACY: CU(cuLaunchHostFunc(CU_STREAM_LEGACY, rewrite, ud));
                    CU(cuMemcpyHtoDAsync(dev, src, n, CU_STREAM_LEGACY)); break;
                case A_PTDS: CU(cuLaunchHostFunc(CU_STREAM_PER_THREAD, rewrite, ud));
                    CU(cuMemcpyHtoDAsync(dev, src, n, CU_STREAM_PER_THREAD)); break;
                case A_BLOCKING: CU(cuLaunchHostFunc(blk, rewrite, ud));
                    CU(cuMemcpyHtoDAsync(dev, src, n, blk)); break;
                case A_NONBLOCKING: CU(cuLaunchHostFunc(nb, rewrite, ud));
                    CU(cuMemcpyHtoDAsync(dev, src, n, nb)); break;
                case S_LEGACY: CU(cuLaunchHostFunc(NULL, rewrite, ud));
                    CU(cuMemcpyHtoD(dev, src, n)); break;
                case S_BLOCKING_THEN_LEGACY: CU(cuLaunchHostFunc(blk, rewrite, ud));
                    CU(cuMemcpyHtoD(dev, src, n)); break;
                default: CU(cuLaunchHostFunc_ptsz(NULL, rewrite, ud));
                    CU(cuMemcpyHtoD_v2_ptds(dev, src, n)); break;
                }
                /* the function may still be writing the source: the host waits for it before
                 * reading anything back */
                CU(cuCtxSynchronize());
                memset(back, 0, n);
                CU(cuMemcpyDtoH(back, dev, n));
                if (check_pattern(back, n, old_seed)) olds++;
                else if (check_pattern(back, n, new_seed)) news++;
                else mixed++;
            }
            CHECKF(mixed == 0, "%zu MiB, %s: the device holds one whole version (%d old, %d new, %d mixed)",
                   n >> 20, wname[w], olds, news, mixed);
        }
    }
    CU(cuStreamDestroy(blk));
    CU(cuStreamDestroy(nb));
    free(src);
    CU(cuMemFreeHost(back));
    CU(cuMemFree(dev));
    CHECKF(fakecuda_violations() == 0, "no violations (%lu)", fakecuda_violations());
    return TEST_SUMMARY();
}
