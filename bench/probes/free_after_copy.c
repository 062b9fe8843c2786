// free_after_copy: what freeing a model's CPU tensors during its move to the GPU costs.  The
// layers of a GPT-2-medium-sized model (24 layers of 12, 4, 16 and 16 MiB tensors) are
// allocated with malloc and filled, then each is copied to the device once (cuMemcpyHtoDAsync
// on the legacy stream, then a synchronize, as tensor.to() does) and, with FREE_EACH=1, freed
// right after its copy, as Module.to frees each parameter's CPU memory; otherwise all are freed
// after the loop.  Prints the loop's time, the copies' and the frees' (each timed alone).
// Driver API only, linked with -lcuda: it runs on a GPU's driver or on the checking fake one.
//   cc -O2 -I$CUDA_INC -o build/free_after_copy bench/probes/free_after_copy.c -lcuda
//   FREE_EACH=1 LD_PRELOAD=build/libpinshim.so build/free_after_copy     (and without either)
#include <string.h>
#include "probe_drv.h"

int main(void)
{
    int free_each = getenv("FREE_EACH") && atoi(getenv("FREE_EACH"));
    probe_context();
    unsigned char *cpu[TENSORS];
    CUdeviceptr gpu[TENSORS];
    for (int i = 0; i < TENSORS; i++) {
        size_t n = per_layer[i % 4];
        if (!(cpu[i] = malloc(n))) {
            printf("error: no memory for %zu bytes\n", n);
            return 1;
        }
        memset(cpu[i], i + 1, n);
        check(cuMemAlloc(&gpu[i], n), "cuMemAlloc");
    }
    double copies = 0, frees = 0, t0 = now();
    for (int i = 0; i < TENSORS; i++) {
        double a = now();
        check(cuMemcpyHtoDAsync(gpu[i], cpu[i], per_layer[i % 4], 0), "cuMemcpyHtoDAsync");
        check(cuStreamSynchronize(0), "cuStreamSynchronize");
        double b = now();
        copies += b - a;
        if (free_each) {
            free(cpu[i]);
            frees += now() - b;
        }
    }
    double loop = now() - t0, after = now();
    if (!free_each)
        for (int i = 0; i < TENSORS; i++)
            free(cpu[i]);
    after = now() - after;
    printf("free_each=%d: %d tensors, loop %.1f ms: copies %.1f ms, frees in the loop %.2f ms (%.1f us each), "
           "frees after it %.2f ms\n", free_each, TENSORS, loop * 1e3, copies * 1e3, frees * 1e3,
           free_each ? frees * 1e6 / TENSORS : 0.0, after * 1e3);
    for (int i = 0; i < TENSORS; i++)
        cuMemFree(gpu[i]);
    return 0;
}
