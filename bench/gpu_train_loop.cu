// gpu_train_loop: a training-style loop with the CUDA runtime.
//
// Each step fills a host batch on the CPU (a cheap loop), copies it H2D with cudaMemcpy, runs a
// small kernel that writes a result from the batch, copies the result D2H and checks it
// (a sample of the words every step, all of them on the last step).
//   --reuse    (default) the host buffers live for the whole run
//   --realloc  they are malloc'ed and freed every step: the alloc-copy-free loop
//   --pinned   host buffers from cudaMallocHost (reference; with --reuse only)
//   --batch SIZE (64M) --result SIZE (16M) --steps N (50) --warmup N (3)
// Prints "RESULT bench=train_loop ... steps_per_s=..." on stdout.
// Exit status: 0 ok, 1 data mismatch, 2 CUDA error, 3 bad usage.
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"

#define CK(call)                                                                              \
    do {                                                                                      \
        cudaError_t e_ = (call);                                                              \
        if (e_ != cudaSuccess) {                                                              \
            fprintf(stderr, "gpu_train_loop: %s:%d: %s: %s\n", __FILE__, __LINE__, #call,    \
                    cudaGetErrorString(e_));                                                  \
            exit(2);                                                                          \
        }                                                                                     \
    } while (0)

__global__ void step_kernel(const uint32_t *batch, uint32_t *result, size_t n, uint32_t step)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        result[i] = batch[i] * 3u + step;
}

static uint32_t expect(size_t i, uint32_t step) { return bu_pattern(i, step) * 3u + step; }

static void usage()
{
    fprintf(stderr, "usage: gpu_train_loop [--reuse|--realloc] [--pinned] [--batch SIZE] "
                    "[--result SIZE] [--steps N] [--warmup N] [--fill-stride N]\n");
    exit(3);
}

static void *host_alloc(size_t n, bool pinned)
{
    void *p = NULL;
    if (pinned)
        CK(cudaMallocHost(&p, n));
    else if ((p = malloc(n)) == NULL) {
        fprintf(stderr, "gpu_train_loop: out of host memory\n");
        exit(3);
    }
    return p;
}

static void host_release(void *p, bool pinned)
{
    if (pinned)
        CK(cudaFreeHost(p));
    else
        free(p);
}

int main(int argc, char **argv)
{
    size_t batch = 64u << 20, result = 16u << 20;
    int steps = 50, warmup = 3;
    /* The CPU fills every fill_stride-th word of the batch (and checks only those): 1 is a
     * CPU-heavy step; 1024 (one word per 4 KiB page, every page still written) makes the loop
     * transfer-bound, the case pinning is for. */
    size_t fill_stride = 1;
    bool realloc_mode = false, pinned = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--reuse")) realloc_mode = false;
        else if (!strcmp(a, "--realloc")) realloc_mode = true;
        else if (!strcmp(a, "--pinned")) pinned = true;
        else if (!strcmp(a, "--batch") && i + 1 < argc) { if (bu_parse_size(argv[++i], &batch)) usage(); }
        else if (!strcmp(a, "--result") && i + 1 < argc) { if (bu_parse_size(argv[++i], &result)) usage(); }
        else if (!strcmp(a, "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(a, "--warmup") && i + 1 < argc) warmup = atoi(argv[++i]);
        else if (!strcmp(a, "--fill-stride") && i + 1 < argc) fill_stride = (size_t)atol(argv[++i]);
        else usage();
    }
    batch &= ~(size_t)3;
    result &= ~(size_t)3;
    if (steps < 1 || warmup < 0 || result == 0 || result > batch || (pinned && realloc_mode) || fill_stride < 1)
        usage();

    CK(cudaSetDevice(0));
    CK(cudaFree(0));
    uint32_t *d_batch, *d_result, *h_batch = NULL, *h_result = NULL;
    CK(cudaMalloc(&d_batch, batch));
    CK(cudaMalloc(&d_result, result));
    const size_t bw = batch / 4, rw = result / 4;
    double t0 = 0.0;
    int ok = 1;

    for (int s = 0; s < warmup + steps && ok; s++) {
        const uint32_t step = (uint32_t)s;
        if (s == warmup) {
            CK(cudaDeviceSynchronize());
            t0 = bu_now();
        }
        if (h_batch == NULL) {
            h_batch = (uint32_t *)host_alloc(batch, pinned);
            h_result = (uint32_t *)host_alloc(result, pinned);
        }
        for (size_t i = 0; i < bw; i += fill_stride)
            h_batch[i] = bu_pattern(i, step);
        CK(cudaMemcpy(d_batch, h_batch, batch, cudaMemcpyHostToDevice));
        step_kernel<<<264, 512>>>(d_batch, d_result, rw, step);
        CK(cudaGetLastError());
        CK(cudaMemcpy(h_result, d_result, result, cudaMemcpyDeviceToHost));
        size_t stride = fill_stride > 1 ? fill_stride : s == warmup + steps - 1 ? 1 : 1009;
        for (size_t i = 0; i < rw; i += stride)
            if (h_result[i] != expect(i, step)) {
                fprintf(stderr, "gpu_train_loop: MISMATCH at step %d word %zu: 0x%08x != 0x%08x\n", s,
                        i, h_result[i], expect(i, step));
                ok = 0;
                break;
            }
        if (fill_stride == 1 && h_result[rw - 1] != expect(rw - 1, step))
            ok = 0;
        if (realloc_mode) {
            host_release(h_batch, pinned);
            host_release(h_result, pinned);
            h_batch = h_result = NULL;
        }
    }
    CK(cudaDeviceSynchronize());
    double secs = bu_now() - t0;
    if (h_batch) {
        host_release(h_batch, pinned);
        host_release(h_result, pinned);
    }
    CK(cudaFree(d_batch));
    CK(cudaFree(d_result));
    if (!ok)
        return 1;
    const char *variant = realloc_mode ? "realloc" : "reuse";
    fprintf(stderr, "gpu_train_loop: %s%s: %d steps in %.3f s, %.2f steps/s\n", variant,
            pinned ? " (cudaMallocHost)" : "", steps, secs, steps / secs);
    printf("RESULT bench=train_loop variant=%s host=%s batch=%zu result=%zu steps=%d seconds=%.6f "
           "steps_per_s=%.4f ok=1\n",
           variant, pinned ? "pinned" : "pageable", batch, result, steps, secs, steps / secs);
    return 0;
}
