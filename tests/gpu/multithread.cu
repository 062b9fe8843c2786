// multithread.cu: many threads copying at once (correctness only).
//
//   workers      8 threads x 40 iterations: allocate (malloc or new, 4 KiB .. 16 MiB), fill,
//                copy H2D and D2H sync and async, on the legacy stream, the default stream, their
//                own blocking stream and their own non-blocking stream, transform with a kernel,
//                check the result and a device-side checksum of what arrived, free.  Some
//                buffers are kept across iterations so they get hot and promoted.
//   pinned_duplex  two threads, one H2D and one D2H of 256 MiB cudaMallocHost buffers at the
//                same time (plain cudaMemcpy and async on own streams), data checked.
#include "common.cuh"

#include <pthread.h>

__global__ void k_sum(const uint8_t *p, size_t n, unsigned long long *out)
{
    unsigned long long acc = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        acc += (unsigned long long)p[i] * ((i & 7) + 1);
    atomicAdd(out, acc);
}

static unsigned long long host_sum(const uint8_t *p, size_t n)
{
    unsigned long long acc = 0;
    for (size_t i = 0; i < n; i++) acc += (unsigned long long)p[i] * ((i & 7) + 1);
    return acc;
}

static const int NT = 8, ITERS = 40;

static void *worker(void *arg)
{
    int id = (int)(intptr_t)arg;
    char name[32];
    snprintf(name, sizeof name, "worker%d", id);
    t_test = name;
    const size_t sizes[] = {4 * KiB + (size_t)id, 256 * KiB, 1 * MiB + 7, 4 * MiB, 16 * MiB - (size_t)id * 3};
    const size_t MAXN = 16 * MiB;
    cudaStream_t sb, snb;
    CK(cudaStreamCreateWithFlags(&sb, cudaStreamDefault));
    CK(cudaStreamCreateWithFlags(&snb, cudaStreamNonBlocking));
    uint8_t *d_in, *d_out;
    unsigned long long *d_sum, h_sum;
    CK(cudaMalloc(&d_in, MAXN));
    CK(cudaMalloc(&d_out, MAXN));
    CK(cudaMalloc(&d_sum, sizeof *d_sum));
    // Kept across iterations: become hot.
    uint8_t *keep_src = (uint8_t *)xmalloc(MAXN + 64), *keep_dst = (uint8_t *)xmalloc(MAXN + 64);
    memset(keep_src, 0, MAXN + 64);
    memset(keep_dst, 0, MAXN + 64);
    for (int it = 0; it < ITERS; it++) {
        size_t n = sizes[(it + id) % 5];
        bool fresh = (it % 3) != 2;
        uint8_t *src, *dst;
        if (fresh) {
            src = (it & 1) ? new uint8_t[n] : (uint8_t *)xmalloc(n);
            dst = (uint8_t *)xmalloc(n);
        } else {
            src = keep_src + (it % 5);
            dst = keep_dst + (it % 3);
        }
        uint32_t seed = (uint32_t)(id * 100000 + it);
        uint8_t salt = (uint8_t)(id * 16 + it);
        fill(src, n, seed);
        unsigned long long expect_sum = host_sum(src, n);
        int how = (it + id) % 4;
        char w[96];
        snprintf(w, sizeof w, "worker %d iteration %d n=%zu how=%d", id, it, n, how);
        CK(cudaMemsetAsync(d_sum, 0, sizeof *d_sum, sb));
        CK(cudaStreamSynchronize(sb));
        switch (how) {
        case 0:  // sync H2D (default stream), kernel on own blocking stream, async D2H on it
            CK(cudaMemcpy(d_in, src, n, cudaMemcpyHostToDevice));
            launch_xform(d_out, d_in, n, salt, PTDS_BUILD ? 0 : sb);
            k_sum<<<grid_for(n), 256, 0, PTDS_BUILD ? 0 : sb>>>(d_in, n, d_sum);
            CK(cudaMemcpyAsync(dst, d_out, n, cudaMemcpyDeviceToHost, PTDS_BUILD ? 0 : sb));
            CK(cudaMemcpyAsync(&h_sum, d_sum, sizeof h_sum, cudaMemcpyDeviceToHost, PTDS_BUILD ? 0 : sb));
            break;
        case 1:  // async H2D on own blocking stream, kernel there, D2H on the legacy stream
            CK(cudaMemcpyAsync(d_in, src, n, cudaMemcpyHostToDevice, sb));
            launch_xform(d_out, d_in, n, salt, sb);
            k_sum<<<grid_for(n), 256, 0, sb>>>(d_in, n, d_sum);
            CK(cudaMemcpyAsync(dst, d_out, n, cudaMemcpyDeviceToHost, cudaStreamLegacy));
            CK(cudaMemcpyAsync(&h_sum, d_sum, sizeof h_sum, cudaMemcpyDeviceToHost, cudaStreamLegacy));
            break;
        case 2:  // legacy stream throughout, D2H with cudaMemcpy default kind
            CK(cudaMemcpyAsync(d_in, src, n, cudaMemcpyHostToDevice, cudaStreamLegacy));
            launch_xform(d_out, d_in, n, salt, cudaStreamLegacy);
            k_sum<<<grid_for(n), 256, 0, cudaStreamLegacy>>>(d_in, n, d_sum);
            CK(cudaMemcpyAsync(dst, d_out, n, cudaMemcpyDefault, cudaStreamLegacy));
            CK(cudaMemcpyAsync(&h_sum, d_sum, sizeof h_sum, cudaMemcpyDeviceToHost, cudaStreamLegacy));
            break;
        case 3:  // own non-blocking stream throughout
            CK(cudaMemcpyAsync(d_in, src, n, cudaMemcpyHostToDevice, snb));
            launch_xform(d_out, d_in, n, salt, snb);
            k_sum<<<grid_for(n), 256, 0, snb>>>(d_in, n, d_sum);
            CK(cudaMemcpyAsync(dst, d_out, n, cudaMemcpyDeviceToHost, snb));
            CK(cudaMemcpyAsync(&h_sum, d_sum, sizeof h_sum, cudaMemcpyDeviceToHost, snb));
            break;
        }
        CK(cudaGetLastError());
        // Pageable destinations: complete when the calls returned.
        verify_xf(dst, n, seed, salt, w);
        if (h_sum != expect_sum) FAILF("%s: device checksum %llu, expected %llu", w, h_sum, expect_sum);
        if (fresh) {
            if (it & 1) delete[] src; else free(src);
            free(dst);
        }
    }
    CK(cudaDeviceSynchronize());
    free(keep_src);
    free(keep_dst);
    CK(cudaFree(d_in));
    CK(cudaFree(d_out));
    CK(cudaFree(d_sum));
    CK(cudaStreamDestroy(sb));
    CK(cudaStreamDestroy(snb));
    return nullptr;
}

// ----- 256 MiB pinned, H2D || D2H -------------------------------------------------------------
static const size_t BIG = 256 * MiB;
static uint8_t *p_up, *p_down, *d_up, *d_down;
static pthread_barrier_t g_bar;

static void *uploader(void *)
{
    t_test = "pinned_duplex/h2d";
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (int it = 0; it < 4; it++) {
        uint32_t seed = 600 + it;
        fill(p_up, BIG, seed);
        pthread_barrier_wait(&g_bar);
        if (it & 1) {
            CK(cudaMemcpyAsync(d_up, p_up, BIG, cudaMemcpyHostToDevice, s));
            CK(cudaStreamSynchronize(s));
        } else {
            CK(cudaMemcpy(d_up, p_up, BIG, cudaMemcpyHostToDevice));
        }
        pthread_barrier_wait(&g_bar);
        // Check on the device side: copy back through the other direction after both finished.
        memset(p_up, 0, BIG);
        CK(cudaMemcpyAsync(p_up, d_up, BIG, cudaMemcpyDeviceToHost, s));
        CK(cudaStreamSynchronize(s));
        verify_pat(p_up, BIG, seed, "pinned_duplex h2d");
        pthread_barrier_wait(&g_bar);
    }
    CK(cudaStreamDestroy(s));
    return nullptr;
}

static void *downloader(void *)
{
    t_test = "pinned_duplex/d2h";
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (int it = 0; it < 4; it++) {
        uint32_t seed = 700 + it;
        launch_fill(d_down, BIG, seed, s);
        CK(cudaStreamSynchronize(s));
        memset(p_down, 0, BIG);
        pthread_barrier_wait(&g_bar);
        if (it & 1) {
            CK(cudaMemcpyAsync(p_down, d_down, BIG, cudaMemcpyDeviceToHost, s));
            CK(cudaStreamSynchronize(s));
        } else {
            CK(cudaMemcpy(p_down, d_down, BIG, cudaMemcpyDeviceToHost));
        }
        pthread_barrier_wait(&g_bar);
        verify_pat(p_down, BIG, seed, "pinned_duplex d2h");
        pthread_barrier_wait(&g_bar);
    }
    CK(cudaStreamDestroy(s));
    return nullptr;
}

int main(void)
{
    device_init();
    double t0 = now_ms();
    pthread_t t[NT];
    for (int i = 0; i < NT; i++) REQUIRE(pthread_create(&t[i], nullptr, worker, (void *)(intptr_t)i) == 0, "pthread_create");
    for (int i = 0; i < NT; i++) pthread_join(t[i], nullptr);
    pass("multithread.workers");

    t_test = "pinned_duplex";
    CK(cudaMallocHost(&p_up, BIG));
    CK(cudaMallocHost(&p_down, BIG));
    CK(cudaMalloc(&d_up, BIG));
    CK(cudaMalloc(&d_down, BIG));
    pthread_barrier_init(&g_bar, nullptr, 2);
    pthread_t a, b;
    REQUIRE(pthread_create(&a, nullptr, uploader, nullptr) == 0, "pthread_create");
    REQUIRE(pthread_create(&b, nullptr, downloader, nullptr) == 0, "pthread_create");
    pthread_join(a, nullptr);
    pthread_join(b, nullptr);
    pthread_barrier_destroy(&g_bar);
    CK(cudaFreeHost(p_up));
    CK(cudaFreeHost(p_down));
    CK(cudaFree(d_up));
    CK(cudaFree(d_down));
    pass("multithread.pinned_duplex");

    CK(cudaDeviceSynchronize());
    CK(cudaGetLastError());
    fprintf(stderr, "multithread: %.0f ms\n", now_ms() - t0);
    return 0;
}
