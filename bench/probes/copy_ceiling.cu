// copy_ceiling: how fast this host's CPUs can fill and empty pinned memory, with and without
// the copy engine using host memory at the same time: the ceiling of a staged copy, which reads
// every byte of the program's buffer, writes it to a staging buffer and has the DMA read it
// (H2D), or the reverse (D2H).  No shim: it measures the host.
//
// 1 GiB of resident pageable memory is copied to (H2D) or from (D2H) a 48 MiB pinned area in
// pieces of 16 MiB, each piece cut in one slice per thread, threads meeting at a barrier per
// piece (as a staging pipeline's copy threads do), at 1 to 16 threads, with streaming stores
// (H2D) or plain memcpy.  "alone": nothing else runs; "with DMA": the main thread keeps the copy
// engine busy meanwhile, 256 MiB pinned<->device copies in the same direction as a staged copy's
// DMAs, so both compete for host memory as in a staged copy; its rate is printed beside.
//   nvcc -O2 -o build/copy_ceiling bench/probes/copy_ceiling.cu -lpthread && build/copy_ceiling
#include <cuda_runtime.h>
#include <emmintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now() { timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

#define SRC_BYTES (1ull << 30)
#define PIECE (16ull << 20)
#define SLOTS 3
#define MAX_T 16

static char *pageable, *pinned;
static int nthreads, d2h, streaming;
static pthread_barrier_t bar;
static volatile int stop_dma;

static void copy_nt(char *dst, const char *src, size_t n)
{
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(src + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(src + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(src + i + 32));
        __m128i d = _mm_loadu_si128((const __m128i *)(src + i + 48));
        _mm_stream_si128((__m128i *)(dst + i), a);
        _mm_stream_si128((__m128i *)(dst + i + 16), b);
        _mm_stream_si128((__m128i *)(dst + i + 32), c);
        _mm_stream_si128((__m128i *)(dst + i + 48), d);
    }
    _mm_sfence();
    memcpy(dst + i, src + i, n - i);
}

static void *worker(void *arg)
{
    long t = (long)arg;
    size_t slice = PIECE / nthreads;
    for (size_t off = 0; off < SRC_BYTES; off += PIECE) {
        char *stage = pinned + (off / PIECE % SLOTS) * PIECE + t * slice;
        char *prog = pageable + off + t * slice;
        if (d2h) memcpy(prog, stage, slice);
        else if (streaming) copy_nt(stage, prog, slice);
        else memcpy(stage, prog, slice);
        pthread_barrier_wait(&bar);
    }
    return NULL;
}

static double run_copy(int threads)
{
    nthreads = threads;
    pthread_barrier_init(&bar, NULL, threads);
    pthread_t tid[MAX_T];
    double t0 = now();
    for (long i = 0; i < threads; i++) pthread_create(&tid[i], NULL, worker, (void *)i);
    for (int i = 0; i < threads; i++) pthread_join(tid[i], NULL);
    double t = now() - t0;
    pthread_barrier_destroy(&bar);
    return SRC_BYTES / t / 1e9;
}

struct dma_arg { char *host; void *dev; size_t n; double gbps; };

static void *dma_loop(void *p)
{
    dma_arg *a = (dma_arg *)p;
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    size_t bytes = 0;
    double t0 = now();
    while (!stop_dma) {
        if (d2h) cudaMemcpyAsync(a->host, a->dev, a->n, cudaMemcpyDeviceToHost, s);
        else cudaMemcpyAsync(a->dev, a->host, a->n, cudaMemcpyHostToDevice, s);
        cudaStreamSynchronize(s);
        bytes += a->n;
    }
    a->gbps = bytes / (now() - t0) / 1e9;
    cudaStreamDestroy(s);
    return NULL;
}

int main()
{
    if (cudaFree(0) != cudaSuccess) { printf("error: no CUDA device\n"); return 1; }
    pageable = (char *)malloc(SRC_BYTES);
    if (!pageable || cudaMallocHost((void **)&pinned, SLOTS * PIECE) != cudaSuccess) { printf("error: no memory\n"); return 1; }
    memset(pageable, 1, SRC_BYTES);
    memset(pinned, 2, SLOTS * PIECE);
    dma_arg da;
    da.n = 256ull << 20;
    if (cudaMallocHost((void **)&da.host, da.n) != cudaSuccess || cudaMalloc(&da.dev, da.n) != cudaSuccess) { printf("error: no memory\n"); return 1; }
    memset(da.host, 3, da.n);
    const int counts[] = { 1, 2, 4, 8, 12, 16 };
    const char *kinds[] = { "H2D streaming stores", "H2D memcpy", "D2H memcpy" };
    printf("GB/s of 1 GiB copied between pageable and pinned memory in 16 MiB pieces (DMA GB/s meanwhile)\n");
    printf("%-22s", "threads");
    for (int c : counts) printf(" %17d", c);
    printf("\n");
    for (int k = 0; k < 3; k++) {
        d2h = k == 2;
        streaming = k == 0;
        for (int with_dma = 0; with_dma < 2; with_dma++) {
            printf("%-16s %-5s", kinds[k], with_dma ? "+DMA" : "alone");
            for (int c : counts) {
                run_copy(c);   // once unmeasured: caches, page tables, thread start
                pthread_t dt;
                if (with_dma) { stop_dma = 0; pthread_create(&dt, NULL, dma_loop, &da); }
                double g = run_copy(c);
                if (with_dma) { stop_dma = 1; pthread_join(dt, NULL); printf("  %6.1f (%5.1f)   ", g, da.gbps); }
                else printf(" %17.1f", g);
            }
            printf("\n");
            fflush(stdout);
        }
    }
    return 0;
}
