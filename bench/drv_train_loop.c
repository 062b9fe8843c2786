/* drv_train_loop: a training-style loop written against the CUDA driver API only, so that it
 * runs on a real GPU and on the checking fake driver alike.  It is the workload of `make demo`.
 *
 * Each step fills a pageable "batch" on the CPU, copies it to the device (cuMemcpyHtoD), runs a
 * "kernel" (a device-to-device copy of the first result-size bytes of the batch into the result
 * buffer, then an asynchronous memset of a small header of the result on the legacy stream),
 * copies the result back (cuMemcpyDtoH, which must see the memset: ordering) and verifies it.
 *
 *   --reuse    (default) the host buffers live for the whole run
 *   --realloc  the host buffers are malloc'ed and freed every step (alloc-copy-free loop)
 *   --batch SIZE --result SIZE --steps N --warmup N --check sample|full
 *
 * Defaults are small (8 MiB batch, 2 MiB result, 20 steps) so that the loop is quick on the fake
 * driver; use e.g. --batch 64M --result 16M --steps 50 on a GPU.
 * Exit status: 0 ok, 1 data mismatch, 2 CUDA error, 3 bad usage or out of memory. */
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"

#define HEADER_WORDS 1024u /* words of the result the "kernel" memsets */

static int check_cu(CUresult r, const char *what, int line)
{
    if (r == CUDA_SUCCESS)
        return 0;
    const char *name = NULL;
    if (cuGetErrorName(r, &name) != CUDA_SUCCESS || name == NULL)
        name = "?";
    fprintf(stderr, "drv_train_loop: line %d: %s failed: %s (%d)\n", line, what, name, (int)r);
    exit(2);
}
#define CU(call) check_cu((call), #call, __LINE__)

static void usage(void)
{
    fprintf(stderr,
            "usage: drv_train_loop [--reuse|--realloc] [--batch SIZE] [--result SIZE]\n"
            "                      [--steps N] [--warmup N] [--check sample|full] [--quiet]\n");
    exit(3);
}

static void fill_batch(uint32_t *w, size_t words, uint32_t step)
{
    for (size_t i = 0; i < words; i++)
        w[i] = bu_pattern(i, step);
}

static uint32_t header_value(uint32_t step) { return 0xA5000000u | (step & 0xFFFFFFu); }

/* Returns the index of the first wrong word, or (size_t)-1 if the result is right. */
static size_t verify(const uint32_t *res, size_t words, uint32_t step, int full)
{
    const uint32_t hv = header_value(step);
    size_t head = words < HEADER_WORDS ? words : HEADER_WORDS;
    for (size_t i = 0; i < head; i++)
        if (res[i] != hv)
            return i;
    size_t stride = full ? 1 : 997;
    for (size_t i = head; i < words; i += stride)
        if (res[i] != bu_pattern(i, step))
            return i;
    if (words > head && res[words - 1] != bu_pattern(words - 1, step))
        return words - 1;
    return (size_t)-1;
}

int main(int argc, char **argv)
{
    size_t batch = 8u << 20, result = 2u << 20;
    long steps = 20, warmup = 2;
    int realloc_mode = 0, full_check = 0, quiet = 0;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--reuse")) realloc_mode = 0;
        else if (!strcmp(a, "--realloc")) realloc_mode = 1;
        else if (!strcmp(a, "--quiet")) quiet = 1;
        else if (!strcmp(a, "--batch") && i + 1 < argc) { if (bu_parse_size(argv[++i], &batch)) usage(); }
        else if (!strcmp(a, "--result") && i + 1 < argc) { if (bu_parse_size(argv[++i], &result)) usage(); }
        else if (!strcmp(a, "--steps") && i + 1 < argc) steps = atol(argv[++i]);
        else if (!strcmp(a, "--warmup") && i + 1 < argc) warmup = atol(argv[++i]);
        else if (!strcmp(a, "--check") && i + 1 < argc) {
            const char *c = argv[++i];
            if (!strcmp(c, "full")) full_check = 1;
            else if (!strcmp(c, "sample")) full_check = 0;
            else usage();
        } else usage();
    }
    batch &= ~(size_t)3;
    result &= ~(size_t)3;
    if (steps < 1 || warmup < 0 || batch == 0 || result == 0 || result > batch)
        usage();

    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr d_batch, d_result;
    char name[128] = "?";
    CU(cuInit(0));
    CU(cuDeviceGet(&dev, 0));
    CU(cuDeviceGetName(name, (int)sizeof name, dev));
    CU(cuDevicePrimaryCtxRetain(&ctx, dev));
    CU(cuCtxSetCurrent(ctx));
    CU(cuMemAlloc(&d_batch, batch));
    CU(cuMemAlloc(&d_result, result));

    uint32_t *h_batch = NULL, *h_result = NULL;
    const size_t bwords = batch / 4, rwords = result / 4;
    double t0 = 0.0, t_fill = 0.0;
    int bad = 0;

    for (long s = 0; s < warmup + steps; s++) {
        const uint32_t step = (uint32_t)s;
        if (s == warmup)
            t0 = bu_now();
        if (h_batch == NULL) {
            h_batch = malloc(batch);
            h_result = malloc(result);
            if (h_batch == NULL || h_result == NULL) {
                fprintf(stderr, "drv_train_loop: out of host memory\n");
                return 3;
            }
        }
        double tf = bu_now();
        fill_batch(h_batch, bwords, step);
        if (s >= warmup)
            t_fill += bu_now() - tf;

        CU(cuMemcpyHtoD(d_batch, h_batch, batch));
        CU(cuMemcpyDtoD(d_result, d_batch, result));
        size_t head = rwords < HEADER_WORDS ? rwords : HEADER_WORDS;
        CU(cuMemsetD32Async(d_result, header_value(step), head, (CUstream)0));
        CU(cuMemcpyDtoH(h_result, d_result, result));

        size_t at = verify(h_result, rwords, step, full_check || s == warmup + steps - 1);
        if (at != (size_t)-1) {
            fprintf(stderr, "drv_train_loop: MISMATCH at step %ld, word %zu: got 0x%08x\n", s, at,
                    (unsigned)h_result[at]);
            bad = 1;
            break;
        }
        if (realloc_mode) {
            free(h_batch);
            free(h_result);
            h_batch = h_result = NULL;
        }
    }
    CU(cuCtxSynchronize());
    double secs = bu_now() - t0;
    free(h_batch);
    free(h_result);
    CU(cuMemFree(d_batch));
    CU(cuMemFree(d_result));
    CU(cuDevicePrimaryCtxRelease(dev));

    if (bad)
        return 1;
    char b1[32], b2[32];
    if (!quiet)
        printf("drv_train_loop: %s, %s loop, batch %s, result %s, %ld steps: %.3f s, %.2f steps/s, "
               "data verified\n",
               name, realloc_mode ? "alloc-copy-free" : "reuse", bu_size_name(batch, b1, sizeof b1),
               bu_size_name(result, b2, sizeof b2), steps, secs, steps / secs);
    printf("RESULT bench=drv_train_loop variant=%s batch=%zu result=%zu steps=%ld seconds=%.6f "
           "steps_per_s=%.4f fill_seconds=%.6f ok=1\n",
           realloc_mode ? "realloc" : "reuse", batch, result, steps, secs, steps / secs, t_fill);
    return 0;
}
