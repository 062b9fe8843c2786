// registration_contention: does a thread registering host memory hold off another thread's
// copies?  The main thread copies 16 MiB D2H into pinned memory and synchronizes, in a loop; a
// second thread registers 64 resident 16 MiB blocks one after another (twice, then with a pause of 100
// and 500 us after each), and they are unregistered after each round.  Per round: how long the
// registering took, and how many iterations the copy loop made meanwhile against what it makes
// alone.  Run without the shim (it measures the driver).
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <vector>
#include <algorithm>
static double now() { timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
#define NB 64
#define S (16u << 20)
static char *blocks[NB];
static volatile int reg_done;
static double reg_t0, reg_t1;
static int pause_us;
static void *registrar(void *) {
    reg_t0 = now();
    for (int i = 0; i < NB; i++) { cudaHostRegister(blocks[i], S, cudaHostRegisterPortable); if (pause_us) usleep(pause_us); }
    reg_t1 = now();
    reg_done = 1;
    return NULL;
}
int main() {
    cudaFree(0);
    char *pin, *d; cudaMallocHost((void **)&pin, S); cudaMalloc(&d, S); cudaMemset(d, 1, S);
    for (int i = 0; i < NB; i++) { blocks[i] = (char *)aligned_alloc(4096, S); memset(blocks[i], i, S); }
    cudaStream_t st; cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
    for (int i = 0; i < 20; i++) { cudaMemcpyAsync(pin, d, S, cudaMemcpyDeviceToHost, st); cudaStreamSynchronize(st); }
    std::vector<double> it;
    double a = now();
    for (int i = 0; i < 100; i++) { double t = now(); cudaMemcpyAsync(pin, d, S, cudaMemcpyDeviceToHost, st); cudaStreamSynchronize(st); it.push_back(now() - t); }
    std::sort(it.begin(), it.end());
    printf("alone: 100 iterations %.1f ms, median %.0f us, max %.0f us\n", (now() - a) * 1e3, it[50] * 1e6, it.back() * 1e6);
    int pauses[] = {0, 0, 100, 500};
    for (int p = 0; p < 4; p++) {
        pause_us = pauses[p]; reg_done = 0;
        pthread_t th; pthread_create(&th, NULL, registrar, NULL);
        std::vector<double> w; double mx = 0; int n = 0;
        while (!reg_done) { double t = now(); cudaMemcpyAsync(pin, d, S, cudaMemcpyDeviceToHost, st); cudaStreamSynchronize(st); double e = now() - t; mx = std::max(mx, e); n++; w.push_back(e); }
        pthread_join(th, NULL);
        std::sort(w.begin(), w.end());
        printf("registering %d x 16 MiB, pause %d us: %.1f ms; main loop %d iterations (alone: %.0f), median %.0f us, max %.0f us\n",
               NB, pause_us, (reg_t1 - reg_t0) * 1e3, n, (reg_t1 - reg_t0) / it[50], w.empty() ? 0 : w[w.size() / 2] * 1e6, mx * 1e6);
        double u0 = now(); for (int i = 0; i < NB; i++) cudaHostUnregister(blocks[i]);
        printf("  unregistering: %.1f ms\n", (now() - u0) * 1e3);
    }
    return 0;
}
