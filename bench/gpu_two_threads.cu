// gpu_two_threads: N host threads copying at once with plain cudaMemcpy, even threads H2D and
// odd threads D2H, each with its own host and device buffer.  Without the shim every cudaMemcpy
// goes to the legacy default stream, so the two directions serialize; the shim moves them to
// per-thread non-blocking streams.
//   --threads N (2) --size SIZE (256M) --iters N (10 per thread per timing) --reps N (3)
//   --kind pinned|pageable (pinned: cudaMallocHost; pageable: malloc)
// Prints "RESULT bench=two_threads ... gbps=..." (aggregate GB/s, median of reps).
// Exit status: 0 ok, 1 data mismatch, 2 CUDA error, 3 bad usage.
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "bench_util.h"

#define CK(call)                                                                              \
    do {                                                                                      \
        cudaError_t e_ = (call);                                                              \
        if (e_ != cudaSuccess) {                                                              \
            fprintf(stderr, "gpu_two_threads: %s:%d: %s: %s\n", __FILE__, __LINE__, #call,   \
                    cudaGetErrorString(e_));                                                  \
            exit(2);                                                                          \
        }                                                                                     \
    } while (0)

struct worker {
    pthread_t tid;
    int index;
    bool h2d;
    uint32_t *host;
    void *dev;
    double busy_s; // this thread's time copying, last rep
};

static int g_threads = 2, g_iters = 10, g_reps = 3;
static size_t g_size = 256u << 20;
static bool g_pinned = true;
static pthread_barrier_t g_start, g_done;

static void *run(void *arg)
{
    worker *w = (worker *)arg;
    CK(cudaSetDevice(0));
    for (int i = 0; i < 2; i++) // warm-up (and, under the shim, promotion)
        CK(w->h2d ? cudaMemcpy(w->dev, w->host, g_size, cudaMemcpyHostToDevice)
                  : cudaMemcpy(w->host, w->dev, g_size, cudaMemcpyDeviceToHost));
    for (int r = 0; r < g_reps; r++) {
        pthread_barrier_wait(&g_start);
        double t0 = bu_now();
        for (int i = 0; i < g_iters; i++)
            CK(w->h2d ? cudaMemcpy(w->dev, w->host, g_size, cudaMemcpyHostToDevice)
                      : cudaMemcpy(w->host, w->dev, g_size, cudaMemcpyDeviceToHost));
        w->busy_s = bu_now() - t0;
        pthread_barrier_wait(&g_done);
    }
    return NULL;
}

static void usage()
{
    fprintf(stderr, "usage: gpu_two_threads [--threads N] [--size SIZE] [--iters N] [--reps N] "
                    "[--kind pinned|pageable]\n");
    exit(3);
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (i + 1 >= argc) usage();
        const char *v = argv[++i];
        if (!strcmp(a, "--threads")) g_threads = atoi(v);
        else if (!strcmp(a, "--size")) { if (bu_parse_size(v, &g_size)) usage(); }
        else if (!strcmp(a, "--iters")) g_iters = atoi(v);
        else if (!strcmp(a, "--reps")) g_reps = atoi(v);
        else if (!strcmp(a, "--kind")) {
            if (!strcmp(v, "pinned")) g_pinned = true;
            else if (!strcmp(v, "pageable")) g_pinned = false;
            else usage();
        } else usage();
    }
    g_size &= ~(size_t)3;
    if (g_threads < 1 || g_threads > 64 || g_iters < 1 || g_reps < 1 || g_size == 0)
        usage();

    CK(cudaSetDevice(0));
    CK(cudaFree(0));
    std::vector<worker> w(g_threads);
    const size_t words = g_size / 4;
    for (int t = 0; t < g_threads; t++) {
        w[t].index = t;
        w[t].h2d = t % 2 == 0;
        if (g_pinned)
            CK(cudaMallocHost((void **)&w[t].host, g_size));
        else if ((w[t].host = (uint32_t *)malloc(g_size)) == NULL) {
            fprintf(stderr, "gpu_two_threads: out of host memory\n");
            return 3;
        }
        CK(cudaMalloc(&w[t].dev, g_size));
        for (size_t i = 0; i < words; i++)
            w[t].host[i] = bu_pattern(i, (uint32_t)t);
        // D2H threads read back a device buffer holding their own pattern.
        CK(cudaMemcpy(w[t].dev, w[t].host, g_size, cudaMemcpyHostToDevice));
    }
    pthread_barrier_init(&g_start, NULL, (unsigned)g_threads + 1);
    pthread_barrier_init(&g_done, NULL, (unsigned)g_threads + 1);
    for (int t = 0; t < g_threads; t++)
        pthread_create(&w[t].tid, NULL, run, &w[t]);
    std::vector<double> agg(g_reps);
    for (int r = 0; r < g_reps; r++) {
        pthread_barrier_wait(&g_start);
        double t0 = bu_now();
        pthread_barrier_wait(&g_done);
        agg[r] = (double)g_size * g_iters * g_threads / (bu_now() - t0) / 1e9;
    }
    for (int t = 0; t < g_threads; t++)
        pthread_join(w[t].tid, NULL);
    CK(cudaDeviceSynchronize());

    int ok = 1;
    for (int t = 0; t < g_threads && ok; t++)
        for (size_t i = 0; i < words; i += 1031)
            if (w[t].host[i] != bu_pattern(i, (uint32_t)t)) {
                fprintf(stderr, "gpu_two_threads: MISMATCH in thread %d word %zu\n", t, i);
                ok = 0;
                break;
            }
    double lo = bu_min(agg.data(), g_reps), hi = bu_max(agg.data(), g_reps);
    double med = bu_median(agg.data(), g_reps);
    fprintf(stderr, "gpu_two_threads: %d threads, %s, %zu MiB each: %.2f GB/s aggregate\n",
            g_threads, g_pinned ? "pinned" : "pageable", g_size >> 20, med);
    printf("RESULT bench=two_threads kind=%s threads=%d bytes=%zu iters=%d gbps=%.4f gbps_min=%.4f "
           "gbps_max=%.4f ok=%d\n",
           g_pinned ? "pinned" : "pageable", g_threads, g_size, g_iters, med, lo, hi, ok);
    for (int t = 0; t < g_threads; t++) {
        if (g_pinned)
            CK(cudaFreeHost(w[t].host));
        else
            free(w[t].host);
        CK(cudaFree(w[t].dev));
    }
    return ok ? 0 : 1;
}
