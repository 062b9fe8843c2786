// register_threads: whether registering resident memory goes faster from several threads.
// 2 GiB of resident memory is split among T threads (1, 2, 4, 8, 16), which register their
// parts at once, then unregister them at once; GB/s of each, twice.  No shim needed.
//   nvcc -O2 -o register_threads bench/probes/register_threads.cu && ./register_threads
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now() { timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
struct arg { char *p; size_t n; double reg, unreg; pthread_barrier_t *b; };
static void *work(void *v)
{
    arg *a = (arg *)v;
    cudaFree(0);
    pthread_barrier_wait(a->b);
    double t0 = now();
    if (cudaHostRegister(a->p, a->n, 0)) printf("register failed\n");
    double t1 = now();
    pthread_barrier_wait(a->b);
    double t2 = now();
    cudaHostUnregister(a->p);
    a->reg = t1 - t0; a->unreg = now() - t2;
    return 0;
}
int main()
{
    cudaFree(0);
    size_t total = 2ull << 30;
    char *mem = (char *)aligned_alloc(1 << 21, total);
    memset(mem, 1, total);
    int ts[] = {1, 2, 4, 8, 16};
    for (int rep = 0; rep < 2; rep++)
    for (int k = 0; k < 5; k++) {
        int T = ts[k];
        pthread_barrier_t b; pthread_barrier_init(&b, 0, T + 1);
        arg a[16]; pthread_t th[16];
        for (int i = 0; i < T; i++) { a[i].p = mem + total / T * i; a[i].n = total / T; a[i].b = &b; pthread_create(&th[i], 0, work, &a[i]); }
        pthread_barrier_wait(&b); double t0 = now();
        pthread_barrier_wait(&b); double t1 = now();
        for (int i = 0; i < T; i++) pthread_join(th[i], 0);
        double t2 = now();
        printf("register 2 GiB resident in %2d threads: %6.1f ms (%5.1f GB/s); unregister %6.1f ms (%5.1f GB/s)\n",
               T, (t1 - t0) * 1e3, total / (t1 - t0) / 1e9, (t2 - t1) * 1e3, total / (t2 - t1) / 1e9);
    }
    return 0;
}
