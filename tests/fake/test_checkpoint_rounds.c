/* A checkpoint written every round: the model's tensors copied to fresh CPU buffers, all of
 * them freed before the next round (a state_dict copied to the CPU, saved, dropped).  Six
 * layers of four tensors in three sizes, so that each size has more blocks than the pinned
 * cache keeps by default.
 *
 * Every round's bytes land.  Where the shim promotes: the first round's allocations mostly miss
 * the pinned cache (the blocks freed after the model's upload fill a few of them); those misses
 * size what each size keeps cached on free, so from the second round on every destination is a
 * registered block when the program gets it, and its copy runs at pinned speed. */
#include <unistd.h>
#include "drvtest.h"
#include "fakecuda.h"

#define LAYERS 6
#define TENSORS (LAYERS * 4)
#define ROUNDS 3

static size_t tensor_bytes(int i)
{
    static const size_t per_layer[4] = { 3u << 20, 1u << 20, 4u << 20, 4u << 20 };
    return per_layer[i % 4];
}

int main(void)
{
    drvtest_init();
    CUdeviceptr dev[TENSORS];
    int ok = 1;
    /* The model built on the CPU and moved to the device, its CPU tensors freed on the way. */
    for (int i = 0; i < TENSORS; i++) {
        size_t n = tensor_bytes(i);
        unsigned char *cpu = malloc(n);
        CHECK(cpu != NULL);
        fill_pattern(cpu, n, (unsigned)i);
        CU(cuMemAlloc(&dev[i], n));
        CU(cuMemcpyHtoDAsync(dev[i], cpu, n, 0));
        CU(cuStreamSynchronize(0));
        free(cpu);
    }
    int registered_on_arrival[ROUNDS] = { 0 };
    for (int r = 0; r < ROUNDS; r++) {
        drvtest_wait_registrations_settled();
        unsigned char *out[TENSORS];
        for (int i = 0; i < TENSORS; i++) {
            size_t n = tensor_bytes(i);
            out[i] = malloc(n);
            CHECK(out[i] != NULL);
            registered_on_arrival[r] += fakecuda_registered(out[i], n);
            CU(cuMemcpyDtoHAsync(out[i], dev[i], n, 0));
            CU(cuStreamSynchronize(0));
        }
        for (int i = 0; i < TENSORS; i++) {
            ok &= check_pattern(out[i], tensor_bytes(i), (unsigned)i);
            free(out[i]);
        }
        printf("info: round %d: %d of %d destinations registered when allocated\n", r + 1,
               registered_on_arrival[r], TENSORS);
    }
    CHECKF(ok, "every round's copies carry the model's bytes");
    if (drvtest_expect_promotion(1u << 20)) {
        CHECKF(registered_on_arrival[0] < TENSORS, "the first round finds the cache short (%d of %d)",
               registered_on_arrival[0], TENSORS);
        for (int r = 1; r < ROUNDS; r++)
            CHECKF(registered_on_arrival[r] == TENSORS,
                   "round %d: every destination comes registered from the pinned cache (%d of %d)", r + 1,
                   registered_on_arrival[r], TENSORS);
    }
    for (int i = 0; i < TENSORS; i++)
        CU(cuMemFree(dev[i]));
    printf("EXPECTED_COPIES h2d=%d d2h=%d d2d=0\n", TENSORS, TENSORS * ROUNDS);
    return TEST_SUMMARY();
}
