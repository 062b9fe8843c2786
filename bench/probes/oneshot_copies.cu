// oneshot_copies: where a one-shot copy's time goes.  Each host buffer, filled first (resident),
// is copied once with cudaMemcpyAsync on the legacy stream and then cudaStreamSynchronize, as
// PyTorch's tensor.to() does; per size: the aggregate GB/s, the median time in the call and the
// median time in the synchronize (a staged H2D copy returns once its source is read; its last
// DMAs finish in the synchronize).  PINNED=1: cudaMallocHost buffers (the ceiling).  HUGE=1:
// each pageable buffer asks for transparent huge pages (MADV_HUGEPAGE) before it is filled, so
// that a staged copy's CPU side walks 2 MiB pages instead of 4 KiB ones.  SYNC=1: cudaMemcpy
// instead (the staging benchmark's kind of call), the synchronize then finds nothing to wait for.
// REUSE=1: every copy of a size uses the same buffer, as the staging benchmark does.
// The bytes are checked after each size's copies (not timed): each buffer carries its own index
// every 4 KiB, so a piece landed from the wrong buffer or the wrong place shows; a mismatch
// prints MISMATCH and ends the run with status 1.
//   nvcc -O2 -o oneshot_copies bench/probes/oneshot_copies.cu
//   ./oneshot_copies h2d|d2h SIZE_MIB...        (with and without LD_PRELOAD=libpinshim.so)
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <algorithm>
#include <vector>

static double now() { timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

// Buffer i's bytes: i + 1, and every 4 KiB a word of its place and i.
static void fill(char *p, size_t n, int i)
{
    memset(p, i + 1, n);
    for (size_t k = 0; k < n / 4096; k++) {
        unsigned w = (unsigned)k * 2654435761u ^ (unsigned)i;
        memcpy(p + k * 4096, &w, sizeof w);
    }
}

int main(int argc, char **argv)
{
    int pinned = getenv("PINNED") && atoi(getenv("PINNED"));
    int huge = getenv("HUGE") && atoi(getenv("HUGE"));
    int sync_call = getenv("SYNC") && atoi(getenv("SYNC"));
    int reuse = getenv("REUSE") && atoi(getenv("REUSE"));
    const char *dirs = argc > 1 ? argv[1] : "h2d";
    int d2h = !strcmp(dirs, "d2h");
    cudaFree(0);
    for (int a = 2; a < argc; a++) {
        size_t S = (size_t)atof(argv[a]) << 20;
        int n = (int)std::max<size_t>(6, std::min<size_t>(48, (768ull << 20) / S));
        std::vector<char *> h(n + 1);
        for (int i = 0; i <= n; i++) {
            if (pinned) cudaMallocHost((void **)&h[i], S);
            else if (huge) {
                // 2 MiB-aligned, so that every page of the buffer can be a huge one
                if (posix_memalign((void **)&h[i], 2u << 20, S)) h[i] = NULL;
                else madvise(h[i], S, MADV_HUGEPAGE);
            } else h[i] = (char *)malloc(S);
            if (!h[i]) { printf("error: no memory for %zu bytes\n", S); return 1; }
            fill(h[i], S, i);
        }
        // What the device holds for D2H copies, and what each of them must deliver.
        std::vector<char> want(S);
        fill(want.data(), S, n);
        char *d; cudaMalloc(&d, S);
        if (d2h) cudaMemcpy(d, want.data(), S, cudaMemcpyHostToDevice);
        // warm-up on a buffer of its own (lanes, threads)
        cudaMemcpyAsync(d2h ? (void *)h[n] : (void *)d, d2h ? (void *)d : (void *)h[n], S,
                        d2h ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, 0);
        cudaStreamSynchronize(0);
        std::vector<double> call(n), sync(n);
        double T0 = now();
        for (int i = 0; i < n; i++) {
            double t0 = now();
            char *hb = h[reuse ? 0 : i];
            void *dst = d2h ? (void *)hb : (void *)d, *src = d2h ? (void *)d : (void *)hb;
            cudaMemcpyKind kind = d2h ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice;
            cudaError_t e = sync_call ? cudaMemcpy(dst, src, S, kind) : cudaMemcpyAsync(dst, src, S, kind, 0);
            double t1 = now();
            cudaStreamSynchronize(0);
            double t2 = now();
            if (e) { printf("error %d\n", e); return 1; }
            call[i] = t1 - t0; sync[i] = t2 - t1;
        }
        double T = now() - T0;
        // D2H: every destination holds the device's bytes; H2D: the device holds the last source.
        std::vector<char> back(S);
        if (!d2h) cudaMemcpy(back.data(), d, S, cudaMemcpyDeviceToHost);
        for (int i = d2h ? 0 : n - 1; i < n; i++) {
            const char *got = d2h ? h[reuse ? 0 : i] : back.data(), *exp = d2h ? want.data() : h[reuse ? 0 : n - 1];
            if (memcmp(got, exp, S)) {
                printf("MISMATCH: %s copy %d of %zu bytes delivered other bytes\n", d2h ? "D2H" : "H2D", i, S);
                return 1;
            }
        }
        std::sort(call.begin(), call.end()); std::sort(sync.begin(), sync.end());
        printf("%s%s%s%s %s %6.1f MiB x%2d: %6.2f GB/s  call med %8.1f us  sync med %8.1f us  (per copy %8.1f us)\n",
               pinned ? "pinned" : "pageable", huge && !pinned ? "-huge" : "", sync_call ? "-sync" : "", reuse ? "-reuse" : "", d2h ? "D2H" : "H2D", S / 1048576.0, n, (double)S * n / T / 1e9,
               call[n / 2] * 1e6, sync[n / 2] * 1e6, T / n * 1e6);
        for (int i = 0; i <= n; i++) { if (pinned) cudaFreeHost(h[i]); else free(h[i]); }
        cudaFree(d);
    }
    return 0;
}
